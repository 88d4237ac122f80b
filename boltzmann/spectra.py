"""Primordial spectrum, linear power spectra and sigma_R from transfer functions (JAX).

Conventions follow CLASS's 'class' transfer normalisation: a transfer function T_X(k) is the
density contrast of species X for unit primordial comoving curvature R, so

    P_R(k) = A_s (k / k_pivot)^(n_s - 1 + alpha_s/2 ln(k/k_pivot))        (dimensionless)
    P_X(k) = 2 pi^2 / k^3 * P_R(k) * T_X(k)^2                              (Mpc^3, k in 1/Mpc)

(e.g. Lesgourgues, CLASS I, arXiv:1104.2932; running as in Planck 2018 X, arXiv:1807.06211).

sigma_R is the rms linear density contrast in a spherical top-hat of radius R:

    sigma^2(R) = int dln k  Delta^2(k) W^2(kR),  Delta^2 = k^3 P / (2 pi^2),
    W(x) = 3 (sin x - x cos x) / x^3

(Peebles 1980, sec. 26). We integrate on the computed k grid by interpolating ln P with a natural
cubic spline in ln k and using composite Simpson on a fine uniform-in-ln k resampling, fine
enough to resolve the window's oscillations at the largest kR. Everything that depends on the
power spectrum values or on R is JAX, so sigma8 is differentiable with respect to the
transfer functions, the primordial parameters and h (through R = 8 Mpc/h). The k grid itself is
treated as a fixed (concrete) array.

Whether the k range is wide enough is checked separately (`check_sigma_k_coverage`): missing
low-k and high-k tails are estimated from power-law extrapolations of Delta^2 at the grid ends,
and an error names the k range that would be needed. The driver avoids that case: it solves the
modes σ8 needs beyond a short requested range (`boltzmann.modes.sigma8_grid`), and
`on_requested_k` cuts P(k) back to the requested wavenumbers once σ8 is integrated.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.lax.linalg import tridiagonal_solve

from solver.caches import Cache

#: compiled power_spectra programs by (the h/Mpc grid, σ8 or not, the fields it reads): one
#: dispatch for the spectra stage instead of one per operation (on a GPU each costs a launch)
_SPECTRA_PROGRAMS = Cache("boltzmann.spectra_programs", maxsize=16)

__all__ = [
    "Spectra",
    "compute_spectra",
    "power_spectra",
    "primordial_curvature_power",
    "power_from_transfer",
    "cb_transfer",
    "tophat_window",
    "sigma_R",
    "sigma8",
    "check_sigma_k_coverage",
    "KRangeError",
    "coverage_problems",
    "on_requested_k",
]

_TWO_PI_SQ = 2.0 * math.pi**2
# Below this x, W(x) uses its Taylor series: the closed form loses ~eps/x^2 relative accuracy.
_WINDOW_SERIES_X = 0.3
# The power-law tail estimates were within ~20% of the true truncation error on CLASS's LCDM P(k)
# (k_max from 0.5 to 3 1/Mpc); inflate them by this factor to stay on the safe side.
_TAIL_SAFETY = 1.3


class KRangeError(ValueError):
    """The k grid does not cover the range an integral over P(k) needs."""


def primordial_curvature_power(k, A_s, n_s, k_pivot=0.05, alpha_s=0.0):
    """Dimensionless primordial curvature spectrum P_R(k).

    P_R = A_s (k/k_pivot)^(n_s - 1 + (alpha_s/2) ln(k/k_pivot)); `alpha_s` is the running
    dn_s/dlnk (0 by default: the hook for running). k and k_pivot in 1/Mpc.
    """
    lnx = jnp.log(jnp.asarray(k) / k_pivot)
    return A_s * jnp.exp((n_s - 1.0 + 0.5 * alpha_s * lnx) * lnx)


def power_from_transfer(k, transfer, A_s, n_s, k_pivot=0.05, alpha_s=0.0):
    """P_X(k) = 2 pi^2/k^3 P_R(k) T_X(k)^2 in Mpc^3, for a transfer in CLASS 'class' normalisation."""
    k = jnp.asarray(k)
    return _TWO_PI_SQ / k**3 * primordial_curvature_power(k, A_s, n_s, k_pivot, alpha_s) * jnp.asarray(transfer) ** 2


def cb_transfer(d_cdm, d_b, omega_cdm, omega_b):
    """Density-weighted CDM + baryon contrast, d_cb = (omega_cdm d_cdm + omega_b d_b)/(omega_cdm + omega_b).

    Both scale as a^-3, so today's physical densities are the right weights at any z.
    """
    return (omega_cdm * jnp.asarray(d_cdm) + omega_b * jnp.asarray(d_b)) / (omega_cdm + omega_b)


def tophat_window(x):
    """Fourier transform of a unit spherical top-hat, W(x) = 3 (sin x - x cos x)/x^3.

    Uses the Taylor series W = 3 sum_{n>=1} (-1)^(n+1) 2n x^(2n-2)/(2n+1)!
    = 1 - x^2/10 + x^4/280 - x^6/15120 + ..., through x^12, for |x| < 0.3 (truncation error < 1e-20
    there; the closed form loses ~eps/x^2 to cancellation) and the closed form elsewhere; the double `where` keeps gradients finite at x = 0.
    """
    return _tophat(jnp.asarray(x), jnp)


def _tophat(x, xp):
    """W(x) with the array module ``xp`` (jax.numpy, or numpy for host-side checks)."""
    small = xp.abs(x) < _WINDOW_SERIES_X
    x_safe = xp.where(small, 1.0, x)
    closed = 3.0 * (xp.sin(x_safe) - x_safe * xp.cos(x_safe)) / x_safe**3
    x2 = x * x
    series = 1.0 + x2 * (-1.0 / 10 + x2 * (1.0 / 280 + x2 * (-1.0 / 15120 + x2 * (
        1.0 / 1330560 + x2 * (-1.0 / 172972800 + x2 / 31135104000)))))
    return xp.where(small, series, closed)


# --------------------------------------------------------------------------- spline + quadrature
def _spline_eval_weights(x: np.ndarray, xq: np.ndarray):
    """Interval index and the A, B weights of the cubic-spline formula at query points (numpy, fixed grid)."""
    idx = np.clip(np.searchsorted(x, xq, side="right") - 1, 0, x.size - 2)
    h = x[idx + 1] - x[idx]
    b = (xq - x[idx]) / h
    a = 1.0 - b
    return idx, a, b, h


def _simpson_weights(n: int, dx: float) -> np.ndarray:
    if n < 3 or n % 2 == 0:
        raise ValueError(f"Simpson's rule needs an odd number >= 3 of points, got {n}")
    w = np.ones(n)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w * dx / 3.0


def _fine_point_count(lnk: np.ndarray, kR_max: float, points_per_period: int, points_per_interval: int) -> int:
    """Odd number of uniform ln k points resolving both the input grid and W^2's oscillations."""
    span = lnk[-1] - lnk[0]
    # W^2 oscillates with period pi in x = kR, i.e. pi/x in ln k.
    n_osc = points_per_period * span * max(kR_max, 1.0) / math.pi
    n_grid = points_per_interval * (lnk.size - 1)
    n = max(n_osc, n_grid, 257)
    # rounded up to a ladder of sizes 2^(j/8) (+ 1, odd): the count moves with h and the k
    # range, and every new count is a new compilation of _sigma2_on_fine_grid that JAX keeps;
    # on the ladder a sampler's changing cosmologies reuse a few (memory stays flat)
    n = int(math.ceil(2.0 ** (math.ceil(8.0 * math.log2(n)) / 8.0)))
    return n + 1 if n % 2 == 0 else n


