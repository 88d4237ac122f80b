"""The perturbation stage: model, tables, per-mode parameters and initial states, ensemble solve.

Inputs: a ``CosmoParams`` (background densities), a ``ThermoTable`` and a ``PrecisionSpec``.
Output: the model's observables (CLASS-named transfer functions) at the requested redshifts for
every k, plus solver statistics. Time variable x = ln a (models/eb.py). The RHS reads one table
per cosmology (ln ℋ, ln τ, ln κ', c_s² with their x-derivatives, for cubic Hermite interpolation),
filled here from boltzmann.background and boltzmann.thermodynamics on one uniform x grid.

Error control (DESIGN §3): photon, massless-neutrino and massive-neutrino multipoles are
excluded from step-size control (weight 0); only the metric, CDM and baryons (and the DE fluid)
steer the step size. At late times they oscillate ~k/ℋ times per e-fold while carrying no weight in
the metric; the L-stable Rodas5P damps the unresolved part instead of resolving it. The matter and
metric results are unchanged by this to ~1e-6 (docs/perturbations.md), and it removes the
late-time step-count explosion at high k. Transfer functions of the radiation itself (d_g, d_ur,
...) at late times are therefore not accurate — CLASS's radiation-streaming approximation makes
the same trade — and only matter/metric outputs are claimed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from models.eb import NcdmQuadrature, build_eb_model
from models.initial_conditions import (adiabatic_initial_conditions, initial_time,
                                       radiation_matter)
from models.tables import pack_table

from . import background as bg
from . import constants as const
from . import ncdm as ncdm_mod
from .thermodynamics import cumulative_hermite

#: extra e-folds the tables extend beyond a = 1 (Hermite cells need both end nodes)
X_MAX = 0.02


@dataclass(frozen=True)
class Grid:
    x_min: float
    dx: float
    n: int

    @property
    def nodes(self) -> np.ndarray:
        return self.x_min + self.dx * np.arange(self.n)


def make_grid(precision) -> Grid:
    x_min = math.log(precision.bg_a_min)
    n = int(precision.bg_n_lna)
    return Grid(x_min, (X_MAX - x_min) / (n - 1), n)


def build_model(cosmo, precision, *, de_at_lambda: bool = False):
    """The generated RHS for this cosmology's species content and the precision's ℓmax/n_q.

    Cached by structure (number of massive species, fluid or not, ℓmax's, n_q): the same Python
    function object comes back for every cosmology of one structure, so the solver's compiled
    plans (JAX programs, CUDA kernels) are reused across runs.
    """
    return _model_for(int(cosmo.n_ncdm), bool(cosmo.use_fld) and not de_at_lambda,
                      int(precision.l_max_g), int(precision.l_max_pol_g), int(precision.l_max_ur),
                      int(precision.l_max_ncdm), int(precision.n_q_ncdm), bool(de_at_lambda))


@functools.lru_cache(maxsize=16)
def _model_for(n_ncdm, use_fld, l_max_g, l_max_pol_g, l_max_ur, l_max_ncdm, n_q,
               de_at_lambda=False):
    species = []
    for _ in range(n_ncdm):
        q, w, dlnf = ncdm_mod.perturbation_quadrature(n_q)
        species.append(NcdmQuadrature(tuple(map(float, q)), tuple(map(float, w)),
                                      tuple(map(float, dlnf))))
    return build_eb_model(l_max_g=l_max_g, l_max_pol_g=l_max_pol_g, l_max_ur=l_max_ur,
                          ncdm=tuple(species), l_max_ncdm=l_max_ncdm, de_fluid=use_fld,
                          de_at_lambda=de_at_lambda)


def build_table(cosmo, thermo, grid: Grid, model) -> jnp.ndarray:
    """One cosmology's (n_cols, 2, n_grid) table on ``grid`` (values and d/dx)."""
    x = jnp.asarray(grid.nodes)
    a = jnp.exp(x)
    H = bg.hubble(cosmo, a)
    conf_h = a * H
    dlnh = 1.0 + bg.dhubble_dlna(cosmo, a) / H
    # tau(x) = tau(x_0) + int dx / (aH), accumulated along the grid by the Hermite (corrected
    # trapezoid) rule, O(dx^4) ~ 1e-12 relative at the default grid: the direct quadrature at every
    # node (bg.conformal_time, 200 Hubble evaluations per node) cost ~0.5 s per cosmology on the
    # CPU and an XLA GPU compile that stalled when vmapped over cosmologies (docs/benchmarks.md).
    inv_ah = 1.0 / conf_h
    tau = bg.conformal_time(cosmo, a[0]) + cumulative_hermite(grid.dx, inv_ah, -inv_ah * dlnh)
    cols = {
        "ln_conformal_hubble": (jnp.log(conf_h), dlnh),
        "ln_conformal_time": (jnp.log(tau), 1.0 / (conf_h * tau)),
        "ln_kappa_dot": (thermo.ln_kappa_dot, thermo.dln_kappa_dot),
        "cs2_b": (thermo.cs2, thermo.dcs2),
    }
    return jnp.stack([jnp.stack([jnp.asarray(v), jnp.asarray(d)]) for v, d in
                      (cols[name] for name in model.table_columns)])


def mode_param_rows(model, cosmo, k, grid: Grid, cosmo_row: int = 0) -> jnp.ndarray:
    """Parameter rows (len(k), P) for the modes ``k`` [1/Mpc] of one cosmology, as a JAX array.

    Traceable in the cosmological parameters (``cosmo`` may hold tracers): the densities, ncdm
    normalisations and fluid parameters enter the rows by differentiable operations; ``k``, the
    grid and ``cosmo_row`` are structure (concrete).
    """
    rho = bg.rho_tilde(cosmo, jnp.asarray(1.0))
    values = dict(cosmo_row=float(cosmo_row), table_x_min=grid.x_min, table_dx=grid.dx,
                  rho_g0=rho["g"], rho_b0=rho["b"], rho_cdm0=rho["cdm"], rho_ur0=rho["ur"])
    for s, quad in enumerate(model.ncdm):
        m_over_t = jnp.asarray(cosmo.m_ncdm)[s] / (const.K_B_EV_PER_K * cosmo.T_ncdm0_K[s])
        eps_sum = jnp.sum(jnp.asarray(quad.weights) * jnp.sqrt(jnp.asarray(quad.q) ** 2
                                                              + m_over_t ** 2))
        values[f"ncdm_norm_{s}"] = rho["ncdm"][s] / eps_sum
        values[f"ncdm_m_over_T_{s}"] = m_over_t
    if model.de_fluid or model.de_at_lambda:
        values.update(rho_de0=rho["fld"], w0=cosmo.w0_fld, wa=cosmo.wa_fld, cs2_de=1.0)
    k = np.asarray(k, dtype=np.float64)
    missing = [n for n in model.param_names if n != "k" and n not in values]
    if missing:
        raise ValueError(f"mode_param_rows: no value for model parameter(s) {missing}")
    cols = [jnp.asarray(k) if name == "k"
            else jnp.broadcast_to(jnp.asarray(values[name], jnp.float64), k.shape)
            for name in model.param_names]
    return jnp.stack(cols, axis=1)


def mode_params(model, cosmo, k, grid: Grid, cosmo_row: int = 0) -> np.ndarray:
    """Parameter rows (len(k), P) for the modes ``k`` [1/Mpc] of one cosmology (numpy)."""
    return np.asarray(mode_param_rows(model, cosmo, k, grid, cosmo_row))


def initial_states(model, params: np.ndarray, k_tau_ini: float, omega_tau_ini: float):
    """(x_ini (N,), y0 (N, n)) of the adiabatic growing mode for every parameter row."""
    x0, y0 = _initial_states_fn(model, float(k_tau_ini), float(omega_tau_ini))(jnp.asarray(params))
    return np.asarray(x0), np.asarray(y0)


@functools.lru_cache(maxsize=16)
def _initial_states_fn(model, k_tau_ini, omega_tau_ini):
    def one(p):
        tau, a = initial_time(model, p, ktau_max=k_tau_ini, omtau_max=omega_tau_ini)
        return jnp.log(a), adiabatic_initial_conditions(model, p, tau, a)
    return jax.jit(jax.vmap(one))


def initial_states_at(model, params, x0):
    """y0 (N, n) of the adiabatic growing mode at given start times x0 = ln a (N,), traceable.

    For derivatives: the start time is a numerical choice (the solution at later times does not
    depend on it beyond the series' truncation error), so it is held fixed while the parameters
    move, and the conformal time follows from a = sqrt(rho_r0) tau + rho_m0 tau^2 / 4, inverted in
    the cancellation-free form tau = 2 a / (sqrt(rho_r0) + sqrt(rho_r0 + rho_m0 a)).
    """
    def one(p, x):
        rho_r0, rho_m0 = radiation_matter(model, p)
        a = jnp.exp(x)
        tau = 2.0 * a / (jnp.sqrt(rho_r0) + jnp.sqrt(rho_r0 + rho_m0 * a))
        return adiabatic_initial_conditions(model, p, tau, a)
    return jax.vmap(one)(jnp.asarray(params), jnp.asarray(x0))


#: state-name prefixes left out of step-size control: every free-streaming hierarchy, and the
#: dark-energy fluid linearised about Λ (``de_at_lambda``: delta_de_A, theta_de_A, delta_de_B,
#: theta_de_B), which enters the Einstein equations only through factors 1 + w0 - wa and
#: wa (2 - a) that vanish at Λ: the states do not depend on it, only their w0/wa sensitivities
#: do.  Its c_s² = 1 sound waves, resolved, multiplied the steps at k = 10 h/Mpc by 6.9 (924 ->
#: 6394, lcdm.yaml, 2026-11-30; docs/gradients.md).
UNCONTROLLED = ("F_g_", "G_g_", "F_ur_", "Psi_", "delta_de_", "theta_de_")


def error_weights(model) -> np.ndarray:
    """1 for the metric/matter/fluid variables, 0 for the hierarchies and the Λ-linearised fluid
    (see module docstring and UNCONTROLLED).

    Measured on lcdm.yaml (4 modes up to 3 h/Mpc, 2026-11-30): taking the massive-neutrino
    multipoles out of control cut the largest step count from 61219 to 570 and changed P_cb by
    < 2e-6.
    """
    w = np.ones(model.n)
    for i, name in enumerate(model.state_names):
        if name.startswith(UNCONTROLLED):
            w[i] = 0.0
    return w
