"""The CUDA kernel as a JAX computation: an XLA FFI custom call launched on XLA's stream.

:meth:`FfiLauncher.solve_jax` returns ``(ys, t_final, status, n_accepted, n_rejected)`` as JAX
arrays. It works eagerly and under ``jax.jit``; ``jax.vmap`` over y0 / params / t0 / t_end /
t_save / first_step (nested vmaps too) folds into the trajectory axis of ONE launch (a
``custom_vmap`` rule: the ensemble already is a batch, vmap only multiplies N); a vmap over
``args`` cannot share a launch and runs one per batch element. :meth:`FfiLauncher.solve` is the
same with ``solver.solve``'s contract. Not differentiable (the custom call has no JVP).

Tolerances, weights, ``max_steps``, the controller and tableau are static (they select the
configuration and its compiled kernel); arrays are traced. Under a trace only shapes are checked.

The launcher owns what one CUDA backend needs for this path: the handler library
(``ffi_library``), the optional on-disk kernel cache (``kernel_cache``), its configurations
(a ``Cache``) and ``stats``: ``ffi_calls`` (custom calls bound -- each vmap level re-traces, only
the innermost, folded one is in the compiled program), ``kernels_registered`` and
``compile_seconds``. Launches actually executed: ``library.launch_count()``.
"""
from __future__ import annotations

import time

import numpy as np

from ...caches import Cache
from ...method.controller import PIDController
from ...method.tableau import RODAS5P
from ...problem.inputs import (check_options, is_tracer, norm_rows, require_x64,
                               validate_inputs, validate_traceable)
from ...problem.solution import Solution
from .codegen import KERNEL_ARGS
from .ffi_kernel import RegisteredKernel, compile_and_register, expected_param_count, layout
from .codegen.warp import WARP_KERNEL_ARGS
from .plan import build_plan, check_plan_split
from .tables import table_split_of
from .toolchain import THREADS_PER_BLOCK, CudaBackendUnavailable
from .warp_plan import build_warp_plan, warp_eligible

__all__ = ["FfiLauncher", "FfiConfig"]


