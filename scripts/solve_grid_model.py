#!/usr/bin/env python
"""What a coarser solve grid at high k would give: the steps saved and the interpolation error.

Solves a config's modes once (JAX backend), then, for each cut k_cut and stride s, keeps every
mode below k_cut and every s-th mode above it (and the last), rebuilds P_m at the dropped
wavenumbers by a cubic spline in (ln k, ln P) through the kept ones, and prints the modes and
solver steps (accepted + rejected) kept, and the largest |P_spline / P_solved − 1| over the
dropped wavenumbers and redshifts; also the transfer fields that the same spline reproduces
worst (sign-definite ones only). The model behind the precision key ``k_solve_stride``
(boltzmann/k_sampling.py; scripts/k_stride_accuracy.py measures the key itself), from a run
that solves every mode (the config's stride is set to 1).

    python scripts/solve_grid_model.py --config lcdm --cuts 0.5 1.0 --strides 2 4
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def spline_error(k, y, keep, dropped):
    """max |spline(ln k, ln |y|) / |y| − 1| at ``dropped`` from the ``keep`` points."""
    from scipy.interpolate import CubicSpline

    cs = CubicSpline(np.log(k[keep]), np.log(np.abs(y[keep])))
    return float(np.max(np.abs(np.exp(cs(np.log(k[dropped]))) / np.abs(y[dropped]) - 1)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--cuts", type=float, nargs="+", default=[0.5, 1.0],
                    help="k_cut [h/Mpc]: every mode below is kept")
    ap.add_argument("--strides", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args(argv)

    from boltzmann import pipeline
    from boltzmann.params import load_config

    cfg = load_config(args.config)
    # every mode solved: the fields and steps of the modes a stride would drop are the point
    cfg = dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, k_solve_stride=1))
    r = pipeline.run(cfg, backend="jax")
    k, h = np.asarray(r.spectra.k)[0], float(cfg.cosmology.h)
    pk = np.asarray(r.spectra.pk_m)[0]
    fields = {n: np.asarray(v)[0] for n, v in r.transfers.fields.items()}
    steps = np.asarray(r.transfers.n_accepted)[0] + np.asarray(r.transfers.n_rejected)[0]
    print(f"# {args.config}: {k.size} modes, {steps.sum():.0f} steps, z = {list(r.z)}")
    print("| k_cut [h/Mpc] | stride | modes kept | steps kept | max \\|P/P_solved − 1\\| | "
          "fields the spline misses most |")
    print("|---|---|---|---|---|---|")
    for cut in args.cuts:
        hi = np.nonzero(k / h >= cut)[0]
        for stride in args.strides:
            keep = np.unique(np.concatenate([np.arange(hi[0]), hi[::stride], [k.size - 1]]))
            dropped = np.setdiff1d(np.arange(k.size), keep)
            err = max(spline_error(k, pk[iz], keep, dropped) for iz in range(pk.shape[0]))
            worst = {}
            for name, f in fields.items():
                for y in f:
                    if np.all(np.isfinite(y)) and (np.all(y > 0) or np.all(y < 0)):
                        worst[name] = max(worst.get(name, 0.0),
                                          spline_error(k, y, keep, dropped))
            top = sorted(worst.items(), key=lambda t: -t[1])[:3]
            print(f"| {cut:g} | {stride} | {keep.size} / {k.size} | {steps[keep].sum():.0f} "
                  f"({1 - steps[keep].sum() / steps.sum():.1%} fewer) | {err:.2e} | "
                  + ", ".join(f"{n} {v:.1e}" for n, v in top) + " |", flush=True)


if __name__ == "__main__":
    main()
