#!/usr/bin/env python
"""The line of sight's Δ^T, Δ^E loop written several ways, timed side by side on one device.

Each form computes the same rows as ``line_of_sight._window_rows`` for configs/planck_cl.yaml's
ℓ ≤ l_late group (every source time) and ℓ > l_late group (times up to z = 30):

- ``dot``: the τ sums as matrix-vector products (the integrand is materialised, then reduced),
  a cell's node values by four gathers from the table's j and j′ arrays;
- ``sum``: the τ sums as reductions of the integrand (one fused kernel can evaluate and reduce);
- ``packed``: ``sum`` with the Bessel table stored as (j_i, j'_i) pairs, so one gather of four
  contiguous numbers gives a cell's two nodes (the form the line of sight uses:
  ``BesselTable.interleaved``, gathered by ``bessel._cells``);
- ``dotpacked``: ``dot`` with that table;
- ``packed4``: ``packed`` with four multipoles per loop iteration.

Prints each form's seconds per group (warm, the best of ``--repeat``) and its largest difference
from ``dot`` relative to the group's largest |Δ|.

    python scripts/profile_los_forms.py [--backend cuda] [--repeat 3] [--forms dot,sum,packed]
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import runtime
from boltzmann.cmb import bessel
from boltzmann.cmb import line_of_sight as los
from boltzmann.cmb.bessel import BesselTable
from boltzmann.cmb.lensing import input_l_max
from boltzmann.cmb.sampling import ClSampling, transfer_wavenumbers, transfer_window
from boltzmann.cmb.sources import compute_sources
from boltzmann.cmb.stage import L_LATE, config_tables, sampled_multipoles
from boltzmann.params import load_config
from models.hermite import hermite

NAMES = ("t0", "t1", "t2", "e")


def _separate_cells(jt, djt, dx, il, x):
    """A cell's node values by four gathers from the table's two arrays (the form before
    ``bessel._cells`` interleaved the row)."""
    jrow, drow = jt[il], djt[il]
    i = jnp.clip(jnp.floor(x / dx).astype(jnp.int32), 0, jrow.shape[0] - 2)
    return x / dx - i, dx, jrow[i], jrow[i + 1], drow[i], drow[i + 1], i * dx


@functools.partial(jax.jit, static_argnames=("width", "form", "batch", "dx", "x_max"))
def _rows(jt, djt, packed, ells, ils, starts, lo, hi, k, chi, w, srcs, *, width, form, batch,
          dx, x_max):
    n_k = k.shape[0]

    def body(args):
        il, start, first, end = args
        ks = jax.lax.dynamic_slice_in_dim(k, start, width)
        s0, s1, s2, se = (jax.lax.dynamic_slice_in_dim(srcs[n], start, width) for n in NAMES)
        x = ks[:, None] * chi[None, :]
        ell = ells[il].astype(jnp.float64)
        cells = (_separate_cells(jt, djt, dx, il, x) if form in ("dot", "sum")
                 else bessel._row_cells(packed[il], dx, x))
        j, dj, d2j, j_x2 = bessel._values_at(ell, x, cells, x_max)
        pref_e = jnp.sqrt((ell + 2.0) * (ell + 1.0) * ell * (ell - 1.0))
        index = start + jnp.arange(width)
        keep = (index >= first) & (index < end)
        if form.startswith("dot"):
            t = (s0 * j + s1 * dj + s2 * d2j) @ w
            e = (se * j_x2) @ w
        else:
            t = jnp.sum((s0 * j + s1 * dj + s2 * d2j) * w, axis=1)
            e = jnp.sum(se * j_x2 * w, axis=1)
        t, e = jnp.where(keep, t, 0.0), jnp.where(keep, pref_e * e, 0.0)
        row = jnp.zeros(n_k, t.dtype)
        return (jax.lax.dynamic_update_slice_in_dim(row, t, start, 0),
                jax.lax.dynamic_update_slice_in_dim(row, e, start, 0))

    return jax.lax.map(body, (ils, starts, lo, hi), batch_size=batch if batch > 1 else None)


@functools.partial(jax.jit, static_argnames=("form", "dx", "x_max"))
def _phi(jt, djt, ils, x, w, s_phi, *, form, dx, x_max):
    """Δ^φ rows (``line_of_sight._phi_rows``) as products (``dot``) or reductions."""

    def body(il):
        t_, h, j0, j1, d0, d1, _ = _separate_cells(jt, djt, dx, il, x)
        j = jnp.where(x <= x_max, hermite(t_, h, j0, d0, j1, d1), 0.0)
        return (s_phi * j) @ w if form.startswith("dot") else jnp.sum(s_phi * j * w, axis=1)

    return jax.lax.map(body, ils)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/planck_cl.yaml")
    ap.add_argument("--backend", default="auto", choices=("auto", "jax", "cuda"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--forms", default="dot,sum,packed,dotpacked,packed4")
    ap.add_argument("--ells", type=int, default=0, help="first N multipoles of each group only")
    a = ap.parse_args()
    runtime.configure()
    cfg = load_config(a.config)
    cosmos, model, grid, tables = config_tables(cfg)
    l_max = input_l_max(2500)
    sampling = ClSampling()
    src = compute_sources(tables, cosmos, cfg.precision, model, l_max, sampling=sampling,
                          lensing_modes=True, backend=a.backend)
    ells = sampled_multipoles(l_max, sampling)
    k = transfer_wavenumbers(src.k[:src.n_cmb], src.tau0, sampling)
    table = BesselTable.cached(ells, float(k[-1] * src.tau0) + 1.0)
    packed = jnp.stack([table.j, table.dj], axis=-1).reshape(table.j.shape[0], -1)
    window = transfer_window(ells, k, src.tau, src.tau0, src.tau_rec, sampling)
    tau = jnp.asarray(src.tau)
    chi, kj = src.tau0 - tau, jnp.asarray(k)
    fine = jax.block_until_ready(los.fine_sources(src, k))
    n_cut = int(np.searchsorted(np.asarray(src.x), -np.log(31.0))) + 1
    groups = {"late": (np.nonzero(ells <= L_LATE)[0], chi, los.trapezoid(tau), fine),
              "early": (np.nonzero(ells > L_LATE)[0], chi[:n_cut], los.trapezoid(tau[:n_cut]),
                        {n: v[:, :n_cut] for n, v in fine.items()})}
    print(f"{ells.size} multipoles, {k.size} transfer k, {tau.size} times ({n_cut} to z = 30), "
          f"device {jax.devices()[0].device_kind}")
    print("| group | form | seconds (best) | all runs | max |Δ - Δ_dot| / max |Δ_dot| |")
    print("|---|---|---|---|---|")
    for gname, (idx, chi_g, w_g, srcs) in groups.items():
        if a.ells:
            idx = idx[:a.ells]
        ils, starts, width, lo, hi = los._grouped(idx, window, k.size)
        args = [jnp.asarray(v, jnp.int32) for v in (ils, starts, lo, hi)]
        ref = None
        for form in a.forms.split(","):
            base, batch = (form[:-1], int(form[-1])) if form[-1].isdigit() else (form, 1)
            call = functools.partial(
                _rows, table.j, table.dj, packed, jnp.asarray(ells), *args, kj, chi_g, w_g,
                {n: srcs[n] for n in NAMES}, width=width, form=base, batch=batch,
                dx=table.dx, x_max=table.x_max)
            times = []
            for _ in range(a.repeat + 1):
                t0 = time.perf_counter()
                out = jax.block_until_ready(call())
                times.append(time.perf_counter() - t0)
            t_rows, e_rows = (np.asarray(v) for v in out)
            if ref is None:
                ref = (t_rows, e_rows)
            diff = max(np.max(np.abs(a_ - b_)) / np.max(np.abs(b_))
                       for a_, b_ in zip((t_rows, e_rows), ref))
            print(f"| {gname} ({idx.size} ℓ, width {width}) | {form} | {min(times[1:]):.4f} | "
                  + " ".join(f"{t:.3f}" for t in times) + f" | {diff:.1e} |", flush=True)
    with_p = np.nonzero(ells <= 100)[0][:a.ells or None]
    ip = window.phi_indices(k.size)
    x = kj[ip][:, None] * chi[None, :]
    ref = None
    for form in ("dot", "sum"):
        call = functools.partial(_phi, table.j, table.dj, jnp.asarray(with_p, jnp.int32), x,
                                 los.trapezoid(tau), fine["phi"][ip], form=form, dx=table.dx,
                                 x_max=table.x_max)
        times = []
        for _ in range(a.repeat + 1):
            t0 = time.perf_counter()
            out = np.asarray(jax.block_until_ready(call()))
            times.append(time.perf_counter() - t0)
        ref = out if ref is None else ref
        print(f"| phi ({with_p.size} ℓ, {ip.size} k) | {form} | {min(times[1:]):.4f} | "
              + " ".join(f"{t:.3f}" for t in times)
              + f" | {np.max(np.abs(out - ref)) / np.max(np.abs(ref)):.1e} |", flush=True)


if __name__ == "__main__":
    main()
