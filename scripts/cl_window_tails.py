#!/usr/bin/env python
"""What the line of sight's k windows leave out: configs/planck_cl.yaml's transfer functions on
the whole transfer k grid (input to ``lensing.input_l_max(2500)``), then, per ℓ group, the
largest fraction of the C_ℓ^TT and C_ℓ^EE k integrals above k = ℓ/χ_rec + extra for several
extras (``ClSampling.k_window_extra``), and what computing Δ^φ on every n-th wavenumber only
(``ClSampling.phi_k_stride``) changes C_ℓ^φφ by.

    python scripts/cl_window_tails.py [--extras 0.1,0.15,0.2,0.25] [--strides 2,3,4,8]
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from boltzmann import modes, runtime
from boltzmann.cmb.bessel import BesselTable
from boltzmann.cmb.lensing import input_l_max
from boltzmann.cmb.line_of_sight import transfer_functions
from boltzmann.cmb.stage import sampled_multipoles  # noqa: E402
from boltzmann.cmb.sampling import (ClSampling, trapezoid_weights,
                                    transfer_wavenumbers, transfer_window)
from boltzmann.cmb.sources import compute_sources
from boltzmann.ensemble import stack_cosmologies
from boltzmann.params import load_config
from boltzmann.spectra import primordial_curvature_power
from boltzmann.tables import compute_tables

REPO = Path(__file__).resolve().parents[1]
GROUPS = ((2, 30), (31, 100), (101, 400), (401, 2500), (2501, 4000))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "planck_cl.yaml"))
    parser.add_argument("--extras", default="0.1,0.15,0.2,0.25")
    parser.add_argument("--strides", default="2,3,4,8")
    args = parser.parse_args(argv)
    runtime.configure(runtime.Settings.from_environment())
    cfg = load_config(args.config)
    cosmos = stack_cosmologies([cfg.cosmology])
    model = modes.model_for(cfg.cosmology, cfg.precision)
    tables = compute_tables(cosmos, modes.make_grid(cfg.precision), model)
    l_max = input_l_max(2500)
    s = dataclasses.replace(ClSampling(), k_window_extra=None, phi_k_stride=1)
    src = compute_sources(tables, cosmos, cfg.precision, model, l_max, sampling=s,
                          lensing_modes=True, backend="jax")
    ells = sampled_multipoles(l_max, s)
    k = transfer_wavenumbers(src.k[:src.n_cmb], src.tau0, s)
    table = BesselTable.cached(ells, float(k[-1] * src.tau0) + 1.0)
    tr = transfer_functions(src, ells, k, table, l_late=400, l_limber=100)
    T, E, P = (np.asarray(a) for a in (tr.T, tr.E, tr.P))
    A_s, n_s, k_pivot = (float(np.asarray(getattr(cosmos, n))[0])
                         for n in ("A_s", "n_s", "k_pivot"))
    power = np.asarray(primordial_curvature_power(jnp.asarray(k), A_s, n_s, k_pivot))
    w = trapezoid_weights(np.log(k)) * power
    tt, ee = (T * T) @ w, (E * E) @ w
    print(f"{ells.size} multipoles to {l_max}, {k.size} transfer k; fraction of each k integral "
          f"above ℓ/χ_rec + extra (χ_rec = {src.tau0 - src.tau_rec:.1f} Mpc), largest per ℓ group")
    print("| extra [1/Mpc] | TT " + " / ".join(f"{a}–{b}" for a, b in GROUPS)
          + " | EE (all ℓ) | widest window |")
    print("|---|---|---|---|")
    for extra in (float(v) for v in args.extras.split(",")):
        win = transfer_window(ells, k, src.tau, src.tau0, src.tau_rec,
                              dataclasses.replace(s, k_window_extra=extra))
        above = np.arange(k.size)[None, :] >= win.hi[:, None]
        f_tt = np.abs(((T * T) * above) @ w) / tt
        f_ee = np.abs(((E * E) * above) @ w) / ee
        groups = " / ".join(f"{f_tt[(ells >= a) & (ells <= b)].max():.1e}" for a, b in GROUPS)
        print(f"| {extra} | {groups} | {f_ee.max():.1e} | {int(np.max(win.hi - win.lo))} |")
    pp = (P * P) @ w
    print("\n| Δ^φ stride | wavenumbers | max |ΔC_ℓ^φφ / C_ℓ^φφ| (ℓ ≤ 100) |\n|---|---|---|")
    for stride in (int(v) for v in args.strides.split(",")):
        idx = np.unique(np.r_[np.arange(0, k.size, stride), k.size - 1])
        w_s = trapezoid_weights(np.log(k[idx])) * power[idx]
        print(f"| {stride} | {idx.size} | {np.abs((P[:, idx] ** 2) @ w_s / pp - 1).max():.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
