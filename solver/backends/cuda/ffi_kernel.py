"""The compiled kernel as the XLA FFI handler launches it: argument layout, image, registration.

Argument layout (numba-cuda-mlir lowers arrays to strided memrefs, with the
``use-bare-ptr-memref-call-conv=false`` convention; its own launcher pushes ``data, data, 0,
shape..., strides/itemsize...``): an array of rank r is 3 + 2r kernel parameters -- allocated
pointer, aligned pointer, offset, sizes, strides, the last three in elements -- and float64/int64
scalars are single parameters. NOT classic numba's ``{meminfo, parent, nitems, itemsize, data,
shape, strides}`` struct. The handler rebuilds that list from XLA's row-major buffers in the order
of ``codegen.KERNEL_ARGS`` (the ``layout`` attribute, :func:`layout`); the count is checked here
against the PTX entry and on the device against ``cuFuncGetParamInfo``.

The kernel: the plan's numba-cuda-mlir dispatcher compiled ahead of time for the fixed argument
types (:func:`compile_result`), its linked cubin and mangled entry name (:func:`kernel_image`, the
one place to adapt if a numba-cuda-mlir release renames them) registered with the handler
library under an integer key; the handler loads the cubin into the context of XLA's stream on
first use.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

from .kernel_cache import cache_key, key_components
from .toolchain import THREADS_PER_BLOCK, CudaBackendUnavailable, kernel_attr

__all__ = ["CallNames", "PLAIN_CALL", "SENS_CALL", "layout", "expected_param_count",
           "ptx_entry_param_sizes", "kernel_image", "compile_result", "RegisteredKernel", "KernelImage", "obtain_image",
           "compile_and_register"]


@dataclass(frozen=True)
class CallNames:
    """Which kernel arguments are which operands of the custom call: ``inputs`` (in order, then
    the leaves of ``args``, then ``after_leaves``), ``outputs``, the float64 scalars (the
    ``f64_scalars`` attribute, in order) and int64 scalars (``i64_scalars``); ``n_traj`` is the
    leading dimension of the first input."""

    inputs: tuple
    outputs: tuple
    f64: tuple = ("rtol", "n_weighted")
    i64: tuple = ()
    after_leaves: tuple = ("sched", "sched_f")   # the warp kernels' lane tables


#: the plain kernel's custom call (``codegen.KERNEL_ARGS``, the warp kernel's tables after them)
PLAIN_CALL = CallNames(inputs=("y0", "t0", "t_end", "t_save", "params", "atol", "weights", "h0"),
                       outputs=("ys", "t_out", "status", "n_accepted", "n_rejected"))
#: the sensitivity kernel's (``codegen.SENS_KERNEL_ARGS``): the directions' count n_dir is an
#: int64 scalar, the tangent tables ``dargs`` an input like any array
SENS_CALL = CallNames(
    inputs=("y0", "t0", "t_end", "t_save", "params", "s0", "dparams", "dargs", "atol", "atol_s",
            "weights", "weights_s", "h0"),
    outputs=("ys", "dys", "t_out", "status", "n_accepted", "n_rejected"), i64=("n_dir",))
_IN_CODE, _OUT_CODE, _F64_CODE, _NTRAJ_CODE, _I64_CODE = 0, 1, 2, 3, 4


def layout(kernel_args, n_arg_leaves: int, names: CallNames = PLAIN_CALL) -> np.ndarray:
    """The ``layout`` attribute: (code, index) per kernel argument, in the kernel's order."""
    codes = []
    n_in = len(names.inputs)
    for name in kernel_args:
        if name in names.inputs:
            codes += [_IN_CODE, names.inputs.index(name)]
        elif name == "args":  # one array (a tuple would be flattened by numba: one slot per leaf)
            for j in range(n_arg_leaves):
                codes += [_IN_CODE, n_in + j]
        elif name in names.outputs:
            codes += [_OUT_CODE, names.outputs.index(name)]
        elif name in names.f64:
            codes += [_F64_CODE, names.f64.index(name)]
        elif name in names.i64:
            codes += [_I64_CODE, names.i64.index(name)]
        elif name == "n_traj":
            codes += [_NTRAJ_CODE, 0]
        elif name in names.after_leaves:
            codes += [_IN_CODE, n_in + n_arg_leaves + names.after_leaves.index(name)]
        else:
            raise CudaBackendUnavailable(
                f"the XLA FFI launch does not know the kernel argument {name!r} "
                f"(kernel arguments {tuple(kernel_args)}): add it to the CallNames of its "
                "kernel in solver/backends/cuda/ffi_kernel.py")
    return np.asarray(codes, np.int64)


