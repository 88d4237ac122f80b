#!/usr/bin/env python
"""The lensing step alone, each of ``lensing.lensed_spectra``'s methods timed side by side:
CLASS's unlensed spectra (tests/data/class_cl.csv, to ℓ = 2500) splined to every ℓ and
continued as a power law to ``lensing.input_l_max(l_max)``, lensed to ``l_max`` by each method
in turn (first call with its compile and, for ``tables``, the Wigner table; then warm calls),
and each method's largest difference from the first one's.

    python scripts/profile_lensing.py [--l-max 2500] [--methods recurrence,tables] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from scipy.interpolate import CubicSpline

from boltzmann import runtime
from boltzmann.cmb.lensing import input_l_max, lensed_spectra

REPO = Path(__file__).resolve().parents[1]


def unlensed(l_in: int):
    """{TT, EE, TE, PP} C_ℓ at ℓ = 2..l_in from the CLASS file, ℓ > 2500 as ℓ^-4 tails."""
    ref = np.loadtxt(REPO / "tests" / "data" / "class_cl.csv", delimiter=",")
    ell_r = ref[:, 0]
    ell = np.arange(2, l_in + 1)
    inside = np.minimum(ell, ell_r[-1])
    tail = (inside / ell) ** 4
    f = ell * (ell + 1.0) / (2 * np.pi)
    cl = {name: CubicSpline(ell_r, ref[:, c])(inside) * tail / f
          for name, c in (("TT", 1), ("EE", 2), ("TE", 3))}
    cl["PP"] = CubicSpline(ell_r, ref[:, 4])(inside) * tail / (f * ell * (ell + 1.0))
    return ell, cl


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--l-max", type=int, default=2500)
    parser.add_argument("--methods", default="recurrence,tables")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    ell, cl = unlensed(input_l_max(args.l_max))
    print(f"lensed to ℓ = {args.l_max} from unlensed spectra to {ell[-1]}; JAX on "
          f"{jax.devices()[0].device_kind}")
    print("| method | first call [s] | warm calls [s] |")
    print("|---|---|---|")
    first = None
    for method in args.methods.split(","):
        times = []
        for _ in range(args.repeat + 1):
            t0 = time.perf_counter()
            out = jax.block_until_ready(lensed_spectra(ell, cl, args.l_max, method=method))
            times.append(time.perf_counter() - t0)
        print(f"| {method} | {times[0]:.3f} | " + ", ".join(f"{t:.4f}" for t in times[1:]) + " |")
        out = {name: np.asarray(v) for name, v in out.items()}
        if first is None:
            first = out
        else:
            for name in out:
                diff = np.max(np.abs(out[name] - first[name])) / np.max(np.abs(first[name]))
                print(f"  {name}: largest difference from {args.methods.split(',')[0]} "
                      f"{diff:.1e} of its largest value")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
