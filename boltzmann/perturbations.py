"""Stage 2: the perturbations of every (cosmology, k) mode, solved in one ensemble.

``compute_perturbations(tables, cosmos, k, z, precision, model)`` builds each mode's parameter
row and adiabatic initial state (boltzmann.modes), integrates all modes with ``solver.solve``
(modes sorted by k, so that neighbouring trajectories — one GPU warp — take similar step counts)
and evaluates the model's observables (CLASS-named transfer functions) at the requested
redshifts. ``differentiable_transfers`` is the same stage as a traceable function of the tables
and parameters, through ``solver.solve_diff`` (forward sensitivities), for boltzmann.gradients.

Both return the transfer functions in one layout: cosmology × redshift × k.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from solver import describe, solve, solve_diff, solve_with_tangents
from solver.backends.registry import resolve_backend
from solver.caches import Cache

from . import fluid_phases, modes
from .progress import null_progress

__all__ = ["Transfers", "compute_perturbations", "differentiable_transfers", "mode_inputs",
           "solve_modes", "solve_modes_with_tangents", "transfers_of_states", "observables",
           "MAX_STEPS", "N_CHUNKS_JAX", "chunk_groups"]

#: step limit of each mode (the slowest sensitivity directions take ~7000 steps at
#: k = 1 h/Mpc in the default model; plain modes under 1000)
MAX_STEPS = 200_000
#: the JAX backend solves the modes in this many lock-step launches, sorted by k: a launch
#: steps all its modes until its slowest is done, so splitting spares the low-k modes most of
#: the high-k modes' steps (the main job's 101 modes on an idle 2-core CPU: 8.3 s in four
#: launches, 9.4 s in one on 32 lanes, ``JaxBackend(lanes=...)``; docs/solver.md). The CUDA
#: backend solves all modes in one launch, whose wall time is the slowest mode's
N_CHUNKS_JAX = 4

_OBSERVABLE_FNS = Cache("boltzmann.observables", maxsize=16)


@dataclass(frozen=True)
class Transfers:
    """Transfer functions of C cosmologies at Z redshifts on K wavenumbers each.

    k: (C, K) wavenumbers [1/Mpc]; z: the redshifts, in the order asked for;
    k_h: (K,) the shared grid in h/Mpc when every cosmology's k is k_h·h (a grid given in h/Mpc),
        else None (one grid in 1/Mpc for all);
    fields: {CLASS name: (C, Z, K)} the model's observables (d_m, d_cb, d_cdm, d_b, phi, ...),
        in CLASS's 'class' normalisation (unit primordial curvature); NaN where a mode failed;
    status: (C, K) solver status codes (0 = ok; ``solver.describe`` says why not);
    n_accepted, n_rejected: (C, K) step counts; backend: which solver backend ran;
    solver_info: the backend's statistics of the launch (kernel seconds, colours, LU slots...).
    """

    k: np.ndarray
    z: tuple
    k_h: np.ndarray | None
    fields: dict
    status: np.ndarray
    n_accepted: np.ndarray
    n_rejected: np.ndarray
    backend: str
    solver_info: dict = field(default_factory=dict)
    #: seconds spent on initial conditions, the solve and the observables
    timings: dict = field(default_factory=dict)

    def failures(self) -> list[tuple[int, float, str]]:
        """(cosmology index, k [1/Mpc], reason) of every mode that did not finish."""
        return [(int(c), float(self.k[c, i]), describe(int(self.status[c, i])))
                for c, i in zip(*np.nonzero(self.status != 0))]

    def stats(self) -> dict:
        """Launch statistics: step counts, failures, the backend's own numbers."""
        acc, rej = np.asarray(self.n_accepted), np.asarray(self.n_rejected)
        return {
            "backend": self.backend,
            "trajectories": int(acc.size),
            "accepted_steps_median": float(np.median(acc)),
            "accepted_steps_max": int(acc.max()),
            "steps_total": int(acc.sum() + rej.sum()),
            "rejected_steps_total": int(rej.sum()),
            "n_failed": int(np.sum(self.status != 0)),
            **{key: value for key, value in self.solver_info.items()
               if isinstance(value, (bool, int, float, str))},
        }


def _observables_program(model):
    """jit of the model's observables over (trajectory, save time), compiled once per model."""
    fn = jax.vmap(jax.vmap(model.observables, in_axes=(0, 0, None, None)),
                  in_axes=(0, None, 0, None))
    return _OBSERVABLE_FNS.get_or_build(id(model), lambda: (model, jax.jit(fn)))[1]


