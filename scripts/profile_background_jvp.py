#!/usr/bin/env python
"""The P(k) Jacobian's background outputs part by part: value against the jvp along every
parameter, and the growth factor at several RK4 step counts side by side.

``PowerSpectrumFunction``'s inputs program also carries the background outputs (H, D_A, D_M,
the growth D and f at the config's z_background, the derived numbers) with their tangents
along every parameter; this times each piece's value and jvp, compiled, on the host CPU (the
process's XLA:CPU pool, ``BOLTZMANN_HOST_THREADS``): min ms of ``--repeats`` warm calls.

    BOLTZMANN_HOST_THREADS=1 python scripts/profile_background_jvp.py --config lcdm \
        --growth-steps 4000 500
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--growth-steps", type=int, nargs="+", default=[4000, 500])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from boltzmann import runtime
    runtime.configure(runtime.Settings.from_environment())
    import jax
    import jax.numpy as jnp

    from boltzmann import background as bg
    from boltzmann import derived as derived_mod
    from boltzmann import distances
    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config

    fn = PowerSpectrumFunction(load_config(args.config), backend="jax")
    theta = fn.theta0
    _, thermo = jax.jit(fn._solve_inputs_and_thermo)(theta)
    z = jnp.asarray(fn.z_background)
    print(f"# {args.config}: z_background {[float(x) for x in fn.z_background]}, {len(fn.derived)} derived "
          f"numbers, {theta.size} parameters; XLA:CPU pool "
          f"{runtime.host_pool_description(runtime.Settings.from_environment().host_threads)}")

    def best(run):
        jax.block_until_ready(run())
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            seconds.append(time.perf_counter() - t0)
        return 1e3 * min(seconds)

    def row(name, piece):
        value = jax.jit(lambda th: piece(fn.cosmology(th)))
        jvp = jax.jit(lambda th: jax.vmap(
            lambda e: jax.jvp(lambda t: piece(fn.cosmology(t)), (th,), (e,)),
            out_axes=(None, 0))(jnp.eye(th.size)))
        print(f"| {name} | {best(lambda: value(theta)):.1f} | {best(lambda: jvp(theta)):.1f} |",
              flush=True)

    print("| part | value [ms] | jvp along every parameter [ms] |\n|---|---|---|")
    row("all background outputs (the code's)", lambda c: fn._background(c, thermo))
    for n in args.growth_steps:
        row(f"growth D, f ({n} RK4 steps)",
            lambda c, n=n: bg.growth_factor(c, 1.0 / (1.0 + z), n=n))
    row("H, D_A, D_M", lambda c: (distances.hubble(c, z), distances.angular_distance(c, z),
                                  distances.transverse_comoving_distance(c, z)))
    row("derived numbers", lambda c: derived_mod.derived_parameters(
        c, {name: v[0] for name, v in thermo.items()}))


if __name__ == "__main__":
    main()