class FfiLauncher:
    """The XLA FFI launch of one CUDA backend (module docstring)."""

    def __init__(self, library, kernel_cache=None, module_dir=None, kernel: str = "auto"):
        self.library, self.kernel_cache, self.module_dir = library, kernel_cache, module_dir
        #: "auto" (the warp kernel where the rhs allows it), "warp" or "thread"
        self.kernel = kernel
        self.configs = Cache("cuda.ffi_configs", maxsize=64)
        #: the sensitivity kernel's custom calls (``launch_ffi_sens.SensFfiConfig``)
        self.sens_configs = Cache("cuda.ffi_sens_configs", maxsize=64)
        self.stats = {"ffi_calls": 0, "kernels_registered": 0, "compile_seconds": 0.0}

    def config(self, rhs, n, P, has_args, rtol, atol, weights, max_steps, sparsity, controller,
               tableau, probe=False) -> "FfiConfig":
        ctrl = controller or PIDController()
        sp = None if sparsity is None else np.asarray(sparsity, bool)
        # shared weights are constants of the call; per-trajectory rows are an operand
        w = np.asarray(weights, np.float64)
        wkey = "rows" if w.ndim == 2 else w.tobytes()
        key = (rhs, n, P, has_args, float(rtol), np.asarray(atol, np.float64).tobytes(),
               wkey, int(max_steps),
               None if sp is None else sp.tobytes(), ctrl, tableau.name, probe, self.kernel)
        return self.configs.get_or_build(key, lambda: FfiConfig(
            self, rhs, n, P, has_args, rtol, atol, weights, max_steps, sp, ctrl, tableau, probe))

    def run(self, rhs, ops, atol_a, w, *, args, rtol, max_steps, sparsity, controller, tableau,
            probe=False, jit_eager=True):
        """The custom call on operands (y0, t0, t_end, t_save, params, h0) of a common leading
        trajectory axis and error weights ``w`` (n,) or (N, n); returns (outputs,
        configuration)."""
        import jax
        import jax.numpy as jnp

        if not probe and jax.default_backend() != "gpu":
            raise CudaBackendUnavailable(
                "the XLA FFI launch needs JAX on a CUDA GPU (default backend: "
                f"{jax.default_backend()})")
        require_x64("the CUDA backend's XLA FFI launch")
        y0, t0a, tea, ts, params, h0 = ops
        N, n = y0.shape
        P = params.shape[1]
        if P == 0:  # the kernel reads a (N, >=1) params array
            params = jnp.zeros((N, 1), jnp.float64)
        leaves = _args_leaves(rhs, args)
        cfg = self.config(rhs, n, P, args is not None, rtol, atol_a, w, max_steps, sparsity,
                          controller, tableau, probe)
        if leaves and not probe and not any(is_tracer(x) for x in (y0, t0a, params, leaves[0])):
            with jax.ensure_compile_time_eval():  # concrete values, perhaps inside an outer trace
                cfg.check_split(y0, t0a, params, leaves[0])
        traj = (y0, t0a, tea, ts, params, h0)
        if cfg.row_weights:
            traj += (jnp.asarray(norm_rows(w)[0], jnp.float64),)
        if jit_eager and not any(is_tracer(x) for x in (*ops, *leaves)):
            if cfg.jitted is None:
                cfg.jitted = jax.jit(cfg.core)
            return cfg.jitted(traj, leaves), cfg
        return cfg.core(traj, leaves), cfg

    def solve_jax(self, rhs, y0, t_save, params, *, args=None, rtol: float = 1e-6, atol=1e-9,
                  t0=None, t_end=None, sparsity=None, error_weights=None,
                  max_steps: int = 100_000, first_step=None, controller=None, tableau=RODAS5P,
                  probe: bool = False, jit_eager: bool = True):
        """The CUDA ensemble solve as a JAX computation: ``(ys, t_final, status, n_accepted,
        n_rejected)`` with shapes (N, m, n), (N,), (N,) int32 ×3.

        Arguments as :func:`solver.solve` (``args``: None, or one numeric array -- the tables,
        read through ``rhs.table_split`` -- shared by the launch). ``probe``: the CPU twin of the
        handler that only reports how it packed the kernel's parameters (tests; a 6th output).
        """
        ops, atol_a, w = _operands(y0, t_save, params, rtol, atol, t0, t_end, error_weights,
                                   max_steps, first_step)
        return self.run(rhs, ops, atol_a, w, args=args, rtol=rtol, max_steps=max_steps,
                        sparsity=sparsity, controller=controller, tableau=tableau, probe=probe,
                        jit_eager=jit_eager)[0]

    def solve(self, rhs, inputs, *, args, rtol, max_steps, sparsity, controller,
              tableau) -> Solution:
        """``solver.solve``'s contract through the custom call, on validated ``inputs``; ys and
        t_final stay JAX arrays on the GPU, as with the JAX backend."""
        regs = self.stats["kernels_registered"]
        t_start = time.perf_counter()
        (ys, t, st, nacc, nrej), cfg = self.run(
            rhs, _validated_operands(inputs), inputs.atol, inputs.weights, args=args, rtol=rtol,
            max_steps=max_steps, sparsity=sparsity, controller=controller, tableau=tableau)
        st = np.asarray(st)  # waits for the launch (one custom call writes every output)
        elapsed = time.perf_counter() - t_start
        kern = next(iter(cfg.kernels.values()))  # one args structure per configuration here
        plan = kern.plan
        registered_now = self.stats["kernels_registered"] > regs
        info = {"linear_solver": "sparse", "launch": "xla-ffi",
                "kernel": getattr(plan, "kind", "thread"), "lanes": getattr(plan, "lanes", 1),
                "jacobian_colors": plan.jacobian_colors,
                "jacobian": plan.jacobian_kind,
                "lu_slots": int(plan.linear.nslots), "kernel_seconds": elapsed,
                # this call compiled the kernel (numba-cuda-mlir + Enzyme + link) / only loaded
                # it from the on-disk kernel cache; kernel_seconds includes that time
                "first_call_includes_compile": registered_now and not kern.from_cache,
                "first_call_includes_kernel_load": registered_now and kern.from_cache,
                "kernel_from_cache": kern.from_cache, "kernel_cache": kern.cache,
                "kernel_cache_key": kern.cache_key,
                "compile_seconds": kern.compile_s,        # in this process (0.0 on a cache hit)
                "kernel_load_seconds": kern.load_s,       # cache hit: read + register
                "cached_compile_seconds": kern.cached_compile_s,  # what the cached compile took
                "host_setup_seconds": plan.host_setup_s,
                "kernel_module": plan.module_path,        # None on a cache hit (not imported)
                "kernel_entry": kern.func_name, "cubin_bytes": kern.image_bytes,
                "table_values": int(getattr(plan.spec, "n_tv", 0)),
                "local_mem_per_thread": kern.local_mem, "regs_per_thread": kern.regs}
        return Solution(ys=ys, status=st.astype(np.int32), t_final=t,
                        n_accepted=np.asarray(nacc), n_rejected=np.asarray(nrej), backend="cuda",
                        info=info)


