"""``solve``: the one entry point for every backend.

Validates shapes and values on the host (clear errors, DESIGN: bad input never reaches a kernel),
derives the Jacobian structure from the RHS itself (sparsity by dependency tracing, column
colouring, slot layout of the compiled sparse LU), and dispatches to a backend. Everything derived
from the RHS is cached per (rhs, sizes, options) so repeated calls pay only the solve.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .controller import PIDController
from .jacobian import build_jacobian_plan
from .linear import build_linear_solver
from .status import Status, describe
from .tableau import RODAS5P, RosenbrockTableau

BACKENDS = ("jax", "cuda", "auto")


@dataclass
class Solution:
    """Result of an ensemble solve.

    ys: (N, n_save, n) state at the save times (NaN where a failed trajectory never got);
    status: (N,) Status codes; t_final: (N,) time each trajectory reached;
    n_accepted / n_rejected: (N,) step counters; backend: which backend ran.
    """

    ys: Any
    status: np.ndarray
    t_final: Any
    n_accepted: np.ndarray
    n_rejected: np.ndarray
    backend: str
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> np.ndarray:
        return np.asarray(self.status) == Status.OK

    def failures(self) -> list[tuple[int, str]]:
        """(trajectory index, reason) for every trajectory that did not finish."""
        st = np.asarray(self.status)
        return [(int(i), describe(st[i])) for i in np.flatnonzero(st != Status.OK)]

    def stats(self) -> dict:
        acc = np.asarray(self.n_accepted)
        rej = np.asarray(self.n_rejected)
        return {
            "backend": self.backend,
            "trajectories": int(acc.size),
            "failed": int(np.sum(~self.ok)),
            "accepted_steps_median": float(np.median(acc)) if acc.size else 0.0,
            "accepted_steps_max": int(acc.max()) if acc.size else 0,
            "rejected_steps_total": int(rej.sum()),
            **self.info,
        }


def _check_finite(name, a):
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[:3].tolist()
        raise ValueError(f"{name} contains non-finite values (first at indices {bad}); "
                         "every entry must be a finite float")


class ValidatedInputs(NamedTuple):
    """Host-side inputs after validation, shaped for every backend."""

    y0: np.ndarray        # (N, n)
    params: np.ndarray    # (N, P)
    t_save: np.ndarray    # (N, m)
    t0: np.ndarray        # (N,)
    t_end: np.ndarray     # (N,)
    atol: np.ndarray      # (n,)
    weights: np.ndarray   # (n,)
    first_step: np.ndarray  # (N,), NaN = automatic


def validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                    first_step) -> ValidatedInputs:
    """Check and normalise ``solve``'s array arguments (shared by every backend).

    Raises ValueError naming the argument and what is allowed.
    """
    y0 = np.asarray(y0, dtype=np.float64)
    if y0.ndim != 2:
        raise ValueError(f"y0 must have shape (N, n) (N trajectories of n variables); got shape "
                         f"{y0.shape}. For one trajectory use y0[None, :].")
    N, n = y0.shape
    if N == 0 or n == 0:
        raise ValueError(f"y0 must be non-empty, got shape {y0.shape}")
    _check_finite("y0", y0)
    params = np.asarray(params, dtype=np.float64)
    if params.ndim == 1 and params.size == 0:
        params = np.zeros((N, 0))
    if params.ndim != 2 or params.shape[0] != N:
        raise ValueError(f"params must have shape (N, P) with N = {N} (one row per trajectory); "
                         f"got shape {params.shape}")
    _check_finite("params", params)
    ts = np.asarray(t_save, dtype=np.float64)
    if ts.ndim == 1:
        ts = np.broadcast_to(ts, (N, ts.size))
    if ts.ndim != 2 or ts.shape[0] != N or ts.shape[1] == 0:
        raise ValueError(f"t_save must have shape (m,) or (N, m) with N = {N}, m >= 1; got "
                         f"{np.shape(t_save)}")
    _check_finite("t_save", ts)
    if np.any(np.diff(ts, axis=1) < 0):
        raise ValueError("t_save must be ascending along each trajectory")
    t0a = ts[:, 0] if t0 is None else np.broadcast_to(np.asarray(t0, np.float64), (N,))
    tea = ts[:, -1] if t_end is None else np.broadcast_to(np.asarray(t_end, np.float64), (N,))
    _check_finite("t0", t0a)
    _check_finite("t_end", tea)
    if np.any(tea < t0a):
        raise ValueError("t_end must be >= t0 for every trajectory (forward integration only)")
    if np.any(ts < t0a[:, None]) or np.any(ts > tea[:, None]):
        raise ValueError("every save time must lie within [t0, t_end] of its trajectory")
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    atol_a = np.broadcast_to(np.asarray(atol, np.float64), (n,)).copy() \
        if np.ndim(atol) in (0, 1) and np.size(atol) in (1, n) else None
    if atol_a is None or np.any(atol_a <= 0):
        raise ValueError(f"atol must be a positive scalar or an array of shape ({n},)")
    if error_weights is None:
        w = np.ones(n)
    else:
        w = np.asarray(error_weights, np.float64)
        if w.shape != (n,) or np.any(w < 0) or not np.all(np.isfinite(w)):
            raise ValueError(f"error_weights must be a finite non-negative array of shape ({n},)")
        if not np.any(w > 0):
            raise ValueError("error_weights: at least one component must have a positive weight")
    if not (isinstance(max_steps, (int, np.integer)) and max_steps > 0):
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    h0 = np.full(N, np.nan) if first_step is None else \
        np.broadcast_to(np.asarray(first_step, np.float64), (N,))
    return ValidatedInputs(y0, params, ts, t0a, tea, atol_a, w, h0)


class _Plan:
    """Everything derived once from (rhs, n, n_params, options): structure, LU, jitted solve."""

    def __init__(self, rhs, n, n_params, has_args, args_example, sparsity, linear_solver, tab,
                 ctrl, max_steps, *, linear=None, seed_columns=None):
        from . import jax_backend

        self.n = n
        if has_args:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p, args)))
        else:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p)))
        self.f = f
        from .sparsity import solver_pattern
        self.pattern = pattern = solver_pattern(rhs, n, n_params, sparsity,
                                                args_example if has_args else None)
        # linear / seed_columns: a prebuilt solver for a structured W and the columns J is
        # taken over (the forward-sensitivity solve's block-triangular system, solver.sensitivity)
        self.linear = linear if linear is not None else build_linear_solver(pattern,
                                                                            method=linear_solver)
        jac_pattern = pattern
        if seed_columns is not None:
            jac_pattern = np.zeros_like(pattern)
            jac_pattern[:, seed_columns] = pattern[:, seed_columns]
        self.jac, self.n_colors = _make_jacobian(rhs, has_args, jac_pattern, self.linear,
                                                 seed_columns)
        self.run = jax.jit(jax_backend.make_ensemble_solver(f, self.jac, self.linear, tab, ctrl,
                                                            max_steps))


def _make_jacobian(rhs, has_args, pattern, linear, seed_columns=None):
    """f, J (in the linear solver's slot layout) and ∂f/∂t by colour-compressed JVP sweeps."""
    plan = build_jacobian_plan(pattern, linear, seed_columns=seed_columns)

    if has_args:
        def jac(y, t, p, args):
            return plan.f_jac_and_dfdt(rhs, y, t, p, args)
    else:
        def jac(y, t, p, args):
            return plan.f_jac_and_dfdt(rhs, y, t, p)
    return jac, plan.n_colors


_PLANS: dict = {}


def solve(rhs: Callable, y0, t_save, params, *, args=None, rtol: float = 1e-6,
          atol: float | np.ndarray = 1e-9, t0=None, t_end=None, sparsity=None,
          error_weights=None, max_steps: int = 100_000, first_step=None, backend: str = "jax",
          linear_solver: str = "auto", controller: PIDController | None = None,
          tableau: RosenbrockTableau = RODAS5P) -> Solution:
    """Integrate an ensemble of N stiff ODE trajectories dy/dt = rhs(y, t, p[, args]).

    rhs: returns a tuple of n scalars; indexes ``y`` and ``p`` with literal integers only (the form
        the CUDA backend compiles, DESIGN §3). ``args`` (optional, any pytree of arrays, shared by
        all trajectories) is passed as the 4th argument when given — e.g. interpolation tables.
    y0: (N, n) initial states. params: (N, P) per-trajectory parameters (P may be 0).
    t_save: (m,) shared or (N, m) per-trajectory save times, ascending, within [t0, t_end].
    t0: scalar or (N,) start times (default: the first save time). t_end: scalar or (N,)
        (default: the last save time).
    rtol, atol: tolerances (atol scalar or (n,)); error_weights: (n,) non-negative weights in the
        error norm — a zero removes that component from step-size control.
    sparsity: optional (n, n) bool pattern, a superset of the true Jacobian structure; by default
        it is detected by tracing ``rhs``. linear_solver: "auto", "dense" or "sparse".
    Returns a ``Solution``; failed trajectories are reported by status, never silently.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        from . import backends
        backend = backends.pick_backend()
    if backend == "cuda":
        from . import cuda_backend  # noqa: F401  (raises a clear error where CUDA is missing)
        return cuda_backend.solve(rhs, y0, t_save, params, args=args, rtol=rtol, atol=atol,
                                  t0=t0, t_end=t_end, sparsity=sparsity,
                                  error_weights=error_weights, max_steps=max_steps,
                                  first_step=first_step, linear_solver=linear_solver,
                                  controller=controller, tableau=tableau)

    v = validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                        first_step)
    y0, params, ts, t0a, tea, atol_a, w, h0 = v
    n = y0.shape[1]
    ctrl = controller or PIDController()

    key = (rhs, n, params.shape[1], args is not None,
           None if sparsity is None else np.asarray(sparsity, bool).tobytes(),
           linear_solver, tableau.name, ctrl, int(max_steps))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _Plan(rhs, n, params.shape[1], args is not None, args, sparsity, linear_solver,
                     tableau, ctrl, int(max_steps))
        _PLANS[key] = plan
    res = plan.run(jnp.asarray(y0), jnp.asarray(t0a), jnp.asarray(tea), jnp.asarray(ts),
                   jnp.asarray(params), args, jnp.float64(rtol), jnp.asarray(atol_a),
                   jnp.asarray(w), jnp.asarray(h0))
    return Solution(ys=res.ys, status=np.asarray(res.status), t_final=res.t,
                    n_accepted=np.asarray(res.n_accepted), n_rejected=np.asarray(res.n_rejected),
                    backend="jax", info={"linear_solver": plan.linear.method,
                                         "jacobian_colors": int(plan.n_colors)})
