"""Lensed CMB spectra by the all-sky correlation-function method (Challinor & Lewis 2005).

With the deflection correlations
    C_gl(β) = Σ_ℓ (2ℓ+1)/4π ℓ(ℓ+1) C_ℓ^φφ d^ℓ_11(β),   C_gl,2(β) = Σ_ℓ (same) d^ℓ_{1,-1}(β),
    σ²(β) = C_gl(0) - C_gl(β),
the lensed correlation functions are, to second order in C_gl,2 and to all orders in σ²,

    ξ̃    = Σ (2ℓ+1)/4π C^TT [X000² d00 + 8/(ℓ(ℓ+1)) C2 X'000² d1-1 + C2² (X'000² d00 + X220² d2-2)]
    ξ̃_+  = Σ (2ℓ+1)/4π (C^EE+C^BB) [X022² d22 + 2 C2 X132 X121 d31 + C2² (X'022² d22 + X242 X220 d40)]
    ξ̃_-  = Σ (2ℓ+1)/4π (C^EE-C^BB) [X022² d2-2 + C2 (X121² d1-1 + X132² d3-3)
                                    + ½ C2² (2X'022² d2-2 + X220² d00 + X242² d4-4)]
    ξ̃_X  = Σ (2ℓ+1)/4π C^TE [X022 X000 d02 + C2 2X'000/√(ℓ(ℓ+1)) (X112 d11 + X132 d3-1)
                             + ½ C2² ((2X'022 X'000 + X220²) d20 + X220 X242 d-24)]

(C2 = C_gl,2, d.. = d^ℓ_{mm'}(β)) with, for s = σ²/4,
    X000 = e^{-ℓ(ℓ+1)s},  X'000 = dX000/dσ² = -ℓ(ℓ+1)/4 X000,  X220 = ¼√((ℓ+2)(ℓ-1)ℓ(ℓ+1)) e^{-(ℓ(ℓ+1)-2)s},
    X022 = e^{-(ℓ(ℓ+1)-5)s},  X'022 = -(ℓ(ℓ+1)-5)/4 X022,
    X121 = X112 = -½√((ℓ+2)(ℓ-1)) e^{-(ℓ(ℓ+1)-8/3)s},  X132 = -½√((ℓ+3)(ℓ-2)) e^{-(ℓ(ℓ+1)-20/3)s},
    X242 = ¼√((ℓ+4)(ℓ+3)(ℓ-2)(ℓ-3)) e^{-(ℓ(ℓ+1)-10)s}.

The spectra follow by Gauss-Legendre quadrature in cos β: C̃^TT = 2π ∫ ξ̃ d00, C̃^EE ± C̃^BB =
2π ∫ ξ̃_± d2±2, C̃^TE = 2π ∫ ξ̃_X d20. Only the change ξ̃ - ξ is transformed and added to the
unlensed C_ℓ, so the quadrature's error touches the small lensing correction only.

Wigner d^ℓ_{mm'} come from the three-term recurrence in ℓ, started at ℓ = max(|m|, |m'|) from
the explicit sum. The three sums over ℓ (deflection correlations, lensed correlation
functions, back-transform) are evaluated in one of two ways, the same formulas either way:

- ``method="recurrence"``: each sum is one ``jax.lax.scan`` over ℓ carrying d^ℓ and d^{ℓ-1} at
  every angle of the pairs the pass uses (two, twelve and four). Little memory, but some ten
  thousand dependent steps: on a GPU each is a few kernel launches, and the three scans take
  about 0.1 s whatever the arithmetic.
- ``method="tables"``: d^ℓ_{mm'}(β) depends on ℓ and the quadrature angles only, not on the
  cosmology, so the recurrence runs once per (ℓ_in, n_β) into a table (``WignerTables``: every
  pair, ℓ and angle; 2.1 GB for ℓ_in = 4000) kept for the process, and each sum is then one
  reduction over the (ℓ, β) plane, with no sequential steps. What a GPU is built for; on a CPU
  the memory traffic costs more than the scans, so ``"auto"`` takes the tables only where JAX's
  default backend is a GPU.

Both are traceable (derivatives of the lensed spectra flow through them) and compiled once per
(ℓ_in, l_max, n_β).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import roots_legendre

from solver.caches import Cache

__all__ = ["lensed_spectra", "wigner_d_start", "WignerTables", "L_EXTRA", "input_l_max",
           "LENSING_METHODS", "default_n_beta", "resolve_method"]

#: ``lensed_spectra``'s ways of summing over ℓ (module docstring)
LENSING_METHODS = ("auto", "recurrence", "tables")
_WIGNER = Cache("boltzmann.cmb.lensing.wigner", maxsize=1)

#: lensed spectra to l_max need the unlensed ones (and φφ) at least this far beyond it (with
#: 500 extra multipoles lensed TT is 4e-3 off CLASS at ℓ = 2500 — docs/cmb.md, Lensing)
L_EXTRA = 1000


def input_l_max(l_max: int) -> int:
    """How far the unlensed spectra must reach for lensed ones to ``l_max``: l_max + L_EXTRA,
    and l_max + 3 l_max/5 where that is more.  Lensed BB sums EE and φφ far beyond ℓ: at
    ℓ = 2000-2500 it is 2.2e-2 off CLASS's (lensed from input to 4500) with our input to 3500,
    2.1e-3 with input to 4000 (docs/cmb.md, Lensing)."""
    l_max = int(l_max)
    return l_max + max(L_EXTRA, -(-3 * l_max // 5))


#: Gauss-Legendre nodes in cos β beyond the input's l (the integrands are polynomials of degree
#: up to about 2 l_in in cos β, products of d^ℓ's; measured converged with this margin)
N_BETA_EXTRA = 1500

#: the (m, m') pairs the correlation functions use (all with m - m' even: d_mm' = d_m'm)
PAIRS = ((0, 0), (1, 1), (1, -1), (2, 2), (2, -2), (2, 0), (3, 1), (3, -1), (3, -3), (4, 0),
         (4, -4), (4, -2))


def wigner_d_start(m: int, mp: int, beta: np.ndarray) -> np.ndarray:
    """d^j_{m m'}(β) at j = max(|m|, |m'|) from Wigner's explicit sum."""
    j = max(abs(m), abs(mp))
    c, s = np.cos(beta / 2.0), np.sin(beta / 2.0)
    f = math.factorial
    out = np.zeros_like(beta)
    for k in range(0, 2 * j + 1):
        a, b, cc, d = j + mp - k, k, m - mp + k, j - m - k
        if min(a, b, cc, d) < 0:
            continue
        coef = (-1) ** (m - mp + k) * math.sqrt(f(j + m) * f(j - m) * f(j + mp) * f(j - mp)) / (
            f(a) * f(b) * f(cc) * f(d))
        out = out + coef * c ** (2 * j + mp - m - 2 * k) * s ** (m - mp + 2 * k)
    return out


