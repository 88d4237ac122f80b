#!/usr/bin/env python
"""The JAX backend's lanes side by side in one process: the perturbation stage of a config's
main job with every mode in lock-step against L lanes that take the next mode when theirs is
done (``JaxBackend(lanes=L)``, ``solver.backends.jax.ensemble``).

In lock-step an iteration costs one step of every mode until the slowest is done; the modes of
a P(k) take from tens of steps (low k) to hundreds (high k), so most of that work is on finished
modes. Prints, per setting, the first call (compilation included), the warm time (median of
``--repeats``), the steps and the largest relative P_m difference from lock-step.

    python scripts/bench_lanes.py --config lcdm --lanes 0 auto --out DIR      # 0: lock-step
    python scripts/bench_lanes.py --config lcdm --lanes 0 8 16 32 --chunks 4
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from boltzmann import modes  # noqa: E402
from boltzmann.ensemble import stack_cosmologies  # noqa: E402
from boltzmann.params import load_config  # noqa: E402
from boltzmann import perturbations  # noqa: E402
from boltzmann.perturbations import compute_perturbations  # noqa: E402
from boltzmann.runtime import Settings, configure  # noqa: E402
from boltzmann.spectra import compute_spectra  # noqa: E402
from boltzmann.tables import compute_tables  # noqa: E402
from solver import JaxBackend  # noqa: E402

from bench_jacobian_kinds import write_outputs  # noqa: E402  (scripts/ is on sys.path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--lanes", nargs="+", default=["0", "auto"],
                    help="lanes per solve: a number, auto (ensemble.auto_lanes) or 0 (every "
                         "mode in lock-step, the code's default)")
    ap.add_argument("--chunks", type=int, default=None,
                    help="solves the modes are split into (default: the code's N_CHUNKS_JAX)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    configure(Settings.from_environment())
    if args.chunks:
        perturbations.N_CHUNKS_JAX = args.chunks
    cfg = load_config(args.config)
    cosmos = [cfg.cosmology]
    stacked = stack_cosmologies(cosmos)
    model = modes.model_for(cfg.cosmology, cfg.precision)
    tables = compute_tables(stacked, modes.make_grid(cfg.precision), model)
    k = np.asarray(cfg.output.k_grid(float(cfg.cosmology.h)), np.float64)[None]
    machine = os.environ.get("BENCH_MACHINE", platform.node())
    date = datetime.date.today().isoformat()
    command = "python scripts/bench_lanes.py " + " ".join(argv or sys.argv[1:])
    rows, pk = [], {}
    for lanes in args.lanes:
        backend = JaxBackend(lanes="auto" if lanes == "auto" else (int(lanes) or None))

        def once():
            t0 = time.perf_counter()
            tr = compute_perturbations(tables, stacked, k, cfg.output.z, cfg.precision, model,
                                       backend=backend)
            sp = compute_spectra(tr, stacked, check_coverage=False)
            return time.perf_counter() - t0, tr, sp

        first, _, _ = once()
        walls = []
        for _ in range(args.repeats):
            wall, tr, sp = once()
            walls.append(wall)
        pk[lanes] = np.asarray(sp.pk_m)
        steps = np.asarray(tr.n_accepted)
        rows.append({"lanes": lanes, "first_s": first, "warm_s": statistics.median(walls),
                     "steps_total": int(steps.sum()), "steps_max": int(steps.max()),
                     "failed": int(np.sum(np.asarray(tr.status) != 0))})
        print(json.dumps(rows[-1]), flush=True)
    ref = pk[args.lanes[0]]
    lines = [f"Machine: {machine}; date {date}; command `{command}`.", "",
             "| lanes | first call [s] | warm [s] | steps total / max | failed modes | "
             f"max \\|P_m ratio − 1\\| vs lanes {args.lanes[0]} |", "|---|---|---|---|---|---|"]
    for r in rows:
        diff = float(np.nanmax(np.abs(pk[r["lanes"]] / ref - 1.0)))
        lines.append(f"| {'all (lock-step)' if r['lanes'] == '0' else r['lanes']} | "
                     f"{r['first_s']:.1f} | "
                     f"{r['warm_s']:.2f} | {r['steps_total']} / {r['steps_max']} | "
                     f"{r['failed']} | {diff:.1e} |")
    table = "\n".join(lines)
    print(table)
    write_outputs(args.out, "lanes", {"machine": machine, "date": date, "command": command,
                                      "rows": rows}, table)


if __name__ == "__main__":
    main()
