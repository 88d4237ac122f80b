#!/usr/bin/env python
"""The baryons' error weight against steps and accuracy, per mode (docs/perturbations.md).

For each weight of δ_b and θ_b in the solver's error norm (precision ``baryon_error_weight``),
solves the modes of a few k of a config's cosmology on the JAX backend and prints, per k, the
steps taken (accepted + rejected) and max |δ_m / δ_m,ref − 1| at the config's redshifts, with the
reference a solve at rtol/100, atol/100 and weight 1.

    python scripts/baryon_weight_scan.py --config lcdm --weights 1 0.1 0.03 0.01 0
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

DEFAULT_K_H = (0.001, 0.01, 0.03, 0.05, 0.1, 0.3, 1.0, 3.0, 10.0)


def main(argv=None) -> int:
    from boltzmann import modes, perturbations
    from boltzmann.ensemble import stack_cosmologies
    from boltzmann.params import load_config
    from boltzmann.tables import compute_tables
    from solver import solve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--weights", type=float, nargs="+", default=[1.0, 0.1, 0.03, 0.01, 0.0])
    ap.add_argument("--k", type=float, nargs="+", default=list(DEFAULT_K_H), help="k [h/Mpc]")
    args = ap.parse_args(argv)

    cfg = load_config(args.config)
    prec = cfg.precision
    model = modes.model_for(cfg.cosmology, prec)
    grid = modes.make_grid(prec)
    cosmos = stack_cosmologies([cfg.cosmology])
    tables = compute_tables(cosmos, grid, model)
    k_h = np.asarray(args.k, np.float64)
    k = (k_h * float(cfg.cosmology.h))[None]
    x_save, _ = modes.save_times(list(cfg.output.z))
    rows = np.asarray(modes.mode_rows(model, cosmos, k, grid))
    x0, y0 = modes.initial_states(model, rows, prec.k_tau_ini, prec.omega_tau_ini)

    def run(weight, rtol, atol):
        sol = solve(model.rhs, y0, x_save, rows, args=tables.model_table, t0=x0, rtol=rtol,
                    atol=atol, error_weights=modes.error_weights(model, weight), backend="jax",
                    max_steps=100_000)
        d_m = np.asarray(perturbations.observables(model, sol.ys, x_save, rows,
                                                   tables.model_table)["d_m"])
        return d_m, np.asarray(sol.n_accepted) + np.asarray(sol.n_rejected)

    ref, _ = run(1.0, prec.rtol / 100, prec.atol / 100)
    print(f"{args.config}, rtol {prec.rtol:g}, z = {list(cfg.output.z)}; reference: weight 1 at "
          f"rtol/100. Per k [h/Mpc]: steps, then max |δ_m/δ_m,ref − 1| over the redshifts\n")
    print("| weight | " + " | ".join(f"{v:g}" for v in k_h) + " | total steps |")
    print("|---" * (len(k_h) + 2) + "|")
    for w in args.weights:
        d_m, steps = run(w, prec.rtol, prec.atol)
        err = np.max(np.abs(d_m / ref - 1.0), axis=1)
        cells = [f"{s} / {e:.1e}" for s, e in zip(steps, err)]
        print(f"| {w:g} | " + " | ".join(cells) + f" | {int(steps.sum())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
