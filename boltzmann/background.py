"""Homogeneous background of a flat FLRW universe, in JAX (differentiable in the CosmoParams leaves).

Conventions (CLASS's, Lesgourgues 2011, arXiv:1104.2932): densities are
``rho_tilde_X = 8 pi G rho_X / 3`` in 1/Mpc^2 so that ``H^2 = sum_X rho_tilde_X`` with H in 1/Mpc
(c = 1); conformal time tau and proper time t are in Mpc (divide t by
:data:`boltzmann.constants.GYR_MPC` for Gyr).  Species: photons ``g``, baryons ``b``, cold dark
matter ``cdm``, massless neutrinos ``ur``, massive relics ``ncdm`` (Fermi–Dirac, one row per
species), and either a cosmological constant ``lambda`` or a CPL fluid ``fld`` with
``w(a) = w0 + wa (1 - a)`` (Chevallier & Polarski 2001; Linder 2003), whose continuity equation
integrates exactly to ``rho_fld(a) = rho_fld0 a^(-3 (1 + w0 + wa)) exp(-3 wa (1 - a))``.

Times: ``tau(a) = int_0^a da' / (a'^2 H)`` and ``t(a) = int_0^a da' / (a' H)``.  We integrate in
ln a from ``ln a - 25`` with composite Gauss–Legendre (25 one-e-fold panels x 8 nodes) and add the
part below analytically in radiation domination (``tau = 1 / (a H)``, ``t = 1 / (2 H)`` there; the
matter correction to this piece is ~e^-25 * 3400 e^-25 relative, negligible).  The quadrature error
is below 1e-12 relative (checked in tests against a finer rule).

:class:`BackgroundTable` tabulates everything on a uniform ln a grid with values and ln a
derivatives for cubic Hermite interpolation.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from models.hermite import hermite

from . import constants as const
from . import ncdm as _ncdm
from .params import CosmoParams


_TAU_EFOLDS = 25.0
_TAU_PANELS = 25
_TAU_NODES = 8


# ----------------------------------------------------------------------------- densities
def _rho0(cosmo: CosmoParams):
    """Present-day rho_tilde [1/Mpc^2] of the species with simple scalings."""
    crit = const.RHO_TILDE_CRIT_H2
    return {
        "g": cosmo.omega_g * crit,
        "b": cosmo.omega_b * crit,
        "cdm": cosmo.omega_cdm * crit,
        "ur": cosmo.omega_ur * crit,
        "de": cosmo.Omega_de * cosmo.H0**2,
    }


@jax.jit
def w_fld(cosmo: CosmoParams, a):
    """CPL equation of state ``w(a) = w0 + wa (1 - a)`` (returns -1 when Lambda is used)."""
    a = jnp.asarray(a, dtype=jnp.float64)
    if not cosmo.use_fld:
        return -jnp.ones_like(a)
    return cosmo.w0_fld + cosmo.wa_fld * (1.0 - a)


def _fld_scaling(cosmo: CosmoParams, a):
    """rho_fld(a) / rho_fld(1) for CPL, exact."""
    w0, wa = cosmo.w0_fld, cosmo.wa_fld
    return jnp.exp(-3.0 * (1.0 + w0 + wa) * jnp.log(a) - 3.0 * wa * (1.0 - a))


def ncdm_rho_p(cosmo: CosmoParams, a, nodes=None):
    """``(rho_tilde, p_tilde)`` of every ncdm species, each shaped ``(n_ncdm, *a.shape)``.

    ``nodes``: optional quadrature (q, W) as in :func:`boltzmann.ncdm.fd_integrals` (e.g. the
    perturbation nodes); default the accurate background rule.
    """
    a = jnp.asarray(a, dtype=jnp.float64)
    n = cosmo.n_ncdm
    if n == 0:
        z = jnp.zeros((0,) + a.shape)
        return z, z
    m = jnp.asarray(cosmo.m_ncdm).reshape((n,) + (1,) * a.ndim)
    t0 = cosmo.T_ncdm0_K.reshape((n,) + (1,) * a.ndim)
    deg = jnp.asarray(cosmo.deg_ncdm).reshape((n,) + (1,) * a.ndim)
    return _ncdm.rho_p_ncdm(a[None], m, t0, deg, nodes)


@jax.jit
def rho_tilde(cosmo: CosmoParams, a) -> dict:
    """Densities ``8 pi G rho_X / 3`` [1/Mpc^2] at scale factor(s) ``a``.

    Keys: ``g, b, cdm, ur, ncdm`` (shape ``(n_ncdm, *a.shape)``) and ``lambda`` or ``fld``.
    """
    a = jnp.asarray(a, dtype=jnp.float64)
    r0 = _rho0(cosmo)
    out = {
        "g": r0["g"] / a**4,
        "b": r0["b"] / a**3,
        "cdm": r0["cdm"] / a**3,
        "ur": r0["ur"] / a**4,
        "ncdm": ncdm_rho_p(cosmo, a)[0],
    }
    if cosmo.use_fld:
        out["fld"] = r0["de"] * _fld_scaling(cosmo, a)
    else:
        out["lambda"] = r0["de"] * jnp.ones_like(a)
    return out


@jax.jit
def pressure_tilde(cosmo: CosmoParams, a) -> dict:
    """Pressures ``8 pi G p_X / 3`` [1/Mpc^2], same keys and shapes as :func:`rho_tilde`."""
    a = jnp.asarray(a, dtype=jnp.float64)
    rho = rho_tilde(cosmo, a)
    out = {
        "g": rho["g"] / 3.0,
        "b": jnp.zeros_like(a),
        "cdm": jnp.zeros_like(a),
        "ur": rho["ur"] / 3.0,
        "ncdm": ncdm_rho_p(cosmo, a)[1],
    }
    if cosmo.use_fld:
        out["fld"] = w_fld(cosmo, a) * rho["fld"]
    else:
        out["lambda"] = -rho["lambda"]
    return out


def _total(d: dict):
    tot = 0.0
    for key, v in d.items():
        tot = tot + (jnp.sum(v, axis=0) if key == "ncdm" else v)
    return tot


@jax.jit
def rho_tot(cosmo: CosmoParams, a):
    """Total rho_tilde [1/Mpc^2] (= H^2)."""
    return _total(rho_tilde(cosmo, a))


@jax.jit
def p_tot(cosmo: CosmoParams, a):
    """Total pressure p_tilde [1/Mpc^2]."""
    return _total(pressure_tilde(cosmo, a))


@jax.jit
def hubble(cosmo: CosmoParams, a):
    """Hubble rate H(a) in 1/Mpc."""
    return jnp.sqrt(rho_tot(cosmo, a))


@jax.jit
def conformal_hubble(cosmo: CosmoParams, a):
    """Conformal Hubble rate aH = a'/a (prime: d/dtau) in 1/Mpc."""
    a = jnp.asarray(a, dtype=jnp.float64)
    return a * hubble(cosmo, a)