class FfiConfig:
    """Static settings of one solve: plan, kernel per args structure, the custom_vmap core."""

    def __init__(self, launcher, rhs, n, P, has_args, rtol, atol, weights, max_steps, sparsity,
                 controller, tableau, probe=False):
        self.launcher = launcher
        self.rhs, self.n, self.P, self.has_args = rhs, n, P, has_args
        self.rtol = float(rtol)
        self.atol = np.asarray(atol, np.float64)
        w = np.asarray(weights, np.float64)
        #: per-trajectory weights: an operand of every call, not a constant of this one
        self.row_weights = w.ndim == 2
        #: the shared weights' row (1, n) (None with row_weights) and the norm's count
        self.weight_rows, self.n_weighted = (None, 1.0) if self.row_weights else norm_rows(w)
        self.max_steps = int(max_steps)
        self.sparsity, self.controller, self.tableau = sparsity, controller, tableau
        self.probe = probe
        mode = launcher.kernel
        self.warp = mode != "thread" and sparsity is None and warp_eligible(rhs, has_args)
        if mode == "warp" and not self.warp:
            raise ValueError("CudaBackend(kernel='warp') needs an rhs with tables and a declared "
                             "linear Jacobian (rhs.linear_jacobian) and sparsity=None")
        self.kernel_args = WARP_KERNEL_ARGS if self.warp else KERNEL_ARGS
        self.kernels: dict = {}
        self.core = _make_core(self)
        self.jitted = None

    def kernel(self, leaves) -> RegisteredKernel:
        meta = tuple((int(np.ndim(x)), str(x.dtype)) for x in leaves)
        k = self.kernels.get(meta)
        if k is not None:
            return k
        codes = layout(self.kernel_args, len(leaves))
        in_ranks = [2, 1, 1, 2, 2, 1, 2, 1] + [int(np.ndim(x)) for x in leaves]
        if self.warp:
            in_ranks += [1, 1]    # sched, sched_f
        out_ranks = [3, 1, 1, 1, 1]
        if self.probe:
            k = RegisteredKernel(0, codes,
                                 n_params=expected_param_count(codes, in_ranks, out_ranks))
        else:
            lau = self.launcher
            k = compile_and_register(self.plan(leaves), self.kernel_args,
                                     self.example(self.kernel_args, leaves), in_ranks, out_ranks,
                                     codes, library=lau.library, kernel_cache=lau.kernel_cache,
                                     stats=lau.stats, module_dir=lau.module_dir)
        self.kernels[meta] = k
        return k

    def plan(self, leaves):
        import jax

        # a concrete stand-in of the tables' shape (only the structure matters to the plan;
        # table_split_of wants a numeric array)
        args_example = np.zeros(np.shape(leaves[0]), np.float64) if self.has_args else None
        with jax.ensure_compile_time_eval():
            if self.warp:
                return build_warp_plan(self.rhs, self.n, self.P, args=args_example,
                                       max_steps=self.max_steps, controller=self.controller,
                                       tableau=self.tableau)
            return build_plan(self.rhs, self.n, self.P, args=args_example,
                              sparsity=self.sparsity, max_steps=self.max_steps,
                              controller=self.controller, tableau=self.tableau)

    def check_split(self, y0, t0, params, args):
        """Once per plan, with concrete values: rhs.table_split reproduces rhs."""
        if args is None:
            return
        plan = self.plan((args,))
        inp = {"y0": np.asarray(y0), "t0": np.asarray(t0), "params": np.asarray(params),
               "P": self.P}
        check_plan_split(plan, self.rhs, inp, np.asarray(args))

    def example(self, kernel_args, leaves):
        """Host values with the kernel's argument types (tiny shapes; only types matter)."""
        n, Pk, f8 = self.n, max(self.P, 1), np.float64
        vals = {"y0": np.zeros((1, n), f8), "t0": np.zeros(1, f8), "t_end": np.zeros(1, f8),
                "t_save": np.zeros((1, 1), f8), "params": np.zeros((1, Pk), f8),
                "rtol": float(self.rtol), "atol": np.zeros(n, f8), "weights": np.zeros((1, n), f8),
                "h0": np.zeros(1, f8), "n_weighted": float(self.n_weighted),
                "ys": np.zeros((1, 1, n), f8), "t_out": np.zeros(1, f8),
                "status": np.zeros(1, np.int32), "n_accepted": np.zeros(1, np.int32),
                "n_rejected": np.zeros(1, np.int32), "n_traj": np.int64(1)}
        ex_leaves = [np.zeros((1,) * max(int(np.ndim(x)), 1), np.dtype(str(x.dtype)))
                     for x in leaves]
        vals["args"] = ex_leaves[0] if len(ex_leaves) == 1 else tuple(ex_leaves)
        if self.warp:
            vals["sched"] = self.plan(leaves).sched
            vals["sched_f"] = self.plan(leaves).sched_f
        return [vals[name] for name in kernel_args]


