#!/usr/bin/env python
"""Where the line of sight's time goes: configs/planck_cl.yaml's sources for a lensed run to
ℓ = 2500 (unlensed input to ``lensing.input_l_max(2500)``), then each part of
``line_of_sight.transfer_functions`` timed alone, waiting for its arrays: the spline of the sources
onto the transfer k grid, Δ^T and Δ^E of the ℓ ≤ l_late group (every τ) and of the ℓ > l_late
group (τ up to z = 30), each over its k window, and Δ^φ for ℓ ≤ l_limber on its coarser k grid,
each as the line of sight's compiled program with the other parts left out, then all of it.
The first run includes the compiles.

    python scripts/profile_line_of_sight.py [--backend jax] [--repeat 2] [--k-window-extra 0.25]
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import modes, runtime
from boltzmann.cmb import line_of_sight as los
from boltzmann.cmb.bessel import BesselTable
from boltzmann.cmb.lensing import input_l_max
from boltzmann.cmb.stage import sampled_multipoles  # noqa: E402
from boltzmann.cmb.sampling import (ClSampling, transfer_wavenumbers,
                                    transfer_window)
from boltzmann.cmb.sources import compute_sources
from boltzmann.ensemble import stack_cosmologies
from boltzmann.params import load_config
from boltzmann.tables import compute_tables

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="jax", choices=("jax", "cuda", "auto"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--l-late", type=int, default=400)
    parser.add_argument("--l-limber", type=int, default=100)
    parser.add_argument("--k-window-extra", type=float, default=ClSampling().k_window_extra,
                        help="ClSampling.k_window_extra [1/Mpc]; 0: no window")
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    cfg = load_config(REPO / "configs" / "planck_cl.yaml")
    cosmos = stack_cosmologies([cfg.cosmology])
    model = modes.model_for(cfg.cosmology, cfg.precision)
    tables = compute_tables(cosmos, modes.make_grid(cfg.precision), model)
    l_max = input_l_max(2500)
    sampling = dataclasses.replace(ClSampling(), k_window_extra=args.k_window_extra or None)
    src = compute_sources(tables, cosmos, cfg.precision, model, l_max, sampling=sampling,
                          lensing_modes=True, backend=args.backend)
    ells = sampled_multipoles(l_max, sampling)
    k = transfer_wavenumbers(src.k[:src.n_cmb], src.tau0, sampling)
    table = BesselTable.cached(ells, float(k[-1] * src.tau0) + 1.0)
    window = transfer_window(ells, k, src.tau, src.tau0, src.tau_rec, sampling)
    tau = jnp.asarray(src.tau)
    n_cut = int(np.searchsorted(np.asarray(src.x), -np.log(31.0))) + 1
    plan = los.plan_of(ells, k, table, tau.size, n_cut, l_late=args.l_late,
                       l_limber=args.l_limber, window=window, batch=None)
    # each part is transfer_functions' compiled program with the other parts left out
    parts = {"late": dataclasses.replace(plan, early=None, with_p=()),
             "early": dataclasses.replace(plan, late=None, with_p=()),
             "phi": dataclasses.replace(plan, late=None, early=None),
             "all": plan}
    print(f"{ells.size} multipoles to {l_max}, {k.size} transfer k (widest window "
          f"{int(np.max(window.hi - window.lo))}, Δ^φ on {len(plan.ip)}), {tau.size} times "
          f"({n_cut} before z = 30)")
    print("| run | sources onto k | ℓ ≤ l_late: T, E (every τ) | ℓ > l_late: T, E (τ to z = 30) "
          "| ℓ ≤ l_limber: φ | all (one program) |")
    print("|---|---|---|---|---|---|")
    kj, tau0 = jnp.asarray(k), jnp.asarray(src.tau0, jnp.float64)
    for run in range(args.repeat):
        t0 = time.perf_counter()
        fine = jax.block_until_ready(los.fine_sources(src, k))
        seconds = [time.perf_counter() - t0]
        for name, part in parts.items():
            t0 = time.perf_counter()
            jax.block_until_ready(los._integrate(part, table.j, table.dj, kj, tau, tau0, fine))
            seconds.append(time.perf_counter() - t0)
        n_late, n_early = len(plan.late[0]), len(plan.early[0])
        print(f"| {run + 1} | {seconds[0]:.3f} s | {seconds[1]:.3f} s ({n_late} ℓ) | "
              f"{seconds[2]:.3f} s ({n_early} ℓ) | {seconds[3]:.3f} s ({len(plan.with_p)} ℓ) | "
              f"{seconds[4]:.3f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
