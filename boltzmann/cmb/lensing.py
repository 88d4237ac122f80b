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
the explicit sum. Host numpy for now (documented in docs/cmb.md): a JAX scan over ℓ is the
traceable form to come.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["lensed_spectra", "wigner_d_start", "L_EXTRA"]

#: lensed spectra to l_max need the unlensed ones (and φφ) this far beyond it (with 500, lensed TT
#: was 4e-3 off CLASS at ℓ = 2500; with 1000, 4.6e-4 — docs/cmb.md)
L_EXTRA = 1000

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


class _Recurrence:
    """d^ℓ_{mm'}(β) for every pair in PAIRS, advanced one ℓ at a time (ℓ = 0, 1, 2, ...)."""

    def __init__(self, beta):
        self.x = np.cos(beta)
        self.beta = beta
        self.prev = {p: np.zeros_like(beta) for p in PAIRS}
        self.cur = {p: np.zeros_like(beta) for p in PAIRS}
        self.ell = -1

    def advance(self) -> dict:
        """Move to ℓ + 1 and return {pair: d^ℓ_{pair}(β)}."""
        ell = self.ell + 1
        for (m, mp) in PAIRS:
            j = max(abs(m), abs(mp))
            if ell < j:
                continue
            if ell == j:
                new = wigner_d_start(m, mp, self.beta)
            elif j == 0 and ell == 1:   # the recurrence divides by ℓ: d^1_00 = cos β
                new = self.x.copy()
            else:
                L = ell - 1  # from d^L and d^{L-1} to d^{L+1}
                a = (2 * L + 1) * (L * (L + 1) * self.x - m * mp)
                b = (L + 1) * math.sqrt((L * L - m * m) * (L * L - mp * mp))
                c = L * math.sqrt(((L + 1) ** 2 - m * m) * ((L + 1) ** 2 - mp * mp))
                new = (a * self.cur[(m, mp)] - b * self.prev[(m, mp)]) / c
            self.prev[(m, mp)], self.cur[(m, mp)] = self.cur[(m, mp)], new
        self.ell = ell
        return self.cur


def _x_functions(ell, s):
    L = ell * (ell + 1.0)
    x000 = np.exp(-L * s)
    x022 = np.exp(-(L - 5.0) * s)
    sq = lambda v: math.sqrt(max(v, 0.0))  # noqa: E731
    return {
        "000": x000, "d000": -0.25 * L * x000,
        "220": 0.25 * sq((ell + 2) * (ell - 1) * ell * (ell + 1)) * np.exp(-(L - 2.0) * s),
        "022": x022, "d022": -0.25 * (L - 5.0) * x022,
        "121": -0.5 * sq((ell + 2) * (ell - 1)) * np.exp(-(L - 8.0 / 3.0) * s),
        "132": -0.5 * sq((ell + 3) * (ell - 2)) * np.exp(-(L - 20.0 / 3.0) * s),
        "242": 0.25 * sq((ell + 4) * (ell + 3) * (ell - 2) * (ell - 3)) * np.exp(-(L - 10.0) * s),
    }