def observables(model, ys, x_save, rows, table, *, compiled: bool = True) -> dict:
    """{name: (N, S)} the model's observables of states ys (N, S, n) at the save times x_save."""
    if compiled:
        return _observables_program(model)(jnp.asarray(ys), jnp.asarray(x_save),
                                           jnp.asarray(rows), table)
    return jax.vmap(jax.vmap(model.observables, in_axes=(0, 0, None, None)),
                    in_axes=(0, None, 0, None))(ys, jnp.asarray(x_save), rows, table)


def _czk(values, C: int, K: int, z_cols, inverse=None):
    """(N, S) in trajectory order → (C, Z, K) in the requested z order (numpy or JAX, as given)."""
    xp = np if isinstance(values, np.ndarray) else jnp
    v = values if inverse is None else values[inverse]
    return xp.moveaxis(v[:, xp.asarray(z_cols)].reshape(C, K, len(z_cols)), 2, 1)


def compute_perturbations(tables, cosmos, k, z, precision, model, *, k_h=None, backend="auto",
                          progress=null_progress, max_steps: int = MAX_STEPS) -> Transfers:
    """Solve every mode of C cosmologies (``cosmos`` stacked, ``k`` (C, K) [1/Mpc], concrete).

    ``k_h``: (K,) the grid in h/Mpc when ``k`` is k_h·h for every cosmology, else None (then every
    row of ``k`` must be the same grid).

    ``backend``: "jax", "cuda", "auto" or a solver backend object. Failed modes are reported in
    ``status`` (their fields are NaN), never raised.
    """
    t0 = time.perf_counter()
    k = np.asarray(k, np.float64)
    C, K = k.shape
    if k_h is None and not np.all(k == k[:1]):
        raise ValueError("compute_perturbations: without k_h every cosmology needs the same k")
    zs = tuple(float(v) for v in z)
    grid = tables.grid
    x_save, z_cols = modes.save_times(zs)
    rows_all = np.asarray(modes.mode_rows(model, cosmos, k, grid))
    order = modes.solve_order(k, resolve_backend(backend).name == "cuda")
    rows = rows_all[order]
    x0, y0 = modes.initial_states(model, rows, precision.k_tau_ini, precision.omega_tau_ini)
    modes.check_start_times(x0, grid, x_save, precision)
    weights = modes.error_weights(model, precision.baryon_error_weight)
    timings = {"initial_conditions": time.perf_counter() - t0}

    t0 = time.perf_counter()
    N = C * K
    progress("perturbations", 0, N)
    status, n_acc, n_rej = np.zeros(N, int), np.zeros(N, int), np.zeros(N, int)
    info = {"state_size": int(model.n)}
    used = None

    def solve_phase(current, active, y_start, t_save, p, x_start, w, *_):
        nonlocal used
        ys, st, acc, rej, used, launch = _solve_in_chunks(
            current, y_start, x_start, t_save, p, tables, precision, w, backend, max_steps)
        status[active] = np.where(status[active] != 0, status[active], st)
        n_acc[active] += acc
        n_rej[active] += rej
        if current is model:
            info.update(launch)
        else:
            info[f"{current.neutrino_fluid}_phase"] = {
                "modes": int(active.size), "state_size": int(current.n),
                **{key: v for key, v in launch.items() if isinstance(v, (int, float, str))}}
        return ys, None

    phases = fluid_phases.plan(model, tables.model_table, grid, rows[:, model.param_index("k")],
                               rows[:, model.param_index("cosmo_row")], precision, x_save)
    ys, _ = _phased(solve_phase, model, phases, y0, None, x0, x_save, jnp.asarray(rows), None,
                    tables.model_table, None, [np.arange(N)], weights)
    progress("perturbations", N, N)
    timings["solve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    inverse = np.empty_like(order)
    inverse[order] = np.arange(N)
    # one transfer of every observable, then host-side reordering (no device op per field)
    obs = jax.device_get(observables(model, ys, x_save, rows, tables.model_table))
    fields = {name: _czk(np.asarray(v), C, K, z_cols, inverse) for name, v in obs.items()}
    timings["observables"] = time.perf_counter() - t0
    return Transfers(k=k, z=zs, k_h=None if k_h is None else np.asarray(k_h, np.float64), fields=fields,
                     status=status[inverse].reshape(C, K), n_accepted=n_acc[inverse].reshape(C, K),
                     n_rejected=n_rej[inverse].reshape(C, K), backend=used, solver_info=info,
                     timings=timings)


def _solve_in_chunks(model, y0, x0, t_save, rows, tables, precision, weights, backend, max_steps):
    """(ys (N, S, n), status, accepted, rejected, backend name, launch info) of N modes: one
    launch on the CUDA backend (its wall time is the slowest mode's either way), N_CHUNKS_JAX
    launches of neighbouring modes (sorted by k) on the JAX backend."""
    one_launch = resolve_backend(backend).name == "cuda"
    N = np.shape(y0)[0]
    n_chunk = N if one_launch else int(np.ceil(N / N_CHUNKS_JAX))
    t_save = np.asarray(t_save, np.float64)
    ys_chunks = []        # left where the solver put them (on the GPU): no host round trip
    status, n_acc, n_rej = (np.empty(N, int) for _ in range(3))
    used, info = None, {}
    for c in range(0, N, n_chunk):
        idx = np.arange(c, min(c + n_chunk, N))
        pad = np.concatenate([idx, np.full(n_chunk - idx.size, idx[-1])])
        ts = t_save[pad] if t_save.ndim == 2 else t_save
        sol = solve(model.rhs, y0[pad], ts, rows[pad], args=tables.model_table, t0=x0[pad],
                    rtol=precision.rtol, atol=precision.atol, error_weights=weights,
                    backend=backend, max_steps=int(max_steps))
        m = idx.size
        ys_chunks.append(sol.ys[:m])
        status[idx] = np.asarray(sol.status)[:m]
        n_acc[idx] = np.asarray(sol.n_accepted)[:m]
        n_rej[idx] = np.asarray(sol.n_rejected)[:m]
        used, info = sol.backend, dict(sol.info)
    ys = ys_chunks[0] if len(ys_chunks) == 1 else jnp.concatenate(
        [jnp.asarray(y) for y in ys_chunks])
    return ys, status, n_acc, n_rej, used, info


def padded_chunks(chunks) -> np.ndarray:
    """(number of chunks, largest chunk) mode indices: a shorter chunk repeats its last mode
    (solved twice, written once with the same value)."""
    chunks = [np.asarray(c, np.int64).reshape(-1) for c in chunks]
    if not chunks or min(c.size for c in chunks) == 0:
        raise ValueError("differentiable_transfers: every chunk needs at least one mode")
    size = max(c.size for c in chunks)
    return np.stack([np.concatenate([c, np.full(size - c.size, c[-1])]) for c in chunks])


def chunk_groups(chunks, n_groups: int) -> list:
    """``padded_chunks(chunks)`` split into ``n_groups`` index arrays (chunks per group, size) of
    equal shape, for one compiled solve run on each group at the same time: chunks (sorted by
    k, so later ones take more steps) are dealt largest first to the group with the least so
    far, an equal number to each. One group (all chunks) when they do not divide evenly."""
    index = padded_chunks(chunks)
    n = index.shape[0]
    if n_groups <= 1 or n % n_groups:
        return [index]
    load, members = [0] * n_groups, [[] for _ in range(n_groups)]
    for c in range(n - 1, -1, -1):                     # later chunks: more steps
        open_groups = [g for g in range(n_groups) if len(members[g]) < n // n_groups]
        g = min(open_groups, key=lambda g: load[g])
        members[g].append(c)
        load[g] += c + 1
    return [index[sorted(m)] for m in members]


def mode_inputs(table, cosmos, k, x0, model, grid):
    """(rows (C·K, P), y0 (C·K, n)): every mode's parameter row and its adiabatic initial state
    at the fixed start times ``x0`` (traceable in ``table`` and ``cosmos``)."""
    rows = modes.mode_rows(model, cosmos, np.asarray(k, np.float64), grid)
    return rows, modes.initial_states_at(model, rows, x0)


def _run_chunks(solve_chunk, chunks, backend, n_modes: int):
    """``solve_chunk(idx)`` over the chunks (a pytree of arrays, the chunk's modes first),
    scattered into arrays over all ``n_modes``. On the JAX backend the chunks, padded to one size
    by repeating a mode, run as one ``lax.map``, so the traced program holds one solve, not one
    per chunk (under differentiation each copy would be a joint sensitivity solve); the CUDA
    launch is one custom call whatever the chunk count, so there the chunks run in turn."""
    def scatter(idx, outs, solved):
        return jax.tree_util.tree_map(
            lambda a, x: (jnp.zeros((n_modes,) + x.shape[1:], x.dtype) if a is None else a)
            .at[idx].set(x), outs, solved, is_leaf=lambda a: a is None)

    if resolve_backend(backend).name != "jax":
        outs = None
        for idx in chunks:
            idx = np.asarray(idx)
            solved = solve_chunk(idx)
            outs = scatter(idx, jax.tree_util.tree_map(lambda _: None, solved) if outs is None
                           else outs, solved)
        return outs
    # a (chunks, size) array of mode indices (traced: a program that solves the chunks it is
    # given) or the chunks themselves, padded here
    index = chunks if isinstance(chunks, jax.Array) else padded_chunks(chunks)
    solved = jax.lax.map(solve_chunk, jnp.asarray(index))     # (chunks, size, ...)
    solved = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), solved)
    return scatter(index.reshape(-1), jax.tree_util.tree_map(lambda _: None, solved), solved)