def _as_concrete_numpy(a):
    """numpy copy of `a`, or None when `a` is a JAX tracer (inside jit/grad)."""
    try:
        return np.asarray(a, dtype=float)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _validated_k(k) -> np.ndarray:
    k_np = _as_concrete_numpy(k)
    if k_np is None:
        raise TypeError("k must be a concrete array (the k grid is fixed; differentiate with respect to P or R instead)")
    if k_np.ndim != 1 or k_np.size < 5:
        raise ValueError(f"k must be a 1-d grid of at least 5 wavenumbers, got shape {k_np.shape}")
    if not np.all(k_np > 0) or not np.all(np.diff(k_np) > 0):
        raise ValueError("k must be positive and strictly increasing")
    return k_np


def sigma_R(k, pk, R, *, check_coverage: bool = True, rtol_tail: float = 1e-4,
            points_per_period: int = 32, points_per_interval: int = 8, R_max_sampling: float = 25.0):
    """rms linear density contrast in a top-hat of radius R [Mpc] for P(k) [Mpc^3] on grid k [1/Mpc].

    `pk` and `R` may be JAX tracers (this is differentiable in both); `k` must be concrete.
    When `pk` and `R` are concrete and `check_coverage` is set, raises `KRangeError` if the
    estimated contribution of the k range outside the grid exceeds `rtol_tail` (relative, on sigma).
    The fine grid resolves W^2 at the largest kR with `points_per_period` points per oscillation;
    when R is traced its sampling uses `R_max_sampling` as an upper bound.
    """
    k_np = _validated_k(k)
    pk = jnp.asarray(pk)
    if pk.shape != k_np.shape:
        raise ValueError(f"pk has shape {pk.shape}, k has shape {k_np.shape}")
    R_np = _as_concrete_numpy(R)
    pk_np = _as_concrete_numpy(pk)
    if check_coverage and R_np is not None and pk_np is not None:
        check_sigma_k_coverage(k_np, pk_np, float(R_np), rtol=rtol_tail)
    R_sampling = float(R_np) if R_np is not None else R_max_sampling

    lnk = np.log(k_np)
    n_fine = _fine_point_count(lnk, k_np[-1] * R_sampling, points_per_period, points_per_interval)
    lnk_fine = np.linspace(lnk[0], lnk[-1], n_fine)
    weights = _simpson_weights(n_fine, lnk_fine[1] - lnk_fine[0])

    idx, a, b, _ = _spline_eval_weights(lnk, lnk_fine)
    h = np.diff(lnk)
    sub, diag, sup = np.concatenate([[0.0], h[1:-1]]), 2.0 * (h[:-1] + h[1:]), np.concatenate([h[1:-1], [0.0]])
    return jnp.sqrt(_sigma2_on_fine_grid(jnp.log(pk), jnp.asarray(R, dtype=float), lnk, h, sub, diag, sup,
                                         idx, a, b, lnk_fine, weights))


