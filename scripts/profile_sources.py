#!/usr/bin/env python
"""Where the CMB sources' stage spends its time, part by part, warm.

For a config's cosmology (default configs/planck_cl.yaml, its l_max and lensing): the sampling
plan (``sources.source_plan``), the modes' rows and initial states, the solve of every mode in
one call with a row of error weights per mode (``SourcePlan.launches``, what ``compute_sources``
does) and, side by side, the two groups in two calls with one row each (the photon-controlled
modes, then the rest: how the sources were solved before), the background at the samples and
the sources' program. On the CUDA backend the solve rows give the kernel's own seconds
(``Solution.info["kernel_seconds"]``) and each call's slowest mode.

    python scripts/profile_sources.py [--config configs/planck_cl.yaml] [--backend cuda]
        [--repeat 3]
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import modes, runtime
from boltzmann.cmb import sources as S
from boltzmann.cmb.lensing import input_l_max
from boltzmann.cmb.stage import config_tables
from boltzmann.params import load_config
from solver import solve


def _timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/planck_cl.yaml")
    ap.add_argument("--backend", default="auto", choices=("auto", "jax", "cuda"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    runtime.configure()
    cfg = load_config(a.config)
    cosmos, model, grid, tables = config_tables(cfg)
    out = cfg.output
    l_max = int(getattr(out, "l_max", 2500))
    lensing = bool(getattr(out, "lensing", False))
    l_in = input_l_max(l_max) if lensing else l_max
    row = jnp.asarray(tables.model_table)[0]
    prec = cfg.precision
    rtol = min(S.ClSampling().rtol, prec.rtol)
    print(f"{a.config}: l_max {l_max} (sources to {l_in}), backend {a.backend}, "
          f"device {jax.devices()[0].device_kind}")

    def solve_modes(idx, weights, rows, x0, y0, plan):
        sol = solve(model.rhs, y0[idx], plan.x, rows[idx], args=tables.model_table,
                    t0=x0[idx], rtol=rtol, atol=prec.atol, error_weights=weights,
                    backend=a.backend, max_steps=200_000)
        np.asarray(sol.status)
        return sol

    for rep in range(a.repeat):
        plan, t_plan = _timed(lambda: S.source_plan(row, cosmos, prec, model, grid, l_in,
                                                    lensing_modes="PP" in (out.cl or ())
                                                    or lensing))
        (rows, x0, y0), t_ics = _timed(lambda: _rows_and_states(model, cosmos, plan, grid, prec))
        every = np.arange(plan.k.size)
        t0 = time.perf_counter()
        one = solve_modes(every, plan.error_weight_rows(model), rows, x0, y0, plan)
        t_one = time.perf_counter() - t0
        t0 = time.perf_counter()
        groups = [solve_modes(idx, S.error_weights(model, controlled), rows, x0, y0, plan)
                  for idx, controlled in plan.groups() if idx.size]
        t_two = time.perf_counter() - t0
        bg, t_bg = _timed(lambda: S.source_background(model, row, grid, plan))
        _, t_eval = _timed(lambda: S.evaluate_sources(S.source_program(model), one.ys, plan.x,
                                                      jnp.asarray(rows), tables.model_table, bg,
                                                      plan.streaming))

        def kernel(sol):
            ks = sol.info.get("kernel_seconds")
            return "" if ks is None else f", kernel {ks:.3f} s"

        print(f"run {rep + 1}: plan {t_plan:.3f} s, rows + initial states {t_ics:.3f} s, "
              f"background {t_bg:.3f} s, sources' program {t_eval:.3f} s")
        print(f"  one solve, {plan.k.size} modes: {t_one:.3f} s{kernel(one)}, slowest "
              f"{int(np.max(one.n_accepted))} steps")
        print(f"  two solves (photon-controlled, the rest): {t_two:.3f} s; "
              + "; ".join(f"{int(np.max(g.n_accepted))} steps{kernel(g)}" for g in groups))


def _rows_and_states(model, cosmos, plan, grid, prec):
    rows = np.asarray(modes.mode_rows(model, cosmos, plan.k[None, :], grid))
    x0, y0 = modes.initial_states(model, rows, prec.k_tau_ini, prec.omega_tau_ini)
    return rows, np.asarray(x0), np.asarray(y0)


if __name__ == "__main__":
    main()
