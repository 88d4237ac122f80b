"""The sensitivity kernel as a JAX computation: the XLA FFI custom call on XLA's stream.

``CudaBackend(sensitivity_launch="ffi")`` runs the tangents of ``solve_with_tangents`` /
``solve_diff`` through :func:`sensitivities_jax` instead of a host callback. The callback copies
its operands to the host, launches the kernel on copies and brings the tangents back, to be
copied to the device again by the JAX program that reads them: for the CMB sources' Jacobian,
hundreds of MB each way per call. Here the operands and results stay XLA buffers on the GPU.

The handler is the plain kernel's (``csrc/rodas_ffi.cc``, ``launch_ffi``) with the sensitivity
kernel's argument list (``ffi_kernel.SENS_CALL``); the cubin is the host launch's (one entry of
the on-disk kernel cache serves both). The grid is the host launch's: the warp kernel a block
per (trajectory, group of nw directions) of nw warps, the thread kernel a thread per
(trajectory, direction). Directions are padded with zero ones to a multiple of nw on the device
and the padding dropped from the results.

What the host launch checks on concrete values is checked here where the operands are concrete,
else once per plan from inside the program (a ``jax.debug.callback`` with the first
trajectory's inputs and the table; it returns at once after the first success): the table split
reproduces the rhs (``plan.check_plan_split``) and no tangent moves a parameter column the
table lookup reads (``inputs.check_lookup_p``). Failures follow ``SensitivitySolution``: a
trajectory with a failed direction is NaN at the save times some direction did not reach, in
every direction and in ys.
"""
from __future__ import annotations

import numpy as np

from ...problem.inputs import is_tracer, norm_rows
from ...problem.status import Status
from .codegen import SENS_KERNEL_ARGS
from .codegen.warp import WARP_SENS_KERNEL_ARGS
from .ffi_kernel import (SENS_CALL, RegisteredKernel, compile_and_register,
                         expected_param_count, layout)
from .inputs import (check_lookup_p, refuse_lookup_tangents, sens_call_args, sens_inputs,
                     sens_outputs)
from .launch_numba import choose_kernel
from .plan import build_sens_plan, check_plan_split
from .toolchain import THREADS_PER_BLOCK
from .warp_plan import build_warp_plan

__all__ = ["sensitivities_jax", "SensFfiConfig"]

