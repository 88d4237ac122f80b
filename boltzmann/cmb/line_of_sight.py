"""Line-of-sight integration: transfer functions Δ_ℓ^X(k) from the sources (JAX).

For each sampled ℓ and every k of the transfer grid (boltzmann.cmb.sampling),

    Δ_ℓ^T(k) = Σ_i w_i [S_0 j_ℓ(x_i) + S_1 j_ℓ'(x_i) + S_2 j_ℓ''(x_i)],
    Δ_ℓ^E(k) = √((ℓ+2)!/(ℓ-2)!) Σ_i w_i S_E j_ℓ(x_i)/x_i²,
    Δ_ℓ^φ(k) = Σ_i w_i S_φ j_ℓ(x_i),                   x_i = k (τ0 - τ_i),

with trapezoid weights w_i on the source times τ_i (τ_i, τ0 may be traced: the samples are fixed
in ln a, so a change of cosmology moves τ_i, τ0 and the weights), and the sources carried from the source k
grid to the transfer k grid by a cubic spline in ln k (one matrix product). The Bessel values
come from boltzmann.cmb.bessel's table.

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
from .sampling import spline_matrix

__all__ = ["Transfers", "transfer_functions", "fine_sources", "trapezoid"]


@dataclass(frozen=True)
class Transfers:
    """Δ_ℓ^X(k) on the sampled multipoles ``ells`` (L,) and the transfer grid ``k`` (K,).

    T, E: (L, K) temperature and E polarisation (units of Θ per unit curvature); P: (L_P, K)
    the lensing potential at ``ells_p`` (the ℓ ≤ l_limber part), or None.
    """

    ells: np.ndarray
    k: np.ndarray
    T: jnp.ndarray
    E: jnp.ndarray
    ells_p: np.ndarray
    P: jnp.ndarray | None


def trapezoid(t):
    """Trapezoid weights on the nodes t (jnp: differentiable in t)."""
    half = 0.5 * jnp.diff(t)
    zero = jnp.zeros(1, half.dtype)
    return jnp.concatenate([half, zero]) + jnp.concatenate([zero, half])


def fine_sources(src, k_fine):
    """{name: (K_fine, S)} the sources on ``k_fine`` (cubic spline in ln k)."""
    m = jnp.asarray(spline_matrix(src.k, k_fine))
    return {name: m @ getattr(src, name) for name in ("t0", "t1", "t2", "e", "phi")}


def _one_multipole(table, il, x, w, s0, s1, s2, se, sp, with_p: bool):
    j, dj, d2j, j_x2 = bessel.values(table, il, x)
    ell = jnp.asarray(table.ells)[il].astype(jnp.float64)
    pref_e = jnp.sqrt((ell + 2.0) * (ell + 1.0) * ell * (ell - 1.0))
    t = (s0 * j + s1 * dj + s2 * d2j) @ w
    e = pref_e * ((se * j_x2) @ w)
    p = (sp * j) @ w if with_p else jnp.zeros_like(t)
    return t, e, p


def _integrate(table, ils, x, w, srcs, with_p):
    def body(il):
        return _one_multipole(table, il, x, w, srcs["t0"], srcs["t1"], srcs["t2"], srcs["e"],
                              srcs["phi"], with_p)
    return jax.lax.map(body, jnp.asarray(ils))


def transfer_functions(src, ells, k, table: bessel.BesselTable, *, l_late: int = 400,
                       late_cut_tau: float | None = None, l_limber: int = 100) -> Transfers:
    """Δ_ℓ^T, Δ_ℓ^E (and Δ_ℓ^φ for ℓ ≤ l_limber) of the sources ``src`` (a SourceGrid)."""
    ells = np.asarray(ells)
    if not np.array_equal(np.asarray(table.ells), ells):
        raise ValueError("transfer_functions: the Bessel table must hold exactly ``ells``")
    tau = jnp.asarray(src.tau)           # may be traced (the C_ℓ Jacobian): jnp throughout
    chi = src.tau0 - tau
    fine = fine_sources(src, k)
    x = jnp.asarray(k)[:, None] * chi[None, :]
    w = trapezoid(tau)
    if late_cut_tau is None:             # the samples are fixed in ln a: cut by x, not by τ
        n_cut = int(np.searchsorted(np.asarray(src.x), -np.log(31.0))) + 1
    else:
        n_cut = int(np.searchsorted(np.asarray(src.tau), late_cut_tau)) + 1
    if np.count_nonzero(ells <= l_limber) > np.count_nonzero(ells <= l_late):
        raise ValueError("l_limber must not exceed l_late")
    # three groups: every τ with φ (ℓ ≤ l_limber), every τ without it, early τ only (ℓ > l_late)
    with_p = np.nonzero(ells <= l_limber)[0]
    low = np.nonzero((ells > l_limber) & (ells <= l_late))[0]
    high = np.nonzero(ells > l_late)[0]
    T = jnp.zeros((ells.size, k.size))
    E = jnp.zeros((ells.size, k.size))
    P = None
    ells_p = ells[with_p]
    if with_p.size:
        t, e, P = _integrate(table, with_p, x, w, fine, True)
        T, E = T.at[with_p].set(t), E.at[with_p].set(e)
    if low.size:
        t, e, _ = _integrate(table, low, x, w, fine, False)
        T, E = T.at[low].set(t), E.at[low].set(e)
    if high.size:
        cut = {name: v[:, :n_cut] for name, v in fine.items()}
        w_cut = trapezoid(tau[:n_cut])
        t, e, _ = _integrate(table, high, x[:, :n_cut], w_cut, cut, False)
        T, E = T.at[high].set(t), E.at[high].set(e)
    return Transfers(ells=ells, k=np.asarray(k), T=T, E=E, ells_p=ells_p, P=P)