def recurrence_coefficients(l_top: int):
    """(A1, A0, B, is_start): (l_top + 1, len(PAIRS)) arrays such that for every ℓ and pair

        d^ℓ = (A1 cos β + A0) d^{ℓ-1} - B d^{ℓ-2}      (ℓ > j = max(|m|, |m'|))

    with d^ℓ = 0 below j and the explicit start at ℓ = j (``is_start``). d^1_00 = cos β is the
    recurrence's ℓ = 1 case with d^0_00 = 1 (the general formula divides by ℓ - 1 = 0 there)."""
    shape = (l_top + 1, len(PAIRS))
    A1, A0, B = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    is_start = np.zeros(shape, bool)
    for p, (m, mp) in enumerate(PAIRS):
        j = max(abs(m), abs(mp))
        if j <= l_top:
            is_start[j, p] = True
        for ell in range(j + 1, l_top + 1):
            L = ell - 1
            if j == 0 and ell == 1:
                A1[ell, p] = 1.0
                continue
            c = L * math.sqrt(((L + 1) ** 2 - m * m) * ((L + 1) ** 2 - mp * mp))
            A1[ell, p] = (2 * L + 1) * L * (L + 1) / c
            A0[ell, p] = -(2 * L + 1) * m * mp / c
            B[ell, p] = (L + 1) * math.sqrt((L * L - m * m) * (L * L - mp * mp)) / c
    return A1, A0, B, is_start


