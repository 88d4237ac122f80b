"""The static settings of one differentiable ensemble solve.

A ``SensitivitySpec`` is what ``solve_diff`` / ``joint_solve`` hand to a backend: the RHS, sizes,
tolerances and options, and the structure of ``args``. It is hashable by identity and built
through a cache (``solver.sensitivity``), so equal settings give the same object, and the plans
and jit caches keyed by it are reused.
"""
from __future__ import annotations

import numpy as np

__all__ = ["SensitivitySpec"]


class SensitivitySpec:
    """Static settings of one differentiable solve (equal settings: the same cached object).

    ``backend`` is the resolved backend object; ``treedef`` / ``leaf_meta`` ((shape, dtype) per
    leaf) describe ``args``; ``sens_atol`` is the absolute tolerance of the sensitivities and
    ``sec`` whether they take part in step-size control; ``jacobian`` is "exact" or the JAX
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
        self.sec = bool(sec)
        self.max_steps = int(max_steps)
        self.sparsity = sparsity
        self.linear_solver, self.tableau, self.ctrl = linear_solver, tableau, ctrl
        self.first_step = first_step
        self.jacobian = jacobian
        self.float_leaf = tuple(np.issubdtype(dt, np.floating) for _, dt in leaf_meta)
        self.leaf_size = tuple(int(np.prod(s)) for s, _ in leaf_meta)
