"""Line-of-sight integration: transfer functions Δ_ℓ^X(k) from the sources (JAX).

For each sampled ℓ and the k of its window of the transfer grid (boltzmann.cmb.sampling:
``transfer_window``; Δ_ℓ is zero outside it),

    Δ_ℓ^T(k) = Σ_i w_i [S_0 j_ℓ(x_i) + S_1 j_ℓ'(x_i) + S_2 j_ℓ''(x_i)],
    Δ_ℓ^E(k) = √((ℓ+2)!/(ℓ-2)!) Σ_i w_i S_E j_ℓ(x_i)/x_i²,
    Δ_ℓ^φ(k) = Σ_i w_i S_φ j_ℓ(x_i),                   x_i = k (τ0 - τ_i),

with trapezoid weights w_i on the source times τ_i (τ_i, τ0 may be traced: the samples are fixed
in ln a, so a change of cosmology moves τ_i, τ0 and the weights), and the sources carried from
the source k grid to the transfer k grid by a quintic spline in ln k (a banded operator,
``k_spline``). The Bessel values come from boltzmann.cmb.bessel's table. The window bounds the
cost: a multipole
costs its window's width (a third of the grid at the default sampling) times the source times;
Δ^φ, smooth in k, is computed on every ``phi_stride``-th wavenumber only.

Late sources (τ > ``late_cut_tau``, default the conformal time at z = 30: late ISW,
reionisation) are included for ℓ ≤ ``l_late`` only; at higher ℓ they contribute below 1e-4
(their k range projects to low ℓ), as in CLASS (``transfer_neglect_late_source``). The lensing
potential lives at late times and is integrated over all τ for ℓ ≤ ``l_limber``; above it
boltzmann.cmb.spectra uses Limber's approximation.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import bessel
from .k_spline import BandedSpline
from .sampling import ClSampling, TransferWindow

__all__ = ["Transfers", "transfer_functions", "fine_sources", "trapezoid", "multipole_batch"]

def multipole_batch(width: int, n_tau: int, copies: int = 1) -> int:
    """Multipoles per iteration of the line of sight's loops when the caller gives none: 1 on
    every backend (``width``, ``n_tau``, ``copies``: the slab one multipole works on, kept for
    callers that size a batch by it).

    Why not more on a GPU: several multipoles per ``lax.map`` iteration was meant to spend fewer
    kernel launches, but on an H200 (configs/planck_cl.yaml, 251 multipoles) eight per iteration
    took the line of sight from 0.29 s to 0.59 s warm (docs/benchmarks.md, the H200 CMB rows):
    the iterations' arithmetic, not their launches, bounds it there. An explicit ``batch`` still
    takes several (the transfers are the same for any batch)."""
    del width, n_tau, copies
    return 1


@dataclass(frozen=True)
class Transfers:
    """Δ_ℓ^X(k) on the sampled multipoles ``ells`` (L,) and the transfer grid ``k`` (K,).

    T, E: (L, K) temperature and E polarisation (units of Θ per unit curvature), zero outside
    each multipole's window; P: (L_P, K_P) the lensing potential at ``ells_p`` (the ℓ ≤ l_limber
    part) on the wavenumbers ``k_p`` (a subset of ``k``), or None.
    """

    ells: np.ndarray
    k: np.ndarray
    T: jnp.ndarray
    E: jnp.ndarray
    ells_p: np.ndarray
    P: jnp.ndarray | None
    k_p: np.ndarray | None = None


def trapezoid(t):
    """Trapezoid weights on the nodes t (jnp: differentiable in t)."""
    half = 0.5 * jnp.diff(t)
    zero = jnp.zeros(1, half.dtype)
    return jnp.concatenate([half, zero]) + jnp.concatenate([zero, half])


def fine_sources(src, k_fine, degree: int = ClSampling.k_spline_degree):
    """{name: (K_fine, S)} the sources on ``k_fine``: the spline of ``degree`` in ln k through
    the source modes (``k_spline.BandedSpline``, the banded form of ``spline_matrix``)."""
    spline = BandedSpline.build(src.k, k_fine, degree)
    return {name: spline.apply(getattr(src, name)) for name in ("t0", "t1", "t2", "e", "phi")}


def _window_rows(table, ils, starts, width, lo, hi, k, chi, w, srcs, batch: int = 1):
    """Δ^T, Δ^E (len(ils), K) of the multipoles ``ils``, each integrated over the ``width``
    transfer wavenumbers from its ``starts`` entry and kept on its window [lo, hi) (zero
    elsewhere in its row); ``batch`` multipoles per iteration."""
    n_k = k.shape[0]
    names = ("t0", "t1", "t2", "e")

    def body(args):
        il, start, first, end = args
        ks = jax.lax.dynamic_slice_in_dim(k, start, width)
        s0, s1, s2, se = (jax.lax.dynamic_slice_in_dim(srcs[n], start, width) for n in names)
        j, dj, d2j, j_x2 = bessel.values(table, il, ks[:, None] * chi[None, :])
        ell = jnp.asarray(table.ells)[il].astype(jnp.float64)
        pref_e = jnp.sqrt((ell + 2.0) * (ell + 1.0) * ell * (ell - 1.0))
        index = start + jnp.arange(width)
        keep = (index >= first) & (index < end)
        t = jnp.where(keep, (s0 * j + s1 * dj + s2 * d2j) @ w, 0.0)
        e = jnp.where(keep, pref_e * ((se * j_x2) @ w), 0.0)
        row = jnp.zeros(n_k, t.dtype)
        return (jax.lax.dynamic_update_slice_in_dim(row, t, start, 0),
                jax.lax.dynamic_update_slice_in_dim(row, e, start, 0))

    return jax.lax.map(body, tuple(jnp.asarray(a, jnp.int32) for a in (ils, starts, lo, hi)),
                       batch_size=batch if batch > 1 else None)


def _phi_rows(table, ils, x, w, s_phi, batch: int = 1):
    """Δ^φ (len(ils), K_φ) on the lensing potential's k grid (x: (K_φ, S)); ``batch``
    multipoles per iteration."""
    return jax.lax.map(lambda il: (s_phi * bessel.j_only(table, il, x)) @ w, jnp.asarray(ils),
                       batch_size=batch if batch > 1 else None)


def _grouped(idx, window, n_k):
    """(multipole indices, starts, width, lo, hi) of one group: every multipole is computed over
    the group's widest window (one shape for ``lax.map``), moved left where it would run past
    the grid's end, and kept on its own window [lo, hi)."""
    lo, hi = window.lo[idx], window.hi[idx]
    width = int(np.max(hi - lo))
    return idx, np.minimum(lo, n_k - width), width, lo, hi