def _scan_d(beta, l_top, step, init, pairs=PAIRS):
    """Run ``carry = step(carry, ell, d)`` over ℓ = 0..l_top, d = {pair: d^ℓ_pair(β)} for the
    ``pairs`` (a subset of PAIRS: each pass carries only the ones it uses); returns the final
    carry and the stacked per-ℓ outputs of ``step``. ``beta``: host angles."""
    beta = np.asarray(beta, np.float64)
    cols = np.asarray([PAIRS.index(pair) for pair in pairs])
    A1, A0, B, is_start = (jnp.asarray(a[:, cols]) for a in recurrence_coefficients(l_top))
    x = jnp.asarray(np.cos(beta))
    start = jnp.asarray(np.stack([wigner_d_start(m, mp, beta) for m, mp in pairs]))
    zeros = jnp.zeros((len(pairs), beta.shape[0]))

    def body(state, row):
        prev, cur, carry = state
        ell, a1, a0, b, st = row
        new = jnp.where(st[:, None], start, (a1[:, None] * x + a0[:, None]) * cur
                        - b[:, None] * prev)
        d = {pair: new[i] for i, pair in enumerate(pairs)}
        carry, out = step(carry, ell, d)
        return (cur, new, carry), out

    rows = (jnp.arange(l_top + 1), A1, A0, B, jnp.asarray(is_start))
    (_, _, carry), outs = jax.lax.scan(body, (zeros, zeros, init), rows)
    return carry, outs


def _x_functions(ell, s, pre, shifts):
    """The X functions of the module docstring at multipole ``ell`` (traced) for s = σ²/4;
    ``shifts``: {c: e^{c s}} (``_shifts``), so that each X is e^{-ℓ(ℓ+1)s} times a
    factor computed once for all ℓ: one exponential per ℓ and angle instead of eight."""
    L = ell * (ell + 1.0)
    x000 = jnp.exp(-L * s)
    x022 = x000 * shifts[5.0]
    return {
        "000": x000, "d000": -0.25 * L * x000,
        "220": pre["220"][ell] * x000 * shifts[2.0],
        "022": x022, "d022": -0.25 * (L - 5.0) * x022,
        "121": pre["121"][ell] * x000 * shifts[8.0 / 3.0],
        "132": pre["132"][ell] * x000 * shifts[20.0 / 3.0],
        "242": pre["242"][ell] * x000 * shifts[10.0],
    }


def _shifts(s) -> dict:
    """{c: e^{c s}} for the constants c the X functions use (``_x_functions``)."""
    return {c: jnp.exp(c * s) for c in (2.0, 5.0, 8.0 / 3.0, 20.0 / 3.0, 10.0)}


def _prefactors(l_top: int) -> dict:
    ell = np.arange(l_top + 1, dtype=np.float64)
    sq = lambda v: np.sqrt(np.maximum(v, 0.0))  # noqa: E731
    return {"220": jnp.asarray(0.25 * sq((ell + 2) * (ell - 1) * ell * (ell + 1))),
            "121": jnp.asarray(-0.5 * sq((ell + 2) * (ell - 1))),
            "132": jnp.asarray(-0.5 * sq((ell + 3) * (ell - 2))),
            "242": jnp.asarray(0.25 * sq((ell + 4) * (ell + 3) * (ell - 2) * (ell - 3)))}


def _quadrature(n_beta: int):
    """Gauss-Legendre angles β (host) and weights in cos β."""
    mu, w = roots_legendre(n_beta)     # O(n); numpy's leggauss is O(n³): 15 s at n = 2000
    return np.arccos(mu), w


def _multiplicity(l_top: int):
    """(2ℓ+1)/4π at ℓ = 0..l_top."""
    return (2.0 * jnp.arange(l_top + 1, dtype=jnp.float64) + 1.0) / (4.0 * math.pi)


