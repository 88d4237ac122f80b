#!/usr/bin/env python
"""Time of the CMB spectra (``boltzmann.cmb.cl_for_config``) in one process, first and warm.

Runs the config's C_ℓ ``--runs`` times in this process (the first compiles; the later ones are
warm: compiled programs, CUDA kernel and the Bessel table kept) and prints a Markdown table with
the stage times of every run (tables = the rest of the call: background, thermodynamics, model
table). ``--class`` also times CLASS (classy) on the same request at its default precision, so
that the two can be compared on one machine; ``--out DIR`` writes ``bench_cl.json``.

    python scripts/bench_cl.py --config configs/planck_cl.yaml --runs 3 --class
    python scripts/bench_cl.py --backend cuda --runs 4 --out OUT
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

STAGES = ("tables", "sources", "bessel", "line_of_sight", "spectra", "lensing")


def device_name() -> str:
    import jax

    d = jax.devices()[0]
    return f"{d.platform}: {getattr(d, 'device_kind', '')}".strip()


def time_ours(config, backend: str, runs: int) -> list[dict]:
    from boltzmann.cmb import cl_for_config

    rows = []
    for i in range(runs):
        t0 = time.perf_counter()
        res = cl_for_config(config, backend=backend)
        total = time.perf_counter() - t0
        stages = {name: float(res.timings.get(name, 0.0)) for name in STAGES[1:]}
        stages["tables"] = total - sum(stages.values())
        rows.append({"run": i + 1, "total_s": total, **{f"{k}_s": v for k, v in stages.items()},
                     "info": res.info})
        print(f"run {i + 1}: {total:.3f} s", {k: round(v, 3) for k, v in stages.items()},
              flush=True)
    return rows


def time_class(config, runs: int) -> list[float]:
    from classy import Class

    from boltzmann.class_reference import class_parameters

    pars = class_parameters(config, pk=False, cl=True)
    walls = []
    for _ in range(runs):
        m = Class()
        m.set(pars)
        t0 = time.perf_counter()
        m.compute()
        if config.output.lensing:
            m.lensed_cl(int(config.output.l_max))
        else:
            m.raw_cl(int(config.output.l_max))
        walls.append(time.perf_counter() - t0)
        m.struct_cleanup()
    return walls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/planck_cl.yaml")
    parser.add_argument("--backend", default="auto", choices=("auto", "jax", "cuda"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--class", dest="with_class", action="store_true",
                        help="also time CLASS (classy) on the same request")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from boltzmann import runtime
    from boltzmann.params import load_config

    config = load_config(args.config)
    if not getattr(config.output, "cl", None):
        parser.error(f"{args.config} asks for no C_l (output.cl): use a C_l config such as "
                     "configs/planck_cl.yaml")
    settings = runtime.Settings.from_environment()     # float64, the persistent cache, as the CLI
    runtime.configure(settings)
    backend = runtime.backend_for(args.backend, settings)
    rows = time_ours(config, backend, args.runs)
    result = {"config": args.config, "backend": args.backend, "device": device_name(),
              "host": platform.node(), "date": datetime.date.today().isoformat(),
              "l_max": int(config.output.l_max), "lensing": bool(config.output.lensing),
              "runs": rows}
    print(f"\n{args.config}, backend {args.backend} on {result['device']}, "
          f"{result['date']}: l_max = {result['l_max']}, lensing = {result['lensing']}\n")
    print("| run | total [s] | " + " | ".join(STAGES) + " |")
    print("|---|---|" + "---|" * len(STAGES))
    for r in rows:
        print(f"| {r['run']} | {r['total_s']:.2f} | "
              + " | ".join(f"{r[s + '_s']:.2f}" for s in STAGES) + " |")
    if args.with_class:
        walls = time_class(config, max(args.runs, 2))
        result["class_s"] = walls
        warm = float(np.median([r["total_s"] for r in rows[1:]])) if len(rows) > 1 else None
        print(f"\nCLASS (default precision, same request): {', '.join(f'{w:.2f}' for w in walls)}"
              f" s" + (f"; ours warm / CLASS = {warm / min(walls):.1f}" if warm else ""))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_cl.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
