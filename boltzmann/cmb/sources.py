"""Line-of-sight sources of the CMB from the synchronous-gauge perturbations, on a (k, τ) grid.

Temperature (Seljak & Zaldarriaga 1996 in synchronous gauge, integrated by parts so that no
time derivative of a tight-coupling quantity is needed; units of Θ = δT/T, MB95 multipoles
F_ℓ = 4Θ_ℓ, Π = F_2 + G_0 + G_2):

    Θ_ℓ(k) = ∫ dτ [S_0 j_ℓ(x) + S_1 j_ℓ'(x) + S_2 j_ℓ''(x)],   x = k(τ0 - τ),
    S_0 = g (δ_γ/4 + α') + e^{-κ} (φ' + ψ') + g Π/16      (SW, early/late ISW, polarisation)
    S_1 = g (θ_b/k + k α)                                  (Doppler: (g θ_b^{Newt}/k²)' by parts)
    S_2 = (3/16) g Π                                       ((3/4k²)(gΠ_SZ)'' by parts)

with α = (h' + 6η')/(2k²) (the synchronous-to-Newtonian time shift), g = κ' e^{-κ} the
visibility, e^{-κ} the transmission; δ_γ/4 + α' = Θ_0 + ψ in Newtonian gauge and
θ_b/k² + α = θ_b^{Newt}/k². E polarisation: Δ_E,ℓ = √((ℓ+2)!/(ℓ-2)!) ∫ dτ S_E j_ℓ(x)/x²,
S_E = (3/16) g Π. Lensing potential: ψ_ℓ(k) = ∫ dτ S_φ j_ℓ(x), S_φ = -(φ+ψ)(τ - τ_*)/((τ0 - τ)
(τ0 - τ_*)) for τ > τ_* (τ_* = τ_rec, the maximum of g), 0 before.

φ' + ψ' is the exact derivative along the solution: the jvp of the model's observables with the
rhs as the state tangent. Everything else is one of the model's observables (models/species:
alpha, alpha_prime, Pi_g, d_g, t_b, phi, psi).

Solver: photon multipoles are normally outside error control (boltzmann.modes). Modes below
``k_photon_control`` keep F_γ0..2 and G_γ0..2 in it to the end — they see the reionisation
rescattering, whose sources need the photon monopole and quadrupole late. Above it the photon
moments after ``z_streaming`` (long after decoupling, kτ ≫ 1) are replaced in the sources by
their free-streaming values, Θ_0 + ψ → 0 and Π → 0 (the non-oscillating solution; CLASS's
radiation-streaming approximation makes the same replacement).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from models.hermite import hermite_interp, hermite_panels
from solver import solve
from solver.backends.registry import resolve_backend
from solver.caches import Cache

from .. import modes
from .sampling import ClSampling, lensing_wavenumbers, source_times, source_wavenumbers

__all__ = ["SourceGrid", "SourcePlan", "compute_sources", "source_plan", "source_background",
           "source_program", "evaluate_sources", "error_weights", "transmission_and_visibility",
           "PHOTON_CONTROL"]

#: photon states kept in error control by the modes below ``ClSampling.k_photon_control``
PHOTON_CONTROL = ("F_g_0", "F_g_1", "F_g_2", "G_g_0", "G_g_1", "G_g_2")
#: modes per solver call on the JAX backend (every call the same size: one compiled program);
#: the CUDA backend solves every mode in one launch, each with its group's row of weights
CHUNK = 32


@dataclass(frozen=True)
class SourceGrid:
    """Sources of one cosmology on K source modes × S conformal times.

    k: (K,) [1/Mpc]; tau: (S,) conformal times [Mpc], ascending, the last one τ0; x: (S,) ln a;
    tau0, tau_rec [Mpc]; t0, t1, t2, e, phi: (K, S) the sources S_0, S_1, S_2, S_E, S_φ (module
    docstring); status, n_accepted: (K,) of the solver; n_cmb: the first n_cmb modes are the
    CMB grid (0: all), the rest extend S_φ to the larger k of the lensing potential's Limber integral.
    """

    k: np.ndarray
    tau: jnp.ndarray
    x: np.ndarray
    tau0: float
    tau_rec: float
    t0: jnp.ndarray
    t1: jnp.ndarray
    t2: jnp.ndarray
    e: jnp.ndarray
    phi: jnp.ndarray
    status: np.ndarray
    n_accepted: np.ndarray
    n_cmb: int = 0


def _column(model, table_row, name):
    c = model.table_columns.index(name)
    return table_row[c, 0], table_row[c, 1]


def transmission_and_visibility(model, table_row, grid):
    """(κ, dκ/dx) at the table nodes: the optical depth from x to today, κ = ∫_x^0 κ'/ℋ dx'."""
    lkd, dlkd = _column(model, table_row, "ln_kappa_dot")
    lch, dlch = _column(model, table_row, "ln_conformal_hubble")
    q = jnp.exp(lkd - lch)
    dq = q * (dlkd - dlch)
    tail = jnp.cumsum(hermite_panels(grid.dx, q, dq)[::-1])[::-1]
    to_end = jnp.concatenate([tail, jnp.zeros(1)])
    nodes = jnp.asarray(grid.nodes)
    kappa = to_end - hermite_interp(nodes, to_end, -q, 0.0)
    return kappa, -q


def _background_at(model, table_row, grid, x):
    """(τ, e^{-κ}, g = κ' e^{-κ}) at x."""
    nodes = jnp.asarray(grid.nodes)
    kappa, dkappa = transmission_and_visibility(model, table_row, grid)
    exp_mk = jnp.exp(-hermite_interp(nodes, kappa, dkappa, x))
    lkd, dlkd = _column(model, table_row, "ln_kappa_dot")
    ltau, dltau = _column(model, table_row, "ln_conformal_time")
    g = jnp.exp(hermite_interp(nodes, lkd, dlkd, x)) * exp_mk
    tau = jnp.exp(hermite_interp(nodes, ltau, dltau, x))
    return tau, exp_mk, g


def _background_program(model, grid):
    """``_background_at`` for one model and grid as one compiled program of (table_row, x): the
    sampling plan and the sources' background call it eagerly, where its ~150 small operations
    would each be dispatched on their own (slow on a GPU)."""
    return _PROGRAMS.get_or_build(("background", id(model), grid), lambda: (model, jax.jit(
        lambda table_row, x: _background_at(model, table_row, grid, x))))[1]


def _sound_horizon(rows, model, tau, x):
    """r_s(τ) = ∫ dτ / sqrt(3(1 + R)), R = 3ρ_b/(4ρ_γ), on host arrays (sampling only)."""
    p = np.asarray(rows[0])
    ratio = 0.75 * p[model.param_index("rho_b0")] / p[model.param_index("rho_g0")]
    cs = 1.0 / np.sqrt(3.0 * (1.0 + ratio * np.exp(x)))
    return float(np.sum(0.5 * (cs[1:] + cs[:-1]) * np.diff(tau)) + tau[0] * cs[0])


def source_terms(model, y, x, p, tab, exp_mk, g, tau, tau0, tau_rec, streaming):
    """(S_0, S_1, S_2, S_E, S_φ) of one mode at one time: the states y (an (n,) array, or a
    tuple of n scalars, as ``source_states`` traces it) at x = ln a, the mode's parameter row p,
    given e^{-κ}, g, τ, τ0, τ_*, streaming."""
    obs = model.observables(y, x, p, tab)
    k = p[model.param_index("k")]

    def phi_psi(yy, xx):
        o = model.observables(yy, xx, p, tab)
        return o["phi"] + o["psi"]

    rates = model.rhs(y, x, p, tab)
    dy = tuple(jnp.asarray(r, jnp.float64) for r in rates) if isinstance(y, tuple) \
        else jnp.stack(rates)
    pp, dpp_dx = jax.jvp(phi_psi, (y, x), (dy, jnp.ones_like(x)))
    dpp = dpp_dx * obs["conformal_hubble"]
    pi = jnp.where(streaming, 0.0, obs["Pi_g"])
    sw = jnp.where(streaming, 0.0, 0.25 * obs["d_g"] + obs["alpha_prime"])
    t0 = g * (sw + pi / 16.0) + exp_mk * dpp
    t1 = g * (obs["t_b"] / k + k * obs["alpha"])
    t2 = 0.1875 * g * pi
    chi = tau0 - tau
    w = jnp.where((tau > tau_rec) & (chi > 0), -(tau - tau_rec) / (jnp.where(
        chi > 0, chi, 1.0) * (tau0 - tau_rec)), 0.0)
    return t0, t1, t2, t2, pp * w


def _source_program(model):
    """(K·S)-vectorised sources of states y at (x, p), given e^{-κ}, g, τ, τ0, τ_*, streaming."""
    one = functools.partial(source_terms, model)
    per_time = jax.vmap(one, in_axes=(0, 0, None, None, 0, 0, 0, None, None, 0))
    return jax.jit(jax.vmap(per_time, in_axes=(0, None, 0, None, None, None, None, None, None, 0)))


_PROGRAMS = Cache("boltzmann.cmb.sources", maxsize=8)


def error_weights(model, photon_control: bool) -> np.ndarray:
    """The solver's error weights of a group of CMB modes: the model's own with the baryons at
    full weight (θ_b at recombination is the Doppler source; the P(k) modes' looser
    ``baryon_error_weight`` is not applied), plus ``PHOTON_CONTROL`` for the modes below
    ``k_photon_control``."""
    w = modes.error_weights(model, baryon_weight=1.0)
    if photon_control:
        for name in PHOTON_CONTROL:
            w[model.index(name)] = 1.0
    return w


@dataclass(frozen=True)
class SourcePlan:
    """The host-side choices of a source computation, made once at a fiducial cosmology and held
    fixed under derivatives: the modes ``k`` [1/Mpc] (the first ``n_cmb`` the CMB grid), their
    start times ``x0`` (ln a), the source samples ``x`` (ln a; ``tau_fid`` their conformal times
    [Mpc] at the fiducial cosmology, ``tau0_fid`` today's), ``x_rec`` (the maximum of the
    visibility, where the lensing kernel starts; ``tau_rec_fid`` its conformal time), ``low`` (the modes that keep their photons in
    error control) and ``streaming`` (K, S) (the samples whose photon sources take their
    free-streaming values)."""

    k: np.ndarray
    n_cmb: int
    x0: np.ndarray
    x: np.ndarray
    tau_fid: np.ndarray
    tau0_fid: float
    x_rec: float
    tau_rec_fid: float
    low: np.ndarray
    streaming: np.ndarray

    def error_weight_rows(self, model) -> np.ndarray:
        """(K, n) the solver's error weights of every mode (``error_weights`` of its group): one
        solve takes both groups, each mode with its own row."""
        rows = {c: error_weights(model, c) for c in (True, False)}
        return np.stack([rows[bool(c)] for c in self.low])

    def launches(self, backend) -> list:
        """[(mode indices, the same padded to the chunk size by repeating the last)]: the calls
        of a plain solve, both groups together with per-mode error weights. The CUDA backend
        takes every mode in one launch (a warp per mode: the launch lasts as long as its
        slowest mode, so one launch instead of one per group halves the solve); the JAX
        backend ``CHUNK`` modes a call (one compiled size)."""
        K = self.k.size
        size = K if resolve_backend(backend).name == "cuda" else CHUNK
        out = []
        for c in range(0, K, size):
            idx = np.arange(c, min(c + size, K))
            out.append((idx, np.concatenate([idx, np.full(size - idx.size, idx[-1])])))
        return out

    def groups(self):
        """(mode indices, photons in error control) of the two solver groups."""
        return ((np.nonzero(self.low)[0], True), (np.nonzero(~self.low)[0], False))

    def chunks(self, backend) -> list:
        """[(mode indices, the same padded to the chunk size by repeating the last, photons in
        error control: True, False, or None for each mode its group's row)]: the calls of a
        solve with tangents. The CUDA backend takes every mode in one launch, each with its
        group's row of error weights, highest k first (a mode's directions are several blocks,
        so the launch is several waves of the GPU: ``modes.solve_order``); the JAX backend one
        group at a time, ``CHUNK`` modes a call (one compiled size, one row of weights)."""
        if resolve_backend(backend).name == "cuda":
            idx = modes.solve_order(self.k, True)
            return [(idx, idx, None)]
        out = []
        for group, controlled in self.groups():
            for c in range(0, group.size, CHUNK):
                idx = group[c:c + CHUNK]
                out.append((idx, np.concatenate([idx, np.full(CHUNK - idx.size, idx[-1])]),
                            controlled))
        return out


def source_plan(table_row, cosmos, precision, model, grid, l_max: int, *,
                sampling: ClSampling = ClSampling(), lensing_modes: bool = False) -> SourcePlan:
    """The sampling of the sources of the first cosmology of ``cosmos`` (``table_row``: its model
    table) for multipoles up to ``l_max`` (module docstring; boltzmann.cmb.sampling)."""
    ltau, _ = _column(model, table_row, "ln_conformal_time")
    tau_nodes = np.exp(np.asarray(ltau))
    x_nodes = grid.nodes
    # recombination (maximum of g) and the start of the sources, on the table nodes
    background = _background_program(model, grid)
    _, _, g_nodes = background(table_row, jnp.asarray(x_nodes))
    g_nodes = np.asarray(g_nodes)
    early = x_nodes < -math.log(101.0)
    i_rec = int(np.argmax(np.where(early, g_nodes, -np.inf)))
    tau_rec = float(tau_nodes[i_rec])
    i_start = int(np.argmax(g_nodes > sampling.visibility_start * g_nodes[i_rec]))
    tau, x = source_times(tau_nodes, x_nodes, tau_rec, float(tau_nodes[i_start]), sampling)
    tau0 = float(tau[-1])
    probe = np.asarray(modes.mode_rows(model, cosmos, np.ones((1, 1)), grid))
    r_s = _sound_horizon(probe, model, tau_nodes[: i_rec + 1], x_nodes[: i_rec + 1])
    k = source_wavenumbers(l_max, tau0, r_s, sampling)
    n_cmb = k.size
    if lensing_modes:
        k = np.concatenate([k, lensing_wavenumbers(float(k[-1]), sampling)])
    rows = np.asarray(modes.mode_rows(model, cosmos, k[None, :], grid))
    x0, _ = modes.initial_states(model, rows, precision.k_tau_ini, precision.omega_tau_ini)
    modes.check_start_times(x0, grid, x, precision)
    low = k < sampling.k_photon_control
    streaming = (~low[:, None]) & (x[None, :] > -math.log1p(sampling.z_streaming))
    # τ at the samples as the stages evaluate it (the table's Hermite interpolation), so that
    # the grids chosen from it and the traced τ agree at the fiducial cosmology
    tau_h = np.asarray(background(table_row, jnp.asarray(x))[0])
    return SourcePlan(k=k, n_cmb=n_cmb, x0=np.asarray(x0, np.float64), x=x, tau_fid=tau_h,
                      tau0_fid=float(tau_h[-1]), x_rec=float(x_nodes[i_rec]),
                      tau_rec_fid=tau_rec, low=low, streaming=streaming)


def source_background(model, table_row, grid, plan: SourcePlan) -> dict:
    """{tau, exp_mk, g: (S,) at the samples; tau0, tau_rec: ()} from the model table (traceable:
    the samples are fixed in ln a, their τ follow the cosmology)."""
    x = jnp.concatenate([jnp.asarray(plan.x), jnp.asarray([plan.x_rec])])
    tau, exp_mk, g = _background_program(model, grid)(table_row, x)
    return {"tau": tau[:-1], "exp_mk": exp_mk[:-1], "g": g[:-1], "tau0": tau[-2],
            "tau_rec": tau[-1]}


def source_program(model):
    """The compiled (K, S)-vectorised sources (``_source_program``), one per model."""
    return _PROGRAMS.get_or_build(id(model), lambda: (model, _source_program(model)))[1]


def evaluate_sources(program, ys, x, rows, table, bg: dict, streaming):
    """(S_0, S_1, S_2, S_E, S_φ), each (K, S), of states ys (K, S, n) at the samples x (S,)
    (traceable; ``streaming`` (K, S) as in SourcePlan)."""
    return program(ys, jnp.asarray(x), rows, table, bg["exp_mk"], bg["g"], bg["tau"],
                   bg["tau0"], bg["tau_rec"], jnp.asarray(streaming))


def _solve_side_by_side(run, launches) -> list:
    """``run`` on every launch, in order. On a CPU of two or more cores (the JAX backend's
    chunks) two at a time after the first, which compiles the program alone: XLA:CPU runs one
    lock-step loop mostly on one core, so two executions side by side use both (as the P(k)
    Jacobian's chunk groups do: ``gradients_ahead.parallel_solves``)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..gradients_ahead import parallel_solves

    workers = parallel_solves()
    if workers < 2 or len(launches) < 3:
        return [run(launch) for launch in launches]
    first = run(launches[0])
    jax.block_until_ready(first.ys)
    with ThreadPoolExecutor(workers, "boltzmann-sources") as pool:
        return [first] + list(pool.map(lambda launch: _finished(run(launch)), launches[1:]))


def _finished(sol):
    """``sol`` once its arrays are computed (a thread's solve is timed by its own wait)."""
    jax.block_until_ready(sol.ys)
    return sol


def compute_sources(tables, cosmos, precision, model, l_max: int, *,
                    sampling: ClSampling = ClSampling(), lensing_modes: bool = False,
                    backend="auto", max_steps: int = 200_000) -> SourceGrid:
    """Solve the CMB modes of the first cosmology of ``tables``/``cosmos`` and evaluate the
    sources on the (k, τ) grid of ``sampling`` for multipoles up to ``l_max`` (with
    ``lensing_modes``, plus the lensing potential's extra modes)."""
    grid = tables.grid
    table_row = jnp.asarray(tables.model_table)[0]
    plan = source_plan(table_row, cosmos, precision, model, grid, l_max, sampling=sampling,
                       lensing_modes=lensing_modes)
    k, x = plan.k, plan.x
    rows = np.asarray(modes.mode_rows(model, cosmos, k[None, :], grid))
    x0, y0 = modes.initial_states(model, rows, precision.k_tau_ini, precision.omega_tau_ini)

    solved = []                  # states stay where the solver put them (the GPU): no copy
    status = np.empty(k.size, int)
    n_acc = np.empty(k.size, int)
    weights = plan.error_weight_rows(model)

    def run(launch):
        _, pad = launch
        return solve(model.rhs, y0[pad], x, rows[pad], args=tables.model_table, t0=x0[pad],
                     rtol=min(sampling.rtol, precision.rtol), atol=precision.atol,
                     error_weights=weights[pad], backend=backend, max_steps=int(max_steps))

    launches = plan.launches(backend)
    for (idx, _), sol in zip(launches, _solve_side_by_side(run, launches)):
        m = idx.size
        solved.append(sol.ys[:m])
        status[idx] = np.asarray(sol.status)[:m]
        n_acc[idx] = np.asarray(sol.n_accepted)[:m]

    bg = source_background(model, table_row, grid, plan)
    ys = solved[0] if len(solved) == 1 else jnp.concatenate([jnp.asarray(y) for y in solved])
    t0, t1, t2, e, phi = evaluate_sources(source_program(model), ys, x, jnp.asarray(rows),
                                          tables.model_table, bg, plan.streaming)
    return SourceGrid(k=k, tau=bg["tau"], x=x, tau0=float(bg["tau0"]), tau_rec=float(bg["tau_rec"]),
                      t0=t0, t1=t1, t2=t2, e=e, phi=phi, status=status, n_accepted=n_acc,
                      n_cmb=plan.n_cmb)