def _deflection_weights(pp, fac):
    """(2ℓ+1)/4π ℓ(ℓ+1) C_ℓ^φφ at ℓ = 0..ℓ_in (0 at ℓ = 0); ``fac``: ``_multiplicity``."""
    ells = jnp.arange(pp.shape[0], dtype=jnp.float64)
    return fac * ells * (ells + 1.0) * pp


def _pairs_of(table) -> dict:
    """{pair: (ℓ, β) view} of a (ℓ, len(PAIRS), n_β) Wigner table."""
    return {pair: table[:, i, :] for i, pair in enumerate(PAIRS)}


def _correlation_terms(ell, s, c2, pre, shifts, d):
    """(ξ_T, ξ_+, ξ_-, ξ_X) per unit C_ℓ at multipole ``ell`` (module docstring, lensed minus
    unlensed), for a traced scalar ℓ and angle vectors, or for a column of ℓ against a row of
    angles (the shapes broadcast)."""
    X = _x_functions(ell, s, pre, shifts)
    L = ell * (ell + 1.0)
    Ls = jnp.where(ell >= 2, L, 1.0)
    xi_t = (X["000"] ** 2 - 1.0) * d[(0, 0)] + 8.0 / Ls * c2 * X["d000"] ** 2 \
        * d[(1, -1)] + c2 ** 2 * (X["d000"] ** 2 * d[(0, 0)] + X["220"] ** 2 * d[(2, -2)])
    xi_p = (X["022"] ** 2 - 1.0) * d[(2, 2)] + 2.0 * c2 * X["132"] * X["121"] * d[(3, 1)] \
        + c2 ** 2 * (X["d022"] ** 2 * d[(2, 2)] + X["242"] * X["220"] * d[(4, 0)])
    xi_m = (X["022"] ** 2 - 1.0) * d[(2, -2)] + c2 * (X["121"] ** 2 * d[(1, -1)]
                                                      + X["132"] ** 2 * d[(3, -3)]) \
        + 0.5 * c2 ** 2 * (2.0 * X["d022"] ** 2 * d[(2, -2)] + X["220"] ** 2 * d[(0, 0)]
                           + X["242"] ** 2 * d[(4, -4)])
    xi_x = (X["022"] * X["000"] - 1.0) * d[(2, 0)] + c2 * 2.0 * X["d000"] / jnp.sqrt(Ls) \
        * (X["121"] * d[(1, 1)] + X["132"] * d[(3, -1)]) \
        + 0.5 * c2 ** 2 * ((2.0 * X["d022"] * X["d000"] + X["220"] ** 2) * d[(2, 0)]
                           + X["220"] * X["242"] * d[(4, -2)])
    return xi_t, xi_p, xi_m, xi_x


def _assemble(tt, ee, te, out, l_max: int) -> dict:
    """The lensed spectra at ℓ = 2..l_max from the back-transformed corrections ``out``
    ((l_max + 1, 4): ξ̃ - ξ of T, +, -, X in harmonic space)."""
    sl = slice(2, l_max + 1)
    T, P, M, X = (out[sl, i] for i in range(4))
    return {"TT": tt[sl] + T, "EE": ee[sl] + 0.5 * (P + M), "BB": 0.5 * (P - M),
            "TE": te[sl] + X}