def _solve_settings(z, x0, model, weights):
    """(save times, start times as numpy, error weights) of the modes' solves; ``weights`` None:
    the model's own (``modes.error_weights``)."""
    return (modes.save_times(z)[0], np.asarray(x0, np.float64),
            modes.error_weights(model) if weights is None else np.asarray(weights, np.float64))


def _start_times(x0, idx):
    return x0[idx] if isinstance(idx, np.ndarray) else jnp.asarray(x0)[idx]


def _save_times(t_save, idx):
    """The chunk's save times: shared (1-d) as they are, per mode (N, S) indexed."""
    return t_save if np.ndim(t_save) == 1 else _start_times(t_save, idx)


def solve_modes(table, rows, y0, x0, z, model, *, rtol, atol, chunks, backend="jax",
                sensitivity_error_control: bool | float = True, max_steps: int = MAX_STEPS,
                weights=None, phases=()):
    """States (C·K, n_save, n) of every mode at ``modes.save_times(z)``, traceable and
    differentiable in (table, rows, y0) through ``solver.solve_diff``; ``chunks``: index arrays
    into the modes, each solved by one call (``_run_chunks``); ``weights``: the solver's error
    weights (None: ``modes.error_weights(model)``); ``phases``: the neutrino-fluid switches
    (``fluid_phases.plan``, concrete ``chunks`` then), the states of modes that end in a fluid
    form written in ``model``'s layout (``fluid_phases.to_full``)."""
    x_save, x0, weights = _solve_settings(z, x0, model, weights)

    def solve_phase(current, _active, y_start, t_save, p, x_start, w, chunks_p, *_):
        def solve_chunk(idx):
            return solve_diff(current.rhs, y_start[idx], _save_times(t_save, idx), p[idx], args=table,
                              t0=_start_times(x_start, idx), rtol=rtol, atol=atol,
                              error_weights=w, max_steps=int(max_steps), backend=backend,
                              sensitivity_error_control=sensitivity_error_control)
        return _run_chunks(solve_chunk, chunks_p, backend, y_start.shape[0]), None

    if not phases:
        return solve_phase(model, None, y0, x_save, rows, x0, weights, chunks)[0]
    return _phased(solve_phase, model, phases, y0, None, x0, x_save, rows, None, table, None,
                   chunks, weights)[0]


