"""The static settings of one differentiable ensemble solve.

A ``SensitivitySpec`` is what ``solve_diff`` / ``joint_solve`` hand to a backend: the RHS, sizes,
tolerances and options, and the structure of ``args``. It is hashable by identity and built
through a cache (``solver.sensitivity``), so equal settings give the same object, and the plans
and jit caches keyed by it are reused.
"""
from __future__ import annotations

import numpy as np

__all__ = ["SensitivitySpec", "sec_weight"]


def sec_weight(sensitivity_error_control) -> float:
    """``sensitivity_error_control`` as the sensitivities' weight in the error norm: True = 1
    (controlled as the state is), False = 0 (not controlled: the plain solve's steps), a number
    in (0, 1) = controlled at relative tolerance rtol / weight."""
    w = float(sensitivity_error_control)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"sensitivity_error_control={sensitivity_error_control!r}: give True, "
                         "False or a weight between 0 and 1 (the sensitivities are then "
                         "controlled at rtol / weight)")
    return w


class SensitivitySpec:
    """Static settings of one differentiable solve (equal settings: the same cached object).

    ``backend`` is the resolved backend object; ``treedef`` / ``leaf_meta`` ((shape, dtype) per
    leaf) describe ``args``; ``sens_atol`` is the absolute tolerance of the sensitivities and
    ``sec`` the weight of the sensitivities in the step-size control (``sec_weight``: 0 = out
    of it, 1 = as the state, between = at tolerances 1/sec looser); ``jacobian`` is "exact" or the JAX
    backend's diagnostic "block_diagonal".
    """

    def __init__(self, rhs, n, P, has_args, treedef, leaf_meta, rtol, atol, weights, sens_atol,
                 sec, max_steps, sparsity, linear_solver, tableau, ctrl, first_step, jacobian,
                 backend):
        self.rhs, self.n, self.P, self.has_args = rhs, n, P, has_args
        self.backend = backend
        self.treedef, self.leaf_meta = treedef, leaf_meta
        self.rtol = float(rtol)
        self.atol = np.asarray(atol, np.float64)
        self.weights = np.asarray(weights, np.float64)
        self.sens_atol = np.asarray(sens_atol, np.float64)
        self.sec = sec_weight(sec)
        self.max_steps = int(max_steps)
        self.sparsity = sparsity
        self.linear_solver, self.tableau, self.ctrl = linear_solver, tableau, ctrl
        self.first_step = first_step
        self.jacobian = jacobian
        self.float_leaf = tuple(np.issubdtype(dt, np.floating) for _, dt in leaf_meta)
        self.leaf_size = tuple(int(np.prod(s)) for s, _ in leaf_meta)