@functools.partial(jax.jit, static_argnames=("l_max", "n_beta"))
def _lensed(tt, ee, te, pp, *, l_max: int, n_beta: int):
    """The three passes as ℓ scans (``method="recurrence"``) on C_ℓ arrays indexed by
    ℓ = 0..ℓ_in (ℓ < 2 zero)."""
    l_in = tt.shape[0] - 1
    beta, w = _quadrature(n_beta)
    w = jnp.asarray(w)
    fac = _multiplicity(l_in)
    a = _deflection_weights(pp, fac)
    zero = jnp.zeros(n_beta)

    # pass 1: deflection correlations
    def deflection(carry, ell, d):
        cgl, cgl2 = carry
        return (cgl + a[ell] * d[(1, 1)], cgl2 + a[ell] * d[(1, -1)]), None

    (cgl, c2), _ = _scan_d(beta, l_in, deflection, (zero, zero), ((1, 1), (1, -1)))
    s = 0.25 * (jnp.sum(a) - cgl)
    pre = _prefactors(l_in)
    shifts = _shifts(s)

    # pass 2: lensed minus unlensed correlation functions
    def correlations(dxi, ell, d):
        xi_t, xi_p, xi_m, xi_x = _correlation_terms(ell, s, c2, pre, shifts, d)
        f = jnp.where(ell >= 2, fac[ell], 0.0)
        new = dxi + f * jnp.stack([tt[ell] * xi_t, ee[ell] * xi_p, ee[ell] * xi_m,
                                   te[ell] * xi_x])
        return new, None

    dxi, _ = _scan_d(beta, l_in, correlations, jnp.zeros((4, n_beta)))

    # pass 3: back to harmonic space
    wd = 2.0 * math.pi * w * dxi

    def harmonic(carry, ell, d):
        return carry, jnp.stack([wd[0] @ d[(0, 0)], wd[1] @ d[(2, 2)], wd[2] @ d[(2, -2)],
                                 wd[3] @ d[(2, 0)]])

    _, out = _scan_d(beta, l_max, harmonic, 0.0, ((0, 0), (2, 2), (2, -2), (2, 0)))
    return _assemble(tt, ee, te, out, l_max)


@dataclass(frozen=True)
class WignerTables:
    """d^ℓ_{mm'}(β_i) for every pair of ``PAIRS``, ℓ = 0..``l_top`` and the ``n_beta``
    Gauss-Legendre angles of the lensing quadrature: ``d`` of shape (l_top + 1, len(PAIRS),
    n_beta), by the same recurrence as the scans (``_scan_d``). Cosmology-independent, so it is
    built once per (l_top, n_beta) and kept (``cached``; one table, as it is large)."""

    l_top: int
    n_beta: int
    d: jnp.ndarray

    @classmethod
    def build(cls, l_top: int, n_beta: int) -> "WignerTables":
        return cls(l_top=int(l_top), n_beta=int(n_beta), d=_wigner_table(int(l_top), int(n_beta)))

    @classmethod
    def cached(cls, l_top: int, n_beta: int) -> "WignerTables":
        key = (int(l_top), int(n_beta), jax.default_backend())
        return _WIGNER.get_or_build(key, lambda: cls.build(l_top, n_beta))

    def pairs(self) -> dict:
        """{pair: (l_top + 1, n_beta) view}."""
        return _pairs_of(self.d)


@functools.partial(jax.jit, static_argnames=("l_top", "n_beta"))
def _wigner_table(l_top: int, n_beta: int):
    beta, _ = _quadrature(n_beta)
    _, ds = _scan_d(beta, l_top, lambda c, ell, d: (c, jnp.stack([d[p] for p in PAIRS])), 0.0)
    return ds


@functools.partial(jax.jit, static_argnames=("l_max",))
def _lensed_tabled(tt, ee, te, pp, table, *, l_max: int):
    """The three passes (``method="tables"``) as reductions over the (ℓ, β) plane of
    ``table`` (a (ℓ_in + 1, len(PAIRS), n_β) ``WignerTables.d``)."""
    n_beta = table.shape[2]
    _, w = _quadrature(n_beta)
    w = jnp.asarray(w)
    d = _pairs_of(table)
    l_in = tt.shape[0] - 1
    fac = _multiplicity(l_in)
    a = _deflection_weights(pp, fac)
    cgl, c2 = a @ d[(1, 1)], a @ d[(1, -1)]                      # pass 1
    s = 0.25 * (jnp.sum(a) - cgl)
    ell = jnp.arange(l_in + 1)[:, None]                          # pass 2: ℓ down, β across
    xi_t, xi_p, xi_m, xi_x = _correlation_terms(ell, s, c2, _prefactors(l_in), _shifts(s), d)
    f = jnp.where(ell >= 2, fac[:, None], 0.0)
    dxi = jnp.stack([jnp.sum(f * tt[ell] * xi_t, axis=0), jnp.sum(f * ee[ell] * xi_p, axis=0),
                     jnp.sum(f * ee[ell] * xi_m, axis=0), jnp.sum(f * te[ell] * xi_x, axis=0)])
    wd = 2.0 * math.pi * w * dxi                                 # pass 3
    top = slice(0, l_max + 1)
    out = jnp.stack([d[(0, 0)][top] @ wd[0], d[(2, 2)][top] @ wd[1], d[(2, -2)][top] @ wd[2],
                     d[(2, 0)][top] @ wd[3]], axis=1)
    return _assemble(tt, ee, te, out, l_max)