class SensFfiConfig:
    """Static settings of one sensitivity custom call: the plan, the kernel's argument layout
    and, once registered, the kernel (``kernel()``)."""

    def __init__(self, launcher, spec, table_shape, kernel_kind, dir_warps, probe=False):
        import jax

        self.launcher, self.spec, self.probe = launcher, spec, probe
        self.table_shape = tuple(table_shape)
        self.dir_warps = dir_warps
        example_table = np.zeros(self.table_shape) if spec.has_args else None
        self.warp = choose_kernel(kernel_kind, spec.rhs, example_table, spec.sparsity) == "warp"
        with jax.ensure_compile_time_eval():
            if self.warp:
                self.plan = build_warp_plan(spec.rhs, spec.n, spec.P, args=example_table,
                                            max_steps=spec.max_steps, controller=spec.ctrl,
                                            tableau=spec.tableau).sens
            else:
                self.plan = build_sens_plan(spec.rhs, spec.n, spec.P, args=example_table,
                                            sparsity=spec.sparsity, max_steps=spec.max_steps,
                                            controller=spec.ctrl, tableau=spec.tableau)
        self.kernel_args = WARP_SENS_KERNEL_ARGS if self.warp else SENS_KERNEL_ARGS
        self.codes = layout(self.kernel_args, 1, SENS_CALL)
        t = len(self.table_shape)
        # ranks of SENS_CALL.inputs, the table, the warp tables; of SENS_CALL.outputs
        self.in_ranks = [2, 1, 1, 2, 2, 3, 3, 1 + t, 1, 1, 2, 2, 1, t] + \
            ([1, 1] if self.warp else [])
        self.out_ranks = [3, 4, 2, 2, 2, 2]
        self.rows, self.n_weighted = norm_rows(spec.weights)
        self._kernel = None

    def direction_warps(self, m: int) -> int:
        """Direction warps per block (1 for the thread kernel)."""
        return self.plan.plain.direction_warps(m, self.dir_warps) if self.warp else 1

    def grid(self, m_pad: int, nw: int) -> tuple[int, int]:
        """(threads_per_block, lanes_per_traj) for the handler, whose grid is
        ceil(N · lanes_per_traj / threads_per_block) blocks: the host launch's grid."""
        if self.warp:
            tpb = self.plan.threads_per_block * nw
            return tpb, self.plan.threads_per_block * m_pad
        return THREADS_PER_BLOCK, m_pad

    def kernel(self) -> RegisteredKernel:
        if self._kernel is None:
            if self.probe:
                self._kernel = RegisteredKernel(0, self.codes, n_params=expected_param_count(
                    self.codes, self.in_ranks, self.out_ranks))
            else:
                lau = self.launcher
                self._kernel = compile_and_register(
                    self.plan, self.kernel_args, self.example(), self.in_ranks, self.out_ranks,
                    self.codes, library=lau.library, kernel_cache=lau.kernel_cache,
                    stats=lau.stats, module_dir=lau.module_dir, entry="sens_kernel")
        return self._kernel

    def info(self) -> dict:
        """What the backend reports as ``last_sensitivity_info`` for this call: the kernel's
        registration (cache state, compile or load seconds), no per-call timings -- the launch
        runs inside the XLA program."""
        kern = self.kernel()
        return {"launch": "xla-ffi", "kernel": "warp" if self.warp else "thread",
                "kernel_cache": kern.cache, "kernel_cache_key": kern.cache_key,
                "kernel_from_cache": kern.from_cache, "compile_seconds": kern.compile_s,
                "kernel_load_seconds": kern.load_s,
                "cached_compile_seconds": kern.cached_compile_s, "kernel_entry": kern.func_name,
                "cubin_bytes": kern.image_bytes, "local_mem_per_thread": kern.local_mem,
                "regs_per_thread": kern.regs}

    def example(self) -> list:
        """Host values with the kernel's argument types, made as the host launch makes its
        arguments (one trajectory, one direction), so both compile for, and share, one
        kernel-cache key."""
        spec = self.spec
        table = np.zeros((1,) * len(self.table_shape)) if spec.has_args else None
        w = spec.weights if spec.weights.ndim == 1 else spec.weights[:1]
        inp = sens_inputs(spec.rhs, np.zeros((1, spec.n)), np.ones((1, 1)),
                          np.zeros((1, spec.P)), np.zeros((1, 1, spec.n)), None, None, table,
                          spec.rtol, spec.atol, spec.sens_atol, spec.sec, np.zeros(1),
                          np.ones(1), w, spec.max_steps, None)
        args_h = np.zeros(1) if table is None else table
        vals = list(sens_call_args(inp, args_h, sens_outputs(inp, fill=False)))
        n_traj = SENS_KERNEL_ARGS.index("n_traj")
        vals[n_traj], vals[n_traj + 1] = np.int64(1), np.int64(1)
        if self.warp:
            vals += [self.plan.sched, self.plan.sched_f]
        return vals

    def check(self, y0, t0, params, table, moved_columns):
        """The host launch's checks: the table split on the first trajectory's inputs (once
        per plan) and that no tangent moves a parameter column the table lookup reads
        (``moved_columns``: (P,) bool, every call)."""
        spec = self.spec
        inp = {"y0": np.asarray(y0).reshape(1, -1), "t0": np.asarray(t0).reshape(1),
               "params": np.asarray(params).reshape(1, -1), "P": spec.P,
               "dparams": np.asarray(moved_columns, np.float64).reshape(1, 1, -1)}
        args = np.asarray(table) if spec.has_args else None
        check_plan_split(self.plan.plain, spec.rhs, inp, args)
        check_lookup_p(self.plan, spec.rhs, inp, args)

    def check_moved(self, moved_lookup_columns):
        """``check`` once the plan has been checked: only the lookup's columns' tangents."""
        if np.any(moved_lookup_columns):
            refuse_lookup_tangents(self.plan.lookup_p)