@jax.jit
def dhubble_dlna(cosmo: CosmoParams, a):
    """dH/dln a = -(3/2) (rho_tot + p_tot) / H (Friedmann + continuity, flat)."""
    return -1.5 * (rho_tot(cosmo, a) + p_tot(cosmo, a)) / hubble(cosmo, a)


# ----------------------------------------------------------------------------- times
def _lna_quadrature(cosmo: CosmoParams, a, integrand):
    """int_{ln a - 25}^{ln a} integrand(a') dln a' by composite Gauss–Legendre, vectorised in a."""
    x, w = np.polynomial.legendre.leggauss(_TAU_NODES)
    edges = np.linspace(-_TAU_EFOLDS, 0.0, _TAU_PANELS + 1)
    lo, hi = edges[:-1, None], edges[1:, None]
    offs = (0.5 * (hi - lo) * x + 0.5 * (hi + lo)).ravel()  # offsets from ln a
    wts = (0.5 * (hi - lo) * w).ravel()
    lna = jnp.log(jnp.asarray(a, dtype=jnp.float64))
    a_nodes = jnp.exp(lna[..., None] + offs)
    return jnp.sum(wts * integrand(a_nodes), axis=-1)


@jax.jit
def conformal_time(cosmo: CosmoParams, a):
    """Conformal time tau(a) = int_0^a da / (a^2 H) in Mpc (see module docstring)."""
    a = jnp.asarray(a, dtype=jnp.float64)
    a_lo = a * np.exp(-_TAU_EFOLDS)
    tail = 1.0 / (a_lo * hubble(cosmo, a_lo))
    return tail + _lna_quadrature(cosmo, a, lambda ax: 1.0 / (ax * hubble(cosmo, ax)))


