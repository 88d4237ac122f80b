"""The JAX backend's per-RHS plan: structure, linear solver, Jacobian and the jitted ensemble loop.

Everything derived from (rhs, sizes, options) is built once and cached, so repeated solves of the
same model pay only the solve; ``solve`` and ``solve_diff``'s undifferentiated value share the
cache. A plain plan's solve program is a ``solver.persisted.PersistedProgram``: with a program
store set, later processes load its traced form instead of tracing it again.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...caches import Cache
from ...digest import digest_of
from ...linalg.direct import build_direct_jacobian, declared_pattern, direct_jacobian_of
from ...linalg.jacobian import build_jacobian_plan
from ...linalg.linear import build_linear_solver
from ...linalg.sparsity import solver_pattern
from ...persisted import PersistedProgram
from .ensemble import make_ensemble_solver

__all__ = ["JaxPlan", "get_plan", "abstract_args"]

#: plans by (rhs, n, P, has_args, sparsity, linear solver, tableau, controller, max_steps,
#: lanes)
PLANS = Cache("jax.plans", maxsize=64)


class JaxPlan:
    """Everything derived once from (rhs, n, n_params, options): structure, LU, jitted solve."""

    def __init__(self, rhs, n, n_params, has_args, args_example, sparsity, linear_solver, tab,
                 ctrl, max_steps, *, linear=None, seed_columns=None, jac_builder=None,
                 f_array=None, lanes=None, initial_step=None):
        self.n = n
        if f_array is not None:
            # the same rhs returning one (n,) array: the joint sensitivity system's n(1 + m)
            # components as a tuple would put a slice, a reshape and a broadcast per component
            # into every evaluation of the compiled loop
            f = f_array
        elif has_args:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p, args)))
        else:
            def f(y, t, p, args):
                return jnp.stack(jnp.broadcast_arrays(*rhs(y, t, p)))
        #: f(y, t, p, args) -> (n,) array
        self.f = f
        # a plain solve of an rhs that declares its Jacobian evaluates it directly; the joint
        # sensitivity system (seed_columns) is not linear-declared and keeps the sweeps
        lj = direct_jacobian_of(rhs) if seed_columns is None and linear is None else None
        if lj is not None and sparsity is None:
            sparsity = declared_pattern(lj, n)
        self.pattern = pattern = solver_pattern(rhs, n, n_params, sparsity,
                                                args_example if has_args else None)
        # linear / seed_columns: a prebuilt solver for a structured W and the columns J is
        # taken over (the forward-sensitivity solve's block-triangular system, joint.py);
        # jac_builder(f, linear) -> jac(y, t, p, args, h): J's slots computed by the caller
        # instead of sweeps
        # a declared (linear, EB-like) Jacobian: the elimination order of fewest levels -- the
        # level-scheduled LU runs one vectorised operation a level, so fewer levels are fewer
        # operations a step (the default model: 49 + 8 x 33 instead of 175 + 8 x 118; 1.65x
        # faster warm and 12 s less to compile on the 2-core CPU, docs/benchmarks.md)
        ordering = "depth" if lj is not None else "amd"
        self.linear = linear if linear is not None else build_linear_solver(
            pattern, method=linear_solver, ordering=ordering)
        jac_pattern = pattern
        if seed_columns is not None:
            jac_pattern = np.zeros_like(pattern)
            jac_pattern[:, seed_columns] = pattern[:, seed_columns]
        if jac_builder is not None:
            # a caller that knows J's structure (the joint system of a declared Jacobian)
            self.jac, self.n_colors, lj = jac_builder(f, self.linear), 0, True
        elif lj is not None:
            self.jac, self.n_colors = _direct_jacobian(f, lj, has_args, self.linear), 0
        else:
            self.jac, self.n_colors = _make_jacobian(rhs, has_args, jac_pattern, self.linear,
                                                     seed_columns)
        #: "direct" (the rhs's declared J and one sweep in t) or "colored" (one sweep per colour)
        self.jacobian = "direct" if lj is not None else "colored"
        #: trajectories advanced together (None: all; ``ensemble.make_ensemble_solver``)
        self.lanes = lanes
        # initial_step: the automatic first step, when not the default's of f (the joint
        # sensitivity system takes its primal's, joint.py)
        run = make_ensemble_solver(f, self.jac, self.linear, tab, ctrl, max_steps, lanes=lanes,
                                   initial_step=initial_step)
        if linear is None and seed_columns is None and jac_builder is None and f_array is None \
                and initial_step is None:
            # a plain plan is determined by what the key names; the joint sensitivity plans
            # (prebuilt solver, seeds, builders) stay plain jit
            parts = _plan_key_parts(rhs, n, n_params, has_args, sparsity, linear_solver, tab,
                                    ctrl, max_steps, lanes)
            self.run = PersistedProgram(run, parts, name="solver.ensemble")
        else:
            self.run = jax.jit(run)


def _plan_key_parts(rhs, n, n_params, has_args, sparsity, linear_solver, tab, ctrl, max_steps,
                    lanes):
    """The persisted solve program's key parts (``PersistedProgram``), computed on first need:
    fingerprints of the rhs and its declared Jacobian (``solver.digest``; Unfingerprintable
    there means the program is not persisted) and the options the plan is built from."""
    def parts():
        lj = direct_jacobian_of(rhs)
        declared = None if lj is None else (digest_of(lj.values), tuple(lj.rows), tuple(lj.cols))
        return ("solver.ensemble", digest_of(rhs), declared, int(n), int(n_params),
                bool(has_args),
                None if sparsity is None else np.asarray(sparsity, bool).tobytes(),
                linear_solver, tab.name, digest_of(vars(tab)), repr(ctrl), int(max_steps), lanes)
    return parts


def _make_jacobian(rhs, has_args, pattern, linear, seed_columns=None):
    """f, J (in the linear solver's slot layout) and ∂f/∂t by colour-compressed JVP sweeps."""
    plan = build_jacobian_plan(pattern, linear, seed_columns=seed_columns)

    if has_args:
        def jac(y, t, p, args, h):
            return plan.f_jac_and_dfdt(rhs, y, t, p, args)
    else:
        def jac(y, t, p, args, h):
            return plan.f_jac_and_dfdt(rhs, y, t, p)
    return jac, plan.n_colors


def _direct_jacobian(f, lj, has_args, linear):
    """f, J (slot layout) and ∂f/∂t: J from the rhs's declared entries, f and ∂f/∂t from one
    forward sweep in t."""
    placed = build_direct_jacobian(lj, linear.slot_rows, linear.slot_cols)

    def jac(y, t, p, args, h):
        f_val, dfdt = jax.jvp(lambda t_: f(y, t_, p, args), (t,), (jnp.ones_like(t),))
        entries = lj.values(t, p, args) if has_args else lj.values(t, p)
        values = jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(v, y.dtype) for v in entries]))
        return f_val, placed.to_slots(values), dfdt
    return jac


def abstract_args(args):
    """``args`` as shape/dtype structs (a plan built inside a trace sees no values)."""
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), args)


def get_plan(rhs, n, n_params, has_args, args_example, sparsity, linear_solver, tableau, ctrl,
             max_steps, *, in_trace: bool = False, lanes: int | None = None) -> JaxPlan:
    """The cached plan. ``sparsity``: None or an (n, n) pattern. ``in_trace``: the plan may be
    built inside a JAX trace (``solve_diff``); its construction-time constants are then
    evaluated eagerly, or they would be tracers leaked into the cache."""
    key = (rhs, n, n_params, has_args,
           None if sparsity is None else np.asarray(sparsity, bool).tobytes(),
           linear_solver, tableau.name, ctrl, int(max_steps), lanes)

    def build():
        if not in_trace:
            return JaxPlan(rhs, n, n_params, has_args, args_example, sparsity, linear_solver,
                           tableau, ctrl, int(max_steps), lanes=lanes)
        with jax.ensure_compile_time_eval():
            return JaxPlan(rhs, n, n_params, has_args, abstract_args(args_example), sparsity,
                           linear_solver, tableau, ctrl, int(max_steps), lanes=lanes)

    return PLANS.get_or_build(key, build)