@jax.jit
def _sigma2_on_fine_grid(ln_pk, R, lnk, h, sub, diag, sup, idx, a, b, lnk_fine, weights):
    """Simpson sum of Delta^2 W^2 on the fine grid; ln P from the natural cubic spline in ln k.

    All grid-dependent arrays are precomputed in numpy and passed in, so one compilation serves
    every call with the same grid sizes.
    """
    rhs = 6.0 * ((ln_pk[2:] - ln_pk[1:-1]) / h[1:] - (ln_pk[1:-1] - ln_pk[:-2]) / h[:-1])
    m_inner = tridiagonal_solve(sub, diag, sup, rhs[:, None])[:, 0]
    m = jnp.concatenate([jnp.zeros((1,)), m_inner, jnp.zeros((1,))])
    hi = lnk[idx + 1] - lnk[idx]
    ln_pk_fine = (a * ln_pk[idx] + b * ln_pk[idx + 1]
                  + ((a**3 - a) * m[idx] + (b**3 - b) * m[idx + 1]) * hi * hi / 6.0)
    delta2 = jnp.exp(ln_pk_fine + 3.0 * lnk_fine) / _TWO_PI_SQ
    return jnp.sum(weights * delta2 * tophat_window(jnp.exp(lnk_fine) * R) ** 2)


def sigma8(k, pk, h, **kwargs):
    """sigma_R at R = 8 Mpc/h (h dimensionless); see `sigma_R` for arguments."""
    return sigma_R(k, pk, 8.0 / h, **kwargs)