@jax.jit
def proper_time(cosmo: CosmoParams, a):
    """Proper (cosmic) time t(a) = int_0^a da / (a H) in Mpc; divide by constants.GYR_MPC for Gyr."""
    a = jnp.asarray(a, dtype=jnp.float64)
    a_lo = a * np.exp(-_TAU_EFOLDS)
    tail = 0.5 / hubble(cosmo, a_lo)
    return tail + _lna_quadrature(cosmo, a, lambda ax: 1.0 / hubble(cosmo, ax))


def conformal_age(cosmo: CosmoParams):
    """tau_0 = tau(a = 1) in Mpc."""
    return conformal_time(cosmo, 1.0)


def age_gyr(cosmo: CosmoParams):
    """Age of the universe t(a = 1) in Gyr."""
    return proper_time(cosmo, 1.0) / const.GYR_MPC


def comoving_distance(cosmo: CosmoParams, a):
    """Comoving (radial) distance tau_0 - tau(a) in Mpc (flat)."""
    return conformal_age(cosmo) - conformal_time(cosmo, a)


# ----------------------------------------------------------------------------- table
@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class BackgroundTable:
    """Background quantities on a uniform ln a grid, with d/dln a, for cubic Hermite interpolation.

    ``lna = lna_min + i * dlna``, i = 0..n-1 (``lna_min``, ``dlna``, ``n`` are static).
    ``values[name]`` and ``derivs[name]`` have shape ``(n,)`` or ``(n_ncdm, n)`` for ncdm entries.
    Names: ``H`` (1/Mpc), ``aH`` (1/Mpc), ``tau`` (Mpc), ``t`` (Mpc), ``rho_tot``, ``p_tot``,
    ``rho_ncdm``, ``p_ncdm`` (1/Mpc^2), ``w_fld``.
    """

    values: dict
    derivs: dict
    lna_min: float
    dlna: float
    n: int

    def tree_flatten(self):
        return (self.values, self.derivs), (self.lna_min, self.dlna, self.n)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], children[1], *aux)

    @property
    def lna(self):
        return self.lna_min + self.dlna * jnp.arange(self.n)

    def interp(self, name: str, lna):
        """Cubic Hermite interpolation of ``name`` at ``lna`` (any shape; clamped to the grid).

        For ncdm entries the result has shape ``(n_ncdm, *lna.shape)``.
        """
        lna = jnp.asarray(lna, dtype=jnp.float64)
        s = (lna - self.lna_min) / self.dlna
        i = jnp.clip(jnp.floor(s).astype(jnp.int32), 0, self.n - 2)
        u = jnp.clip(s - i, 0.0, 1.0)
        y, dy = self.values[name], self.derivs[name]
        y0, y1 = y[..., i], y[..., i + 1]
        d0, d1 = dy[..., i] * self.dlna, dy[..., i + 1] * self.dlna
        u2, u3 = u * u, u * u * u
        h00 = 2 * u3 - 3 * u2 + 1
        h10 = u3 - 2 * u2 + u
        h01 = -2 * u3 + 3 * u2
        h11 = u3 - u2
        return h00 * y0 + h10 * d0 + h01 * y1 + h11 * d1

    def lna_of_tau(self, tau):
        """Inverse of tau(ln a) by Newton iteration on the Hermite interpolant (tau increasing)."""
        tau = jnp.asarray(tau, dtype=jnp.float64)
        tau_nodes = self.values["tau"]
        i = jnp.clip(jnp.searchsorted(tau_nodes, tau) - 1, 0, self.n - 2)
        # linear start inside the bracketing interval, then Newton with dtau/dlna = 1/(aH)
        t0, t1 = tau_nodes[i], tau_nodes[i + 1]
        lna = self.lna_min + self.dlna * (i + (tau - t0) / (t1 - t0))
        for _ in range(4):
            lna = lna - (self.interp("tau", lna) - tau) * self.interp("aH", lna)
        return lna


