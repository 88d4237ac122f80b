#!/usr/bin/env python
"""How far the unlensed spectra must reach for lensed ones to ℓ = 2500: our unlensed C_ℓ of
configs/planck_cl.yaml computed once to the largest ``--inputs`` value, cut at each value, lensed
to 2500, and compared with CLASS's lensed spectra lensed from input to 4500
(tests/data/class_cl_lensed_l3500.csv): the table of docs/cmb.md, Lensing.

    python scripts/lensing_input_range.py --inputs 3500 4000 4500     # ~5 min on 2 cores
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from boltzmann import runtime
from boltzmann.cmb import cl_for_config
from boltzmann.cmb.accuracy import COLUMNS, RANGES, load_reference
from boltzmann.cmb.lensing import lensed_spectra
from boltzmann.params import load_config

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, nargs="+", default=[3500, 4000, 4500])
    parser.add_argument("--backend", default="jax", choices=("jax", "cuda", "auto"))
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    config = load_config(REPO / "configs" / "planck_cl.yaml")
    top = max(args.inputs)
    unlensed = cl_for_config(config, l_max=top, spectra=("TT", "EE", "TE", "PP"), lensing=False,
                             backend=args.backend)
    ref = load_reference("lcdm")   # its lensed columns: CLASS lensing from input to 4500
    ell_ref = ref[:, 0].astype(int)
    print("| our input to | " + " | ".join(
        f"{name} {lo}–{hi}" for name in ("TT", "EE", "BB") for lo, hi in RANGES[2:]) + " |")
    print("|---|" + "---|" * (3 * len(RANGES[2:])))
    for l_in in sorted(args.inputs):
        ell = np.arange(2, l_in + 1)
        cl = {k: np.asarray(v)[:ell.size] for k, v in unlensed.cl.items()}
        lensed = lensed_spectra(ell, cl, 2500)
        cells = []
        for name in ("TT", "EE", "BB"):
            d = ell_ref * (ell_ref + 1.0) / (2 * np.pi) * np.asarray(lensed[name])[ell_ref - 2]
            dev = np.abs(d / ref[:, COLUMNS[f"{name}_lensed"]] - 1.0)
            cells += [f"{np.max(dev[(ell_ref >= lo) & (ell_ref <= hi)]):.1e}"
                      for lo, hi in RANGES[2:]]
        print(f"| {l_in} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
