"""Launching the CUDA kernels from the host: host arrays copied to the device, a thread or a
warp per trajectory (the sensitivity kernels: per (trajectory, direction), or a block per
trajectory and group of directions), results copied back.  numba-cuda-mlir compiles and
launches them; the sensitivity kernel, with a kernel cache, is launched from its cached image
through the driver instead (``launch_cubin``).  The XLA FFI launch (``launch_ffi``) runs the
plain kernel's cubin on XLA's stream."""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...method.tableau import RODAS5P
from .codegen import SENS_KERNEL_ARGS
from .codegen.warp import WARP_SENS_KERNEL_ARGS
from .ffi_kernel import obtain_image
from .launch_cubin import CubinFunction, DeviceBuffer, DriverError, parameter_count
from .inputs import (check_lookup_p, pad_directions, sens_call_args, sens_inputs, sens_outputs,
                     trim_directions)
from .plan import build_plan, build_sens_plan, check_plan_split
from .results import SensitivitySolution, keep_states, kernel_solution
from .tables import args_array, table_split_of
from .toolchain import THREADS_PER_BLOCK, check_cuda_packages, cuda_modules, kernel_attr
from .warp_plan import build_warp_plan, warp_eligible

__all__ = ["solve_numba", "solve_sensitivities", "choose_kernel", "SENS_DOC_ARGS"]


