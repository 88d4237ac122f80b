#!/usr/bin/env python
"""How far the absolute tolerance bounds the CMB sources of the largest-scale modes.

Solves a few CMB modes (photons in error control, as the low-k group is) at the config's
tolerances and at tighter absolute ones, and prints each mode's largest |S_0 - S_0(ref)| over its
largest |S_0|, against a reference at rtol 1e-9, atol 1e-18, with the accepted steps: the figures
of docs/cmb.md, Accuracy (the modes far outside the horizon at recombination).

    python scripts/cmb_atol_low_k.py --config configs/planck_cl.yaml
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/planck_cl.yaml")
    parser.add_argument("--k", type=float, nargs="+",
                        default=[7.05e-6, 2.41e-5, 1e-4, 1e-3, 0.015], help="modes [1/Mpc]")
    args = parser.parse_args(argv)

    import jax.numpy as jnp

    from boltzmann import modes, runtime
    from boltzmann.cmb.sampling import ClSampling
    from boltzmann.cmb.sources import (error_weights, evaluate_sources, source_background,
                                       source_plan, source_program)
    from boltzmann.cmb.stage import config_tables
    from boltzmann.params import load_config
    from solver import solve

    runtime.use_float64()
    c = load_config(args.config)
    cosmos, model, grid, tables = config_tables(c)
    row = jnp.asarray(tables.model_table)[0]
    plan = source_plan(row, cosmos, c.precision, model, grid, 500)
    k = np.asarray(args.k, np.float64)
    rows = np.asarray(modes.mode_rows(model, cosmos, k[None, :], grid))
    x0, y0 = modes.initial_states(model, rows, c.precision.k_tau_ini, c.precision.omega_tau_ini)
    bg = source_background(model, row, grid, plan)
    rtol0 = min(ClSampling().rtol, c.precision.rtol)
    cases = [(rtol0, c.precision.atol), (rtol0, 1e-14), (rtol0, 1e-16), (1e-9, 1e-18)]
    s0, steps = {}, {}
    for rtol, atol in cases:
        sol = solve(model.rhs, y0, plan.x, rows, args=tables.model_table, t0=x0, rtol=rtol,
                    atol=atol, error_weights=error_weights(model, True), backend="jax",
                    max_steps=200_000)
        s0[(rtol, atol)] = np.asarray(evaluate_sources(
            source_program(model), sol.ys, plan.x, jnp.asarray(rows), tables.model_table, bg,
            np.zeros((k.size, plan.x.size), bool))[0])
        steps[(rtol, atol)] = np.asarray(sol.n_accepted)
    ref = s0[cases[-1]]
    print(f"{args.config}: S_0 error against rtol 1e-9, atol 1e-18 (fraction of the mode's "
          "largest |S_0|), accepted steps\n")
    print("| rtol, atol | " + " | ".join(f"k = {v:.3g}" for v in k) + " |")
    print("|---|" + "---|" * k.size)
    for case in cases[:-1]:
        err = np.max(np.abs(s0[case] - ref), axis=1) / np.max(np.abs(ref), axis=1)
        print(f"| {case[0]:g}, {case[1]:g} | "
              + " | ".join(f"{e:.1e} ({n})" for e, n in zip(err, steps[case])) + " |")


if __name__ == "__main__":
    main()
