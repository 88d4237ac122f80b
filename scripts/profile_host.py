#!/usr/bin/env python
"""Where one warm P(k) spends its host time, function by function.

On a GPU machine the tables of a few cosmologies are computed on the host CPU
(``tables.HOST_TABLES_MAX``) and the Jacobian's inputs program runs there too; their time
differed by 2× between hosts and between XLA:CPU pool sizes (docs/benchmarks.md), more than
the arithmetic explains. This script runs one P(k) of a config's fiducial cosmology end to end
(``ensemble.run_ensemble``, as ``bench_gpu.py`` part c), warm, then:

- the stage seconds of ``--repeat`` warm calls (tables / initial conditions / solve / spectra);
- the tables stage in its pieces: the host program alone on a cosmology already on the host,
  the same from the stacked cosmology as the stage receives it (slicing, host copies), and the
  table's copy to the default device;
- with ``--jacobian``, the Jacobian's inputs program (tables and their tangents) warm;
- a cProfile of ``--repeat`` warm calls: the functions with the most own time and the most
  cumulative time.

    python scripts/profile_host.py [--config lcdm] [--backend cuda] [--repeat 10] [--jacobian]
        [--out FILE]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import jax
import numpy as np

from boltzmann import ensemble, modes, runtime
from boltzmann.params import load_config
from boltzmann.tables import _program, compute_tables, host_cpu


def _best(fn, repeat: int) -> tuple[float, float]:
    """(min, median) wall seconds of ``repeat`` calls of fn after one unclocked call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def _line(name: str, times: tuple[float, float]) -> str:
    return f"| {name} | {1e3 * times[0]:.1f} | {1e3 * times[1]:.1f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--jacobian", action="store_true",
                    help="also time the Jacobian's inputs program (tables and their tangents)")
    ap.add_argument("--top", type=int, default=25, help="functions listed per cProfile table")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    settings = runtime.Settings.from_environment()
    runtime.configure(settings)
    cfg = load_config(args.config)
    cosmos = ensemble.fiducial_ensemble(1, cfg)

    def one_pk():
        return ensemble.run_ensemble(cosmos, cfg.precision, cfg.output, backend=args.backend)

    lines = [f"# profile_host {args.config}, backend {args.backend}: default device "
             f"{jax.devices()[0].device_kind}, host programs on "
             f"{'the host CPU' if host_cpu() is not None else 'the default device'}; XLA:CPU "
             f"pool: {runtime.host_pool_description(settings.host_threads)}", ""]
    t0 = time.perf_counter()
    one_pk()
    lines.append(f"first call {time.perf_counter() - t0:.1f} s")
    stages = []
    for _ in range(args.repeat):
        stages.append(one_pk().timings)
    lines += ["", "| stage | min [ms] | median [ms] |", "|---|---|---|"]
    for name in stages[0]:
        vals = [s[name] for s in stages]
        lines.append(_line(name, (min(vals), statistics.median(vals))))

    # the tables stage in pieces
    model = modes.model_for(cfg.cosmology, cfg.precision)
    grid = modes.make_grid(cfg.precision)
    stacked = ensemble.stack_cosmologies(cosmos)
    cpu = host_cpu() or jax.devices("cpu")[0]
    program = _program(grid, model, False)
    on_host = jax.device_put(jax.tree_util.tree_map(lambda x: x[0], stacked), cpu)
    table = compute_tables(stacked, grid, model).model_table
    lines += ["", "| tables stage piece | min [ms] | median [ms] |", "|---|---|---|",
              _line("compute_tables (the stage)",
                    _best(lambda: compute_tables(stacked, grid, model).model_table, args.repeat)),
              _line("host program alone (cosmology on the host)",
                    _best(lambda: program(on_host), args.repeat)),
              _line("cosmology sliced and copied to the host",
                    _best(lambda: jax.device_put(jax.tree_util.tree_map(lambda x: x[0], stacked),
                                                 cpu), args.repeat)),
              _line("table to the default device",
                    _best(lambda: jax.device_put(np.asarray(table)), args.repeat))]
    if args.jacobian:
        from boltzmann.gradients import PowerSpectrumFunction
        f = PowerSpectrumFunction(cfg, backend=args.backend)
        theta = f.theta0
        lines += [_line("Jacobian inputs program (tables, rows, y0 and tangents)",
                        _best(lambda: f._host_inputs(f._jit_inputs_jvp, theta), args.repeat)),
                  _line("value inputs program (tables, rows, y0)",
                        _best(lambda: f._host_inputs(f._jit_stage_inputs, theta), args.repeat))]

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.repeat):
        one_pk()
    prof.disable()
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
        lines += ["", f"## cProfile of {args.repeat} warm calls, by {key}", "```",
                  buf.getvalue().strip(), "```"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
