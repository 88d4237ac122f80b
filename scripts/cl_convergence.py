#!/usr/bin/env python
"""Sampling convergence of the CMB spectra: the default ``ClSampling`` against refined ones.

    python scripts/cl_convergence.py [--config configs/planck_cl.yaml] [--l-max 2500]
        [--variants all,k,tau,ell] [--set NAME=VALUE[+...]] [--lensing] [--backend jax]
        [--json out.json] [--save DIR]

Runs the tables once, then ``boltzmann.cmb.compute_cl`` with the default sampling and with
``ClSampling().refined(...)`` — every k step halved (source modes, transfer grid, lensing modes),
every τ step halved, the ℓ sampling doubled, all three, or named fields set (``--variants
tau_step_max=6.25``; ``--set`` changes the base the same way) — and prints, per variant, the largest
|refined/default − 1| of each spectrum in the ℓ ranges of the accuracy targets (TE as
|ΔD^TE|/√(D^TT D^EE), as in the comparison with CLASS). What refining changes is the sampling
error left in the defaults; docs/cmb.md records the numbers and tests/test_cmb_convergence.py
checks them (``-m slow``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boltzmann.cmb.convergence import (RANGES, VARIANTS, convergence_table,  # noqa: E402
                                       max_changes, with_settings)
from boltzmann.cmb.sampling import ClSampling  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/planck_cl.yaml")
    parser.add_argument("--l-max", type=int, default=None, help="default: the config's l_max")
    parser.add_argument("--variants", default="all,k,tau,ell",
                        help=f"comma-separated, from {', '.join(VARIANTS)}, or a setting of "
                             "the default's fields, name=value[+name=value]")
    parser.add_argument("--set", default=None, metavar="NAME=VALUE[+NAME=VALUE]",
                        help="the base sampling's fields that differ from ClSampling()'s "
                             "(e.g. tau_step_max=25 for the former late step)")
    parser.add_argument("--lensing", action="store_true",
                        help="also the lensed spectra (unlensed to l_max + 1000)")
    parser.add_argument("--backend", default="jax")
    parser.add_argument("--json", help="write the table here as JSON")
    parser.add_argument("--save", metavar="DIR",
                        help="write each run's D_ell here (<variant>.npz: ell and the spectra)")
    args = parser.parse_args(argv)

    from boltzmann.params import load_config
    from boltzmann.runtime import use_float64

    use_float64()
    config = load_config(args.config)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    t0 = time.perf_counter()
    base = with_settings(ClSampling(), args.set) if args.set else ClSampling()
    runs = convergence_table(config, variants, l_max=args.l_max, lensing=args.lensing,
                             backend=args.backend, base=base,
                             log=lambda s: print(s, flush=True))
    table = {v: max_changes(runs["default"], runs[v]) for v in variants}
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    header = "| variant | spectrum | " + " | ".join(f"{lo}-{hi}" for lo, hi in RANGES) + " |"
    print(header)
    print("|" + "---|" * (2 + len(RANGES)))
    for v, rows in table.items():
        for name, values in rows.items():
            cells = " | ".join("—" if np.isnan(x) else f"{x:.1e}" for x in values)
            print(f"| {v} | {name} | {cells} |")
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        for v, run in runs.items():
            lensed = {f"{n}_lensed": d for n, d in run.d_ell(lensed=True).items()} \
                if run.lensed is not None else {}
            np.savez(Path(args.save) / f"{v}.npz", ell=run.ell, **run.d_ell(), **lensed)
    if args.json:
        info = {v: runs[v].info for v in runs}
        Path(args.json).write_text(json.dumps({"table": table, "info": info,
                                               "timings": {v: runs[v].timings for v in runs}},
                                              indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
