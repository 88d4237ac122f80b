"""The perturbation model of a cosmology and the inputs of each Fourier mode.

Everything the perturbation stage needs besides the tables: which generated model a cosmology's
species content calls for (``model_for``), the ln a grid the tables live on (``make_grid``), one
parameter row per mode (``mode_rows``), the adiabatic initial state of each mode
(``initial_states``, ``initial_states_at``), the error-control weights (``error_weights``) and
the wavenumbers σ8 needs beyond a short requested range (``sigma8_grid``).
Time variable x = ln a (models/eb.py).

Error control: photon, massless-neutrino and massive-neutrino multipoles are excluded from
step-size control (weight 0); only the metric, CDM and baryons (and a dark-energy fluid) steer the
step size. At late times the hierarchies oscillate ~k/ℋ times per e-fold while carrying no weight
in the metric; the L-stable Rodas5P damps the unresolved part instead of resolving it. Matter and
metric results are unchanged by this to ~1e-6 (docs/perturbations.md), and it removes the
late-time growth of the step count at high k. Transfer functions of the radiation itself (d_g,
d_ur, ...) at late times are therefore not accurate — CLASS's radiation-streaming approximation
makes the same trade — and only matter/metric outputs are claimed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from models.eb import NcdmQuadrature, build_eb_model
from models.initial_conditions import (adiabatic_initial_conditions, initial_time,
                                       radiation_matter)
from solver.caches import Cache

from . import background as bg
from . import constants as const
from . import ncdm as ncdm_mod

__all__ = ["Grid", "make_grid", "model_for", "fluid_form", "switch_times", "mode_rows",
           "initial_states", "initial_states_at",
           "error_weights", "UNCONTROLLED", "BARYON_STATES", "save_times", "check_start_times",
           "sigma8_grid",
           "SIGMA8_K_RANGE_H", "SIGMA8_K_PER_DECADE"]

#: extra e-folds the tables extend beyond a = 1 (Hermite cells need both end nodes)
X_MAX = 0.02

#: generated models by structure: the same function object comes back for every cosmology of one
#: structure, so the solver's compiled plans (keyed by the RHS) are reused across runs
_MODELS = Cache("boltzmann.models", maxsize=16)
#: the neutrino-fluid form of each of those models, by the full model (kept alive with it)
_FLUID_MODELS = Cache("boltzmann.fluid_models", maxsize=16)
#: jitted initial-state programs per (model, start-time criteria)
_ROW_PROGRAMS = Cache("boltzmann.mode_row_programs", maxsize=32)
_INITIAL_STATE_FNS = Cache("boltzmann.initial_states", maxsize=16)


@dataclass(frozen=True)
class Grid:
    """The uniform ln a grid every table is sampled on: nodes x_min + dx·i, i < n.

    thermo_stride: grid cells per Radau step of the recombination equations below z = 3000
    (``boltzmann.thermodynamics``; the nodes between step ends are Hermite-interpolated). It
    belongs to the grid because the tables computed on it depend on it, so every cache keyed by
    the grid tells the strides apart.
    """

    x_min: float
    dx: float
    n: int
    thermo_stride: int = 1

    @property
    def nodes(self) -> np.ndarray:
        return self.x_min + self.dx * np.arange(self.n)


def make_grid(precision) -> Grid:
    """The table grid of a precision: ``bg_n_lna`` nodes from ln ``bg_a_min`` to X_MAX, the
    recombination equations stepped over as many whole cells as fit in ``thermo_ode_step``
    (at least one: a coarse grid keeps a step per cell)."""
    x_min = math.log(precision.bg_a_min)
    n = int(precision.bg_n_lna)
    dx = (X_MAX - x_min) / (n - 1)
    stride = max(1, int(math.floor(float(precision.thermo_ode_step) / dx + 1e-9)))
    return Grid(x_min, dx, n, stride)


def model_for(cosmo, precision, *, de_at_lambda: bool = False):
    """The generated RHS for this cosmology's species content and the precision's ℓmax/n_q.

    ``de_at_lambda``: the dark-energy fluid linearised about Λ, for w0/wa derivatives of a Λ
    cosmology (boltzmann.gradients).  Otherwise a fluid cosmology gets the PPF closure when
    ``cosmo.use_ppf`` (CLASS's default) and the rest-frame fluid equations when not.
    """
    fluid = bool(cosmo.use_fld) and not de_at_lambda
    ppf = fluid and bool(cosmo.use_ppf)
    key = (int(cosmo.n_ncdm), fluid and not ppf, int(precision.l_max_g),
           int(precision.l_max_pol_g), int(precision.l_max_ur), int(precision.l_max_ncdm),
           int(precision.n_q_ncdm), bool(de_at_lambda), ppf)
    return _MODELS.get_or_build(key, lambda: _build_model(*key))


def fluid_form(model, species: str = "ur+ncdm"):
    """The neutrino-fluid form of ``model`` (models/species/neutrino_fluids.py): the same
    parameters and tables, F_ur_0..2 and three fluid variables per massive species in place of
    the hierarchies; a mode continues in it after its switch time (``switch_times``).
    ``species``: which hierarchies give way, "ur", "ncdm" or "ur+ncdm"."""
    if model.neutrino_fluid:
        raise ValueError("fluid_form: the model is already the neutrino-fluid form")

    def build():
        return model, build_eb_model(
            l_max_g=model.l_max_g, l_max_pol_g=model.l_max_pol_g, l_max_ur=model.l_max_ur,
            ncdm=model.ncdm, l_max_ncdm=model.l_max_ncdm, de_fluid=model.de_fluid,
            de_at_lambda=model.de_at_lambda, de_ppf=model.de_ppf, neutrino_fluid=species)
    return _FLUID_MODELS.get_or_build((id(model), species), build)[1]


def switch_times(model, model_table, grid: Grid, k, cosmo_index, k_tau: float) -> np.ndarray:
    """x = ln a (N,) at which each mode reaches k τ = ``k_tau``, from the tables' ln τ column.

    k: (N,) wavenumbers [1/Mpc]; cosmo_index: (N,) each mode's table row. Modes that reach it
    only beyond the grid get +inf (they never switch)."""
    col = list(model.table_columns).index("ln_conformal_time")
    ln_tau = np.asarray(jax.device_get(model_table[:, col, 0, :]))      # (C, n_grid)
    target = math.log(k_tau) - np.log(np.asarray(k, np.float64))
    out = np.full(target.shape, np.inf)
    for c in np.unique(cosmo_index):
        sel = np.asarray(cosmo_index) == c
        inside = sel & (target <= ln_tau[c, -1]) & (target >= ln_tau[c, 0])
        out[inside] = np.interp(target[inside], ln_tau[c], grid.nodes)
    return out


def _build_model(n_ncdm, use_fld, l_max_g, l_max_pol_g, l_max_ur, l_max_ncdm, n_q, de_at_lambda,
                 de_ppf):
    species = []
    for _ in range(n_ncdm):
        q, w, dlnf = ncdm_mod.perturbation_quadrature(n_q)
        species.append(NcdmQuadrature(tuple(map(float, q)), tuple(map(float, w)),
                                      tuple(map(float, dlnf))))
    return build_eb_model(l_max_g=l_max_g, l_max_pol_g=l_max_pol_g, l_max_ur=l_max_ur,
                          ncdm=tuple(species), l_max_ncdm=l_max_ncdm, de_fluid=use_fld,
                          de_at_lambda=de_at_lambda, de_ppf=de_ppf)


def _rows_one(model, cosmo, n_k: int, grid: Grid):
    """(n_k, P) parameter rows of one cosmology with k = 1 and cosmo_row = 0 (filled by the
    caller); traceable in the cosmological parameters."""
    rho = bg.rho_tilde(cosmo, jnp.asarray(1.0))
    values = dict(cosmo_row=0.0, k=1.0, table_x_min=grid.x_min, table_dx=grid.dx,
                  rho_g0=rho["g"], rho_b0=rho["b"], rho_cdm0=rho["cdm"], rho_ur0=rho["ur"])
    for s, quad in enumerate(model.ncdm):
        m_over_t = jnp.asarray(cosmo.m_ncdm)[s] / (const.K_B_EV_PER_K * cosmo.T_ncdm0_K[s])
        eps_sum = jnp.sum(jnp.asarray(quad.weights) * jnp.sqrt(jnp.asarray(quad.q) ** 2
                                                              + m_over_t ** 2))
        values[f"ncdm_norm_{s}"] = rho["ncdm"][s] / eps_sum
        values[f"ncdm_m_over_T_{s}"] = m_over_t
    if model.de_fluid or model.de_at_lambda or model.de_ppf:
        values.update(rho_de0=rho["fld"], w0=cosmo.w0_fld, wa=cosmo.wa_fld, cs2_de=cosmo.cs2_fld)
    missing = [n for n in model.param_names if n not in values]
    if missing:
        raise ValueError(f"mode_rows: no value for model parameter(s) {missing}")
    row = jnp.stack([jnp.asarray(values[name], jnp.float64) for name in model.param_names])
    return jnp.broadcast_to(row, (n_k, row.size))


def mode_rows(model, cosmos, k, grid: Grid):
    """Parameter rows (C·K, P) of every (cosmology, k), cosmology-major, as a JAX array.

    ``cosmos``: a CosmoParams whose leaves carry a leading axis of C cosmologies
    (``boltzmann.ensemble.stack_cosmologies``); ``k``: (C, K) wavenumbers [1/Mpc], concrete.
    Row ``c·K + i`` holds mode k[c, i] of cosmology c, whose ``cosmo_row`` column points at table
    row c. Traceable in the cosmological parameters (the densities, ncdm normalisations and
    fluid parameters enter by differentiable operations).
    """
    k = np.asarray(k, np.float64)
    C, K = k.shape
    key = (id(model), K, grid)

    def build():
        def rows_of(cosmos, k_flat, cosmo_row):
            rows = jax.vmap(lambda c: _rows_one(model, c, K, grid))(cosmos)
            rows = rows.reshape(-1, rows.shape[-1])
            rows = rows.at[:, model.param_index("k")].set(k_flat)
            return rows.at[:, model.param_index("cosmo_row")].set(cosmo_row)
        # one compiled program: run op by op, the rows were a few hundred small dispatches —
        # on a GPU each a kernel launch, a tenth of one P(k)'s time
        return model, jax.jit(rows_of)

    _, program = _ROW_PROGRAMS.get_or_build(key, build)
    return program(cosmos, jnp.asarray(k.reshape(-1)),
                   jnp.asarray(np.repeat(np.arange(C, dtype=np.float64), K)))


def initial_states(model, rows, k_tau_ini: float, omega_tau_ini: float):
    """(x_ini (N,), y0 (N, n)) of the adiabatic growing mode for every parameter row, with the
    start time chosen by the k τ and ω τ criteria of the precision settings."""
    key = (id(model), float(k_tau_ini), float(omega_tau_ini))

    def build():
        def one(p):
            tau, a = initial_time(model, p, ktau_max=k_tau_ini, omtau_max=omega_tau_ini)
            return jnp.log(a), adiabatic_initial_conditions(model, p, tau, a)
        return model, jax.jit(jax.vmap(one))

    _, fn = _INITIAL_STATE_FNS.get_or_build(key, build)
    x0, y0 = fn(jnp.asarray(rows))
    return np.asarray(x0), np.asarray(y0)


def initial_states_at(model, rows, x0):
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
    return jax.vmap(one)(jnp.asarray(rows), jnp.asarray(x0))


def save_times(zs) -> tuple[np.ndarray, list[int]]:
    """(x_save ascending, column of each requested z in x_save): the solver needs ascending save
    times, the results are reported in the order the redshifts were asked for."""
    x_save = np.sort(-np.log1p(np.asarray(zs, np.float64)))
    z_of_col = np.expm1(-x_save)
    return x_save, [int(np.argmin(np.abs(z_of_col - z))) for z in zs]


def solve_order(k, one_launch: bool) -> np.ndarray:
    """Indices of the modes (``k`` flattened over cosmologies) in the order a solve takes them.

    By k, then cosmology, so that neighbouring trajectories take similar step counts: the JAX
    backend's chunks and ``perturbations.chunk_groups`` rely on ascending k. For one GPU launch
    (``one_launch``) the order is reversed: the GPU starts blocks about in index order and the
    high-k modes take the most steps, so starting them first leaves the short ones to fill the
    last wave (longest processing time first) instead of ending on a wave of the longest."""
    order = np.argsort(np.asarray(k, np.float64).reshape(-1), kind="stable")
    return order[::-1].copy() if one_launch else order


def check_start_times(x0, grid: Grid, x_save, precision) -> None:
    """Raise ValueError when a mode would start before the tables or after a save time."""
    x0 = np.asarray(x0)
    if np.any(x0 < grid.x_min):
        raise ValueError(f"precision.bg_a_min = {precision.bg_a_min:g} is above the initial scale "
                         f"factor of the largest k ({np.exp(x0.min()):.3g}); lower it")
    if np.any(x0[:, None] > np.asarray(x_save)[None, :]):
        raise ValueError("a requested redshift lies before the perturbations start; "
                         f"max z allowed here is {np.expm1(-x0.max()):.3g}")


#: state-name prefixes left out of step-size control: every free-streaming hierarchy (and the
#: massive neutrinos' fluid variables that replace theirs inside the horizon), and the
#: dark-energy fluid linearised about Λ (``de_at_lambda``: delta_de_A, theta_de_A, delta_de_B,
#: theta_de_B), which enters the Einstein equations only through factors 1 + w0 - wa and
#: wa (2 - a) that vanish at Λ: the states do not depend on it, only their w0/wa sensitivities
#: do, and resolving its c_s² = 1 sound waves multiplies the steps at high k (docs/gradients.md).
UNCONTROLLED = ("F_g_", "G_g_", "F_ur_", "Psi_", "delta_de_", "theta_de_", "delta_ncdm_",
                "theta_ncdm_", "sigma_ncdm_")
#: the baryon states, whose error weight is the precision key ``baryon_error_weight``
BARYON_STATES = ("delta_b", "theta_b")


def error_weights(model, baryon_weight: float = 1.0) -> np.ndarray:
    """1 for the metric, CDM and fluid variables, ``baryon_weight`` for δ_b and θ_b, 0 for the
    hierarchies and the Λ-linearised fluid (module docstring and UNCONTROLLED).

    ``baryon_weight`` < 1 holds the baryons to a looser tolerance: before recombination they
    oscillate with the photons, and resolving those acoustic oscillations at rtol is what sets
    the step count of the modes above k ≈ 1 h/Mpc (precision key ``baryon_error_weight``,
    docs/perturbations.md)."""
    w = np.ones(model.n)
    for i, name in enumerate(model.state_names):
        if name.startswith(UNCONTROLLED):
            w[i] = 0.0
        elif name in BARYON_STATES:
            w[i] = float(baryon_weight)
    return w


#: the k range [h/Mpc] σ(R = 8 Mpc/h) is integrated over when the requested grid is shorter.
#: On CLASS's ΛCDM P(k), cutting at 5 h/Mpc moves σ8 by 3e-6 against 10 h/Mpc, at 1e-3 h/Mpc by
#: 4e-8 against 1e-4 h/Mpc (1e-2 h/Mpc would cost 2.5e-4); spectra.check_sigma_k_coverage still
#: checks the result
SIGMA8_K_RANGE_H = (1.0e-3, 5.0)
#: points per decade of the modes added for σ8: the request's own density, kept in this interval
#: (20 per decade resolves the baryon wiggles to ~1e-5 in σ8; below 5 the integral is poor)
SIGMA8_K_PER_DECADE = (5.0, 20.0)


def _extend(k: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(k continued down to ``lo`` and up to ``hi`` at the grid's density, index of each
    original point in it)."""
    decades = math.log10(k[-1] / k[0]) if k.size > 1 else 0.0
    density = (k.size - 1) / decades if decades > 0 else SIGMA8_K_PER_DECADE[0]
    density = min(max(density, SIGMA8_K_PER_DECADE[0]), SIGMA8_K_PER_DECADE[1])
    n_lo = int(math.ceil(math.log10(k[0] / lo) * density)) if k[0] > lo else 0
    n_hi = int(math.ceil(math.log10(hi / k[-1]) * density)) if k[-1] < hi else 0
    below = k[0] * 10.0 ** (-np.arange(n_lo, 0, -1) / density)
    above = k[-1] * 10.0 ** (np.arange(1, n_hi + 1) / density)
    return np.concatenate([below, k, above]), np.arange(n_lo, n_lo + k.size)


def sigma8_grid(k, k_h, h) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The wavenumbers to solve so that σ8 has the range it needs, whatever range was asked for.

    k: (C, K) requested wavenumbers [1/Mpc]; k_h: (K,) the same grid in h/Mpc (k = k_h·h per
    cosmology) or None for one grid in 1/Mpc shared by all; h: (C,) the cosmologies' h.
    Returns (k_solve (C, K'), k_h_solve (K',) or None, keep (K,)): the request continued below
    and above to ``SIGMA8_K_RANGE_H`` at its own density (within ``SIGMA8_K_PER_DECADE``), and
    where the requested modes sit in it — P(k) is reported on those, σ8 integrates over all.
    Nothing is added when the request already spans the range.
    """
    k = np.asarray(k, np.float64)
    h = np.asarray(h, np.float64).reshape(-1)
    lo_h, hi_h = SIGMA8_K_RANGE_H
    if k_h is not None:
        k_h_all, keep = _extend(np.asarray(k_h, np.float64), lo_h, hi_h)
        return k_h_all[None, :] * h[:, None], k_h_all, keep
    # one grid in 1/Mpc for every cosmology: the widest range any of them needs
    k_all, keep = _extend(k[0], lo_h * float(h.min()), hi_h * float(h.max()))
    return np.broadcast_to(k_all, (k.shape[0], k_all.size)).copy(), None, keep