def transfer_functions(src, ells, k, table: bessel.BesselTable, *, l_late: int = 400,
                       late_cut_tau: float | None = None, l_limber: int = 100,
                       window: TransferWindow | None = None,
                       spline_degree: int = ClSampling.k_spline_degree,
                       batch: int | None = None) -> Transfers:
    """Δ_ℓ^T, Δ_ℓ^E (and Δ_ℓ^φ for ℓ ≤ l_limber) of the sources ``src`` (a SourceGrid), each
    multipole over its ``window`` of the k grid (sampling.transfer_window; None: all of it);
    the sources reach the k grid by the spline of ``spline_degree`` in ln k. ``batch``:
    multipoles per loop iteration (None: ``multipole_batch``)."""
    ells = np.asarray(ells)
    if not np.array_equal(np.asarray(table.ells), ells):
        raise ValueError("transfer_functions: the Bessel table must hold exactly ``ells``")
    window = TransferWindow.whole(ells.size, k.size) if window is None else window
    if window.lo.shape != ells.shape:
        raise ValueError("transfer_functions: the window must have one entry per multipole")
    tau = jnp.asarray(src.tau)           # may be traced (the C_ℓ Jacobian): jnp throughout
    chi = src.tau0 - tau
    fine = fine_sources(src, k, spline_degree)
    kj = jnp.asarray(k)
    w = trapezoid(tau)
    if late_cut_tau is None:             # the samples are fixed in ln a: cut by x, not by τ
        n_cut = int(np.searchsorted(np.asarray(src.x), -np.log(31.0))) + 1
    else:
        n_cut = int(np.searchsorted(np.asarray(src.tau), late_cut_tau)) + 1
    if np.count_nonzero(ells <= l_limber) > np.count_nonzero(ells <= l_late):
        raise ValueError("l_limber must not exceed l_late")
    # T and E: every τ up to l_late, early τ only above it; φ: every τ, ℓ ≤ l_limber
    T = jnp.zeros((ells.size, k.size))
    E = jnp.zeros((ells.size, k.size))
    late = np.nonzero(ells <= l_late)[0]
    early = np.nonzero(ells > l_late)[0]

    def per_iteration(width, n_tau):
        return batch if batch is not None else multipole_batch(width, n_tau)

    if late.size:
        group = _grouped(late, window, k.size)
        t, e = _window_rows(table, *group, kj, chi, w, fine,
                            batch=per_iteration(group[2], tau.shape[0]))
        T, E = T.at[late].set(t), E.at[late].set(e)
    if early.size:
        cut = {name: v[:, :n_cut] for name, v in fine.items()}
        group = _grouped(early, window, k.size)
        t, e = _window_rows(table, *group, kj, chi[:n_cut], trapezoid(tau[:n_cut]), cut,
                            batch=per_iteration(group[2], n_cut))
        T, E = T.at[early].set(t), E.at[early].set(e)
    with_p = np.nonzero(ells <= l_limber)[0]
    ip = window.phi_indices(k.size)
    P = None
    if with_p.size:
        P = _phi_rows(table, with_p, kj[ip][:, None] * chi[None, :], w, fine["phi"][ip],
                      batch=per_iteration(ip.size, tau.shape[0]))
    return Transfers(ells=ells, k=np.asarray(k), T=T, E=E, ells_p=ells[with_p], P=P,
                     k_p=np.asarray(k)[ip])