def _args_leaves(rhs, args):
    """The kernel's ``args`` operand: None -> () (a (1,) float64 dummy is passed); else one
    numeric array (the tables, read through ``rhs.table_split``), as float64."""
    import jax.numpy as jnp

    if args is None:
        return ()
    table_split_of(rhs, np.zeros(np.shape(args)) if is_tracer(args) else args)
    x = jnp.asarray(args)
    if not jnp.issubdtype(x.dtype, jnp.number) or x.ndim == 0:
        raise TypeError(f"the XLA FFI launch: args must be one numeric array, got {x.dtype} of "
                        f"shape {x.shape}")
    return (x.astype(jnp.float64),)


def _validated_operands(v):
    """JAX operands (y0, t0, te, ts, params, h0) of :class:`ValidatedInputs` ``v``."""
    import jax.numpy as jnp

    ops = (v.y0, v.t0, v.t_end, v.t_save, v.params, v.first_step)
    return tuple(jnp.asarray(np.ascontiguousarray(a), jnp.float64) for a in ops)


def _operands(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps, first_step):
    """Validated/broadcast JAX operands (y0, t0, te, ts, params, h0), atol, weights."""
    import jax.numpy as jnp

    if not any(is_tracer(x) for x in (y0, t_save, params, t0, t_end, first_step)):
        v = validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                            first_step)
        return _validated_operands(v), v.atol, v.weights
    # traced: shapes (values where concrete); static options checked as usual
    tr = validate_traceable(y0, t_save, params, t0, t_end)
    N, n = tr.y0.shape
    h0 = jnp.full((N,), jnp.nan, jnp.float64) if first_step is None else \
        jnp.broadcast_to(jnp.asarray(first_step, jnp.float64), (N,))
    atol_a, w = check_options(n, rtol, atol, error_weights, max_steps)
    return (tr.y0, tr.t0, tr.t_end, tr.t_save, tr.params, h0), atol_a, w