@partial(jax.jit, static_argnames=("a_min", "n", "lna_max"))
def background_table(cosmo: CosmoParams, a_min: float = 1e-10, n: int = 2000,
                     lna_max: float = 0.05) -> BackgroundTable:
    """Tabulate the background on ``n`` uniform ln a nodes from ``ln(a_min)`` to ``lna_max``.

    ``tau`` and ``t`` are accumulated panel by panel (4-node Gauss–Legendre per grid interval)
    from their values at ``a_min``; other entries are evaluated directly and their ln a
    derivatives come from forward-mode AD, so the table is exact at the nodes and differentiable
    in ``cosmo``.
    """
    if not (a_min > 0 and np.log(a_min) < lna_max):
        raise ValueError(f"background_table: need 0 < a_min < exp(lna_max), got a_min={a_min}, "
                         f"lna_max={lna_max}")
    if not (isinstance(n, (int, np.integer)) and n >= 4):
        raise ValueError(f"background_table: n must be an integer >= 4, got {n!r}")
    lna_min = float(np.log(a_min))
    dlna = (lna_max - lna_min) / (n - 1)
    lna = lna_min + dlna * jnp.arange(n)

    def direct(lna_):
        a = jnp.exp(lna_)
        h = hubble(cosmo, a)
        rho_n, p_n = ncdm_rho_p(cosmo, a)
        return {"H": h, "aH": a * h, "rho_tot": rho_tot(cosmo, a), "p_tot": p_tot(cosmo, a),
                "rho_ncdm": rho_n, "p_ncdm": p_n, "w_fld": w_fld(cosmo, a)}

    values, derivs = jax.jvp(direct, (lna,), (jnp.ones_like(lna),))
    values, derivs = dict(values), dict(derivs)

    # cumulative tau and t: 4-node GL on each interval [lna_i, lna_i+1]
    x, w = np.polynomial.legendre.leggauss(4)
    nodes = lna[:-1, None] + 0.5 * dlna * (x + 1.0)
    a_nodes = jnp.exp(nodes)
    h_nodes = hubble(cosmo, a_nodes)
    dtau = 0.5 * dlna * jnp.sum(w / (a_nodes * h_nodes), axis=-1)
    dt = 0.5 * dlna * jnp.sum(w / h_nodes, axis=-1)
    tau0 = conformal_time(cosmo, a_min)
    t0 = proper_time(cosmo, a_min)
    values["tau"] = tau0 + jnp.concatenate([jnp.zeros(1), jnp.cumsum(dtau)])
    values["t"] = t0 + jnp.concatenate([jnp.zeros(1), jnp.cumsum(dt)])
    derivs["tau"] = 1.0 / values["aH"]
    derivs["t"] = 1.0 / values["H"]
    return BackgroundTable(values=values, derivs=derivs, lna_min=lna_min, dlna=float(dlna), n=n)