def lensed_spectra(ell, cl: dict, l_max: int, *, n_beta: int | None = None) -> dict:
    """Lensed TT, EE, TE, BB [same units as the input] at ℓ = 2..l_max.

    ``ell``: (L,) every ℓ from 2 to at least l_max + L_EXTRA; ``cl``: unlensed C_ℓ of TT, EE,
    TE (BB taken as 0) and PP (C_ℓ^φφ) on ``ell``.
    """
    ell = np.asarray(ell, dtype=np.int64)
    if ell[0] != 2 or np.any(np.diff(ell) != 1):
        raise ValueError("lensed_spectra: ell must be every multipole from 2")
    l_in = int(ell[-1])
    if l_in < l_max:
        raise ValueError(f"lensed_spectra: the unlensed spectra stop at {l_in} < l_max = {l_max}")
    full = lambda v: np.concatenate([[0.0, 0.0], np.asarray(v, np.float64)])  # noqa: E731
    tt, ee, te, pp = (full(cl[n]) for n in ("TT", "EE", "TE", "PP"))
    n_beta = n_beta or int(l_in + 1.5 * L_EXTRA)
    mu, w = np.polynomial.legendre.leggauss(n_beta)
    beta = np.arccos(mu)
    fac = (2.0 * np.arange(l_in + 1) + 1.0) / (4.0 * math.pi)

    # pass 1: deflection correlations
    rec = _Recurrence(beta)
    cgl = np.zeros_like(beta)
    cgl2 = np.zeros_like(beta)
    cgl0 = 0.0
    for L in range(l_in + 1):
        d = rec.advance()
        if L >= 1:
            a = fac[L] * L * (L + 1.0) * pp[L]
            cgl += a * d[(1, 1)]
            cgl2 += a * d[(1, -1)]
            cgl0 += a
    s = 0.25 * (cgl0 - cgl)
    c2 = cgl2

    # pass 2: lensed minus unlensed correlation functions
    rec = _Recurrence(beta)
    dxi = {n: np.zeros_like(beta) for n in ("T", "P", "M", "X")}
    for L in range(l_in + 1):
        d = rec.advance()
        if L < 2:
            continue
        X = _x_functions(L, s)
        f = fac[L]
        xi_t = (X["000"] ** 2 - 1.0) * d[(0, 0)] + 8.0 / (L * (L + 1.0)) * c2 * X["d000"] ** 2 \
            * d[(1, -1)] + c2 ** 2 * (X["d000"] ** 2 * d[(0, 0)] + X["220"] ** 2 * d[(2, -2)])
        xi_p = (X["022"] ** 2 - 1.0) * d[(2, 2)] + 2.0 * c2 * X["132"] * X["121"] * d[(3, 1)] \
            + c2 ** 2 * (X["d022"] ** 2 * d[(2, 2)] + X["242"] * X["220"] * d[(4, 0)])
        xi_m = (X["022"] ** 2 - 1.0) * d[(2, -2)] + c2 * (X["121"] ** 2 * d[(1, -1)]
                                                          + X["132"] ** 2 * d[(3, -3)]) \
            + 0.5 * c2 ** 2 * (2.0 * X["d022"] ** 2 * d[(2, -2)] + X["220"] ** 2 * d[(0, 0)]
                               + X["242"] ** 2 * d[(4, -4)])
        xi_x = (X["022"] * X["000"] - 1.0) * d[(2, 0)] + c2 * 2.0 * X["d000"] / math.sqrt(
            L * (L + 1.0)) * (X["121"] * d[(1, 1)] + X["132"] * d[(3, -1)]) \
            + 0.5 * c2 ** 2 * ((2.0 * X["d022"] * X["d000"] + X["220"] ** 2) * d[(2, 0)]
                               + X["220"] * X["242"] * d[(4, -2)])
        dxi["T"] += f * tt[L] * xi_t
        dxi["P"] += f * ee[L] * xi_p
        dxi["M"] += f * ee[L] * xi_m
        dxi["X"] += f * te[L] * xi_x

    # pass 3: back to harmonic space
    rec = _Recurrence(beta)
    out = {n: np.zeros(l_max + 1) for n in ("T", "P", "M", "X")}
    for L in range(l_max + 1):
        d = rec.advance()
        if L < 2:
            continue
        out["T"][L] = 2.0 * math.pi * np.sum(w * dxi["T"] * d[(0, 0)])
        out["P"][L] = 2.0 * math.pi * np.sum(w * dxi["P"] * d[(2, 2)])
        out["M"][L] = 2.0 * math.pi * np.sum(w * dxi["M"] * d[(2, -2)])
        out["X"][L] = 2.0 * math.pi * np.sum(w * dxi["X"] * d[(2, 0)])
    sl = slice(2, l_max + 1)
    return {"TT": tt[sl] + out["T"][sl],
            "EE": ee[sl] + 0.5 * (out["P"][sl] + out["M"][sl]),
            "BB": 0.5 * (out["P"][sl] - out["M"][sl]),
            "TE": te[sl] + out["X"][sl]}