def _make_core(cfg):
    """custom_vmap'd solve over ((y0, t0, t_end, t_save, params, h0[, weight rows]),
    args_leaves): the first tuple with a leading trajectory axis, the args leaves shared by the
    launch."""
    import jax
    import jax.numpy as jnp

    @jax.custom_batching.custom_vmap
    def core(traj, leaves):
        return _ffi_solve(cfg, traj, leaves)

    @core.def_vmap
    def _fold(axis_size, in_batched, traj, leaves):
        batched = in_batched[0]
        if any(jax.tree_util.tree_leaves(in_batched[1])):
            # different tables per batch element cannot share one launch: one launch each
            full = tuple(x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                         for x, b in zip(traj, batched))
            lv = tuple(x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                       for x, b in zip(leaves, in_batched[1]))
            outs = jax.lax.map(lambda xs: core(xs[0], xs[1]), (full, lv))
            return tuple(outs), (True,) * len(outs)
        N = traj[0].shape[1] if batched[0] else traj[0].shape[0]
        folded = []
        for x, b in zip(traj, batched):
            if not b:
                x = jnp.broadcast_to(x, (axis_size,) + x.shape)
            folded.append(x.reshape((axis_size * N,) + x.shape[2:]))
        outs = core(tuple(folded), leaves)  # core again: nested vmaps fold too
        outs = tuple(o.reshape((axis_size, N) + o.shape[1:]) for o in outs)
        return outs, (True,) * len(outs)

    return core


def _ffi_solve(cfg, traj, leaves):
    """One custom call on arrays with a common leading trajectory axis N: ``traj`` = (y0, t0,
    t_end, t_save, params, h0[, weight rows])."""
    import jax
    import jax.numpy as jnp

    f8 = jnp.float64
    if not leaves:
        leaves_k = (jnp.zeros((1,), f8),)
    else:
        leaves_k = leaves
    kern = cfg.kernel(leaves_k)
    y0, t0, te, ts, params, h0 = traj[:6]
    N, n = y0.shape
    m = ts.shape[1]
    rows = traj[6] if cfg.row_weights else jnp.asarray(cfg.weight_rows, f8)
    inputs = [y0, t0, te, ts, params, jnp.asarray(cfg.atol, f8), rows, h0, *leaves_k]
    tpb, lanes = THREADS_PER_BLOCK, 1
    if cfg.warp:
        plan = cfg.plan(leaves_k)
        inputs += [jnp.asarray(plan.sched, jnp.uint32), jnp.asarray(plan.sched_f, f8)]
        tpb, lanes = plan.threads_per_block, plan.lanes
    out_types = [jax.ShapeDtypeStruct((N, m, n), f8), jax.ShapeDtypeStruct((N,), f8),
                 jax.ShapeDtypeStruct((N,), jnp.int32), jax.ShapeDtypeStruct((N,), jnp.int32),
                 jax.ShapeDtypeStruct((N,), jnp.int32)]
    if cfg.probe:
        out_types.append(jax.ShapeDtypeStruct((N, kern.n_params + 2), jnp.int64))
    target = cfg.launcher.library.register_target(probe=cfg.probe)
    cfg.launcher.stats["ffi_calls"] += 1
    call = jax.ffi.ffi_call(target, out_types, vmap_method="sequential")
    outs = call(*inputs, kernel_key=np.int64(kern.key), layout=kern.layout,
                f64_scalars=np.array([cfg.rtol, cfg.n_weighted], np.float64),
                i64_scalars=np.zeros(1, np.int64), traj_arg=np.int64(0),
                threads_per_block=np.int64(tpb), lanes_per_traj=np.int64(lanes))
    return tuple(outs)