def expected_param_count(layout, in_ranks, out_ranks) -> int:
    count = 0
    for code, idx in layout.reshape(-1, 2):
        if code == _IN_CODE:
            count += 3 + 2 * in_ranks[idx]
        elif code == _OUT_CODE:
            count += 3 + 2 * out_ranks[idx]
        else:
            count += 1
    return count


def ptx_entry_param_sizes(ptx: str, func_name: str) -> list[int] | None:
    """Byte sizes of the parameters of ``.entry func_name(...)`` in PTX text (None if absent;
    -1 for a declaration it cannot read)."""
    m = re.search(r"\.entry\s+" + re.escape(func_name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return None
    sizes = []
    for decl in m.group(1).split(","):
        decl = decl.strip()
        if not decl.startswith(".param"):
            continue
        # e.g. ".param .u64 k_param_0", ".param .u64 .ptr .global .align 8 k_param_1",
        # ".param .align 8 .b8 k_param_2[24]"
        typ = re.search(r"\.[busf](8|16|32|64)\b", decl)
        if typ is None:
            sizes.append(-1)
            continue
        arr = re.search(r"\[(\d+)\]\s*$", decl)
        sizes.append(int(typ.group(1)) // 8 * (int(arr.group(1)) if arr else 1))
    return sizes


def as_image(obj) -> bytes:
    """A cubin (bytes) or PTX (NUL-terminated) from whatever numba-cuda-mlir stores."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, str):
        return obj.encode() + b"\0"
    if hasattr(obj, "code"):  # cuda.core ObjectCode
        return as_image(obj.code)
    if isinstance(obj, np.ndarray):
        return obj.tobytes()
    raise CudaBackendUnavailable(f"unrecognised kernel image type {type(obj).__name__}")


def kernel_image(cres, dispatcher):
    """(image bytes, entry name, ptx text or None) of a numba-cuda-mlir CompileResult.

    numba-cuda-mlir 0.5.4 (descriptor.MLIRDispatcher._compile_impl, mlir_optimization.optimize):
    ``cres.metadata["cubin"]`` is the linked cubin, ``cres.metadata["func_name"]`` the mangled
    kernel name, ``cres.metadata["ptx"]`` the PTX (empty with LTO).  This is the one place to
    adapt if a release renames them.
    """
    meta = getattr(cres, "metadata", None)
    if meta is None:
        meta = getattr(getattr(cres, "cres", None), "metadata", None) or {}
    image = meta.get("cubin")
    name = meta.get("func_name")
    lib = None
    if image is None or name is None:
        try:
            lib = getattr(cres, "_codelibrary", None)
        except Exception:
            lib = None
        if lib is not None:
            image = image if image is not None else getattr(lib, "_cubin", None)
            name = name if name is not None else getattr(lib, "_func_name", None)
    if image is None or name is None:
        raise CudaBackendUnavailable(
            "could not find the compiled kernel's cubin and entry name: CompileResult "
            f"{type(cres).__name__} has metadata keys {sorted(meta)} and attributes "
            f"{sorted(a for a in dir(cres) if not a.startswith('__'))}; code library: "
            f"{type(lib).__name__ if lib is not None else None}. Adapt "
            "solver.backends.cuda.ffi_kernel.kernel_image to this numba-cuda-mlir version.")
    callbacks = list(meta.get("setup_callbacks") or []) + \
        list(getattr(dispatcher, "_module_setup_callbacks", None) or [])
    if callbacks:
        raise CudaBackendUnavailable(
            f"the kernel needs module setup callbacks after loading ({callbacks}; e.g. the NRT "
            "allocator), which the XLA FFI path does not run")
    image = as_image(image)
    if name.encode() not in image:
        raise CudaBackendUnavailable(
            f"the kernel image ({len(image)} bytes) does not contain the entry name {name!r}")
    ptx = meta.get("ptx") or None
    return image, str(name), ptx if isinstance(ptx, str) else None


class RegisteredKernel:
    """One compiled kernel registered with the handler library.

    ``from_cache``: the image came from the on-disk kernel cache (``dispatcher`` is then None and
    nothing was compiled in this process: ``compile_s`` is 0, ``load_s`` the read + register
    time, ``cached_compile_s`` what the original compile took); ``cache``: "hit", "stored",
    "miss" (compiled, not stored), "disabled" (no kernel cache) or "unavailable"
    (no compute capability / device functions that cannot be fingerprinted); ``local_mem`` /
    ``regs``: per-thread local memory (bytes) and registers as numba reported them at compile
    time (None if it could not say)."""

    def __init__(self, key, layout, func_name=None, image_bytes=0, compile_s=0.0, n_params=None,
                 plan=None, dispatcher=None, *, from_cache=False, load_s=0.0,
                 cached_compile_s=None, cache=None, cache_key=None, local_mem=None, regs=None):
        self.key, self.layout, self.func_name = key, layout, func_name
        self.image_bytes, self.compile_s, self.n_params = image_bytes, compile_s, n_params
        self.plan, self.dispatcher = plan, dispatcher
        self.from_cache, self.load_s, self.cached_compile_s = from_cache, load_s, cached_compile_s
        self.cache, self.cache_key = cache, cache_key
        self.local_mem, self.regs = local_mem, regs


def compile_result(disp, example):
    """The numba-cuda-mlir CompileResult of the kernel for the example values' types.

    Ahead of time through ``MLIRDispatcher.compile_for`` (numba-cuda-mlir 0.5.4; the same
    compile_mlir + optimize as a launch, and it reuses an overload a launch already compiled).  If
    that is refused (e.g. a whole-function planner that needs launch metadata), one launch of a
    single finished trajectory (t0 = t_end) compiles it and the overload is read back."""
    errors = []
    if hasattr(disp, "compile_for"):
        try:
            return disp.compile_for(*example)
        except Exception as exc:  # noqa: BLE001 - fall back below, report both if that fails
            errors.append(f"compile_for: {type(exc).__name__}: {exc}")
    try:
        disp[1, THREADS_PER_BLOCK](*example)  # host arrays: copied in and back by numba
        found = [c for c in list(getattr(disp, "overloads", {}).values()) +
                 list(getattr(disp, "_launch_config_overloads", {}).values())
                 if "cubin" in (getattr(c, "metadata", None) or {})]
        if found:
            return found[-1]
        errors.append("launch: no overload with a cubin in dispatcher.overloads / "
                      "_launch_config_overloads")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"launch: {type(exc).__name__}: {exc}")
    raise CudaBackendUnavailable("could not compile the kernel ahead of time for the XLA custom "
                                 "call: " + "; ".join(errors))


class KernelImage:
    """A kernel's image and what is known of it: from the on-disk cache (``from_cache``;
    ``dispatcher`` None, ``compile_s`` 0, ``load_s`` the read time, ``cached_compile_s`` what the
    original compile took) or compiled in this process.  ``cache``: "hit", "stored", "miss"
    (compiled, not stored), "disabled" or "unavailable" (as :class:`RegisteredKernel`)."""

    def __init__(self, image, func_name, *, compile_s=0.0, dispatcher=None, from_cache=False,
                 load_s=0.0, cached_compile_s=None, cache="disabled", cache_key=None,
                 local_mem=None, regs=None):
        self.image, self.func_name = image, func_name
        self.compile_s, self.dispatcher = compile_s, dispatcher
        self.from_cache, self.load_s, self.cached_compile_s = from_cache, load_s, cached_compile_s
        self.cache, self.cache_key = cache, cache_key
        self.local_mem, self.regs = local_mem, regs


def obtain_image(plan, kernel_args, example, n_params, layout_codes=None, *, kernel_cache=None,
                 module_dir=None, entry=None) -> KernelImage:
    """The kernel's image: from ``kernel_cache`` when it holds a valid entry for this key (no
    compile: ``plan.kernel()`` is never called), else compiled (numba-cuda-mlir + Enzyme +
    nvJitLink), its parameter list checked against ``n_params`` eight-byte parameters, and
    stored.  ``entry``: which of the plan's kernels (``kernel_cache.key_components``)."""
    key_hex, cache_state, comps = None, "disabled", None
    if kernel_cache is not None:
        comps = key_components(plan, kernel_args, example, entry=entry)
        if comps is None:
            cache_state = "unavailable"
        else:
            key_hex = cache_key(comps)
            t_start = time.perf_counter()
            hit = kernel_cache.load(key_hex, layout_codes, n_params)
            if hit is not None:
                image, meta = hit
                load_s = time.perf_counter() - t_start
                kernel_cache.stats["hits"] += 1
                kernel_cache.stats["load_seconds"] += load_s
                return KernelImage(image, meta["func_name"], from_cache=True, load_s=load_s,
                                   cached_compile_s=meta.get("compile_seconds"), cache="hit",
                                   cache_key=key_hex, local_mem=meta.get("local_mem_per_thread"),
                                   regs=meta.get("regs_per_thread"))
            kernel_cache.stats["misses"] += 1
            cache_state = "miss"
    t_start = time.perf_counter()  # binding (Enzyme jvp objects) + compile + link
    disp = plan.kernel(module_dir)  # numba-cuda-mlir dispatcher (CudaBackendUnavailable without)
    cres = compile_result(disp, example)
    compile_s = time.perf_counter() - t_start
    image, func_name, ptx = kernel_image(cres, disp)
    ptx_check = "no ptx"
    if ptx:
        sizes = ptx_entry_param_sizes(ptx, func_name)
        ptx_check = "entry not found" if sizes is None else \
            ("unreadable" if -1 in sizes else "ok")
        if sizes is not None and -1 not in sizes and \
                (len(sizes) != n_params or any(s != 8 for s in sizes)):
            raise CudaBackendUnavailable(
                f"kernel {func_name}: its PTX entry has {len(sizes)} parameters of sizes {sizes} "
                f"bytes, the launch packs {n_params} parameters of 8 bytes for "
                f"{tuple(kernel_args)} (arrays as allocated, aligned, offset, sizes, strides). "
                "numba-cuda-mlir's argument lowering differs from what the launch assumes.")
    local_mem = kernel_attr(disp, "get_local_mem_per_thread")
    regs = kernel_attr(disp, "get_regs_per_thread")
    if key_hex is not None:
        codes = None if layout_codes is None else [int(v) for v in np.asarray(layout_codes)]
        meta = {"func_name": func_name, "layout": codes,
                "n_params": int(n_params), "compile_seconds": compile_s,
                "local_mem_per_thread": local_mem, "regs_per_thread": regs,
                "ptx_param_check": ptx_check, "kernel_args": list(kernel_args),
                "versions": {k: v for k, v in comps.items() if k != "source"}}
        if kernel_cache.store(key_hex, image, meta) is not None:
            kernel_cache.stats["stores"] += 1
            cache_state = "stored"
    return KernelImage(image, func_name, compile_s=compile_s, dispatcher=disp,
                       cache=cache_state, cache_key=key_hex, local_mem=local_mem, regs=regs)


def compile_and_register(plan, kernel_args, example, in_ranks, out_ranks, layout_codes, *,
                         library, kernel_cache=None, stats=None, module_dir=None,
                         entry=None) -> RegisteredKernel:
    """The kernel's image (:func:`obtain_image`: cached or compiled) registered with
    ``library`` (an ``FfiLibrary``).  ``stats`` (a dict) accumulates ``kernels_registered`` and
    ``compile_seconds``.  ``entry``: which of the plan's kernels (None: the plain one); the
    sensitivity kernel's cache entry is shared with its launch from the host, which stores no
    layout, so its layout is not compared."""
    stats = {} if stats is None else stats
    expected = expected_param_count(layout_codes, in_ranks, out_ranks)
    img = obtain_image(plan, kernel_args, example, expected,
                       layout_codes if entry is None else None, kernel_cache=kernel_cache,
                       module_dir=module_dir, entry=entry)
    key = library.register_kernel(img.image, img.func_name)
    _count(stats, "kernels_registered", 1)
    if not img.from_cache:
        _count(stats, "compile_seconds", img.compile_s)
    return RegisteredKernel(key, layout_codes, img.func_name, len(img.image), img.compile_s,
                            expected, plan, img.dispatcher, from_cache=img.from_cache,
                            load_s=img.load_s, cached_compile_s=img.cached_compile_s,
                            cache=img.cache, cache_key=img.cache_key, local_mem=img.local_mem,
                            regs=img.regs)


def _count(stats, name, amount):
    stats[name] = stats.get(name, 0) + amount
