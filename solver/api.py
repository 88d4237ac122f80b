"""``solve``: the one entry point of an ensemble solve, for every backend.

It validates the inputs on the host (``problem.inputs``: bad input never reaches a kernel),
resolves ``backend`` (``backends.registry``) and hands the validated inputs to the backend, which
derives the Jacobian structure from the RHS itself (sparsity by dependency tracing, column
colouring, the slot layout of the compiled sparse LU), caches all of it per (rhs, sizes,
options), and integrates.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .backends.registry import resolve_backend
from .method.controller import PIDController
from .method.tableau import RODAS5P, RosenbrockTableau
from .problem.inputs import require_x64, validate_inputs
from .problem.solution import Solution

__all__ = ["solve"]


def solve(rhs: Callable, y0, t_save, params, *, args=None, rtol: float = 1e-6,
          atol: float | np.ndarray = 1e-9, t0=None, t_end=None, sparsity=None,
          error_weights=None, max_steps: int = 100_000, first_step=None, backend="jax",
          linear_solver: str = "auto", controller: PIDController | None = None,
          tableau: RosenbrockTableau = RODAS5P) -> Solution:
    """Integrate an ensemble of N stiff ODE trajectories dy/dt = rhs(y, t, p[, args]).

    rhs: returns a tuple of n scalars; indexes ``y`` and ``p`` with literal integers only (the
        form the CUDA backend compiles). ``args`` (optional, any pytree of arrays, shared by all
        trajectories) is passed as the 4th argument when given — e.g. interpolation tables.
    y0: (N, n) initial states. params: (N, P) per-trajectory parameters (P may be 0).
    t_save: (m,) shared or (N, m) per-trajectory save times, ascending, within [t0, t_end].
    t0: scalar or (N,) start times (default: the first save time). t_end: scalar or (N,)
        (default: the last save time).
    rtol, atol: tolerances (atol scalar or (n,)); error_weights: (n,) non-negative weights in the
        error norm — a zero removes that component from step-size control — or (N, n), a row
        per trajectory (one launch for trajectories that control different components; each
        row's norm is its own RMS over its positive weights).
    sparsity: optional (n, n) bool pattern, a superset of the true Jacobian structure; by default
        it is detected by tracing ``rhs``. linear_solver: "auto", "dense" or "sparse".
    backend: "jax", "cuda", "auto" (CUDA where it can run) or a Backend object
        (``JaxBackend()``, ``CudaBackend(launch=..., cache_root=...)``).
    Returns a ``Solution``; failed trajectories are reported by status, never silently.
    """
    require_x64("solver.solve")
    be = resolve_backend(backend)
    inputs = validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights,
                             max_steps, first_step)
    return be.solve(rhs, inputs, args=args, rtol=rtol, max_steps=int(max_steps),
                    sparsity=sparsity, linear_solver=linear_solver,
                    controller=controller or PIDController(), tableau=tableau)