# ----------------------------------------------------------------------------- growth
#: RK4 steps of ``growth_factor`` over ln a from 1e-8 to 1: D and f within 7e-8 of 16000 steps
#: (configs/lcdm.yaml, z ≤ 1000), far below their 3e-6 agreement with CLASS. The solve is a
#: sequential scan whose every step evaluates the massive neutrinos' densities, run on the host
#: for each P(k) and, along every parameter, for each Jacobian: 4000 steps took 23 ms of a value
#: and 37 ms of a Jacobian's inputs on the 2-core CPU, 500 take 2.4 ms (docs/benchmarks.md).
GROWTH_STEPS = 500


@partial(jax.jit, static_argnames=("a_ini", "n"))
def growth_factor(cosmo: CosmoParams, a, a_ini: float = 1e-8, n: int = GROWTH_STEPS):
    """Scale-independent linear growth: ``(D(a), f(a))`` with ``D(1) = 1`` and ``f = dlnD/dlna``.

    Solves ``D'' + (2 + dlnH/dlna) D' = (3/2) Omega_M(a) D`` (primes: d/dln a) with
    ``Omega_M = (rho_b + rho_cdm) / H^2`` -- the same source term as CLASS's ``gr.fac. D`` column
    (massive neutrinos and radiation enter only through H) -- from the Meszaros growing mode
    ``D ∝ 1 + 3y/2``, ``y = rho_M / rho_rad`` at ``a_ini`` (Meszaros 1974), by classical RK4 on
    ``n`` uniform ln a steps, then cubic Hermite interpolation.  An approximation for massive
    neutrino cosmologies; the exact, scale-dependent growth comes from the perturbations.
    """
    a = jnp.asarray(a, dtype=jnp.float64)
    lna_grid = jnp.linspace(np.log(a_ini), 0.0, n)
    step = -np.log(a_ini) / (n - 1)

    def rhs(x, y):
        ax = jnp.exp(x)
        rho = rho_tilde(cosmo, ax)
        h2 = rho_tot(cosmo, ax)
        dlnh = dhubble_dlna(cosmo, ax) / jnp.sqrt(h2)
        return jnp.stack([y[1], -(2.0 + dlnh) * y[1] + 1.5 * (rho["b"] + rho["cdm"]) / h2 * y[0]])

    rho_i = rho_tilde(cosmo, a_ini)
    y_rat = (rho_i["b"] + rho_i["cdm"]) / (rho_i["g"] + rho_i["ur"] + jnp.sum(rho_i["ncdm"]))
    y0 = jnp.stack([1.0 + 1.5 * y_rat, 1.5 * y_rat])

    def rk4(y, x):
        k1 = rhs(x, y)
        k2 = rhs(x + step / 2, y + step / 2 * k1)
        k3 = rhs(x + step / 2, y + step / 2 * k2)
        k4 = rhs(x + step, y + step * k3)
        y_new = y + step / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return y_new, y_new

    _, ys = jax.lax.scan(rk4, y0, lna_grid[:-1])
    ys = jnp.concatenate([y0[None], ys])            # (n, 2): D, dD/dlna
    dys = jax.vmap(rhs)(lna_grid, ys)               # (n, 2): dD/dlna, d2D/dlna2
    s_idx = (jnp.log(a) - np.log(a_ini)) / step
    i = jnp.clip(jnp.floor(s_idx).astype(jnp.int32), 0, n - 2)
    u = jnp.clip(s_idx - i, 0.0, 1.0)
    d_val = hermite(u, step, ys[i, 0], dys[i, 0], ys[i + 1, 0], dys[i + 1, 0])
    dp_val = hermite(u, step, ys[i, 1], dys[i, 1], ys[i + 1, 1], dys[i + 1, 1])
    return d_val / ys[-1, 0], dp_val / d_val


__all__ = [
    "w_fld", "ncdm_rho_p", "rho_tilde", "pressure_tilde", "rho_tot", "p_tot", "hubble",
    "conformal_hubble", "dhubble_dlna", "conformal_time", "proper_time", "conformal_age",
    "age_gyr", "comoving_distance", "BackgroundTable", "background_table", "growth_factor",
    "GROWTH_STEPS",
]
