#!/usr/bin/env python
"""The lensing step alone, each of ``lensing.lensed_spectra``'s methods timed side by side:
CLASS's unlensed spectra (tests/data/class_cl.csv, to ℓ = 2500) splined to every ℓ and
continued as a power law to ``lensing.input_l_max(l_max)``, lensed to ``l_max`` by each method
in turn (first call with its compile and, for ``tables``, the Wigner table; then warm calls),
and each method's largest difference from the first one's. ``--directions M`` also times the
lensed spectra with M tangent directions of the unlensed ones (``jax.jvp`` under ``jax.vmap``,
jitted, the Wigner table an argument of the program as ``ClFunction`` passes it): the lensing
step's share of a C_ℓ Jacobian, and its memory.

    python scripts/profile_lensing.py [--l-max 2500] [--methods recurrence,tables] [--repeat 3]
        [--directions 2]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from scipy.interpolate import CubicSpline

from boltzmann import runtime
from boltzmann.cmb.lensing import (WignerTables, default_n_beta, input_l_max,
                                   lensed_spectra)

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


def timed_row(method: str, call, repeat: int) -> dict:
    """Print ``method``'s row (first call, then ``repeat`` warm calls, each waited for) and
    return the last call's {name: array}."""
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        out = jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    print(f"| {method} | {times[0]:.3f} | " + ", ".join(f"{t:.4f}" for t in times[1:]) + " |")
    return {name: np.asarray(v) for name, v in out.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--l-max", type=int, default=2500)
    parser.add_argument("--methods", default="recurrence,tables")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--directions", type=int, default=0,
                        help="also time value and jvp in this many directions (0: not)")
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    ell, cl = unlensed(input_l_max(args.l_max))
    print(f"lensed to ℓ = {args.l_max} from unlensed spectra to {ell[-1]}; JAX on "
          f"{jax.devices()[0].device_kind}")
    print("| method | first call [s] | warm calls [s] |")
    print("|---|---|---|")
    first = None
    for method in args.methods.split(","):
        out = timed_row(method, lambda: lensed_spectra(ell, cl, args.l_max, method=method),
                        args.repeat)
        if first is None:
            first = out
        else:
            for name in out:
                diff = np.max(np.abs(out[name] - first[name])) / np.max(np.abs(first[name]))
                print(f"  {name}: largest difference from {args.methods.split(',')[0]} "
                      f"{diff:.1e} of its largest value")
    if args.directions:
        jvp_rows(ell, cl, args.l_max, args.methods.split(","), args.directions, args.repeat)
    return 0


def jvp_rows(ell, cl, l_max: int, methods, m: int, repeat: int) -> None:
    """Value and m tangents of the lensed spectra per method, first and warm, and the largest
    tangent difference from the first method's."""
    import jax.numpy as jnp

    names = ("TT", "EE", "TE", "PP")
    base = tuple(jnp.asarray(cl[n]) for n in names)
    rng = np.random.default_rng(0)
    tangents = tuple(jnp.asarray(v * rng.uniform(0.5, 1.5, (m, v.size))) for v in base)
    print(f"\nvalue and {m} tangent directions (jit(vmap(jvp))):")
    print("| method | first call [s] | warm calls [s] |")
    print("|---|---|---|")
    first = None
    for method in methods:
        wigner = WignerTables.cached(int(ell[-1]), default_n_beta(int(ell[-1]))).d \
            if method == "tables" else None

        def f(values, w):
            return lensed_spectra(ell, dict(zip(names, values)), l_max, method="recurrence",
                                  wigner=w)

        prog = jax.jit(lambda v, t, w: jax.vmap(lambda d: jax.jvp(lambda u: f(u, w), (v,),
                                                                   (d,))[1])(t))
        out = timed_row(method, lambda: prog(base, tangents, wigner), repeat)
        if first is None:
            first = out
        else:
            diff = max(float(np.max(np.abs(out[n] - first[n])) / np.max(np.abs(first[n])))
                       for n in out)
            print(f"  tangents: largest difference from {methods[0]} {diff:.1e} of their "
                  "largest value")


if __name__ == "__main__":
    raise SystemExit(main())