def sensitivities_jax(launcher, spec, y0, params, table, ts, t0, te, s0, dparams, dtable, *,
                      kernel_kind="auto", dir_warps=None, with_ys=False, states=None,
                      probe=False, info=None):
    """The sensitivity kernel's tangents as JAX arrays: dys (m, N, ns, k), or (ys (N, ns, k),
    dys) with ``with_ys``; k = len(``states``) (the kept states) or n. ``info`` (a dict) gets
    ``SensFfiConfig.info()``.

    y0 (N, n), params (N, P), table (the one args leaf, or a dummy (1,) without args), ts
    (N, ns), t0 and te (N,); s0 (m, N, n) and dparams (m, N, P) (zeros where not
    differentiated), dtable (m, *table.shape) or None. ``probe``: the CPU twin of the handler
    that only reports how it packed the kernel's parameters (tests); the dump (N, slots + 2)
    is returned last."""
    import jax
    import jax.numpy as jnp

    f8 = jnp.float64
    N, n = y0.shape
    m, ns = s0.shape[0], ts.shape[1]
    key = (spec, tuple(table.shape), kernel_kind, dir_warps, probe)
    cfg = launcher.sens_configs.get_or_build(key, lambda: SensFfiConfig(
        launcher, spec, table.shape, kernel_kind, dir_warps, probe))
    params_k = params if spec.P else jnp.zeros((N, 1), f8)
    dparams_k = dparams if spec.P else jnp.zeros((m, N, 1), f8)
    table = jnp.asarray(table, f8)
    dtable_k = jnp.zeros((1,) + table.shape, f8) if dtable is None else jnp.asarray(dtable, f8)
    if not probe:
        _check(cfg, y0, t0, params, table, dparams)
    nw = cfg.direction_warps(m)
    m_pad = -(-m // nw) * nw
    if m_pad > m:
        def pad(a):
            return jnp.concatenate([a, jnp.zeros((m_pad - m,) + a.shape[1:], a.dtype)])

        s0, dparams_k = pad(s0), pad(dparams_k)
        if dtable is not None:
            dtable_k = pad(dtable_k)
    rows = cfg.rows   # (1, n) shared or (N, n), the kernel's error-norm rows
    h0 = jnp.full((N,), np.nan, f8) if spec.first_step is None else \
        jnp.full((N,), spec.first_step, f8)
    inputs = [y0, t0, te, ts, params_k, s0, dparams_k, dtable_k, jnp.asarray(spec.atol, f8),
              jnp.asarray(spec.sens_atol, f8), jnp.asarray(rows, f8),
              jnp.asarray(rows * spec.sec, f8), h0, table]
    if cfg.warp:
        inputs += [jnp.asarray(cfg.plan.sched, jnp.uint32), jnp.asarray(cfg.plan.sched_f, f8)]
    kern = cfg.kernel()
    if info is not None and not probe:
        info.update(cfg.info())
    out_types = [jax.ShapeDtypeStruct((N, ns, n), f8), jax.ShapeDtypeStruct((m_pad, N, ns, n), f8),
                 jax.ShapeDtypeStruct((m_pad, N), f8)] + \
        [jax.ShapeDtypeStruct((m_pad, N), jnp.int32)] * 3
    if probe:
        out_types.append(jax.ShapeDtypeStruct((N, kern.n_params + 2), jnp.int64))
    tpb, lanes = cfg.grid(m_pad, nw)
    target = launcher.library.register_target(probe=probe)
    launcher.stats["ffi_sens_calls"] = launcher.stats.get("ffi_sens_calls", 0) + 1
    outs = jax.ffi.ffi_call(target, out_types, vmap_method="sequential")(
        *inputs, kernel_key=np.int64(kern.key), layout=kern.layout,
        f64_scalars=np.array([spec.rtol, cfg.n_weighted], np.float64),
        i64_scalars=np.array([m_pad], np.int64), traj_arg=np.int64(0),
        threads_per_block=np.int64(tpb), lanes_per_traj=np.int64(lanes))
    ys, dys, status = outs[0], outs[1][:m], outs[3][:m]
    if states is not None:
        idx = np.asarray(states, np.int64)
        ys, dys = ys[..., idx], dys[..., idx]
    ys, dys = _nan_where_unreached(ys, dys, status)
    out = (ys, dys) if with_ys else dys
    return (out, outs[-1]) if probe else out


def _nan_where_unreached(ys, dys, status):
    """``SensitivitySolution.dys_or_nan`` / ``ys_or_nan`` on the device: a failed direction's
    kernel leaves NaN at the save times it did not reach; there every direction and ys are
    NaN."""
    import jax.numpy as jnp

    failed = jnp.any(status != int(Status.OK), axis=0)                      # (N,)
    unreached = failed[:, None] & jnp.any(jnp.isnan(dys), axis=(0, 3))     # (N, ns)
    return (jnp.where(unreached[:, :, None], jnp.nan, ys),
            jnp.where(unreached[None, :, :, None], jnp.nan, dys))


def _check(cfg, y0, t0, params, table, dparams):
    """The host launch's checks (``SensFfiConfig.check``), now on concrete operands, else from
    inside the program: the whole check while the plan has not had it, afterwards only the
    tangents of the lookup's parameter columns (a few booleans to the host, not the table)."""
    import jax
    import jax.numpy as jnp

    plan = cfg.plan
    if plan.plain.split is None:     # no tables: nothing the host launch would check
        return
    moved = jnp.any(dparams != 0, axis=(0, 1)) if cfg.spec.P else jnp.zeros((0,), bool)
    if plan.plain.split_checked and plan.lookup_p is not None:
        # checked before: only the lookup columns' tangents (no table to the host)
        cols = np.asarray(plan.lookup_p, np.int64)
        if not cols.size:
            return
        if is_tracer(moved):
            jax.debug.callback(cfg.check_moved, moved[cols])
        else:
            cfg.check_moved(np.asarray(moved[cols]))
        return
    operands = (y0[0], t0[0], params[0], table, moved)
    if any(is_tracer(x) for x in operands):
        jax.debug.callback(cfg.check, *operands)
    else:
        cfg.check(*(np.asarray(x) for x in operands))
