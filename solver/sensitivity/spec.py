"""Building the :class:`~solver.problem.SensitivitySpec` of a differentiable solve: option checks,
backend resolution, and a cache so equal settings give the same (identity-hashed) spec."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..backends.cuda.toolchain import CudaBackendUnavailable
from ..backends.registry import resolve_backend
from ..caches import Cache
from ..method.controller import PIDController
from ..method.tableau import RODAS5P
from ..problem.inputs import check_options, require_x64, validate_traceable
from ..problem.sensitivity_spec import SensitivitySpec, sec_weight

__all__ = ["prepare", "CudaSensitivityUnavailable", "SOLVE_KWARGS"]

#: ``solve`` options that ``solve_diff`` / ``joint_solve`` pass through (``_jacobian``: the JAX
#: backend's "block_diagonal" diagnostic)
SOLVE_KWARGS = ("sparsity", "linear_solver", "controller", "tableau", "first_step", "backend",
                "_jacobian")

SPECS = Cache("sensitivity.specs", maxsize=256)


class CudaSensitivityUnavailable(CudaBackendUnavailable, ValueError):
    """``solve_diff(backend="cuda")`` where the CUDA backend cannot run: the
    :class:`~solver.backends.cuda.CudaBackendUnavailable` that ``solve`` raises, with its reason;
    also a ValueError, as callers that only know the JAX backend catch bad ``backend`` values."""


def _spec(rhs, n, P, args, rtol, atol, error_weights, sens_atol, sec, max_steps, kw,
          n_traj=None):
    """The spec of these settings (cached); ``n_traj``: the trajectories of the call, which
    per-trajectory error weights (n_traj, n) need (None: one row (n,) only)."""
    unknown = set(kw) - set(SOLVE_KWARGS)
    if unknown:
        raise TypeError(f"solve_diff got unexpected keyword arguments {sorted(unknown)}")
    backend = resolve_backend(kw.get("backend", "jax"))
    atol_a, w = check_options(n, rtol, atol, error_weights, max_steps, n_traj=n_traj)
    sa = atol_a if sens_atol is None else np.broadcast_to(
        np.asarray(sens_atol, np.float64), (n,)).copy()
    if np.any(sa <= 0):
        raise ValueError("sensitivity_atol must be positive")
    sparsity = kw.get("sparsity")
    sp = None if sparsity is None else np.asarray(sparsity, bool)
    fs = kw.get("first_step")
    if fs is not None and np.ndim(fs) != 0:
        raise ValueError("solve_diff: first_step must be a scalar")
    fs_key = None if fs is None else float(fs)
    leaves, treedef = jax.tree_util.tree_flatten(args)
    leaf_meta = tuple((tuple(np.shape(x)), np.dtype(jnp.result_type(x))) for x in leaves)
    ctrl = kw.get("controller") or PIDController()
    tab = kw.get("tableau", RODAS5P)
    jacobian = kw.get("_jacobian", "exact")
    linear_solver = kw.get("linear_solver", "auto")
    key = (rhs, n, P, args is not None, treedef, leaf_meta, float(rtol), atol_a.tobytes(),
           w.tobytes(), sa.tobytes(), sec_weight(sec), int(max_steps),
           None if sp is None else sp.tobytes(), linear_solver, tab.name, ctrl, fs_key, jacobian,
           backend)
    spec = SPECS.get(key)
    if spec is None:
        spec = SensitivitySpec(rhs, n, P, args is not None, treedef, leaf_meta, rtol, atol_a, w,
                               sa, sec, max_steps, sp, linear_solver, tab, ctrl, fs_key,
                               jacobian, backend)
        try:
            backend.check_sensitivities(spec)
        except CudaBackendUnavailable as exc:
            raise CudaSensitivityUnavailable(str(exc)) from exc
        SPECS.put(key, spec)
    return spec


def prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end, error_weights,
            sensitivity_atol, sec, max_steps, kw):
    """(spec, y0, params, t_save, t0, t_end): the spec and the arrays as JAX float64 arrays of
    normalised shapes (values checked where concrete)."""
    require_x64("solve_diff / joint_solve")
    v = validate_traceable(y0, t_save, params, t0, t_end)
    spec = _spec(rhs, v.y0.shape[1], v.params.shape[1], args, rtol, atol, error_weights,
                 sensitivity_atol, sec, max_steps, kw, v.y0.shape[0])
    return spec, v.y0, v.params, v.t_save, v.t0, v.t_end