def solve_modes_with_tangents(table, rows, y0, dtable, drows, dy0, x0, z, model, *, rtol, atol,
                              chunks, backend="jax", sensitivity_error_control: bool | float = True,
                              max_steps: int = MAX_STEPS, weights=None, phases=()):
    """(states (C·K, n_save, n), their tangents (m, C·K, n_save, n)) along m input tangents
    (leading axis m on dtable, drows, dy0): ``solve_modes``'s derivative by
    ``solver.solve_with_tangents``, whose values come from the joint solve itself (on the JAX
    backend one integration loop per chunk in the program, on the CUDA backend one
    sensitivity-kernel launch; no plain solve beside it); ``phases`` as ``solve_modes``'s."""
    x_save, x0, weights = _solve_settings(z, x0, model, weights)

    def solve_phase(current, _active, y_start, t_save, p, x_start, w, chunks_p, dy_start, dp):
        def solve_chunk(idx):
            ys, dys = solve_with_tangents(
                current.rhs, y_start[idx], _save_times(t_save, idx), p[idx], dy0=dy_start[:, idx],
                dparams=dp[:, idx], dargs=dtable, args=table, t0=_start_times(x_start, idx),
                rtol=rtol, atol=atol, error_weights=w, max_steps=int(max_steps),
                backend=backend, sensitivity_error_control=sensitivity_error_control)
            return ys, jnp.moveaxis(dys, 0, 1)                   # the chunk's modes first
        ys, dys = _run_chunks(solve_chunk, chunks_p, backend, y_start.shape[0])
        return ys, jnp.moveaxis(dys, 1, 0)

    if not phases:
        return solve_phase(model, None, y0, x_save, rows, x0, weights, chunks, dy0, drows)
    return _phased(solve_phase, model, phases, y0, dy0, x0, x_save, rows, drows, table, dtable,
                   chunks, weights)