def solve_numba(rhs, inp, args, sparsity, max_steps, controller, tableau, module_dir=None,
                kernel_kind="auto"):
    """The plain kernel through a numba launch, on kernel inputs (``inputs.kernel_inputs``):
    the warp kernel (one warp per trajectory) where ``choose_kernel`` picks it, else the thread
    kernel."""
    warp = choose_kernel(kernel_kind, rhs, args, sparsity) == "warp"
    if warp:
        plan = build_warp_plan(rhs, inp["n"], inp["P"], args=args, max_steps=max_steps,
                               controller=controller, tableau=tableau)
    else:
        plan = build_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                          max_steps=max_steps, controller=controller, tableau=tableau)
    check_plan_split(plan, rhs, inp, args)
    kernel = plan.kernel(module_dir)
    cuda = plan._cuda
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    d = {k: cuda.to_device(inp[k]) for k in ("y0", "t0", "t_end", "t_save", "params", "atol",
                                             "weights", "h0")}
    args_d = cuda.to_device(np.zeros(1) if args is None else args_array(args))
    out = [cuda.device_array(shape, dtype=dt) for shape, dt in
           (((N, m, n), np.float64), (N, np.float64), (N, np.int32), (N, np.int32),
            (N, np.int32))]
    if warp:
        extra = (cuda.to_device(plan.sched), cuda.to_device(plan.sched_f))
        blocks, tpb = plan.blocks(N), plan.threads_per_block
    else:
        extra = ()
        blocks, tpb = (N + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK, THREADS_PER_BLOCK
    first = plan.compile_s is None
    t_launch = time.perf_counter()
    kernel[blocks, tpb](d["y0"], d["t0"], d["t_end"], d["t_save"], d["params"], args_d,
                        inp["rtol"], d["atol"], d["weights"], d["h0"], inp["n_weighted"], *out,
                        np.int64(N), *extra)
    cuda.synchronize()
    elapsed = time.perf_counter() - t_launch
    if first:
        plan.compile_s = elapsed  # compile + first run
    info = {"linear_solver": "sparse", "kernel": "warp" if warp else "thread",
            "lanes": getattr(plan, "lanes", 1), "jacobian_colors": plan.jacobian_colors,
            "jacobian": plan.jacobian_kind,
            "lu_slots": int(plan.linear.nslots), "kernel_seconds": elapsed,
            "first_call_includes_compile": first, "host_setup_seconds": plan.host_setup_s,
            "kernel_module": plan.module_path, "table_values": plan.spec.n_tv, "launch": "numba",
            "local_mem_per_thread": kernel_attr(kernel, "get_local_mem_per_thread"),
            "regs_per_thread": kernel_attr(kernel, "get_regs_per_thread")}
    return kernel_solution(*(o.copy_to_host() for o in out), "cuda", info)


def choose_kernel(kind: str, rhs, args, sparsity) -> str:
    """"warp" or "thread" for a plain solve: ``kind`` "auto" takes the warp kernel where the rhs
    allows it (``warp_plan.warp_eligible``, no explicit sparsity)."""
    if kind == "thread":
        return "thread"
    ok = sparsity is None and warp_eligible(rhs, args is not None)
    if kind == "warp" and not ok:
        raise ValueError("CudaBackend(kernel='warp') needs an rhs with tables and a declared "
                         "linear Jacobian (rhs.linear_jacobian) and sparsity=None")
    return "warp" if ok else "thread"


SENS_DOC_ARGS = """
    s0 (m, N, n), dparams (m, N, P), dargs (m, *args.shape): the m tangent directions (initial
    sensitivities, parameter tangents, tangent tables; None = zero, at least one given).
    sensitivity_error_control: True -> the error norm covers [y, s] (joint error² = RMS_y² +
    RMS_s², the JAX backend's convention for one direction); False -> s has zero weight and every
    thread takes exactly the plain solve's steps.  sensitivity_atol: atol of s (default atol).
    Other arguments as :func:`solver.solve`.  Returns a :class:`SensitivitySolution`."""


def solve_sensitivities(rhs, y0, t_save, params, *, s0=None, dparams=None, dargs=None,
                        args=None, rtol=1e-6, atol=1e-9, sensitivity_atol=None,
                        sensitivity_error_control=True, t0=None, t_end=None, sparsity=None,
                        error_weights=None, max_steps=100_000, first_step=None, controller=None,
                        tableau=RODAS5P, module_dir=None, kernel_cache=None, kernel_kind="auto",
                        dir_warps=None, saved_states=None):
    """Forward sensitivities on the GPU: the warp sensitivity kernel where ``choose_kernel``
    picks it -- a block per (trajectory, group of nw directions), a warp per direction, nw =
    ``inputs.direction_warps`` of m and the plan's ``dir_warps`` (``dir_warps`` caps it), the
    directions padded by zero ones to a multiple of nw -- else one thread per (trajectory,
    direction), N·m threads, thread g = i·m + d (a trajectory's directions share a warp: same
    tables row and parameters, and without sensitivity error control identical step sequences,
    so no divergence).

    With a ``kernel_cache`` (``KernelCache``) the kernel's image comes from it -- compiled and
    stored on a miss -- and is launched through the driver on driver-allocated arrays
    (``launch_cubin``), so a later process neither compiles it nor imports numba-cuda-mlir;
    without one, numba-cuda-mlir compiles and launches it.

    ``saved_states`` (increasing state indices, default all): the returned ys and dys hold only
    those states (last axis len(saved_states)); the kernel still integrates every state, but
    only the kept ones are copied to the host (``DeviceBuffer.copy_columns_to_host``)."""
    table_split_of(rhs, args)
    inp = sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol,
                      sensitivity_atol, sensitivity_error_control, t0, t_end, error_weights,
                      max_steps, first_step)
    if kernel_cache is None:
        cuda_modules()
    else:   # imported only if the image must be compiled (obtain_image)
        check_cuda_packages()
    warp = choose_kernel(kernel_kind, rhs, args, sparsity) == "warp"
    if warp:
        plan = build_warp_plan(rhs, inp["n"], inp["P"], args=args, max_steps=max_steps,
                               controller=controller, tableau=tableau).sens
    else:
        plan = build_sens_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                               max_steps=max_steps, controller=controller, tableau=tableau)
    check_plan_split(plan.plain, rhs, inp, args)
    check_lookup_p(plan, rhs, inp, args)
    args_h = np.zeros(1) if args is None else args_array(args)
    m = inp["m"]
    if warp:   # a block per (trajectory, group of nw directions), a warp per direction
        nw = plan.plain.direction_warps(m, dir_warps)
        inp = pad_directions(inp, nw)
    # through the kernel cache the outputs are filled on the device (``DeviceBuffer.unwritten``)
    host = sens_outputs(inp, fill=kernel_cache is None)
    dev_in = list(sens_call_args(inp, args_h, host))
    dev_in[_N_TRAJ], dev_in[_N_TRAJ + 1] = np.int64(inp["N"]), np.int64(inp["m"])
    if warp:
        dev_in += [plan.sched, plan.sched_f]
        blocks, tpb = inp["N"] * (inp["m"] // nw), plan.threads_per_block * nw
    else:
        threads = inp["N"] * inp["m"]
        tpb = THREADS_PER_BLOCK
        blocks = (threads + tpb - 1) // tpb
    first = plan.compile_s is None
    if kernel_cache is not None:
        launch, info = _cached_launch(plan, dev_in, kernel_cache, module_dir, blocks, tpb)
        t_in = time.perf_counter()
        dev = [(DeviceBuffer.unwritten(x) if _OUTPUTS.start <= j < _OUTPUTS.stop
                else DeviceBuffer(x)) if isinstance(x, np.ndarray) else x
               for j, x in enumerate(dev_in)]
    else:
        kernel = plan.kernel(module_dir)
        launch = kernel[blocks, tpb]
        info = _numba_info(kernel, first)
        t_in = time.perf_counter()
        dev = _numba_arrays(dev_in)
    copy_in = time.perf_counter() - t_in
    info["kernel"] = "warp" if warp else "thread"
    t_launch = time.perf_counter()
    try:
        launch(*dev)
    except DriverError as exc:  # refused before launching (e.g. a parameter-layout mismatch)
        warnings.warn(f"the cached sensitivity kernel could not be launched ({exc}); compiling "
                      "it with numba-cuda-mlir instead", RuntimeWarning, stacklevel=2)
        kernel = plan.kernel(module_dir)
        info.update(_numba_info(kernel, True))
        filled = sens_outputs(inp)
        dev_in[_OUTPUTS] = [filled[k] for k in _OUT_NAMES]
        dev = _numba_arrays(dev_in)
        kernel[blocks, tpb](*dev)
    if info["launch"] == "numba":       # numba's launch is asynchronous
        cuda_modules()[0].synchronize()
    elapsed = time.perf_counter() - t_launch
    if first:
        plan.compile_s = elapsed if kernel_cache is None else info["compile_seconds"]
    # the padded directions (zero ones, the last rows of every per-direction output) stay on
    # the device where the buffers allow it
    t_out = time.perf_counter()
    res = trim_directions({k: _to_host(d, None if k == "ys" else m,
                                       saved_states if k in ("ys", "dys") else None)
                           for k, d in zip(_OUT_NAMES, dev[_OUTPUTS])}, m)
    # the copies' seconds: with the kernel's, what a launch from the host costs beyond the
    # solve (the sensitivities cross to the host here, and back to the device in the caller)
    info.update({"kernel_seconds": elapsed, "threads": blocks * tpb, "directions": m,
                 "kernel_module": plan.module_path, "copy_in_seconds": copy_in,
                 "copy_out_seconds": time.perf_counter() - t_out,
                 "output_bytes": int(sum(np.asarray(v).nbytes for v in res.values()))})
    if warp:
        info["direction_warps"] = nw
    return SensitivitySolution(res["ys"], res["dys"], res["status"], res["t_out"],
                               res["n_accepted"], res["n_rejected"], "cuda", info)


#: the sensitivity kernel's outputs, as ``inputs.sens_outputs`` names them, and their positions
#: (and n_traj's, n_dir after it) among its arguments
_OUT_NAMES = ("ys", "dys", "t_out", "status", "n_accepted", "n_rejected")
_OUTPUTS = slice(SENS_KERNEL_ARGS.index(_OUT_NAMES[0]), SENS_KERNEL_ARGS.index(_OUT_NAMES[-1]) + 1)
_N_TRAJ = SENS_KERNEL_ARGS.index("n_traj")


def _to_host(buffer, leading, columns=None):
    """A device output on the host: a ``DeviceBuffer``'s first ``leading`` rows (all with
    None), numba's array whole; ``columns``: only those entries of the last axis."""
    if isinstance(buffer, DeviceBuffer):
        if columns is not None:
            return buffer.copy_columns_to_host(columns, leading)
        return buffer.copy_to_host(leading)
    return keep_states(buffer.copy_to_host(), columns)


def _numba_arrays(values) -> list:
    """numba-cuda-mlir device copies of the host arrays among ``values`` (others as they are)."""
    cuda = cuda_modules()[0]
    return [cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in values]


def _numba_info(kernel, first):
    return {"kernel_cache": "disabled", "launch": "numba", "first_call_includes_compile": first,
            "local_mem_per_thread": kernel_attr(kernel, "get_local_mem_per_thread"),
            "regs_per_thread": kernel_attr(kernel, "get_regs_per_thread")}


def _cached_launch(plan, example, kernel_cache, module_dir, blocks=None, tpb=THREADS_PER_BLOCK):
    """(launch(*device_args), info): the sensitivity kernel's image from ``kernel_cache`` (or
    compiled and stored), loaded once per plan and launched through the driver; ``blocks``
    default: one thread per (trajectory, direction) of the example."""
    if blocks is None:
        blocks = (int(example[_N_TRAJ]) * int(example[_N_TRAJ + 1]) + tpb - 1) // tpb
    cached = plan.cubin
    kernel_args = WARP_SENS_KERNEL_ARGS if getattr(plan, "kind", "") == "warp" else \
        SENS_KERNEL_ARGS
    if cached is None:
        img = obtain_image(plan, kernel_args, example, parameter_count(example),
                           kernel_cache=kernel_cache, module_dir=module_dir,
                           entry="sens_kernel")
        plan.cubin = cached = (img, CubinFunction(img.image, img.func_name))
        first = True
    else:
        first = False
    img, fn = cached
    info = {"launch": "cubin", "kernel_cache": img.cache, "kernel_cache_key": img.cache_key,
            "kernel_from_cache": img.from_cache,
            "first_call_includes_compile": first and img.dispatcher is not None,
            "compile_seconds": img.compile_s if first else 0.0,
            "kernel_load_seconds": img.load_s if first else 0.0,
            "cached_compile_seconds": img.cached_compile_s, "kernel_entry": img.func_name,
            "cubin_bytes": len(img.image), "local_mem_per_thread": img.local_mem,
            "regs_per_thread": img.regs}
    return (lambda *dev: fn.launch(blocks, tpb, dev)), info


solve_sensitivities.__doc__ += SENS_DOC_ARGS
