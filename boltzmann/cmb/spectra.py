"""Angular power spectra from the transfer functions: C_ℓ^{XY} = 4π ∫ dk/k P_R(k) Δ_ℓ^X Δ_ℓ^Y.

The k integral is the trapezoid rule in ln k on the transfer grid; the sampled ℓ are carried to
every ℓ from 2 to l_max by a quintic spline of ℓ(ℓ+1)C_ℓ in ℓ, apart on each side of a change
of method (``ell_spline_matrix``; one fixed matrix, so the whole chain stays a JAX function of
the sources). TT, EE, TE are in μK² (times T_cmb²); PP
is the dimensionless lensing-potential spectrum C_ℓ^φφ.

Above ``l_limber`` C_ℓ^φφ is Limber's approximation of the same integral,

    C_ℓ^φφ = 2π² ∫ dτ P_R(k) S_φ(k, τ)² / (k³ χ²),   k = (ℓ + ½)/χ,  χ = τ0 - τ,

whose relative error is O(1/ℓ²); S_φ(k, τ) at k = (ℓ + ½)/χ is the cubic spline in ln k of the
source grid (0 beyond its largest k — the caveat in docs/cmb.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from scipy.interpolate import CubicSpline, make_interp_spline

from solver.caches import Cache

from ..spectra import primordial_curvature_power
from .line_of_sight import trapezoid
from .sampling import ClSampling, trapezoid_weights

__all__ = ["ClSpectra", "cl_from_transfers", "ell_spline_matrix", "limber_pp", "limber_cells",
           "D_ELL_NAMES"]

#: ``limber_cells``' spline-derivative matrices per source grid (they depend on no cosmology)
_SPLINE_DERIVATIVES = Cache("boltzmann.cmb.limber", maxsize=4)

#: spectra of a ClSpectra, in the column order of cl.csv
D_ELL_NAMES = ("TT", "EE", "TE", "BB", "PP")


@dataclass(frozen=True)
class ClSpectra:
    """CMB angular power spectra of one cosmology at every ℓ = 2..l_max.

    ell: (L,) integers; cl: {name: (L,)} unlensed C_ℓ — TT, EE, TE, BB in μK² (BB is zero
    without lensing: scalar modes make no B), PP = C_ℓ^φφ (dimensionless); lensed: the lensed
    TT, EE, TE, BB [μK²] when computed, else None; T_cmb [K]; timings: seconds per step;
    info: sample counts (k modes, τ samples, sampled ℓ) and solver statistics.
    """

    ell: np.ndarray
    cl: dict
    lensed: dict | None = None
    T_cmb: float = 2.7255
    timings: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def d_ell(self, lensed: bool = False) -> dict:
        """{name: (L,)} D_ℓ = ℓ(ℓ+1)C_ℓ/2π [μK²] (TT, EE, TE, BB) and [ℓ(ℓ+1)]² C_ℓ^φφ/2π (PP)."""
        ell = self.ell.astype(np.float64)
        f = ell * (ell + 1.0) / (2.0 * math.pi)
        src = self.lensed if lensed else self.cl
        if src is None:
            raise ValueError("no lensed spectra were computed (output.lensing: false)")
        out = {name: f * np.asarray(v) for name, v in src.items() if name != "PP"}
        if "PP" in src:
            out["PP"] = f * ell * (ell + 1.0) * np.asarray(src["PP"])
        return out


def ell_spline_matrix(ells_sampled: np.ndarray, l_max: int, breaks=(),
                      degree: int = ClSampling.l_spline_degree) -> np.ndarray:
    """(l_max - 1, L_s) matrix: values at ℓ = 2..l_max of the interpolating spline of ``degree``
    through the samples, taken apart on each side of every ℓ in ``breaks`` (the sides meet
    between b and b + 1, both sampled: ``sampling.multipoles(..., breaks)``).

    Why apart: where the computation changes method (the late sources dropped above ℓ = 400,
    Limber's C_ℓ^φφ above ℓ = 100) C_ℓ has a step of ~1e-4, and one spline across it spreads
    that step over the neighbouring multipoles — 2e-4 in TT near ℓ = 400 and PP near ℓ = 100.
    Why degree 5: the cubic's error, ∝ (ℓ step)^4, was 1.6–2e-4 in EE at ℓ ≥ 30 (docs/cmb.md,
    Convergence); twice the samples move the quintic by 6e-5 at most."""
    ells_sampled = np.asarray(ells_sampled)
    if ells_sampled.size < 4:
        raise ValueError("need at least 4 sampled multipoles")
    ells = np.arange(2, l_max + 1)
    edges = [b for b in sorted(breaks) if ells_sampled[0] <= b < ells_sampled[-1]]
    for b in edges:
        if not {b, b + 1} <= set(ells_sampled.tolist()):
            raise ValueError(f"ell_spline_matrix: the break at ℓ = {b} needs ℓ = {b} and "
                             f"{b + 1} sampled (sampling.multipoles(..., breaks))")
    out = np.zeros((ells.size, ells_sampled.size))
    lo = -np.inf
    for hi in [*edges, np.inf]:
        cols = np.nonzero((ells_sampled > lo) & (ells_sampled <= hi))[0]
        rows = np.nonzero((ells > lo) & (ells <= hi))[0]
        x = ells_sampled[cols].astype(float)
        if cols.size == 1:
            out[rows, cols[0]] = 1.0
        else:
            k = min(int(degree), cols.size - 1)
            if k > 1 and k % 2 == 0:   # an even degree's knots fall between the samples
                k -= 1
            out[np.ix_(rows, cols)] = make_interp_spline(x, np.eye(cols.size), k=k,
                                                         axis=0)(ells[rows])
        lo = hi
    return out


def _lnk_weights(k):
    return jnp.asarray(trapezoid_weights(np.log(np.asarray(k))))


def cl_from_transfers(tr, A_s, n_s, k_pivot, *, T_cmb) -> dict:
    """{TT, EE, TE: (L_s,) [μK²], PP: (L_P,)} on the sampled ℓ of ``tr`` (line_of_sight.Transfers)."""
    k_p = tr.k if tr.k_p is None else tr.k_p
    return _k_integrals(tr.T, tr.E, tr.P, jnp.asarray(tr.k), _lnk_weights(tr.k),
                        jnp.asarray(k_p), _lnk_weights(k_p), A_s, n_s, k_pivot, T_cmb)


@jax.jit
def _k_integrals(T, E, P, k, w_k, k_p, w_p, A_s, n_s, k_pivot, T_cmb):
    """``cl_from_transfers``' sums, one compiled program (the trapezoid weights in ln k
    ``w_k``, ``w_p`` computed on the host)."""
    def weight(k, w):
        return 4.0 * math.pi * w * primordial_curvature_power(k, A_s, n_s, k_pivot)

    w = weight(k, w_k)
    t2 = (T_cmb * 1e6) ** 2
    out = {"TT": t2 * (T * T) @ w, "EE": t2 * (E * E) @ w, "TE": t2 * (T * E) @ w}
    if P is not None:
        out["PP"] = (P * P) @ weight(k_p, w_p)
    return out


def limber_cells(k_source, tau_h, tau0_h: float, ells) -> dict:
    """Host arrays of Limber's integral at ``ells`` for sources at the conformal times
    ``tau_h`` (today ``tau0_h``) on the wavenumbers ``k_source``: ``keep`` the samples at
    χ = τ0 − τ > 1 Mpc, ``cell`` (L, S_keep) the spline cell in ln k each k = (ℓ + ½)/χ falls in,
    ``inside`` where that k lies on the source grid, ``deriv`` the (K, K) matrix of the cubic
    spline's node derivatives in ln k, ``lnk``, ``nu`` = ℓ + ½ (L, 1) and ``k_ends``, the grid's
    first and last k."""
    tau_h = np.asarray(tau_h, np.float64)
    keep = np.nonzero((tau0_h - tau_h) > 1.0)[0]
    lnk = np.log(np.asarray(k_source, np.float64))
    deriv = _SPLINE_DERIVATIVES.get_or_build(
        lnk.tobytes(), lambda: CubicSpline(lnk, np.eye(lnk.size), axis=0).derivative()(lnk))
    nu = np.asarray(ells, np.float64)[:, None] + 0.5
    k_h = nu / (tau0_h - tau_h[keep])[None, :]
    k0, k1 = float(k_source[0]), float(k_source[-1])
    cell = np.clip(np.searchsorted(lnk, np.log(np.clip(k_h, k0, k1))) - 1, 0, lnk.size - 2)
    return {"keep": keep, "cell": cell.astype(np.int32), "inside": (k_h >= k0) & (k_h <= k1),
            "deriv": deriv, "lnk": lnk, "nu": nu, "k_ends": np.array([k0, k1])}


def limber_pp(src, ells, A_s, n_s, k_pivot, *, tau_fid=None, tau0_fid=None):
    """C_ℓ^φφ of Limber's approximation at ``ells`` from the source grid ``src`` (module doc).

    S_φ(k, τ_i) at k = (ℓ + ½)/χ_i: the cubic spline in ln k of the source grid, written as
    Hermite cells with the spline's node derivatives (one matrix), so it stays a JAX gather.
    ``src.tau``, ``src.tau0`` may be traced (the C_ℓ Jacobian); the cells each k falls in are
    then fixed by the host values ``tau_fid``, ``tau0_fid`` (the fiducial cosmology's), which
    leaves the derivative exact (the spline is C¹ across cells). The cells are host arrays
    (``limber_cells``), the sum one compiled program of them."""
    tau_h = np.asarray(src.tau if tau_fid is None else tau_fid)
    tau0_h = float(src.tau0 if tau0_fid is None else tau0_fid)
    cells = {name: jnp.asarray(v) for name, v in limber_cells(src.k, tau_h, tau0_h,
                                                               ells).items()}
    return _limber_sum(cells, jnp.asarray(src.phi), jnp.asarray(src.tau),
                       jnp.asarray(src.tau0, jnp.float64), A_s, n_s, k_pivot)


@jax.jit
def _limber_sum(cells, phi, tau, tau0, A_s, n_s, k_pivot):
    """``limber_pp``'s integral from its cells (``limber_cells``), traceable in the sources,
    τ and τ0."""
    keep, i, lnk = cells["keep"], cells["cell"], cells["lnk"]
    chi = (tau0 - tau)[keep]
    w = trapezoid(tau)[keep]
    phi = phi[:, keep]                                                   # (K, S)
    dphi = cells["deriv"] @ phi
    h = lnk[i + 1] - lnk[i]
    k = cells["nu"] / chi[None, :]
    t = (jnp.log(jnp.clip(k, cells["k_ends"][0], cells["k_ends"][1])) - lnk[i]) / h
    col = jnp.broadcast_to(jnp.arange(chi.shape[0])[None, :], i.shape)
    f0, f1 = phi[i, col], phi[i + 1, col]
    d0, d1 = dphi[i, col] * h, dphi[i + 1, col] * h
    t2, t3 = t * t, t * t * t
    s_phi = ((2 * t3 - 3 * t2 + 1) * f0 + (t3 - 2 * t2 + t) * d0 + (-2 * t3 + 3 * t2) * f1
             + (t3 - t2) * d1)
    pr = primordial_curvature_power(k, A_s, n_s, k_pivot)
    integrand = jnp.where(cells["inside"], pr * s_phi * s_phi / (k ** 3 * chi ** 2), 0.0)
    return 2.0 * math.pi ** 2 * integrand @ w
