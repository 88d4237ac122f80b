"""The JAX backend: an ensemble of Rosenbrock trajectories advanced together.

One ``lax.while_loop`` runs until every trajectory has finished; each iteration attempts one step
for every still-running trajectory in flight (``vmap`` of the single-trajectory step) and leaves
finished ones untouched. In flight are all N trajectories (lock-step) or L lanes, each taking the
next waiting trajectory when its own has finished (``make_ensemble_solver``'s ``lanes``). Each
trajectory has its own step size, controller history, end time, counters and status, so the
ensemble is exactly N independent solves. Runs on the CPU (the project's CI) and on
a GPU through XLA (the GPU baseline the CUDA backend is measured against).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...method.rosenbrock import dense_output, rosenbrock_step_looped
from ...problem.status import Status


class EnsembleResult(NamedTuple):
    ys: jax.Array        # (N, n_save, n); NaN at save times a failed trajectory never reached
    t: jax.Array         # (N,) time reached
    status: jax.Array    # (N,) int32, see solver.problem.status.Status
    n_accepted: jax.Array
    n_rejected: jax.Array


# the ensemble solve's output, persisted by jax.export (solver.persisted) as this namedtuple
jax.export.register_namedtuple_serialization(
    EnsembleResult, serialized_name="solver.backends.jax.ensemble.EnsembleResult")


def _weighted_rms(err, y0, y1, rtol, atol, weights, n_weighted):
    scale = atol + rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1))
    r = weights * err / scale
    return jnp.sqrt(jnp.sum(r * r) / n_weighted)


#: the JAX backend's lanes by default (``JaxBackend(lanes=...)``): lock-step. On an idle
#: 2-core CPU the main job's 101 modes took 8.3 s in four lock-step launches against 9.4 s in
#: one launch on 32 lanes (docs/solver.md), so lanes are an option, not the default
DEFAULT_LANES = None
#: "auto": at least this many lanes, and at least a quarter of the trajectories
AUTO_LANES_MIN = 32
#: "auto": ensembles smaller than this stay in lock-step
AUTO_LANES_FROM = 64


def lane_option(lanes) -> int | str | None:
    """A validated ``lanes`` option: None (lock-step), "auto" or a positive integer."""
    if lanes is None or lanes == "auto":
        return lanes
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1:
        raise ValueError(f"lanes must be a positive integer, 'auto' or None (all trajectories "
                         f"in lock-step), got {lanes!r}")
    return int(lanes)


def auto_lanes(n_traj: int) -> int:
    """max(AUTO_LANES_MIN, ⌈N/4⌉) from AUTO_LANES_FROM trajectories on, else all of them.

    An iteration over fewer lanes costs less, but not in proportion (docs/solver.md), so an
    ensemble keeps a quarter of its trajectories in flight. Just above
    the lane count the trajectories left over would run almost alone after the others (twice
    the iterations when all take as many steps), so small ensembles stay in lock-step."""
    if n_traj < AUTO_LANES_FROM:
        return int(n_traj)
    return max(AUTO_LANES_MIN, -(-int(n_traj) // 4))


def lane_count(n_traj: int, lanes) -> int:
    """How many trajectories advance together: all of them (``lanes`` None or ≥ N), else
    ``lanes`` ("auto": ``auto_lanes``)."""
    if lanes == "auto":
        lanes = auto_lanes(n_traj)
    if lanes is None or lanes >= n_traj:
        return int(n_traj)
    return int(lane_option(lanes))


def hnw_initial_step(f: Callable, tab):
    """The first step of one trajectory of y' = f(y, t, p, args) (Hairer, Nørsett & Wanner,
    Solving ODEs I, §II.4: h from ‖y0‖, ‖f0‖ and a finite difference of f; robust for stiff
    starts because it only ever shrinks). Returned function: (y0, t0, t_end, p, args, rtol,
    atol, weights, n_weighted) -> h."""
    def initial_step(y0, t0, t_end, p, args, rtol, atol, weights, n_weighted):
        zero = jnp.zeros_like(y0)
        d0 = _weighted_rms(y0, y0, y0, rtol, atol, weights, n_weighted)
        span = t_end - t0

        def euler_step(fv):
            d1 = _weighted_rms(fv, y0, y0, rtol, atol, weights, n_weighted)
            h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
            return jnp.minimum(h0, span), d1

        # f at y0, then at the Euler point y0 + h0 f0: a loop of two passes, so that the
        # program holds one copy of f (of the joint system's, thousands of operations) not two
        def evaluate(point, _):
            fv = f(point[0], point[1], p, args)
            h_e, _ = euler_step(fv)
            return (y0 + h_e * fv, t0 + h_e), fv

        _, (f0, f1) = jax.lax.scan(evaluate, (y0, t0), None, length=2)
        h0, d1 = euler_step(f0)
        d2 = _weighted_rms(f1 - f0, y0, y0 + zero, rtol, atol, weights, n_weighted) / h0
        dmax = jnp.maximum(d1, d2)
        h1 = jnp.where(dmax <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3),
                       (0.01 / dmax) ** (1.0 / (tab.order + 1.0)))
        h = jnp.minimum(100.0 * h0, h1)
        h = jnp.where(jnp.isfinite(h) & (h > 0), h, 1e-6 * span)
        return jnp.minimum(h, span)

    return initial_step


def make_ensemble_solver(f: Callable, jac: Callable, linear, tab, ctrl, max_steps: int,
                         lanes: int | str | None = None, initial_step: Callable | None = None):
    """Build the (un-jitted) ensemble solve for one RHS and one linear-algebra plan.

    f(y, t, p, args) -> (n,) array; jac(y, t, p, args, h) -> (f, J in slot layout, ∂f/∂t) at the
    start of a step of size h (h lets a jac that differences in t scale its increment).
    Returned function: run(y0 (N,n), t0 (N,), t_end (N,), t_save (N,m), params (N,P), args,
    rtol, atol (n,), weights (n,) or (N, n) per trajectory, h0 (N,) or NaN for automatic)
    -> EnsembleResult.

    ``lanes`` < N (or "auto", ``auto_lanes``): only that many trajectories advance together,
    and a lane whose trajectory has finished takes the next one waiting (``_refill_loop``). In
    lock-step every iteration costs N steps until the slowest trajectory is done, so an
    ensemble whose step counts spread widely (the modes of a P(k): tens of steps at low k,
    hundreds at high k) does most of its work on finished trajectories; with lanes the work is
    about the sum of the step counts. Each trajectory's arithmetic is the same either way.

    ``initial_step``: the automatic first step (called as ``hnw_initial_step``'s function is),
    by default ``hnw_initial_step(f, tab)``.
    """
    k_ctrl = tab.embedded_order + 1.0
    running = np.int32(Status.RUNNING)  # a numpy constant: plans may be built inside a trace
    if initial_step is None:
        initial_step = hnw_initial_step(f, tab)

    def step(state, p, ts, t_end, args, rtol, atol, weights, n_weighted):
        t, y, h, e1, e2, nacc, nrej, status, ys = state
        active = status == running
        to_end = t_end - t
        last = h >= to_end
        h = jnp.where(last, to_end, h)
        f0, jvals, dfdt = jac(y, t, p, args, h)
        fy = lambda yy, tt: f(yy, tt, p, args)  # noqa: E731
        y1, errv, K = rosenbrock_step_looped(tab, fy, linear, y, t, h, f0, jvals, dfdt)
        err = _weighted_rms(errv, y, y1, rtol, atol, weights, n_weighted)
        finite = jnp.isfinite(err) & jnp.all(jnp.isfinite(y1))
        accept = finite & (err <= 1.0)
        err_s = jnp.maximum(jnp.where(finite, err, 1.0), 1e-10)
        fac_acc = (ctrl.safety * err_s ** (-ctrl.beta1 / k_ctrl) * e1 ** (-ctrl.beta2 / k_ctrl)
                   * e2 ** (-ctrl.beta3 / k_ctrl))
        fac_acc = jnp.clip(fac_acc, ctrl.factor_min, ctrl.factor_max)
        fac_rej = jnp.clip(ctrl.safety * err_s ** (-1.0 / k_ctrl), ctrl.factor_min, 1.0)
        fac = jnp.where(accept, fac_acc, jnp.where(finite, fac_rej, ctrl.factor_min))
        h_new = h * fac
        t_new = jnp.where(accept, jnp.where(last, t_end, t + h), t)
        y_new = jnp.where(accept, y1, y)
        # dense output for the save times passed by this step
        theta = (ts - t) / h
        hit = accept & (ts > t) & ((ts <= t + h) | last)
        ys_new = jnp.where(hit[:, None], dense_output(y, y1, K, theta), ys)
        nacc_new = nacc + accept
        nrej_new = nrej + (~accept)
        dt_min = ctrl.dt_min_rel * jnp.maximum(jnp.abs(t), 1.0)
        st = jnp.where(accept & last, jnp.int32(Status.OK), running)
        st = jnp.where(~accept & (h_new < dt_min),
                       jnp.where(finite, jnp.int32(Status.STEP_TOO_SMALL),
                                 jnp.int32(Status.NON_FINITE)), st)
        st = jnp.where((st == running) & (nacc_new + nrej_new >= max_steps),
                       jnp.int32(Status.MAX_STEPS), st)
        e1n = jnp.where(accept, err_s, e1)
        e2n = jnp.where(accept, e1, e2)
        new = (t_new, y_new, h_new, e1n, e2n, nacc_new, nrej_new, st, ys_new)
        return tuple(jnp.where(active, a, b) if a.ndim == 0 else
                     jnp.where(jnp.reshape(active, (1,) * a.ndim), a, b)
                     for a, b in zip(new, state))

    def run(y0, t0, t_end, t_save, params, args, rtol, atol, weights, h0):
        N, n = y0.shape
        # per-trajectory weights (N, n): each row with its own count, so that a trajectory
        # takes the steps of a solve with its row as the shared weights
        rows = weights.ndim == 2
        n_weighted = jnp.maximum(jnp.sum(weights > 0, axis=-1), 1)
        w_ax = 0 if rows else None
        h_auto = jax.vmap(initial_step, in_axes=(0, 0, 0, 0, None, None, None, w_ax, w_ax))(
            y0, t0, t_end, params, args, rtol, atol, weights, n_weighted)
        h = jnp.where(jnp.isnan(h0), h_auto, jnp.minimum(h0, t_end - t0))
        at_start = t_save <= t0[:, None]
        ys = jnp.where(at_start[:, :, None], y0[:, None, :], jnp.nan)
        status = jnp.where(t_end > t0, jnp.int32(Status.RUNNING), jnp.int32(Status.OK))
        ones = jnp.ones((N,), y0.dtype)
        zeros_i = jnp.zeros((N,), jnp.int32)
        state = (t0, y0, h, ones, ones, zeros_i, zeros_i, status, ys)
        vstep = jax.vmap(step, in_axes=(0, 0, 0, 0, None, None, None, w_ax, w_ax))

        def cond(st):
            return jnp.any(st[7] == running)

        def body(st):
            return vstep(st, params, t_save, t_end, args, rtol, atol, weights, n_weighted)

        L = lane_count(N, lanes)
        if L < N:
            return _refill_loop(vstep, state, L, params, t_save, t_end, args, rtol, atol,
                                weights, n_weighted, running, rows)
        t, y, h, e1, e2, nacc, nrej, status, ys = jax.lax.while_loop(cond, body, state)
        return EnsembleResult(ys, t, status, nacc, nrej)

    return run


def _refill_loop(vstep, init, L, params, t_save, t_end, args, rtol, atol, weights, n_weighted,
                 running, rows=False):
    """The ensemble on L lanes: ``init`` holds every trajectory's starting state (t, y, h, e1,
    e2, n_acc, n_rej, status, ys; leading axis N). Lane l works on trajectory ``idx[l]``; when it
    stops running, its state is written to the results and the next waiting trajectory (in
    index order) takes the lane. ``idx`` = N marks a lane with nothing left to do."""
    N = init[0].shape[0]
    idx0 = jnp.arange(L, dtype=jnp.int32)
    lane0 = tuple(a[:L] for a in init)

    def cond(st):
        lane, idx, nxt, _ = st
        return jnp.any(lane[7] == running) | (nxt < N)

    def retire_and_refill(lane, idx, nxt, out):
        done = (lane[7] != running) & (idx < N)
        where_out = jnp.where(done, idx, N)               # N: dropped by the scatter
        out = tuple(o.at[where_out].set(a, mode="drop") for o, a in zip(out, lane))
        new = nxt + jnp.cumsum(done.astype(jnp.int32)) - 1
        fresh = done & (new < N)
        idx = jnp.where(done, jnp.where(fresh, new, N), idx).astype(jnp.int32)
        take = jnp.minimum(idx, N - 1)
        lane = tuple(jnp.where(jnp.reshape(fresh, (L,) + (1,) * (a.ndim - 1)), a0[take], a)
                     for a, a0 in zip(lane, init))
        return lane, idx, nxt + jnp.sum(done, dtype=jnp.int32), out

    def body(st):
        lane, idx, nxt, out = st
        take = jnp.minimum(idx, N - 1)
        w, nw = (weights[take], n_weighted[take]) if rows else (weights, n_weighted)
        lane = vstep(lane, params[take], t_save[take], t_end[take], args, rtol, atol, w, nw)
        any_done = jnp.any((lane[7] != running) & (idx < N))
        lane, idx, nxt, out = jax.lax.cond(any_done, retire_and_refill,
                                           lambda a, b, c, d: (a, b, c, d), lane, idx, nxt, out)
        return lane, idx, nxt, out

    st = (lane0, idx0, jnp.int32(L), init)
    # lanes that start finished (t_end <= t0) are retired before the first step
    st = (*retire_and_refill(*st[:3], st[3]),)
    _, _, _, out = jax.lax.while_loop(cond, body, st)
    t, y, h, e1, e2, nacc, nrej, status, ys = out
    return EnsembleResult(ys, t, status, nacc, nrej)
