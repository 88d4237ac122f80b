"""The JAX backend's per-RHS plan: structure, linear solver, Jacobian and the jitted ensemble loop.

Everything derived from (rhs, sizes, options) is built once and cached, so repeated solves of the
same model pay only the solve; ``solve`` and ``solve_diff``'s undifferentiated value share the
cache.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...caches import Cache
from ...linalg.jacobian import build_jacobian_plan
from ...linalg.linear import build_linear_solver
from ...linalg.sparsity import solver_pattern
from .ensemble import make_ensemble_solver

__all__ = ["JaxPlan", "get_plan", "abstract_args"]

#: plans by (rhs, n, P, has_args, sparsity, linear solver, tableau, controller, max_steps)
PLANS = Cache("jax.plans", maxsize=64)


class JaxPlan:
    """Everything derived once from (rhs, n, n_params, options): structure, LU, jitted solve."""

    def __init__(self, rhs, n, n_params, has_args, args_example, sparsity, linear_solver, tab,
                 ctrl, max_steps, *, linear=None, seed_columns=None):
        self.n = n
        if has_args:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p, args)))
        else:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p)))
        self.f = f
        self.pattern = pattern = solver_pattern(rhs, n, n_params, sparsity,
                                                args_example if has_args else None)
        # linear / seed_columns: a prebuilt solver for a structured W and the columns J is
        # taken over (the forward-sensitivity solve's block-triangular system, joint.py)
        self.linear = linear if linear is not None else build_linear_solver(pattern,
                                                                            method=linear_solver)
        jac_pattern = pattern
        if seed_columns is not None:
            jac_pattern = np.zeros_like(pattern)
            jac_pattern[:, seed_columns] = pattern[:, seed_columns]
        self.jac, self.n_colors = _make_jacobian(rhs, has_args, jac_pattern, self.linear,
                                                 seed_columns)
        self.run = jax.jit(make_ensemble_solver(f, self.jac, self.linear, tab, ctrl, max_steps))


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


def abstract_args(args):
    """``args`` as shape/dtype structs (a plan built inside a trace sees no values)."""
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), args)


def get_plan(rhs, n, n_params, has_args, args_example, sparsity, linear_solver, tableau, ctrl,
             max_steps, *, in_trace: bool = False) -> JaxPlan:
    """The cached plan. ``sparsity``: None or an (n, n) pattern. ``in_trace``: the plan may be
    built inside a JAX trace (``solve_diff``); its construction-time constants are then
    evaluated eagerly, or they would be tracers leaked into the cache."""
    key = (rhs, n, n_params, has_args,
           None if sparsity is None else np.asarray(sparsity, bool).tobytes(),
           linear_solver, tableau.name, ctrl, int(max_steps))

    def build():
        if not in_trace:
            return JaxPlan(rhs, n, n_params, has_args, args_example, sparsity, linear_solver,
                           tableau, ctrl, int(max_steps))
        with jax.ensure_compile_time_eval():
            return JaxPlan(rhs, n, n_params, has_args, abstract_args(args_example), sparsity,
                           linear_solver, tableau, ctrl, int(max_steps))

    return PLANS.get_or_build(key, build)