def _phased(solve_phase, model, phases, y0, dy0, x0, x_save, rows, drows, table, dtable, chunks,
            weights):
    """``solve_phase`` over the neutrino-fluid phases (``fluid_phases``): each phase solves the
    modes still running in its form of the model, to their next switch or to the end; (states,
    tangents or None) in ``model``'s layout, tangents when ``dy0`` is given.

    ``solve_phase(form model, active (the phase's modes, into all N), y, t_save (n_active, S),
    rows, x_start, error weights, chunks (positions in active), dy, drows) -> (ys, dys)``: the
    main job's runs its own launches and records their statistics, the differentiable ones
    solve ``chunks`` as given."""
    N, S = y0.shape[0], x_save.size
    tangents = dy0 is not None
    ys_out = jnp.zeros((N, S, model.n), jnp.result_type(y0))
    dys_out = jnp.zeros((dy0.shape[0], N, S, model.n), ys_out.dtype) if tangents else None
    current, active = model, np.arange(N)
    y, dy, x_start, p, dp = y0, dy0, np.asarray(x0), rows, drows
    for form, x_next in [*phases, ("", None)]:
        x_sw = np.full(active.size, np.inf) if x_next is None else np.asarray(x_next)[active]
        switching = np.isfinite(x_sw)
        # every mode to its last save time, or to its switch time (saved there, S times over,
        # for one (n_active, S) save array); shared save times when no mode switches
        t_save = (np.where(switching[:, None], x_sw[:, None], x_save[None, :])
                  if switching.any() else x_save)
        w = weights if current is model else fluid_phases.phase_weights(current, model, weights)
        ys, dys = solve_phase(current, active, y, t_save, p, x_start, w,
                              fluid_phases.phase_chunks(chunks, active, N), dy, dp)
        if current is model and not switching.any():
            return ys, dys                     # no mode switches: the full model's states
        done = np.nonzero(~switching)[0]
        if done.size:
            yd, dyd = ys[done], (dys[:, done] if tangents else None)
            if current is not model:
                lifted = fluid_phases.to_full(current, model, yd, x_save, p[done], dyd,
                                              dp[:, done] if tangents else None)
                yd, dyd = lifted if tangents else (lifted, None)
            ys_out = ys_out.at[active[done]].set(yd)
            if tangents:
                dys_out = dys_out.at[:, active[done]].set(dyd)
        if not switching.any():
            break
        sw = np.nonzero(switching)[0]
        nxt = modes.fluid_form(model, form)
        moved = fluid_phases.to_next(current, nxt, ys[sw, -1], x_sw[sw], p[sw], table,
                                     dys[:, sw, -1] if tangents else None,
                                     dp[:, sw] if tangents else None, dtable)
        y, dy = moved if tangents else (moved, None)
        x_start, active, current = x_sw[sw], active[sw], nxt
        p, dp = p[sw], (dp[:, sw] if tangents else None)
    return ys_out, dys_out


def transfers_of_states(ys, rows, table, k, z, model) -> dict:
    """{name: (C, Z, K)} the model's observables of the solved states (traceable)."""
    C, K = np.shape(k)
    x_save, z_cols = modes.save_times(z)
    obs = observables(model, ys, x_save, rows, table, compiled=False)
    return {name: _czk(v, C, K, z_cols) for name, v in obs.items()}


def differentiable_transfers(table, cosmos, k, z, x0, model, grid, *, rtol, atol, chunks,
                             backend="jax", sensitivity_error_control: bool | float = True,
                             max_steps: int = MAX_STEPS) -> dict:
    """{name: (C, Z, K)} transfer functions as a traceable function of ``table`` and ``cosmos``:
    ``mode_inputs`` → ``solve_modes`` → ``transfers_of_states``.

    The start times ``x0`` (C·K,) are held fixed (boltzmann.modes.initial_states_at);
    ``chunks``: index arrays into the C·K modes (``solve_modes``).
    """
    rows, y0 = mode_inputs(table, cosmos, k, x0, model, grid)
    ys = solve_modes(table, rows, y0, x0, z, model, rtol=rtol, atol=atol, chunks=chunks,
                     backend=backend, sensitivity_error_control=sensitivity_error_control,
                     max_steps=max_steps)
    return transfers_of_states(ys, rows, table, k, z, model)