def default_n_beta(l_in: int) -> int:
    """Gauss-Legendre angles for unlensed spectra to ``l_in`` (``N_BETA_EXTRA``)."""
    return int(l_in) + N_BETA_EXTRA


def resolve_method(method: str) -> str:
    """``"recurrence"`` or ``"tables"`` for a ``LENSING_METHODS`` entry (``"auto"``: tables
    where JAX's default backend is a GPU); anything else is refused by name."""
    if method not in LENSING_METHODS:
        raise ValueError(f"lensing method must be one of {LENSING_METHODS}, got {method!r}")
    if method == "auto":
        return "tables" if jax.default_backend() == "gpu" else "recurrence"
    return method


def lensed_spectra(ell, cl: dict, l_max: int, *, n_beta: int | None = None,
                   method: str = "recurrence", wigner=None) -> dict:
    """Lensed TT, EE, TE, BB [same units as the input] at ℓ = 2..l_max (JAX arrays; traceable
    in the C_ℓ).

    ``ell``: (L,) every ℓ from 2 to at least ``input_l_max(l_max)``; ``cl``: unlensed C_ℓ of
    TT, EE, TE (BB taken as 0) and PP (C_ℓ^φφ) on ``ell``. ``method`` (``LENSING_METHODS``,
    module docstring): ``"recurrence"`` (ℓ scans), ``"tables"`` (the process's
    ``WignerTables``: not inside a trace, whose arrays a cached table must not hold) or
    ``"auto"`` (tables where JAX's default backend is a GPU). ``wigner``: a ``WignerTables.d``
    array to use instead (an argument of a traced program: then ``method`` is not read).
    """
    ell = np.asarray(ell, dtype=np.int64)
    if ell[0] != 2 or np.any(np.diff(ell) != 1):
        raise ValueError("lensed_spectra: ell must be every multipole from 2")
    l_in = int(ell[-1])
    if l_in < l_max:
        raise ValueError(f"lensed_spectra: the unlensed spectra stop at {l_in} < l_max = {l_max}")
    full = lambda v: jnp.concatenate([jnp.zeros(2), jnp.asarray(v, jnp.float64)])  # noqa: E731
    tt, ee, te, pp = (full(cl[n]) for n in ("TT", "EE", "TE", "PP"))
    n_beta = int(n_beta or default_n_beta(l_in))
    if wigner is not None:
        if wigner.shape[:2] != (l_in + 1, len(PAIRS)):
            raise ValueError(f"lensed_spectra: a Wigner table of shape {wigner.shape} does not "
                             f"serve unlensed spectra to {l_in} (WignerTables.build({l_in}, "
                             "n_beta) does)")
        return _lensed_tabled(tt, ee, te, pp, wigner, l_max=int(l_max))
    if resolve_method(method) == "tables":
        if isinstance(tt, jax.core.Tracer):
            raise ValueError("lensed_spectra: method='tables' keeps a table for the process and "
                             "cannot be traced (it would become a constant of the program); "
                             "pass its array as wigner=, an argument of the program, or use "
                             "method='recurrence' inside jit, grad or vmap")
        table = WignerTables.cached(l_in, n_beta)
        return _lensed_tabled(tt, ee, te, pp, table.d, l_max=int(l_max))
    return _lensed(tt, ee, te, pp, l_max=int(l_max), n_beta=n_beta)
