#!/usr/bin/env python
"""Our lensed C_ℓ (l_max = 2500) against a CLASS reference of tests/data: the accuracy table of
docs/cmb.md for one case (``boltzmann.cmb.accuracy.REFERENCES``: lcdm, heavy_nu, desi_w0wa).

    python scripts/cl_vs_class.py --case heavy_nu [--backend jax] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from boltzmann import runtime
from boltzmann.cmb import cl_for_config
from boltzmann.cmb.accuracy import RANGES, REFERENCES, deviations, load_reference
from boltzmann.params import load_config

REPO = Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(REFERENCES), default="lcdm")
    parser.add_argument("--backend", default="jax", choices=("jax", "cuda", "auto"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    config = load_config(REPO / REFERENCES[args.case][0])
    t0 = time.perf_counter()
    res = cl_for_config(config, l_max=2500, spectra=("TT", "EE", "TE", "BB", "PP"),
                        lensing=True, backend=args.backend)
    wall = time.perf_counter() - t0
    dev = deviations(res, load_reference(args.case))
    print(f"{args.case} ({REFERENCES[args.case][0]}), {wall:.0f} s, solver failures "
          f"{res.info['solver_failures']}\n")
    print("| spectrum | " + " | ".join(f"{lo}–{hi}" for lo, hi in RANGES) + " |")
    print("|---|" + "---|" * len(RANGES))
    names = sorted({name for name, _ in dev}, key=lambda n: (n.endswith("lensed"), n))
    for name in names:
        cells = [f"{dev[(name, r)]:.1e}" if (name, r) in dev else "—" for r in RANGES]
        print(f"| {name.replace('_', ' ')} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"cl_vs_class_{args.case}.json").write_text(json.dumps(
            {"case": args.case, "wall_s": wall, "info": res.info,
             "deviations": {f"{n} {lo}-{hi}": v for (n, (lo, hi)), v in dev.items()}}, indent=1))


if __name__ == "__main__":
    main()
