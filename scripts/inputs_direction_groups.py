#!/usr/bin/env python
"""The P(k) Jacobian's inputs program with its tangent directions in groups, side by side.

``PowerSpectrumFunction.jacobian`` computes the tables, mode rows and initial states with their
tangents along every solve direction in one program (``_inputs_and_tangents``), on the host
CPU where a GPU runs the solve. Its cost grows with the directions; this measures whether the
directions split into G groups (each group recomputing the primal) run faster as G programs
side by side — in turn, dispatched from one thread, and from a thread each — than the whole
program, under the process's XLA:CPU pool (``BOLTZMANN_HOST_THREADS``; unset: the code's
default). Prints warm seconds (min, median) per form. A lever's measurement, not a feature.

    BOLTZMANN_HOST_THREADS=1 python scripts/inputs_direction_groups.py --config lcdm --groups 2
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _timed(run, repeats):
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return min(seconds), float(np.median(seconds))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from boltzmann import runtime
    runtime.configure(runtime.Settings.from_environment())
    import jax
    import jax.numpy as jnp

    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config

    fn = PowerSpectrumFunction(load_config(args.config), backend="jax")
    theta, S = fn.theta0, np.asarray(fn._map.solve_directions)
    cpu = jax.devices("cpu")[0]
    print(f"# {args.config}: {S.size} solve directions in {args.groups} groups; XLA:CPU pool "
          f"{runtime.host_pool_description(runtime.Settings.from_environment().host_threads)}; "
          f"{os.cpu_count()} CPUs", flush=True)
    whole = jax.jit(fn._inputs_and_tangents)

    def grouped(th, basis):
        return jax.vmap(lambda e: jax.jvp(fn._solve_inputs_and_thermo, (th,), (e,)),
                        out_axes=(None, 0))(basis)

    group = jax.jit(grouped)
    size = -(-S.size // args.groups)
    eye = np.eye(theta.size)
    blocks = []
    for i in range(args.groups):
        idx = S[i * size:(i + 1) * size]
        b = np.zeros((size, theta.size))
        b[:idx.size] = eye[idx]
        blocks.append(jnp.asarray(b))
    with jax.default_device(cpu):
        for name, run in (("whole, first", lambda: whole(theta)),
                          ("one group, first", lambda: group(theta, blocks[0]))):
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)

        def threaded():
            threads = [threading.Thread(target=lambda b=b: jax.block_until_ready(group(theta, b)))
                       for b in blocks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        forms = {"whole program": lambda: jax.block_until_ready(whole(theta)),
                 "one group": lambda: jax.block_until_ready(group(theta, blocks[0])),
                 "groups in turn": lambda: [jax.block_until_ready(group(theta, b))
                                            for b in blocks],
                 "groups dispatched from one thread": lambda: jax.block_until_ready(
                     [group(theta, b) for b in blocks]),
                 "groups from a thread each": threaded}
        for name, run in forms.items():
            lo, med = _timed(run, args.repeats)
            print(f"| {name} | {lo * 1e3:.1f} | {med * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
