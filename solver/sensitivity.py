"""Exact derivatives through the ensemble solve by forward sensitivities (DESIGN §8).

``solve_diff(rhs, y0, t_save, params, args=...)`` returns the saved states ``ys`` (N, m_save, n)
like ``solve(...).ys`` and is differentiable with ``jax.jvp``, ``jax.jacfwd``, ``jax.grad``,
``jax.jacrev`` and ``jax.vjp`` with respect to ``y0``, ``params`` and the float leaves of
``args`` (tables shared by all trajectories); it composes with ``jax.jit`` and ``jax.vmap``.
Save times, ``t0`` and ``t_end`` are not differentiated (their tangents are treated as zero).

How (details and measurements in docs/gradients.md):

* An undifferentiated call is the ordinary solve: the same cached plan and jitted ensemble loop
  that ``solver.solve`` runs; nothing about sensitivities is built or run.
* Under differentiation a ``jax.custom_jvp`` rule returns the ordinary solve as primal and, as
  tangent, one linear primitive (``sensitivity_tangent``) of the input tangents.  Its
  implementation integrates, per trajectory, the joint system ``z = [y, s_1 .. s_m]`` of the
  state and ``m`` directional sensitivities ``s_d = S θ̇_d``::

      y'   = f(y, t, p, args)
      s_d' = J s_d + (∂f/∂p) ṗ_d + (∂f/∂args) ȧrgs_d = jvp(f, (y, p, args), (s_d, ṗ_d, ȧrgs_d))
      s_d(t0) = ẏ0_d

  with the same Rodas5P solver.  The solver's Jacobian of this augmented rhs is taken by forward
  AD of the jvp, i.e. forward-over-forward: it contains ``d²f/dy² · s_d`` exactly (the block
  ``∂s_d'/∂y``); DESIGN §8 explains why the block-diagonal approximation is not acceptable.
  The joint W is block lower-triangular with W0 = I/(hγ) - J on every diagonal block, so it is
  solved staggered (``solver.linear.build_block_triangular_solver``: W0 factored once, the
  direction blocks by forward substitution) and the Jacobian is swept over the y columns only.
* Batching: ``jax.jacfwd`` (``vmap`` over tangents) reaches the primitive's batching rule, which
  puts all B requested directions into ONE joint solve ``[y, s_1..s_B]`` — or, when B exceeds the
  number K of independent input components per trajectory (K = n for y0 + P for params + the size
  of every differentiated args leaf), computes the K unit-direction sensitivities once and
  contracts them with the tangents (e.g. ``jacfwd`` w.r.t. an (N, P) params array asks for N·P
  directions, but trajectories are independent, so P suffice).
* Reverse mode: the primitive is linear in the tangents, and its transpose rule computes the
  sensitivities for the K unit directions of the differentiated inputs (forward mode!) and
  contracts them with the cotangent.  So ``jax.grad``/``jacrev``/``vjp`` are exact, and cost one
  joint solve with K directions, independent of the number of outputs — fine for a handful of
  parameters, expensive when a large table in ``args`` is differentiated (K = table size).  For a
  pipeline θ → tables → solve, wrap the whole θ-map with :func:`grad_by_forward_mode` so
  ``jax.grad`` costs one joint solve with len(θ) directions.
* Error control: ``sensitivity_error_control=True`` (default) includes the sensitivities in the
  error norm (the weights are scaled so the joint error² = Σ over blocks of each block's RMS²,
  hence every block is controlled at least as tightly as the plain solve controls y);
  ``False`` gives them zero weight, so the joint solve takes exactly the plain solve's steps and
  the sensitivities carry whatever error those steps make.
* Second derivatives (jvp of the tangent primitive) are not implemented.

The augmented rhs is a Python closure that slices ``z`` and ``p`` with literal ranges and returns a
tuple — the JAX backend's form.

CUDA backend (``backend="cuda"``, or ``"auto"`` where CUDA is available): the primal is the plain
CUDA kernel and the tangent primitive's implementation is the generated sensitivity kernel of
:mod:`solver.cuda_backend` (``solve_sensitivities``): one GPU thread per (trajectory, direction),
each integrating ``[y, s_d]`` with the exact joint Jacobian (staggered stage solves, H·u by
Enzyme's ``jvp(jvp(f))``; docs/gradients.md, "CUDA backend").  Both run as host callbacks
(``jax.pure_callback``: a numba launch on copies of the operands), so they work eagerly, under
``jit`` and ``vmap`` (sequentially); batching, transposition and contraction are the same code as
for the JAX backend.  With ``sensitivity_error_control`` each thread controls RMS_y² + RMS_s² of
its own direction (the JAX joint solve of m directions controls RMS_y² + Σ_d RMS_s_d²), so the two
backends take different steps and agree to the tolerance, not to rounding.  ``args`` must be one
array read through ``rhs.table_split`` (as for ``solve(..., backend="cuda")``); the tangent
tables enter linearly (Hermite lookup is linear in the table).
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

try:  # public home since JAX 0.4.3x
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
    from jax.core import Primitive

from . import api
from .controller import PIDController
from .cuda_backend import CudaBackendUnavailable
from .linear import build_block_triangular_solver
from .sparsity import detect_sparsity
from .tableau import RODAS5P

__all__ = ["solve_diff", "joint_solve", "grad_by_forward_mode", "COUNTERS", "clear_caches",
           "CudaSensitivityUnavailable"]


class CudaSensitivityUnavailable(CudaBackendUnavailable, ValueError):
    """``solve_diff(backend="cuda")`` where the CUDA backend cannot run: the
    :class:`~solver.cuda_backend.CudaBackendUnavailable` that ``solve`` raises, with its reason;
    also a ValueError, which is what ``solve_diff`` raised for any backend but "jax" before the
    CUDA sensitivities existed (callers catching that keep working)."""

#: How often the joint (sensitivity) system was built / run eagerly; tests use it to prove that an
#: undifferentiated call never touches it.  ``joint_traces`` counts every trace of the joint solve
#: (eager calls and jit traces), ``plans`` the joint plans built.
COUNTERS = {"joint_traces": 0, "plans": 0, "pattern_seconds": 0.0}

#: the latest CUDA launches made through solve_diff's host callbacks, "primal" (plain kernel) and
#: "tangent" (sensitivity kernel): kernel seconds, threads, steps (accepted + rejected) max and
#: median, and for the tangent the slowest thread's (trajectory, direction) — a launch lasts as
#: long as its slowest thread (bench_gpu part (d) reports them).
LAST_CUDA_LAUNCH: dict = {}


def _record_launch(kind, sol, steps, **extra):
    steps = np.asarray(steps)
    rec = {"kernel_seconds": (sol.info or {}).get("kernel_seconds"), "threads": int(steps.size),
           "steps_max": int(steps.max()) if steps.size else 0,
           "steps_median": float(np.median(steps)) if steps.size else 0.0}
    rec.update(extra)
    LAST_CUDA_LAUNCH[kind] = rec

_SOLVE_KWARGS = ("sparsity", "linear_solver", "controller", "tableau", "first_step", "backend",
                 "_jacobian")


# ---------------------------------------------------------------------------------------------
# configuration (hashable by identity, cached so equal settings reuse plans and jit caches)
# ---------------------------------------------------------------------------------------------
class _Config:
    """Static settings of one differentiable solve; hashable by identity (cached in _CONFIGS)."""

    def __init__(self, rhs, n, P, has_args, treedef, leaf_meta, rtol, atol, weights, sens_atol,
                 sec, max_steps, sparsity, linear_solver, tableau, ctrl, first_step, jacobian,
                 backend="jax"):
        self.rhs, self.n, self.P, self.has_args = rhs, n, P, has_args
        self.backend = backend                                  # "jax" | "cuda" (resolved)
        self.treedef, self.leaf_meta = treedef, leaf_meta       # leaf_meta: ((shape, dtype), ...)
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


_CONFIGS: dict = {}
_JOINT_PLANS: dict = {}
_AUG_PATTERNS: dict = {}
_DIFF_FNS: dict = {}


def clear_caches():
    """Forget cached configurations, joint plans and patterns (tests, memory)."""
    _CONFIGS.clear()
    _JOINT_PLANS.clear()
    _AUG_PATTERNS.clear()
    _DIFF_FNS.clear()


def _config(rhs, n, P, args, rtol, atol, error_weights, sens_atol, sec, max_steps, kw):
    unknown = set(kw) - set(_SOLVE_KWARGS)
    if unknown:
        raise TypeError(f"solve_diff got unexpected keyword arguments {sorted(unknown)}")
    backend = _resolve_backend(kw.get("backend", "jax"), kw.get("_jacobian", "exact"))
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    atol_a = np.asarray(atol, np.float64)
    if atol_a.ndim > 1 or atol_a.size not in (1, n) or np.any(atol_a <= 0):
        raise ValueError(f"atol must be a positive scalar or an array of shape ({n},)")
    atol_a = np.broadcast_to(atol_a, (n,)).copy()
    sa = atol_a if sens_atol is None else np.broadcast_to(
        np.asarray(sens_atol, np.float64), (n,)).copy()
    if np.any(sa <= 0):
        raise ValueError("sensitivity_atol must be positive")
    if error_weights is None:
        w = np.ones(n)
    else:
        w = np.asarray(error_weights, np.float64)
        if w.shape != (n,) or np.any(w < 0) or not np.all(np.isfinite(w)) or not np.any(w > 0):
            raise ValueError(f"error_weights must be a finite non-negative array of shape ({n},) "
                             "with at least one positive entry")
    if not (isinstance(max_steps, (int, np.integer)) and max_steps > 0):
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    sparsity = kw.get("sparsity")
    sp = None if sparsity is None else np.asarray(sparsity, bool)
    fs = kw.get("first_step")
    fs_key = None if fs is None else float(fs)
    if fs is not None and np.ndim(fs) != 0:
        raise ValueError("solve_diff: first_step must be a scalar")
    leaves, treedef = jax.tree_util.tree_flatten(args)
    leaf_meta = tuple((tuple(np.shape(x)), np.dtype(jnp.result_type(x))) for x in leaves)
    if backend == "cuda":
        _check_cuda_args(rhs, args, leaf_meta)
    ctrl = kw.get("controller") or PIDController()
    tab = kw.get("tableau", RODAS5P)
    jacobian = kw.get("_jacobian", "exact")
    key = (rhs, n, P, args is not None, treedef, leaf_meta, float(rtol), atol_a.tobytes(),
           w.tobytes(), sa.tobytes(), bool(sec), int(max_steps),
           None if sp is None else sp.tobytes(), kw.get("linear_solver", "auto"), tab.name, ctrl,
           fs_key, jacobian, backend)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = _Config(rhs, n, P, args is not None, treedef, leaf_meta, rtol, atol_a, w, sa, sec,
                      max_steps, sp, kw.get("linear_solver", "auto"), tab, ctrl, fs_key, jacobian,
                      backend)
        _CONFIGS[key] = cfg
    return cfg


def _resolve_backend(backend, jacobian):
    """"jax" or "cuda" ("auto": CUDA where available); "cuda" where it cannot run raises
    :class:`CudaSensitivityUnavailable` with the reason."""
    if backend not in api.BACKENDS:
        raise ValueError(f"backend must be one of {api.BACKENDS}, got {backend!r}")
    if backend == "auto":
        from . import backends
        backend = backends.pick_backend()
    if backend == "cuda":
        from . import cuda_backend
        try:
            cuda_backend._cuda_modules()
        except CudaBackendUnavailable as exc:
            raise CudaSensitivityUnavailable(str(exc)) from exc
        if jacobian != "exact":
            raise ValueError("_jacobian='block_diagonal' is a JAX-backend diagnostic")
    return backend


def _check_cuda_args(rhs, args, leaf_meta):
    """backend='cuda' reads tables through rhs.table_split: args must be ONE numeric array
    (checked on its shape and dtype only: args may be a tracer here)."""
    if args is None:
        return
    from .cuda_backend import table_split_of
    if len(leaf_meta) != 1:
        raise TypeError("backend='cuda': args must be one numeric array (the tables, read through "
                        f"rhs.table_split), got a pytree with {len(leaf_meta)} leaves")
    shape, dtype = leaf_meta[0]
    table_split_of(rhs, np.zeros(shape, dtype))


# ---------------------------------------------------------------------------------------------
# the plain solve (same plan cache and jitted loop as solver.solve, traceable inputs)
# ---------------------------------------------------------------------------------------------
def _plain_plan(cfg, args):
    key = (cfg.rhs, cfg.n, cfg.P, cfg.has_args,
           None if cfg.sparsity is None else cfg.sparsity.tobytes(), cfg.linear_solver,
           cfg.tableau.name, cfg.ctrl, cfg.max_steps)
    plan = api._PLANS.get(key)
    if plan is None:
        # plans are built inside traces here (solve builds them eagerly): evaluate their
        # construction-time jnp constants eagerly, or they would be tracers leaked into the cache
        with jax.ensure_compile_time_eval():
            plan = api._Plan(cfg.rhs, cfg.n, cfg.P, cfg.has_args, _abstract(args), cfg.sparsity,
                             cfg.linear_solver, cfg.tableau, cfg.ctrl, cfg.max_steps)
        api._PLANS[key] = plan
    return plan


def _abstract(args):
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), args)


def _h0(cfg, N):
    return jnp.full((N,), jnp.nan if cfg.first_step is None else cfg.first_step, jnp.float64)


def _primal_ys(cfg, y0, params, args, ts, t0, te):
    """The undifferentiated solve's ys on the configuration's backend."""
    if cfg.backend == "cuda":
        return _cuda_plain_ys(cfg, y0, params, args, ts, t0, te)
    return _plain_solve(cfg, y0, params, args, ts, t0, te).ys


def _cuda_table(cfg, args):
    """The one table array the CUDA kernels read (a 1-element dummy without args)."""
    return jax.tree_util.tree_leaves(args)[0] if cfg.has_args else jnp.zeros(1)


def _cuda_plain_ys(cfg, y0, params, args, ts, t0, te):
    """The plain CUDA kernel as a host callback (a numba launch; eager, jit and vmap)."""
    N, ns = ts.shape

    def host(y0, params, tab, ts, t0, te):
        from . import cuda_backend as cb
        inp = cb._prepare(y0, ts, params, cfg.rtol, cfg.atol, t0, te, cfg.weights,
                          cfg.max_steps, cfg.first_step)
        sol = cb._solve_numba(cfg.rhs, inp, tab if cfg.has_args else None, cfg.sparsity,
                              cfg.max_steps, cfg.ctrl, cfg.tableau)
        _record_launch("primal", sol, np.asarray(sol.n_accepted) + np.asarray(sol.n_rejected))
        return np.asarray(sol.ys, np.float64)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((N, ns, cfg.n), jnp.float64), y0,
                             params, _cuda_table(cfg, args), ts, t0, te,
                             vmap_method="sequential")


def _plain_solve(cfg, y0, params, args, ts, t0, te):
    plan = _plain_plan(cfg, args)
    N = y0.shape[0]
    res = plan.run(y0, t0, te, ts, params, args if cfg.has_args else None, jnp.float64(cfg.rtol),
                   jnp.asarray(cfg.atol), jnp.asarray(cfg.weights), _h0(cfg, N))
    return res


# ---------------------------------------------------------------------------------------------
# the joint system [y, s_1..s_m]
# ---------------------------------------------------------------------------------------------
def _make_aug(cfg, m, mask, jacobian):
    """Augmented rhs for m directions; mask = (y0 present, params present, args-leaf indices)."""
    rhs, n, P = cfg.rhs, cfg.n, cfg.P
    treedef = cfg.treedef
    arg_idx = mask[2]
    block_diag = jacobian == "block_diagonal"

    def aug(z, t, q, A):
        args_leaves, dargs = A
        y = z[:n]
        S = z[n:].reshape(m, n)
        p = q[:P]
        dP = q[P:].reshape(m, P)
        dargs = tuple(dargs)

        def g(y_, p_, ad_):
            leaves = list(args_leaves)
            for i, v in zip(arg_idx, ad_):
                leaves[i] = v
            if cfg.has_args:
                out = rhs(y_, t, p_, jax.tree_util.tree_unflatten(treedef, leaves))
            else:
                out = rhs(y_, t, p_)
            return jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(o, z.dtype) for o in out]))

        ad0 = tuple(args_leaves[i] for i in arg_idx)
        fy = g(y, p, ad0)
        yl = jax.lax.stop_gradient(y) if block_diag else y
        ds = jax.vmap(lambda s, dp, da: jax.jvp(g, (yl, p, ad0), (s, dp, da))[1])(S, dP, dargs)
        out = jnp.concatenate([fy, ds.reshape(-1)])
        return tuple(out[i] for i in range(n * (1 + m)))

    return aug


def _aug_pattern(cfg, mask, base_pattern, args_example, jacobian):
    """Pattern of the m-direction joint Jacobian from the one-direction coupling block.

    Structure [[P, 0, ..], [P', P, 0, ..], [P', 0, P, ..], ..] where P' = ∂s'/∂y (Hessian
    coupling) is detected on the one-direction augmented rhs (P' ⊆ P always holds).
    """
    key = (cfg, mask, jacobian)
    hit = _AUG_PATTERNS.get(key)
    if hit is not None:
        return hit
    n = cfg.n
    t0 = time.perf_counter()
    if jacobian == "block_diagonal":
        coupling = np.zeros((n, n), bool)
    else:
        aug1 = _make_aug(cfg, 1, mask, jacobian)
        A1 = _aug_args(cfg, args_example, mask, 1)
        with jax.ensure_compile_time_eval():
            pat1 = detect_sparsity(aug1, 2 * n, 2 * cfg.P, args=A1)
        coupling = pat1[n:, :n] & base_pattern
    COUNTERS["pattern_seconds"] += time.perf_counter() - t0
    _AUG_PATTERNS[key] = (base_pattern, coupling)
    return base_pattern, coupling


def _block_pattern(base, coupling, m):
    n = base.shape[0]
    pat = np.zeros((n * (1 + m), n * (1 + m)), bool)
    pat[:n, :n] = base
    for d in range(m):
        r = slice(n * (1 + d), n * (2 + d))
        pat[r, :n] = coupling
        pat[r, r] = base
    return pat


def _aug_args(cfg, args, mask, m):
    leaves = tuple(jax.tree_util.tree_leaves(_abstract(args))) if cfg.has_args else ()
    dargs = tuple(jax.ShapeDtypeStruct((m,) + cfg.leaf_meta[i][0], jnp.float64)
                  for i in mask[2])
    return (leaves, dargs)


def _joint_plan(cfg, m, mask, args):
    key = (cfg, m, mask)
    plan = _JOINT_PLANS.get(key)
    if plan is None:
        plain = _plain_plan(cfg, args)
        base, coupling = _aug_pattern(cfg, mask, plain.pattern, args, cfg.jacobian)
        pattern = _block_pattern(base, coupling, m)
        aug = _make_aug(cfg, m, mask, cfg.jacobian)
        # W is block lower-triangular: factor the y block with the plain solve's W0 solver and
        # substitute (staggered, as the CUDA kernel does); J and the couplings H_d come from
        # sweeps over y alone
        linear = build_block_triangular_solver(plain.linear, coupling, m)
        with jax.ensure_compile_time_eval():
            plan = api._Plan(aug, cfg.n * (1 + m), cfg.P * (1 + m), True,
                             _aug_args(cfg, args, mask, m), pattern, cfg.linear_solver,
                             cfg.tableau, cfg.ctrl, cfg.max_steps, linear=linear,
                             seed_columns=np.arange(cfg.n))
        COUNTERS["plans"] += 1
        _JOINT_PLANS[key] = plan
    return plan


def _joint_run(cfg, mask, y0, params, args_leaves, ts, t0, te, dy0, dp, dargs):
    """Run the joint solve; dy0 (m,N,n) | None, dp (m,N,P) | None, dargs tuple of (m, *leaf)."""
    COUNTERS["joint_traces"] += 1
    present = [x for x in (dy0, dp) if x is not None] + list(dargs)
    m = present[0].shape[0]
    N, n = y0.shape
    P = cfg.P
    args = jax.tree_util.tree_unflatten(cfg.treedef, list(args_leaves)) if cfg.has_args else None
    plan = _joint_plan(cfg, m, mask, args)
    s0 = jnp.zeros((N, m * n)) if dy0 is None else jnp.moveaxis(dy0, 0, 1).reshape(N, m * n)
    dq = jnp.zeros((N, m * P)) if dp is None else jnp.moveaxis(dp, 0, 1).reshape(N, m * P)
    z0 = jnp.concatenate([y0, s0], axis=1)
    q = jnp.concatenate([params, dq], axis=1)
    A = (tuple(args_leaves), tuple(jnp.asarray(d, jnp.float64) for d in dargs))
    if cfg.sec:
        scale = np.sqrt(1.0 + m)
        w = np.concatenate([cfg.weights] * (1 + m)) * scale
    else:
        w = np.concatenate([cfg.weights, np.zeros(n * m)])
    atol = np.concatenate([cfg.atol] + [cfg.sens_atol] * m)
    res = plan.run(z0, t0, te, ts, q, A, jnp.float64(cfg.rtol), jnp.asarray(atol),
                   jnp.asarray(w), _h0(cfg, N))
    return res, m


# ---------------------------------------------------------------------------------------------
# the linear tangent primitive: operands (y0, params, *args_leaves, ts, t0, te, *tangents)
# each tangent has a leading direction axis; output (m, N, n_save, n)
# ---------------------------------------------------------------------------------------------
sensitivity_tangent_p = Primitive("sensitivity_tangent")


def _split(operands, n_leaves):
    y0, params = operands[0], operands[1]
    leaves = tuple(operands[2:2 + n_leaves])
    ts, t0, te = operands[2 + n_leaves:5 + n_leaves]
    tans = tuple(operands[5 + n_leaves:])
    return y0, params, leaves, ts, t0, te, tans


def _unpack_tangents(mask, tans):
    i = 0
    dy0 = dp = None
    if mask[0]:
        dy0, i = tans[0], 1
    if mask[1]:
        dp, i = tans[i], i + 1
    return dy0, dp, tuple(tans[i:])


def _cuda_tangent(cfg, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
    """The tangent (m, N, ns, n) from the CUDA sensitivity kernel (host callback): N·m threads,
    one per (trajectory, direction); a trajectory with a failed direction is NaN at the save
    times that direction did not reach, in every direction (``dys_or_nan``)."""
    COUNTERS["joint_traces"] += 1
    present = [x for x in (dy0, dp) if x is not None] + list(dargs)
    m = present[0].shape[0]
    N, n = y0.shape
    ns = ts.shape[1]
    s0 = jnp.zeros((m, N, n)) if dy0 is None else jnp.asarray(dy0, jnp.float64)
    dpp = jnp.zeros((m, N, cfg.P)) if dp is None else jnp.asarray(dp, jnp.float64)
    ops = [y0, params, _cuda_table(cfg, leaves), ts, t0, te, s0, dpp]
    ops += [jnp.asarray(d, jnp.float64) for d in dargs]   # at most the one table leaf

    def host(y0, params, tab, ts, t0, te, s0, dp, *da):
        from . import cuda_backend as cb
        sol = cb.solve_sensitivities(
            cfg.rhs, y0, ts, params, s0=s0, dparams=dp if cfg.P else None,
            dargs=da[0] if da else None, args=tab if cfg.has_args else None, rtol=cfg.rtol,
            atol=cfg.atol, sensitivity_atol=cfg.sens_atol, sensitivity_error_control=cfg.sec,
            t0=t0, t_end=te, sparsity=cfg.sparsity, error_weights=cfg.weights,
            max_steps=cfg.max_steps, first_step=cfg.first_step, controller=cfg.ctrl,
            tableau=cfg.tableau)
        steps = np.asarray(sol.n_accepted) + np.asarray(sol.n_rejected)      # (m, N)
        d, i = np.unravel_index(int(np.argmax(steps)), steps.shape)
        _record_launch("tangent", sol, steps, slowest_trajectory=int(i), slowest_direction=int(d))
        return sol.dys_or_nan()

    return jax.pure_callback(host, jax.ShapeDtypeStruct((m, N, ns, n), jnp.float64), *ops,
                             vmap_method="sequential")


def _tangent_impl(*operands, cfg, mask):
    y0, params, leaves, ts, t0, te, tans = _split(operands, len(cfg.leaf_meta))
    dy0, dp, dargs = _unpack_tangents(mask, tans)
    if cfg.backend == "cuda":
        return _cuda_tangent(cfg, y0, params, leaves, ts, t0, te, dy0, dp, dargs)
    res, m = _joint_run(cfg, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs)
    N, ns = y0.shape[0], res.ys.shape[1]
    n = cfg.n
    return jnp.moveaxis(res.ys[:, :, n:].reshape(N, ns, m, n), 2, 0)


def _tangent_abstract(*avals, cfg, mask):
    y0, _, leaves, ts, _, _, tans = _split(avals, len(cfg.leaf_meta))
    m = tans[0].shape[0]
    return jax.core.ShapedArray((m, y0.shape[0], ts.shape[1], cfg.n), jnp.float64)


sensitivity_tangent_p.def_impl(_tangent_impl)
sensitivity_tangent_p.def_abstract_eval(_tangent_abstract)
mlir.register_lowering(sensitivity_tangent_p,
                       mlir.lower_fun(_tangent_impl, multiple_results=False))


def _n_inputs(cfg, mask):
    """K: independent input components per trajectory among the differentiated inputs."""
    return (cfg.n if mask[0] else 0) + (cfg.P if mask[1] else 0) + \
        sum(cfg.leaf_size[i] for i in mask[2])


def _unit_sensitivities(cfg, mask, res_ops):
    """Sensitivities for the K unit directions: list of blocks, each (k_block, N, ns, n)."""
    y0 = res_ops[0]
    N, n, P = y0.shape[0], cfg.n, cfg.P
    seeds = []
    if mask[0]:
        seeds.append(jnp.broadcast_to(jnp.eye(n)[:, None, :], (n, N, n)))
    if mask[1]:
        seeds.append(jnp.broadcast_to(jnp.eye(P)[:, None, :], (P, N, P)))
    for i in mask[2]:
        size = cfg.leaf_size[i]
        seeds.append(jnp.eye(size).reshape((size,) + cfg.leaf_meta[i][0]))
    K = _n_inputs(cfg, mask)
    # every block gets K directions: block b's seeds sit at its own offset, zeros elsewhere
    full, off = [], 0
    for s in seeds:
        k = s.shape[0]
        pad = [(off, K - off - k)] + [(0, 0)] * (s.ndim - 1)
        full.append(jnp.pad(s, pad))
        off += k
    T = sensitivity_tangent_p.bind(*res_ops, *full, cfg=cfg, mask=mask)   # (K, N, ns, n)
    blocks, off = [], 0
    for s in seeds:
        blocks.append(T[off:off + s.shape[0]])
        off += s.shape[0]
    return blocks


def _contract(cfg, mask, blocks, tans):
    """Σ_blocks T_block · tangent: tans have a leading direction axis m; returns (m, N, ns, n)."""
    out = 0.0
    for T, (kind, tan) in zip(blocks, _tagged(mask, tans)):
        if kind == "y0" or kind == "p":     # per-trajectory components
            out = out + jnp.einsum("kNsi,mNk->mNsi", T, tan)
        else:                                # shared args leaf
            out = out + jnp.einsum("kNsi,mk->mNsi", T, tan.reshape(tan.shape[0], -1))
    return out


def _tagged(mask, tans):
    dy0, dp, dargs = _unpack_tangents(mask, tans)
    out = []
    if dy0 is not None:
        out.append(("y0", dy0))
    if dp is not None:
        out.append(("p", dp))
    out += [("a", d) for d in dargs]
    return out


def _tangent_transpose(ct, *operands, cfg, mask):
    n_res = 5 + len(cfg.leaf_meta)
    res_ops = operands[:n_res]
    lin = operands[n_res:]
    if any(ad.is_undefined_primal(x) for x in res_ops):
        raise ValueError("sensitivity_tangent: residual operands must be known in transposition")
    if type(ct) is ad.Zero:
        return [None] * n_res + [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None
                                 for x in lin]
    blocks = _unit_sensitivities(cfg, mask, res_ops)
    cts = []
    tagged = _tagged(mask, lin)
    for T, (kind, x) in zip(blocks, tagged):
        if kind in ("y0", "p"):
            c = jnp.einsum("kNsi,mNsi->mNk", T, ct)
        else:
            shape = x.aval.shape
            c = jnp.einsum("kNsi,mNsi->mk", T, ct).reshape(shape)
        cts.append(c if ad.is_undefined_primal(x) else None)
    return [None] * n_res + cts


ad.primitive_transposes[sensitivity_tangent_p] = _tangent_transpose


def _tangent_batch(args, dims, *, cfg, mask):
    n_res = 5 + len(cfg.leaf_meta)
    res_ops, res_dims = args[:n_res], dims[:n_res]
    lin, lin_dims = args[n_res:], dims[n_res:]
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    if any(d is not None for d in res_dims):
        # batched primals (vmap over cosmologies/ensembles): one bind per batch element
        moved = [jnp.moveaxis(x, d, 0) if d is not None else x
                 for x, d in zip(args, dims)]
        mapped = [d is not None for d in dims]

        def one(xs):
            it = iter(xs)
            ops = [next(it) if mp else x for x, mp in zip(moved, mapped)]
            return sensitivity_tangent_p.bind(*ops, cfg=cfg, mask=mask)

        out = jax.lax.map(one, [x for x, mp in zip(moved, mapped) if mp])
        return out, 0
    # only tangents batched: fold the batch into the direction axis
    flat = []
    for x, d in zip(lin, lin_dims):
        if d is None:
            x = jnp.broadcast_to(x[None], (size,) + x.shape)
        else:
            x = jnp.moveaxis(x, d, 0)
        flat.append(x.reshape((size * x.shape[1],) + x.shape[2:]))
    m_total = flat[0].shape[0]
    if m_total > _n_inputs(cfg, mask):
        blocks = _unit_sensitivities(cfg, mask, res_ops)
        out = _contract(cfg, mask, blocks, tuple(flat))
    else:
        out = sensitivity_tangent_p.bind(*res_ops, *flat, cfg=cfg, mask=mask)
    return out.reshape((size, m_total // size) + out.shape[1:]), 0


batching.primitive_batchers[sensitivity_tangent_p] = _tangent_batch


# ---------------------------------------------------------------------------------------------
# the custom_jvp function
# ---------------------------------------------------------------------------------------------
def _is_zero(t):
    return isinstance(t, jax.custom_derivatives.SymbolicZero) or t is None


def _diff_fn(cfg):
    fn = _DIFF_FNS.get(cfg)
    if fn is not None:
        return fn

    @jax.custom_jvp
    def f(y0, params, args, ts, t0, te):
        return _primal_ys(cfg, y0, params, args, ts, t0, te)

    @functools.partial(f.defjvp, symbolic_zeros=True)
    def f_jvp(primals, tangents):
        y0, params, args, ts, t0, te = primals
        dy0, dp, dargs = tangents[:3]
        ys = f(y0, params, args, ts, t0, te)
        leaves = jax.tree_util.tree_leaves(args)
        dleaves = jax.tree_util.tree_leaves(
            dargs, is_leaf=lambda x: isinstance(x, jax.custom_derivatives.SymbolicZero))
        arg_idx, arg_tans = [], []
        for i, (fl, d) in enumerate(zip(cfg.float_leaf, dleaves)):
            if fl and not _is_zero(d):
                arg_idx.append(i)
                arg_tans.append(jnp.asarray(d, jnp.float64)[None])
        mask = (not _is_zero(dy0), not _is_zero(dp) and cfg.P > 0, tuple(arg_idx))
        tans = []
        if mask[0]:
            tans.append(jnp.asarray(dy0, jnp.float64)[None])
        if mask[1]:
            tans.append(jnp.asarray(dp, jnp.float64)[None])
        tans += arg_tans
        if not tans:
            return ys, jnp.zeros_like(ys)
        out = sensitivity_tangent_p.bind(y0, params, *leaves, ts, t0, te, *tans,
                                         cfg=cfg, mask=mask)
        return ys, out[0]

    _DIFF_FNS[cfg] = f
    return f


def _prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end, error_weights,
             sensitivity_atol, sec, max_steps, kw):
    y0 = jnp.asarray(y0, jnp.float64)
    if y0.ndim != 2 or 0 in y0.shape:
        raise ValueError(f"y0 must have shape (N, n) with N, n >= 1; got {y0.shape}")
    N, n = y0.shape
    params = jnp.asarray(params, jnp.float64)
    if params.ndim == 1 and params.size == 0:
        params = jnp.zeros((N, 0))
    if params.ndim != 2 or params.shape[0] != N:
        raise ValueError(f"params must have shape (N, P) with N = {N}; got {params.shape}")
    ts = jnp.asarray(t_save, jnp.float64)
    if ts.ndim == 1:
        ts = jnp.broadcast_to(ts, (N, ts.size))
    if ts.ndim != 2 or ts.shape[0] != N or ts.shape[1] == 0:
        raise ValueError(f"t_save must have shape (m,) or (N, m); got {np.shape(t_save)}")
    t0a = ts[:, 0] if t0 is None else jnp.broadcast_to(jnp.asarray(t0, jnp.float64), (N,))
    tea = ts[:, -1] if t_end is None else jnp.broadcast_to(jnp.asarray(t_end, jnp.float64), (N,))
    concrete = not any(isinstance(x, jax.core.Tracer) for x in (y0, params, ts, t0a, tea))
    if concrete:   # value checks where the values are known (skipped under jit)
        for name, a in (("y0", y0), ("params", params), ("t_save", ts), ("t0", t0a),
                        ("t_end", tea)):
            if not bool(jnp.all(jnp.isfinite(a))):
                raise ValueError(f"{name} contains non-finite values")
        if bool(jnp.any(jnp.diff(ts, axis=1) < 0)):
            raise ValueError("t_save must be ascending along each trajectory")
        if bool(jnp.any(tea < t0a)):
            raise ValueError("t_end must be >= t0 for every trajectory")
        if bool(jnp.any(ts < t0a[:, None])) or bool(jnp.any(ts > tea[:, None])):
            raise ValueError("every save time must lie within [t0, t_end] of its trajectory")
    cfg = _config(rhs, n, params.shape[1], args, rtol, atol, error_weights, sensitivity_atol, sec,
                  max_steps, kw)
    return cfg, y0, params, ts, t0a, tea


def solve_diff(rhs: Callable, y0, t_save, params, *, args=None, rtol: float = 1e-6,
               atol=1e-9, t0=None, t_end=None, error_weights=None,
               sensitivity_error_control: bool = True, sensitivity_atol=None,
               max_steps: int = 100_000, **solve_kwargs):
    """Differentiable ensemble solve: returns ``ys`` (N, m_save, n), as ``solve(...).ys``.

    Same arguments as :func:`solver.solve` (``sparsity``, ``linear_solver``, ``controller``,
    ``tableau``, ``first_step`` pass through; ``backend`` "jax" (default), "cuda" or "auto":
    see the module docstring for the CUDA backend).  Differentiable w.r.t. ``y0``
    (N, n), ``params`` (N, P) and the float leaves of ``args`` with jvp/jacfwd/grad/jacrev/vjp;
    t_save, t0, t_end are not differentiated.  ``rtol``, ``atol``, ``error_weights`` must be
    concrete (they are compile-time settings).

    sensitivity_error_control: include the sensitivities in the step-size control (True,
        default; the steps then also resolve the sensitivities, so the derivative is accurate to
        about the tolerance) or not (False; the joint solve takes the plain solve's steps, cheaper,
        but the derivative's error is not controlled — see docs/gradients.md).
    sensitivity_atol: absolute tolerance of the sensitivity components (default: atol).
    Failed trajectories give NaN (as ``solve``'s ys); check ``solve(...).failures()`` if in doubt.
    """
    cfg, y0, params, ts, t0a, tea = _prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end,
                                             error_weights, sensitivity_atol,
                                             sensitivity_error_control, max_steps, solve_kwargs)
    return _diff_fn(cfg)(y0, params, args, ts, t0a, tea)


def joint_solve(rhs: Callable, y0, t_save, params, *, dy0=None, dparams=None, dargs=None,
                args=None, rtol: float = 1e-6, atol=1e-9, t0=None, t_end=None,
                error_weights=None, sensitivity_error_control: bool = True,
                sensitivity_atol=None, max_steps: int = 100_000, **solve_kwargs):
    """Eager joint solve for explicit directions (diagnostics, docs, tests).

    dy0: (m, N, n), dparams: (m, N, P), dargs: pytree like args with a leading m on each leaf
    (any may be None). Returns ``(ys, dys, info)``: ys (N, ns, n), dys (m, N, ns, n) and info with
    the joint solve's status and accepted/rejected step counts per trajectory.
    Option ``_jacobian="block_diagonal"`` (in solve_kwargs) drops the d²f/dy²·s block from the
    joint Jacobian (a measurement of DESIGN §8's claim, not for use).
    """
    cfg, y0, params, ts, t0a, tea = _prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end,
                                             error_weights, sensitivity_atol,
                                             sensitivity_error_control, max_steps, solve_kwargs)
    leaves = tuple(jax.tree_util.tree_leaves(args))
    arg_idx, dl = [], []
    if dargs is not None:
        for i, d in enumerate(jax.tree_util.tree_leaves(dargs)):
            if d is not None and cfg.float_leaf[i]:
                arg_idx.append(i)
                dl.append(jnp.asarray(d, jnp.float64))
    mask = (dy0 is not None, dparams is not None and cfg.P > 0, tuple(arg_idx))
    dy0 = None if dy0 is None else jnp.asarray(dy0, jnp.float64)
    dp = None if not mask[1] else jnp.asarray(dparams, jnp.float64)
    if dy0 is None and dp is None and not dl:
        raise ValueError("joint_solve needs at least one tangent (dy0, dparams or dargs)")
    if cfg.backend == "cuda":
        return _cuda_joint_solve(cfg, y0, params, args, ts, t0a, tea, dy0, dp, dl)
    res, m = _joint_run(cfg, mask, y0, params, leaves, ts, t0a, tea, dy0, dp, tuple(dl))
    N, ns, n = y0.shape[0], res.ys.shape[1], cfg.n
    dys = jnp.moveaxis(res.ys[:, :, n:].reshape(N, ns, m, n), 2, 0)
    info = {"status": np.asarray(res.status), "n_accepted": np.asarray(res.n_accepted),
            "n_rejected": np.asarray(res.n_rejected)}
    return res.ys[:, :, :n], dys, info


def _cuda_joint_solve(cfg, y0, params, args, ts, t0, te, dy0, dp, dl):
    """joint_solve on the CUDA backend: info per trajectory (status: OK unless a direction
    failed; step counts: the most over its directions) and per thread (``thread_*``, (m, N))."""
    from . import cuda_backend as cb
    sol = cb.solve_sensitivities(
        cfg.rhs, np.asarray(y0), np.asarray(ts), np.asarray(params),
        s0=None if dy0 is None else np.asarray(dy0),
        dparams=None if dp is None else np.asarray(dp),
        dargs=np.asarray(dl[0]) if dl else None,
        args=None if args is None else np.asarray(_cuda_table(cfg, args)), rtol=cfg.rtol,
        atol=cfg.atol, sensitivity_atol=cfg.sens_atol, sensitivity_error_control=cfg.sec,
        t0=np.asarray(t0), t_end=np.asarray(te), sparsity=cfg.sparsity,
        error_weights=cfg.weights, max_steps=cfg.max_steps, first_step=cfg.first_step,
        controller=cfg.ctrl, tableau=cfg.tableau)
    info = {"status": sol.trajectory_status(), "n_accepted": sol.n_accepted.max(axis=0),
            "n_rejected": sol.n_rejected.max(axis=0), "thread_status": sol.status,
            "thread_n_accepted": sol.n_accepted, "thread_n_rejected": sol.n_rejected,
            "launch": sol.info}
    return jnp.asarray(sol.ys), jnp.asarray(sol.dys_or_nan()), info


def grad_by_forward_mode(fun: Callable) -> Callable:
    """Wrap ``fun(*xs)`` so reverse mode (grad/vjp/jacrev) uses ``jax.jacfwd`` inside.

    For a pipeline θ → (tables, ICs) → solve_diff → outputs with few θ: ``jax.grad`` of the
    wrapped function costs one joint solve with len(θ) directions (plus the θ → tables
    derivatives), instead of the unit-direction sensitivities of every table entry that the
    solve's own transpose rule would need.  Forward mode (jvp/jacfwd) of the wrapped function is
    not available (it is a ``custom_vjp``); call ``fun`` itself for that.
    """

    @jax.custom_vjp
    def wrapped(*xs):
        return fun(*xs)

    def fwd(*xs):
        out = fun(*xs)
        jac = jax.jacfwd(fun, argnums=tuple(range(len(xs))))(*xs)
        return out, jac

    def bwd(jac, ct):
        ct_leaves, ct_tree = jax.tree_util.tree_flatten(ct)
        jac_per_out = ct_tree.flatten_up_to(jac)       # each: tuple over inputs
        grads = None
        for c, jo in zip(ct_leaves, jac_per_out):
            g = tuple(jax.tree_util.tree_map(
                lambda J, c=c: jnp.tensordot(c, J, axes=c.ndim), ji) for ji in jo)
            grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
        return grads

    wrapped.defvjp(fwd, bwd)
    return wrapped