def _log_slopes(lnk: np.ndarray, ln_y: np.ndarray, end: str, span: float = 0.3) -> np.ndarray:
    """Least-squares d ln y / d ln k of every row over its last (or first) `span` in ln k (at
    least 3 points): closed form on masks, numpy only, all rows at once."""
    K = lnk.shape[-1]
    idx = np.arange(K)
    if end == "high":
        sel = (lnk >= lnk[:, -1:] - span) | (idx >= K - 3)
    else:
        sel = (lnk <= lnk[:, :1] + span) | (idx < 3)
    w = sel.astype(float)
    n = w.sum(axis=1, keepdims=True)
    x_mean = (w * lnk).sum(axis=1, keepdims=True) / n
    y_mean = (w * ln_y).sum(axis=1, keepdims=True) / n
    dx = lnk - x_mean
    return (w * dx * (ln_y - y_mean)).sum(axis=1) / (w * dx * dx).sum(axis=1)


def _tophat_window_np(x: np.ndarray) -> np.ndarray:
    """``tophat_window`` in numpy, for the host-side coverage check (no JAX dispatch per call)."""
    return _tophat(np.asarray(x, dtype=float), np)


def _coverage(k: np.ndarray, pk: np.ndarray, R: np.ndarray, rtol: float) -> dict:
    """The tail estimates of ``check_sigma_k_coverage`` for rows k, pk (M, K), R (M,) at once
    (an ensemble checks every cosmology, redshift and spectrum: one numpy pass, not M calls)."""
    lnk = np.log(k)
    delta2 = k**3 * pk / _TWO_PI_SQ
    ln_d2 = np.log(delta2)
    R = np.asarray(R, dtype=float)[:, None]
    # sigma^2 on the grid: trapezoid is plenty for an error estimate.
    sigma2 = np.trapezoid(delta2 * _tophat_window_np(k * R) ** 2, lnk, axis=1)
    s_lo, s_hi = _log_slopes(lnk, ln_d2, "low"), _log_slopes(lnk, ln_d2, "high")
    R = R[:, 0]
    target = 2.0 * rtol * sigma2  # allowed missing sigma^2
    kR_hi = k[:, -1] * R
    envelope_hi = np.where(kR_hi > 5, 4.5 / kR_hi**4, 1.0)
    d_lo, d_hi, k_lo, k_hi = delta2[:, 0], delta2[:, -1], k[:, 0], k[:, -1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tail_lo = np.where(s_lo > 0, _TAIL_SAFETY * d_lo / s_lo, np.inf)
        tail_hi = np.where(s_hi < 4.0, _TAIL_SAFETY * d_hi * envelope_hi / (4.0 - s_hi), np.inf)
        need_lo = np.where(tail_lo <= target, k_lo, np.where(
            s_lo > 0, k_lo * (target * s_lo / (_TAIL_SAFETY * d_lo)) ** (1.0 / s_lo), 0.0))
        # Delta^2(K) 4.5/(K R)^4 / (4 - s) = target with Delta^2(K) = Delta^2(k_max) (K/k_max)^s
        c = target * (4.0 - s_hi) / _TAIL_SAFETY * R**4 / (4.5 * d_hi * k_hi ** (-s_hi))
        need_hi = np.where(tail_hi <= target, k_hi, np.where(
            s_hi < 4.0, np.maximum(c ** (1.0 / (s_hi - 4.0)), 5.0 / R), np.inf))
    return {"sigma2_estimate": sigma2, "missing_low_fraction": tail_lo / sigma2,
            "missing_high_fraction": tail_hi / sigma2, "k_needed_min": need_lo,
            "k_needed_max": need_hi, "ok": (tail_lo <= target) & (tail_hi <= target)}


def _coverage_message(info: dict, i: int, k, R: float, rtol: float) -> str:
    return (f"k grid [{k[0]:.3g}, {k[-1]:.3g}] 1/Mpc is too narrow for sigma(R={R:.4g} Mpc) to "
            f"relative accuracy {rtol:g}: it needs k from <= {info['k_needed_min'][i]:.3g} to "
            f">= {info['k_needed_max'][i]:.3g} 1/Mpc (estimated missing sigma^2 fractions: "
            f"low-k {info['missing_low_fraction'][i]:.2g}, high-k "
            f"{info['missing_high_fraction'][i]:.2g})")


def _check_positive(k, pk):
    if not np.all(np.isfinite(pk)) or not np.all(pk > 0):
        bad = k[~(np.isfinite(pk) & (pk > 0))]
        raise ValueError(f"P(k) must be finite and positive for sigma_R; bad at k = "
                         f"{bad[:5].tolist()} 1/Mpc")


def check_sigma_k_coverage(k, pk, R: float, rtol: float = 1e-4) -> dict:
    """Check that the k grid covers what sigma_R needs; raise `KRangeError` naming the needed range.

    The integrand outside the grid is extrapolated as a power law in k fitted to the last
    ~0.3 in ln k of Delta^2: below k_min, Delta^2 W^2 ~ Delta^2 (W ~ 1 for kR << 1); above k_max,
    W^2 is replaced by its envelope average 9/(2 x^4) (valid for x = kR >~ 5). The missing
    fraction of sigma^2 (times a safety factor 1.3) is halved to give the relative error on sigma.
    Returns the estimates (fractions of sigma^2 and the needed k_min, k_max in 1/Mpc).
    """
    k = np.asarray(k, dtype=float)
    pk = np.asarray(pk, dtype=float)
    _check_positive(k, pk)
    info = _coverage(k[None], pk[None], np.array([float(R)]), rtol)
    if not info["ok"][0]:
        raise KRangeError(_coverage_message(info, 0, k, float(R), rtol))
    return {name: float(v[0]) for name, v in info.items() if name != "ok"}


def coverage_problems(k, pk, R, rtol: float = 1e-4) -> list:
    """``check_sigma_k_coverage`` for many rows at once: k, pk (M, K), R (M,). Returns, per row,
    None or the message of the KRangeError it would raise; rows whose P(k) is not finite and
    positive are skipped (None): they fail elsewhere."""
    k = np.asarray(k, dtype=float)
    pk = np.asarray(pk, dtype=float)
    R = np.asarray(R, dtype=float)
    good = np.all(np.isfinite(pk) & (pk > 0), axis=1)
    out = [None] * k.shape[0]
    if not np.any(good):
        return out
    rows = np.flatnonzero(good)
    info = _coverage(k[rows], pk[rows], R[rows], rtol)
    for j, i in enumerate(rows):
        if not info["ok"][j]:
            out[i] = _coverage_message(info, j, k[i], float(R[i]), rtol)
    return out


# --------------------------------------------------------------------------- the spectra stage
@dataclass(frozen=True)
class Spectra:
    """Linear power spectra and σ8 of C cosmologies at Z redshifts (stage 3).

    k: (C, K) [1/Mpc]; z: the redshifts; pk_m, pk_cb: (C, Z, K) [Mpc^3] linear P(k) of all matter
    (cdm + b + ncdm) and of cdm + b; sigma8, sigma8_cb: (C, Z), NaN where a mode of the cosmology
    failed or fewer than 5 wavenumbers were computed;
    problems: (cosmology, "d_m" | "d_cb", z, message) for every σ8 whose k range is too narrow
    (``check_sigma_k_coverage``) or that could not be formed;
    sigma8_k: (C, K') the wavenumbers σ8 integrated over when they extend ``k``
    (``on_requested_k``), else None.
    """

    k: np.ndarray
    z: tuple
    pk_m: np.ndarray
    pk_cb: np.ndarray
    sigma8: np.ndarray
    sigma8_cb: np.ndarray
    problems: list = field(default_factory=list)
    sigma8_k: np.ndarray | None = None

    def problem(self, c: int, name: str, z: float) -> str | None:
        """The message of σ8's problem for cosmology c, "d_m" or "d_cb", redshift z (or None)."""
        for cc, nn, zz, message in self.problems:
            if (cc, nn, zz) == (c, name, z):
                return message
        return None


def _primordial(cosmos):
    return tuple(jnp.asarray(getattr(cosmos, n))[:, None, None] for n in ("A_s", "n_s", "k_pivot"))


def _sigma8_all(k, k_h, pk, h):
    """σ(8 Mpc/h) of every row of pk (C, K), by one vmapped sigma_R.

    A grid given in h/Mpc (k = k_h·h) is the same grid in k/h for every cosmology, and
    σ(8 Mpc/h) = σ_R(k_h, h³ P, R = 8) exactly; a grid in 1/Mpc is shared as is, R = 8/h then
    varies and the sampling is set by the largest R (25 Mpc when h is traced).
    """
    if k_h is not None:
        return jax.vmap(lambda p, hh: sigma_R(k_h, p * hh**3, 8.0, check_coverage=False))(pk, h)
    h_np = _as_concrete_numpy(h)
    r_max = 25.0 if h_np is None else float(np.max(8.0 / h_np))
    return jax.vmap(lambda p, hh: sigma_R(k[0], p, 8.0 / hh, check_coverage=False,
                                          R_max_sampling=r_max))(pk, h)


def _sparse(sampling) -> bool:
    """Whether ``sampling`` (a ``k_sampling.KSampling`` or None) leaves modes to the spline."""
    return sampling is not None and not sampling.every_mode


def power_spectra(fields, k, cosmos, *, k_h=None, with_sigma8: bool = True,
                  sampling=None) -> dict:
    """{P_m, P_cb: (C, Z, K); sigma8, sigma8_cb: (C, Z)} from transfer fields (C, Z, K); traceable
    in the fields and in ``cosmos`` (stacked CosmoParams); ``k`` (C, K) concrete, or traced when
    the grid is given in h/Mpc (``k_h``). ``sampling``: a ``k_sampling.KSampling`` of the axis
    ``k`` when the fields hold only its solved modes (K' of them): P_m and P_cb are computed
    there, filled onto the whole axis by its spline of ln P, and σ8 integrates over the axis."""
    if k_h is None:
        k = np.asarray(k, np.float64)
    fill = _sparse(sampling)
    d_m = jnp.asarray(fields["d_m"])
    if "d_cb" in fields:
        d_cb = jnp.asarray(fields["d_cb"])
    else:
        w_c = jnp.asarray(cosmos.omega_cdm)[:, None, None]
        w_b = jnp.asarray(cosmos.omega_b)[:, None, None]
        d_cb = cb_transfer(fields["d_cdm"], fields["d_b"], w_c, w_b)
    A_s, n_s, k_pivot = _primordial(cosmos)
    kk = jnp.asarray(k)[:, None, :]
    if fill:
        kk = kk[..., sampling.solved]
    out = {"P_m": power_from_transfer(kk, d_m, A_s, n_s, k_pivot),
           "P_cb": power_from_transfer(kk, d_cb, A_s, n_s, k_pivot)}
    if fill:
        out = {name: sampling.fill_power(p) for name, p in out.items()}
    if with_sigma8:
        h = jnp.asarray(cosmos.h)
        for name, key in (("sigma8", "P_m"), ("sigma8_cb", "P_cb")):
            out[name] = jnp.stack([_sigma8_all(k, k_h, out[key][:, iz], h)
                                   for iz in range(d_m.shape[1])], axis=1)
    return out


def _spectra_program(k_h: np.ndarray, with_sigma8: bool, names: tuple, sampling=None):
    """``power_spectra`` on an h/Mpc grid ``k_h`` compiled once (k and the fields traced)."""
    def build():
        return jax.jit(lambda fields, k, cosmos: power_spectra(
            fields, k, cosmos, k_h=k_h, with_sigma8=with_sigma8, sampling=sampling))
    key = (k_h.tobytes(), with_sigma8, names)
    if _sparse(sampling):   # its solved modes set the program
        key += (sampling.solved.tobytes(),)
    return _SPECTRA_PROGRAMS.get_or_build(key, build)


def compute_spectra(transfers, cosmos, *, check_coverage: bool = True,
                    sampling=None) -> Spectra:
    """Stage 3: P_m, P_cb and σ8 of every cosmology from a ``perturbations.Transfers``.

    ``cosmos``: the stacked CosmoParams of the transfers' cosmologies. With ``check_coverage``,
    every σ8 whose k range misses more than 1e-4 of it is listed in ``problems``. ``sampling``:
    the ``k_sampling.KSampling`` whose solved modes the transfers hold; the spectra are then on
    its whole axis (``sampling.k``, ``sampling.k_h``), P filled in by its spline.
    """
    if _sparse(sampling):
        k, k_h = np.asarray(sampling.k), sampling.k_h
    else:
        k, k_h = np.asarray(transfers.k), transfers.k_h
    C, K = k.shape
    with_sigma8 = K >= 5
    names = ("d_m", "d_cb") if "d_cb" in transfers.fields else ("d_m", "d_cdm", "d_b")
    used = {n: transfers.fields[n] for n in names}
    if k_h is None:
        spectra = power_spectra(used, k, cosmos, with_sigma8=with_sigma8, sampling=sampling)
    else:
        spectra = _spectra_program(np.asarray(k_h, np.float64), with_sigma8, names, sampling)(
            used, jnp.asarray(k), cosmos)
    out = {n: np.asarray(v) for n, v in jax.device_get(spectra).items()}
    problems = []
    if not with_sigma8:
        nan = np.full((C, len(transfers.z)), np.nan)
        out["sigma8"], out["sigma8_cb"] = nan, nan.copy()
        problems = [(c, name, z, f"no sigma8: {K} wavenumbers, at least 5 are needed")
                    for c in range(C) for name in ("d_m", "d_cb") for z in transfers.z]
    elif check_coverage:
        h = np.asarray(cosmos.h, np.float64)
        Z = len(transfers.z)
        keys = []
        for c in range(C):
            for iz, z in enumerate(transfers.z):
                keys += [(c, name, z, out[key][c, iz]) for name, key in (("d_m", "P_m"),
                                                                          ("d_cb", "P_cb"))]
        messages = coverage_problems(np.repeat(k, 2 * Z, axis=0),
                                     np.stack([row[3] for row in keys]),
                                     np.repeat(8.0 / h, 2 * Z))
        problems = [(c, name, z, msg) for (c, name, z, _), msg in zip(keys, messages)
                    if msg is not None]
    return Spectra(k=k, z=tuple(transfers.z), pk_m=out["P_m"], pk_cb=out["P_cb"],
                   sigma8=out["sigma8"], sigma8_cb=out["sigma8_cb"], problems=problems)


def on_requested_k(transfers, spectra: Spectra, keep, sampling=None):
    """(transfers, spectra) cut to the requested wavenumbers ``keep`` (indices into the spectra's
    k), after σ8 was integrated over all of them (``boltzmann.modes.sigma8_grid`` added the rest).
    ``sampling``: the ``k_sampling.KSampling`` whose solved modes the transfers hold (None: all
    modes); the transfers keep the solved modes among the requested ones.

    A failed added mode leaves no trace in the cut transfers, so it is named in ``problems``
    (σ8 of that cosmology is NaN).
    """
    keep = np.asarray(keep)
    K = spectra.k.shape[1]
    if keep.size == K:
        return transfers, spectra
    # the transfers' own indices: the place of each solved mode among the solved ones
    solved = np.arange(K) if sampling is None else np.asarray(sampling.solved)
    place = np.full(K, -1)
    place[solved] = np.arange(solved.size)
    keep_t = place[keep][place[keep] >= 0]
    dropped = np.setdiff1d(np.arange(solved.size), keep_t)
    problems = list(spectra.problems)
    for c, i in zip(*np.nonzero(np.asarray(transfers.status)[:, dropped] != 0)):
        message = (f"the mode k = {transfers.k[c, dropped[i]]:.4g} 1/Mpc, added to the requested "
                   f"k range for sigma8, failed (solver status {transfers.status[c, dropped[i]]})")
        problems += [(int(c), name, z, message) for name in ("d_m", "d_cb") for z in spectra.z]
    cut = dataclasses.replace(
        transfers, k=transfers.k[:, keep_t],
        k_h=None if transfers.k_h is None else transfers.k_h[keep_t],
        fields={name: v[..., keep_t] for name, v in transfers.fields.items()},
        status=transfers.status[:, keep_t], n_accepted=transfers.n_accepted[:, keep_t],
        n_rejected=transfers.n_rejected[:, keep_t])
    return cut, dataclasses.replace(spectra, k=spectra.k[:, keep], pk_m=spectra.pk_m[..., keep],
                                    pk_cb=spectra.pk_cb[..., keep], problems=problems,
                                    sigma8_k=spectra.k)
