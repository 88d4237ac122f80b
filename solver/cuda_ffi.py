"""JAX interop for the CUDA backend: the ensemble kernel as an XLA FFI custom call (DESIGN §7).

``solve_jax(rhs, y0, t_save, params, ...)`` returns ``(ys, t_final, status, n_accepted,
n_rejected)`` as JAX arrays computed by the numba-cuda-mlir Rodas5P kernel of
:mod:`solver.cuda_backend`, launched by XLA on its own stream.  It works eagerly and under
``jax.jit``; ``jax.vmap`` over y0/params/t0/t_end/t_save/first_step (any number of nested vmaps)
folds into the trajectory axis of ONE launch (a ``custom_vmap`` rule: the ensemble already is a
batch, vmap only multiplies N).  ``solve(...)`` is the same with ``solver.solve``'s contract
(returns a :class:`solver.api.Solution`); it is the entry that ``cuda_backend.solve`` can delegate
to.  No derivatives (the custom call has no JVP).

How:

* ``solver/csrc/rodas_ffi.cc`` is an XLA FFI handler (typed API) compiled on first use with g++
  against ``jax.ffi.include_dir()`` and cached under ``$BOLTZMANN_CUDA_CACHE/ffi`` (default
  ``<tmp>/boltzmann_cuda_kernels/ffi``) by a hash of its source, the jax/jaxlib versions and the
  flags.  No CUDA headers: it dlopens ``libcuda.so.1`` at run time and resolves
  ``cuModuleLoadData``, ``cuModuleGetFunction``, ``cuLaunchKernel``, ``cuStreamGetCtx`` ...
  ``BOLTZMANN_FFI_LIB=/path/to/lib.so`` uses a prebuilt library instead (``python -m
  solver.cuda_ffi --build DIR`` writes one) — for machines without a compiler.
* The kernel: the cached ``cuda_backend`` plan's numba-cuda-mlir dispatcher is compiled ahead of
  time for the fixed argument types (``MLIRDispatcher.compile_for``; float64 C-contiguous arrays of
  the kernel's ranks, float64/int64 scalars -- exactly what ``cuda_backend.solve``'s launch uses,
  so an overload compiled by a plain launch is reused), and its linked cubin
  (``metadata["cubin"]``) and mangled entry name (``metadata["func_name"]``) are registered with the
  library once under an integer key (:func:`_kernel_image` is the one place to adapt if a
  numba-cuda-mlir release renames them).  The handler loads the cubin with cuModuleLoadData into
  the context of XLA's stream on first use.
* Argument layout (read from numba-cuda-mlir 0.5.4: ``models.ArrayModel`` lowers arrays to strided
  memrefs; the pipeline uses ``convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=false}``; its
  own C++ launcher pushes ``data, data, 0, shape..., strides/itemsize...``): an array of rank r is
  3 + 2r kernel parameters -- allocated pointer, aligned pointer, offset, sizes, strides, the last
  three in elements -- and float64/int64 scalars are single parameters.  NOT classic numba's
  ``{meminfo, parent, nitems, itemsize, data, shape, strides}`` struct.  The handler rebuilds that
  list from the XLA buffers in the order of ``cuda_codegen.KERNEL_ARGS`` (the ``layout``
  attribute), checks it against the PTX entry's parameter list here and against
  ``cuFuncGetParamInfo`` on the device, and launches ceil(N/32) blocks of
  ``cuda_backend.THREADS_PER_BLOCK`` threads.
* Kernel-image cache (the first solve of the EB model in a new process spent ~170-200 s in the
  numba-cuda-mlir compile and nvJitLink link on the H200; Enzyme's derivatives were already cached
  by numba-enzyme-cuda): the linked cubin, its entry name and parameter layout are stored as
  ``$BOLTZMANN_CUDA_CACHE/cubin/<key>.cubin`` + ``<key>.json`` (default
  ``<tmp>/boltzmann_cuda_kernels/cubin``; written atomically; the JSON also holds n_params, the
  image size and sha256, the original compile seconds, local memory / registers per thread as
  numba reported them, created-at and the versions).  ``<key>`` is the sha256 of the generated
  kernel source (``plan.source``), a fingerprint of the device functions compiled with it (the
  rhs, or the table split's core and lookups: bytecode, constants, closure cells, the globals
  they name), the entry (``gpu:kernel``), the numba-cuda-mlir / numba-enzyme-cuda / numba /
  Python versions, the GPU's compute capability (:func:`_compute_capability`, the one place to
  adapt), the argument types ``_compile_result`` compiles for, ``THREADS_PER_BLOCK`` and
  ``CACHE_FORMAT``.  On a valid entry the image is registered without compiling: the plan's
  host side (structure, colours, LU, source) is still built, ``plan.kernel()`` is never called
  (no dispatcher: ``info["kernel_module"]`` is None; the PTX parameter check ran when the entry
  was stored).  Corrupt or mismatched entries warn and are recompiled and overwritten; an rhs
  reading objects the fingerprint cannot pin down, or an unknown compute capability, disables
  the cache for that kernel (``info["kernel_cache"] == "unavailable"``).
  ``BOLTZMANN_CUDA_KERNEL_CACHE=0`` disables reading and writing; ``python -m solver.cuda_ffi
  --clear-kernel-cache`` (or deleting the directory) clears it.  ``info`` reports
  ``kernel_cache`` (hit / stored / miss / disabled / unavailable), ``kernel_from_cache``,
  ``compile_seconds`` (this process), ``kernel_load_seconds``, ``cached_compile_seconds``;
  ``COUNTERS`` counts hits, misses and stores.  The cubin's cuModuleLoadData still happens in
  the handler at the first launch (inside ``kernel_seconds``).  Benefit: not yet measured on a
  GPU.

Tolerances, weights, ``max_steps``, the controller and tableau are static (they select the
compiled kernel / are attributes); arrays are traced.  Under a trace only shapes are checked;
eager calls get the full value checks of ``solver.solve``.
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .cuda_backend import THREADS_PER_BLOCK, CudaBackendUnavailable
from .tableau import RODAS5P

__all__ = ["solve_jax", "solve", "build_library", "library_path", "load_library", "launch_count",
           "COUNTERS", "FfiBuildError", "TARGET_NAME", "kernel_cache_dir", "clear_kernel_cache",
           "CACHE_FORMAT"]

SOURCE = Path(__file__).with_name("csrc") / "rodas_ffi.cc"
TARGET_NAME = "boltzmann_rodas_solve"            # platform CUDA
PROBE_TARGET_NAME = "boltzmann_rodas_pack_probe"  # platform cpu (tests: packing without a GPU)
HANDLER_SYMBOL = "BoltzmannRodasSolve"
PROBE_SYMBOL = "BoltzmannRodasPackProbe"
ABI_VERSION = 1
CXX_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++17")

#: ``ffi_calls``: custom calls bound (traces: each vmap level re-traces; only the innermost,
#: folded one is in the compiled program);
#: ``kernels_registered``: kernel images handed to the library; ``compile_seconds``: their total
#: compile time.  Launches actually executed: :func:`launch_count`.
#: ``cache_hits`` / ``cache_misses`` / ``cache_stores``: the on-disk kernel cache (a hit registers
#: a stored image without compiling; ``load_seconds``: the hits' read + register time).
COUNTERS = {"ffi_calls": 0, "kernels_registered": 0, "compile_seconds": 0.0, "cache_hits": 0,
            "cache_misses": 0, "cache_stores": 0, "load_seconds": 0.0}


class FfiBuildError(CudaBackendUnavailable):
    """The FFI handler library cannot be built or loaded here."""


# =============================================================================== the C++ library
def cache_dir() -> Path:
    root = Path(os.environ.get("BOLTZMANN_CUDA_CACHE",
                               Path(tempfile.gettempdir()) / "boltzmann_cuda_kernels"))
    return root / "ffi"


def _source_digest() -> str:
    import jax
    import jaxlib

    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(f"jax={jax.__version__};jaxlib={jaxlib.__version__};flags={CXX_FLAGS}".encode())
    return h.hexdigest()[:20]


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise FfiBuildError(
            f"the CUDA backend's JAX interop needs a C++ compiler to build its XLA FFI handler "
            f"(solver/csrc/rodas_ffi.cc), but {cxx!r} was not found on PATH. Install g++ "
            "(e.g. apt-get install g++), set CXX, or build the library on another x86_64 Linux "
            "machine with `python -m solver.cuda_ffi --build DIR` and point BOLTZMANN_FFI_LIB at "
            "the .so it writes.")
    return path


def build_library(out: str | os.PathLike | None = None) -> Path:
    """Compile the FFI handler; returns the shared object's path (cached by source hash)."""
    import jax.ffi

    out = Path(out) if out is not None else cache_dir() / f"rodas_ffi_{_source_digest()}.so"
    cxx = _compiler()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [cxx, *CXX_FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", str(tmp),
           "-ldl"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise FfiBuildError(f"running the C++ compiler failed: {' '.join(cmd)}: {exc}") from exc
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise FfiBuildError(
            f"building the XLA FFI handler failed (exit {proc.returncode}):\n  {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}")
    os.replace(tmp, out)
    return out


def library_path(build: bool = True) -> Path:
    """``$BOLTZMANN_FFI_LIB`` if set, else the cached build for this source and jax (built if
    missing and ``build``)."""
    env = os.environ.get("BOLTZMANN_FFI_LIB")
    if env:
        p = Path(env)
        if not p.is_file():
            raise FfiBuildError(f"BOLTZMANN_FFI_LIB={env} is not a file")
        return p
    p = cache_dir() / f"rodas_ffi_{_source_digest()}.so"
    if not p.is_file():
        if not build:
            raise FfiBuildError(f"{p} not built yet")
        build_library(p)
    return p


_LOCK = threading.RLock()
_LIB = None
_REGISTERED: set = set()


def load_library():
    """The loaded handler library (ctypes), built on first use."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise FfiBuildError(f"loading the FFI handler library {path} failed: {exc}") from exc
        for sym in (HANDLER_SYMBOL, PROBE_SYMBOL, "rodas_ffi_abi_version",
                    "rodas_ffi_register_kernel", "rodas_ffi_launch_count",
                    "rodas_ffi_driver_status"):
            if not hasattr(lib, sym):
                raise FfiBuildError(f"{path} does not export {sym}: stale or foreign library")
        lib.rodas_ffi_abi_version.restype = ctypes.c_int
        if lib.rodas_ffi_abi_version() != ABI_VERSION:
            raise FfiBuildError(f"{path} has C ABI version {lib.rodas_ffi_abi_version()}, this "
                                f"module needs {ABI_VERSION}: rebuild it")
        lib.rodas_ffi_register_kernel.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_char_p]
        lib.rodas_ffi_register_kernel.restype = ctypes.c_int
        lib.rodas_ffi_launch_count.restype = ctypes.c_longlong
        lib.rodas_ffi_driver_status.restype = ctypes.c_char_p
        _LIB = lib
        return lib


def _register_target(probe: bool = False) -> str:
    import jax

    name = PROBE_TARGET_NAME if probe else TARGET_NAME
    with _LOCK:
        if name not in _REGISTERED:
            lib = load_library()
            fn = getattr(lib, PROBE_SYMBOL if probe else HANDLER_SYMBOL)
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn),
                                        platform="cpu" if probe else "CUDA")
            _REGISTERED.add(name)
    return name


def launch_count() -> int:
    """Kernel launches the CUDA handler has made in this process."""
    return int(load_library().rodas_ffi_launch_count())


# =============================================================================== argument layout
# Inputs of the custom call, in order (then the leaves of ``args``), and its outputs.
_IN_NAMES = ("y0", "t0", "t_end", "t_save", "params", "atol", "weights", "h0")
_OUT_NAMES = ("ys", "t_out", "status", "n_accepted", "n_rejected")
_F64_NAMES = ("rtol", "n_weighted")
_IN_CODE, _OUT_CODE, _F64_CODE, _NTRAJ_CODE = 0, 1, 2, 3


def _layout(kernel_args, n_arg_leaves: int) -> np.ndarray:
    """The ``layout`` attribute: (code, index) per kernel argument, in the kernel's order."""
    codes = []
    for name in kernel_args:
        if name in _IN_NAMES:
            codes += [_IN_CODE, _IN_NAMES.index(name)]
        elif name == "args":  # one array (a tuple would be flattened by numba: one slot per leaf)
            for j in range(n_arg_leaves):
                codes += [_IN_CODE, len(_IN_NAMES) + j]
        elif name in _OUT_NAMES:
            codes += [_OUT_CODE, _OUT_NAMES.index(name)]
        elif name in _F64_NAMES:
            codes += [_F64_CODE, _F64_NAMES.index(name)]
        elif name == "n_traj":
            codes += [_NTRAJ_CODE, 0]
        else:
            raise CudaBackendUnavailable(
                f"solver.cuda_ffi does not know the kernel argument {name!r} "
                f"(cuda_codegen.KERNEL_ARGS = {tuple(kernel_args)}): add it to _IN_NAMES / "
                "_OUT_NAMES / _F64_NAMES in solver/cuda_ffi.py")
    return np.asarray(codes, np.int64)


def _expected_param_count(layout, in_ranks, out_ranks) -> int:
    count = 0
    for code, idx in layout.reshape(-1, 2):
        if code == _IN_CODE:
            count += 3 + 2 * in_ranks[idx]
        elif code == _OUT_CODE:
            count += 3 + 2 * out_ranks[idx]
        else:
            count += 1
    return count


def _ptx_entry_param_sizes(ptx: str, func_name: str) -> list[int] | None:
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


# =============================================================================== kernel-image cache
#: Bump when the entry format or anything the key must cover changes meaning.
CACHE_FORMAT = 1
#: ``$BOLTZMANN_CUDA_KERNEL_CACHE``: "0" / "false" / "off" / "no" disables reading and writing.
CACHE_ENV = "BOLTZMANN_CUDA_KERNEL_CACHE"
#: What ``_Plan.kernel`` compiles: ``_module("gpu")``'s function ``kernel``.
KERNEL_ENTRY = "kernel"
KERNEL_MODULE_TAG = "gpu"


def kernel_cache_enabled() -> bool:
    return os.environ.get(CACHE_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def kernel_cache_dir() -> Path:
    """``$BOLTZMANN_CUDA_CACHE/cubin`` (default ``<tmp>/boltzmann_cuda_kernels/cubin``)."""
    return cache_dir().parent / "cubin"


def clear_kernel_cache() -> int:
    """Delete every cached kernel image; returns how many files were removed."""
    d = kernel_cache_dir()
    count = 0
    if d.is_dir():
        for p in d.iterdir():
            if p.suffix in (".cubin", ".json", ".tmp"):
                p.unlink(missing_ok=True)
                count += 1
    return count


def _dist_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - PackageNotFoundError, broken metadata
        return "unknown"


def _compute_capability() -> str | None:
    """"major.minor" of the GPU numba-cuda-mlir compiles for (device ordinal 0, its default
    current device), from the CUDA driver (libcuda.so.1: cuInit, cuDeviceGet,
    cuDeviceGetAttribute 75/76), else JAX's first GPU device; None if neither can say (then the
    cache is not used: a cubin must never be reused on another architecture).  The one place
    to adapt (e.g. to ``numba_cuda_mlir.cuda.get_current_device().compute_capability``)."""
    try:
        drv = ctypes.CDLL("libcuda.so.1")
        dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if drv.cuInit(0) == 0 and drv.cuDeviceGet(ctypes.byref(dev), 0) == 0 and \
                drv.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) == 0 and \
                drv.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) == 0:
            return f"{major.value}.{minor.value}"
    except (OSError, AttributeError):
        pass
    try:
        import jax

        for d in jax.devices():
            cc = getattr(d, "compute_capability", None) if d.platform == "gpu" else None
            if cc:
                return str(cc)
    except Exception:  # noqa: BLE001
        pass
    return None


class _Unfingerprintable(Exception):
    pass


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _fingerprint(obj, h, seen: dict) -> None:
    """Feed a stable (process-independent) description of ``obj`` -- a device function and what
    it reads: its code, defaults, closure cells and the globals its code names -- into ``h``.
    Raises _Unfingerprintable for anything whose behaviour it cannot pin down."""
    import types

    def put(tag, text=""):
        h.update(f"{tag}\x00{text}\x01".encode())

    if isinstance(obj, _PLAIN):
        put(type(obj).__name__, repr(obj))
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise _Unfingerprintable("an object array")
        put("ndarray", f"{obj.dtype.str}{obj.shape}")
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        put("npscalar", f"{obj.dtype.str}:{obj.tobytes().hex()}")
    elif isinstance(obj, (tuple, list)):
        put(type(obj).__name__, str(len(obj)))
        for x in obj:
            _fingerprint(x, h, seen)
    elif isinstance(obj, (set, frozenset)):
        parts = []
        for x in obj:
            sub = hashlib.sha256()
            _fingerprint(x, sub, seen)
            parts.append(sub.hexdigest())
        put(type(obj).__name__, ",".join(sorted(parts)))
    elif isinstance(obj, dict):
        put("dict", str(len(obj)))
        for k in sorted(obj, key=repr):
            _fingerprint(k, h, seen)
            _fingerprint(obj[k], h, seen)
    elif isinstance(obj, types.ModuleType):
        put("module", f"{obj.__name__}={getattr(obj, '__version__', '')}")
    elif isinstance(obj, types.CodeType):
        # not co_filename / line numbers / qualname: generated code gets a new pseudo-file name
        # per process (models.codegen), which does not change what it computes
        put("code", f"{obj.co_argcount},{obj.co_posonlyargcount},{obj.co_kwonlyargcount},"
                    f"{obj.co_flags},{obj.co_names},{obj.co_varnames},{obj.co_freevars},"
                    f"{obj.co_cellvars}")
        h.update(obj.co_code)
        _fingerprint(tuple(obj.co_consts), h, seen)
    elif isinstance(obj, types.FunctionType):
        if id(obj) in seen:  # recursion / shared helpers
            put("ref", str(seen[id(obj)]))
            return
        seen[id(obj)] = len(seen)
        put("function", obj.__name__)
        _fingerprint(obj.__code__, h, seen)
        _fingerprint(obj.__defaults__, h, seen)
        _fingerprint(obj.__kwdefaults__, h, seen)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                put("empty-cell")
                continue
            _fingerprint(value, h, seen)
        names, todo = set(), [obj.__code__]
        while todo:
            code = todo.pop()
            names.update(code.co_names)
            todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        g = obj.__globals__
        for name in sorted(names):
            if name in g:
                put("global", name)
                _fingerprint(g[name], h, seen)
    elif isinstance(obj, types.BuiltinFunctionType):
        put("builtin", f"{getattr(obj, '__module__', '')}.{obj.__qualname__}")
    elif isinstance(obj, type) and obj.__module__ == "builtins":
        put("builtin-type", obj.__qualname__)
    elif isinstance(getattr(obj, "py_func", None), types.FunctionType):  # a numba dispatcher
        put("dispatcher", type(obj).__qualname__)
        _fingerprint(obj.py_func, h, seen)
    else:
        raise _Unfingerprintable(f"{type(obj).__module__}.{type(obj).__qualname__}")


def _device_functions(plan) -> list:
    """(global name, function) of what ``cuda_backend._bind_gpu`` compiles into the kernel
    besides ``plan.source`` (one definition: ``cuda_backend.device_functions``)."""
    from .cuda_backend import device_functions

    return sorted(device_functions(plan).items())


def _device_code_digest(plan) -> str:
    h = hashlib.sha256()
    seen: dict = {}
    for label, fn in _device_functions(plan):
        h.update(label.encode() + b"\x02")
        _fingerprint(fn, h, seen)
    return h.hexdigest()


def _arg_types(kernel_args, example) -> str:
    """The argument types ``_compile_result`` compiles for (from its example values)."""
    parts = []
    for name, v in zip(kernel_args, example):
        if isinstance(v, np.ndarray):
            order = "C" if v.flags.c_contiguous else ("F" if v.flags.f_contiguous else "A")
            parts.append(f"{name}:{v.dtype.str}[{v.ndim}d,{order}]")
        elif isinstance(v, tuple):
            parts.append(f"{name}:({_arg_types(range(len(v)), v)})")
        elif isinstance(v, np.generic):
            parts.append(f"{name}:{v.dtype.str}")
        else:
            parts.append(f"{name}:{type(v).__name__}")
    return ";".join(parts)


def _key_components(plan, kernel_args, example) -> dict | None:
    """Everything the linked cubin depends on; None when the cache cannot be used (no compute
    capability, or a device function whose globals/closure cannot be pinned down)."""
    cc = _compute_capability()
    if cc is None:
        return None
    try:
        device_code = _device_code_digest(plan)
    except _Unfingerprintable:
        return None
    return {"format": CACHE_FORMAT, "source": plan.source, "device_code": device_code,
            "entry": f"{KERNEL_MODULE_TAG}:{KERNEL_ENTRY}",
            "numba_cuda_mlir": _dist_version("numba-cuda-mlir"),
            "numba_enzyme_cuda": _dist_version("numba-enzyme-cuda"),
            "numba": _dist_version("numba"),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "compute_capability": cc, "arg_types": _arg_types(kernel_args, example),
            "threads_per_block": int(THREADS_PER_BLOCK)}


def kernel_cache_key(components: dict) -> str:
    """sha256 of the key components (``_key_components``), hex."""
    import json

    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()


def _entry_paths(key: str):
    d = kernel_cache_dir()
    return d / f"{key}.cubin", d / f"{key}.json"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def store_kernel(key: str, image: bytes, meta: dict) -> Path | None:
    """Write ``<key>.cubin`` then ``<key>.json`` (the commit marker), each atomically.  Returns
    the json path, or None (with a warning) if the directory cannot be written."""
    import datetime
    import json
    import warnings

    cubin, js = _entry_paths(key)
    record = dict(meta, format=CACHE_FORMAT, key=key, image_bytes=len(image),
                  image_sha256=hashlib.sha256(image).hexdigest(),
                  created_at=datetime.datetime.now(datetime.timezone.utc).isoformat())
    try:
        cubin.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(cubin, bytes(image))
        _atomic_write(js, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    except OSError as exc:
        warnings.warn(f"could not write the kernel cache entry {js}: {exc}", RuntimeWarning,
                      stacklevel=2)
        return None
    return js


def load_kernel(key: str, layout=None, n_params=None):
    """(image bytes, metadata dict) of a valid entry, or None.  A missing entry is a silent
    miss; a corrupt or mismatched one (unreadable JSON, other format/key, size or checksum
    mismatch, entry name not in the image, another argument layout) warns and is a miss (the
    caller then compiles and overwrites it)."""
    import json
    import warnings

    cubin, js = _entry_paths(key)
    if not js.exists():
        return None

    def reject(why):
        warnings.warn(f"ignoring the kernel cache entry {js} ({why}); the kernel is compiled "
                      "again and the entry overwritten", RuntimeWarning, stacklevel=3)
        return None

    try:
        meta = json.loads(js.read_text())
    except (OSError, ValueError) as exc:
        return reject(f"unreadable JSON: {exc}")
    if not isinstance(meta, dict):
        return reject("the JSON is not an object")
    if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
        return reject(f"format {meta.get('format')!r} / key {meta.get('key')!r} do not match")
    name = meta.get("func_name")
    if not isinstance(name, str) or not name:
        return reject("no entry name")
    try:
        image = cubin.read_bytes()
    except OSError as exc:
        return reject(f"image unreadable: {exc}")
    if len(image) != meta.get("image_bytes"):
        return reject(f"image has {len(image)} bytes, the entry says {meta.get('image_bytes')}")
    if meta.get("image_sha256") not in (None, hashlib.sha256(image).hexdigest()):
        return reject("image checksum mismatch")
    if name.encode() not in image:
        return reject(f"the entry name {name!r} is not in the image")
    if layout is not None and meta.get("layout") != [int(v) for v in np.asarray(layout)]:
        return reject("another argument layout")
    if n_params is not None and meta.get("n_params") != int(n_params):
        return reject(f"{meta.get('n_params')} kernel parameters, expected {n_params}")
    return image, meta


# =============================================================================== the kernel
def _as_image(obj) -> bytes:
    """A cubin (bytes) or PTX (NUL-terminated) from whatever numba-cuda-mlir stores."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, str):
        return obj.encode() + b"\0"
    if hasattr(obj, "code"):  # cuda.core ObjectCode
        return _as_image(obj.code)
    if isinstance(obj, np.ndarray):
        return obj.tobytes()
    raise CudaBackendUnavailable(f"unrecognised kernel image type {type(obj).__name__}")


def _kernel_image(cres, dispatcher):
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
            "solver.cuda_ffi._kernel_image to this numba-cuda-mlir version.")
    callbacks = list(meta.get("setup_callbacks") or []) + \
        list(getattr(dispatcher, "_module_setup_callbacks", None) or [])
    if callbacks:
        raise CudaBackendUnavailable(
            f"the kernel needs module setup callbacks after loading ({callbacks}; e.g. the NRT "
            "allocator), which the XLA FFI path does not run")
    image = _as_image(image)
    if name.encode() not in image:
        raise CudaBackendUnavailable(
            f"the kernel image ({len(image)} bytes) does not contain the entry name {name!r}")
    ptx = meta.get("ptx") or None
    return image, str(name), ptx if isinstance(ptx, str) else None


class _Kernel:
    """One compiled kernel registered with the handler library.

    ``from_cache``: the image came from the on-disk kernel cache (``dispatcher`` is then None and
    nothing was compiled in this process: ``compile_s`` is 0, ``load_s`` the read + register
    time, ``cached_compile_s`` what the original compile took); ``cache``: "hit", "stored",
    "miss" (compiled, not stored), "disabled" ($BOLTZMANN_CUDA_KERNEL_CACHE=0) or "unavailable"
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


_KEYS = itertools.count(1)


def _compile_result(disp, example):
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


def _register_image(image: bytes, func_name: str) -> int:
    key = next(_KEYS)
    lib = load_library()
    lib.rodas_ffi_register_kernel(key, image, len(image), func_name.encode())
    COUNTERS["kernels_registered"] += 1
    return key


def _compile_and_register(plan, kernel_args, example, in_ranks, out_ranks, layout) -> _Kernel:
    """The kernel's image registered with the library: from the on-disk kernel cache when it
    holds a valid entry for this key (no compile: ``plan.kernel()`` is never called), else
    compiled (numba-cuda-mlir + Enzyme + nvJitLink), checked, registered and stored."""
    expected = _expected_param_count(layout, in_ranks, out_ranks)
    key_hex, cache_state = None, "disabled"
    if kernel_cache_enabled():
        comps = _key_components(plan, kernel_args, example)
        if comps is None:
            cache_state = "unavailable"
        else:
            key_hex = kernel_cache_key(comps)
            t_start = time.perf_counter()
            hit = load_kernel(key_hex, layout, expected)
            if hit is not None:
                image, meta = hit
                key = _register_image(image, meta["func_name"])
                load_s = time.perf_counter() - t_start
                COUNTERS["cache_hits"] += 1
                COUNTERS["load_seconds"] += load_s
                return _Kernel(key, layout, meta["func_name"], len(image), 0.0, expected, plan,
                               None, from_cache=True, load_s=load_s,
                               cached_compile_s=meta.get("compile_seconds"), cache="hit",
                               cache_key=key_hex, local_mem=meta.get("local_mem_per_thread"),
                               regs=meta.get("regs_per_thread"))
            COUNTERS["cache_misses"] += 1
            cache_state = "miss"
    t_start = time.perf_counter()  # binding (Enzyme jvp objects) + compile + link
    disp = plan.kernel()  # numba-cuda-mlir dispatcher (raises CudaBackendUnavailable without it)
    cres = _compile_result(disp, example)
    compile_s = time.perf_counter() - t_start
    image, func_name, ptx = _kernel_image(cres, disp)
    ptx_check = "no ptx"
    if ptx:
        sizes = _ptx_entry_param_sizes(ptx, func_name)
        ptx_check = "entry not found" if sizes is None else \
            ("unreadable" if -1 in sizes else "ok")
        if sizes is not None and -1 not in sizes and \
                (len(sizes) != expected or any(s != 8 for s in sizes)):
            raise CudaBackendUnavailable(
                f"kernel {func_name}: its PTX entry has {len(sizes)} parameters of sizes {sizes} "
                f"bytes, the FFI layout packs {expected} parameters of 8 bytes for "
                f"{tuple(kernel_args)} (arrays as allocated, aligned, offset, sizes, strides). "
                "numba-cuda-mlir's argument lowering differs from what solver.cuda_ffi assumes.")
    key = _register_image(image, func_name)
    COUNTERS["compile_seconds"] += compile_s
    from .cuda_backend import _kernel_attr

    local_mem = _kernel_attr(disp, "get_local_mem_per_thread")
    regs = _kernel_attr(disp, "get_regs_per_thread")
    if key_hex is not None:
        meta = {"func_name": func_name, "layout": [int(v) for v in np.asarray(layout)],
                "n_params": int(expected), "compile_seconds": compile_s,
                "local_mem_per_thread": local_mem, "regs_per_thread": regs,
                "ptx_param_check": ptx_check, "kernel_args": list(kernel_args),
                "versions": {k: v for k, v in comps.items() if k != "source"}}
        if store_kernel(key_hex, image, meta) is not None:
            COUNTERS["cache_stores"] += 1
            cache_state = "stored"
    return _Kernel(key, layout, func_name, len(image), compile_s, expected, plan, disp,
                   cache=cache_state, cache_key=key_hex, local_mem=local_mem, regs=regs)


# =============================================================================== configurations
class _Config:
    """Static settings of one solve: plan, kernel per args structure, the custom_vmap core."""

    def __init__(self, rhs, n, P, has_args, rtol, atol, weights, max_steps, sparsity, controller,
                 tableau, probe):
        self.rhs, self.n, self.P, self.has_args = rhs, n, P, has_args
        self.rtol = float(rtol)
        self.atol = np.asarray(atol, np.float64)
        self.weights = np.asarray(weights, np.float64)
        self.n_weighted = float(max(int(np.sum(self.weights > 0)), 1))
        self.max_steps = int(max_steps)
        self.sparsity, self.controller, self.tableau = sparsity, controller, tableau
        self.probe = probe
        self.kernels: dict = {}
        self.core = _make_core(self)
        self.jitted = None

    def kernel(self, leaves) -> _Kernel:
        from .cuda_codegen import KERNEL_ARGS

        meta = tuple((int(np.ndim(x)), str(x.dtype)) for x in leaves)
        k = self.kernels.get(meta)
        if k is not None:
            return k
        layout = _layout(KERNEL_ARGS, len(leaves))
        in_ranks = [2, 1, 1, 2, 2, 1, 1, 1] + [int(np.ndim(x)) for x in leaves]
        out_ranks = [3, 1, 1, 1, 1]
        if self.probe:
            k = _Kernel(0, layout, n_params=_expected_param_count(layout, in_ranks, out_ranks))
        else:
            k = _compile_and_register(self._plan(leaves), KERNEL_ARGS,
                                      self._example(KERNEL_ARGS, leaves), in_ranks, out_ranks,
                                      layout)
        self.kernels[meta] = k
        return k

    def _plan(self, leaves):
        import jax

        from .cuda_backend import build_plan

        # a concrete stand-in of the tables' shape (only the structure matters to the plan; the
        # CUDA backend's table_split_of wants a numeric array)
        args_example = np.zeros(np.shape(leaves[0]), np.float64) if self.has_args else None
        with jax.ensure_compile_time_eval():
            return build_plan(self.rhs, self.n, self.P, args=args_example,
                              sparsity=self.sparsity, max_steps=self.max_steps,
                              controller=self.controller, tableau=self.tableau)

    def check_split(self, y0, t0, params, args):
        """Once per plan, with concrete values: the CUDA backend's check that rhs.table_split
        reproduces rhs (skipped where cuda_backend has no such check)."""
        from . import cuda_backend

        check = getattr(cuda_backend, "_check_plan_split", None)
        if check is None or args is None:
            return
        plan = self._plan((args,))
        inp = {"y0": np.asarray(y0), "t0": np.asarray(t0), "params": np.asarray(params),
               "P": self.P}
        check(plan, self.rhs, inp, np.asarray(args))

    def _example(self, kernel_args, leaves):
        """Host values with the kernel's argument types (tiny shapes; only types matter)."""
        n, Pk, f8 = self.n, max(self.P, 1), np.float64
        vals = {"y0": np.zeros((1, n), f8), "t0": np.zeros(1, f8), "t_end": np.zeros(1, f8),
                "t_save": np.zeros((1, 1), f8), "params": np.zeros((1, Pk), f8),
                "rtol": float(self.rtol), "atol": np.zeros(n, f8), "weights": np.zeros(n, f8),
                "h0": np.zeros(1, f8), "n_weighted": float(self.n_weighted),
                "ys": np.zeros((1, 1, n), f8), "t_out": np.zeros(1, f8),
                "status": np.zeros(1, np.int32), "n_accepted": np.zeros(1, np.int32),
                "n_rejected": np.zeros(1, np.int32), "n_traj": np.int64(1)}
        ex_leaves = [np.zeros((1,) * max(int(np.ndim(x)), 1), np.dtype(str(x.dtype)))
                     for x in leaves]
        vals["args"] = ex_leaves[0] if len(ex_leaves) == 1 else tuple(ex_leaves)
        return [vals[name] for name in kernel_args]


_CONFIGS: dict = {}


def _config(rhs, n, P, has_args, rtol, atol, weights, max_steps, sparsity, controller, tableau,
            probe=False) -> _Config:
    from .controller import PIDController

    ctrl = controller or PIDController()
    sp = None if sparsity is None else np.asarray(sparsity, bool)
    key = (rhs, n, P, has_args, float(rtol), np.asarray(atol, np.float64).tobytes(),
           np.asarray(weights, np.float64).tobytes(), int(max_steps),
           None if sp is None else sp.tobytes(), ctrl, tableau.name, probe)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = _Config(rhs, n, P, has_args, rtol, atol, weights, max_steps, sp, ctrl, tableau,
                      probe)
        _CONFIGS[key] = cfg
    return cfg


# =============================================================================== the custom call
def _args_leaves(rhs, args):
    """The kernel's ``args`` operand: None -> () (a (1,) float64 dummy is passed); else one numeric
    array (the tables, read through ``rhs.table_split``; see solver.cuda_backend), as float64."""
    import jax.numpy as jnp

    if args is None:
        return ()
    from . import cuda_backend

    split_of = getattr(cuda_backend, "table_split_of", None)
    if split_of is not None:  # the CUDA backend's TypeError for args without rhs.table_split
        split_of(rhs, np.zeros(np.shape(args)) if _is_tracer(args) else args)
    x = jnp.asarray(args)
    if not jnp.issubdtype(x.dtype, jnp.number) or x.ndim == 0:
        raise TypeError(f"solver.cuda_ffi: args must be one numeric array, got {x.dtype} of "
                        f"shape {x.shape}")
    return (x.astype(jnp.float64),)


def _ffi_solve(cfg, y0, t0, te, ts, params, h0, leaves):
    """One custom call on arrays with a common leading trajectory axis N."""
    import jax
    import jax.numpy as jnp

    f8 = jnp.float64
    if not leaves:
        leaves_k = (jnp.zeros((1,), f8),)
    else:
        leaves_k = leaves
    kern = cfg.kernel(leaves_k)
    N, n = y0.shape
    m = ts.shape[1]
    inputs = [y0, t0, te, ts, params, jnp.asarray(cfg.atol, f8), jnp.asarray(cfg.weights, f8),
              h0, *leaves_k]
    out_types = [jax.ShapeDtypeStruct((N, m, n), f8), jax.ShapeDtypeStruct((N,), f8),
                 jax.ShapeDtypeStruct((N,), jnp.int32), jax.ShapeDtypeStruct((N,), jnp.int32),
                 jax.ShapeDtypeStruct((N,), jnp.int32)]
    if cfg.probe:
        out_types.append(jax.ShapeDtypeStruct((N, kern.n_params + 2), jnp.int64))
    target = _register_target(probe=cfg.probe)
    COUNTERS["ffi_calls"] += 1
    call = jax.ffi.ffi_call(target, out_types, vmap_method="sequential")
    outs = call(*inputs, kernel_key=np.int64(kern.key), layout=kern.layout,
                f64_scalars=np.array([cfg.rtol, cfg.n_weighted], np.float64),
                i64_scalars=np.zeros(1, np.int64), traj_arg=np.int64(0),
                threads_per_block=np.int64(THREADS_PER_BLOCK))
    return tuple(outs)


def _make_core(cfg):
    """custom_vmap'd solve over (y0, t0, t_end, t_save, params, h0, args_leaves), each with a
    leading trajectory axis except the args leaves (shared by the launch)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_batching.custom_vmap
    def core(y0, t0, te, ts, params, h0, leaves):
        return _ffi_solve(cfg, y0, t0, te, ts, params, h0, leaves)

    @core.def_vmap
    def _fold(axis_size, in_batched, y0, t0, te, ts, params, h0, leaves):
        per_traj = (y0, t0, te, ts, params, h0)
        batched = in_batched[:6]
        if any(jax.tree_util.tree_leaves(in_batched[6])):
            # different tables per batch element cannot share one launch: one launch each
            def one(xs):
                return core(*xs[:6], xs[6])
            full = tuple(x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                         for x, b in zip(per_traj, batched))
            lv = tuple(x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                       for x, b in zip(leaves, in_batched[6]))
            outs = jax.lax.map(one, full + (lv,))
            return tuple(outs), (True,) * len(outs)
        N = y0.shape[1] if batched[0] else y0.shape[0]
        folded = []
        for x, b in zip(per_traj, batched):
            if not b:
                x = jnp.broadcast_to(x, (axis_size,) + x.shape)
            folded.append(x.reshape((axis_size * N,) + x.shape[2:]))
        outs = core(*folded, leaves)  # core again: nested vmaps fold too
        outs = tuple(o.reshape((axis_size, N) + o.shape[1:]) for o in outs)
        return outs, (True,) * len(outs)

    return core


def _is_tracer(x) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps, first_step):
    """Validated/broadcast JAX operands (y0, t0, te, ts, params, h0), atol, weights."""
    import jax.numpy as jnp

    from .api import validate_inputs

    f8 = jnp.float64
    if not any(_is_tracer(x) for x in (y0, t_save, params, t0, t_end, first_step)):
        v = validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                            first_step)
        ops = (v.y0, v.t0, v.t_end, v.t_save, v.params, v.first_step)
        return tuple(jnp.asarray(np.ascontiguousarray(a), f8) for a in ops), v.atol, v.weights
    # traced: shapes only (values cannot be inspected); static options checked as usual
    y0 = jnp.asarray(y0, f8)
    if y0.ndim != 2 or 0 in y0.shape:
        raise ValueError(f"y0 must have shape (N, n) with N, n >= 1; got {y0.shape}")
    N, n = y0.shape
    params = jnp.asarray(params, f8)
    if params.ndim == 1 and params.size == 0:
        params = jnp.zeros((N, 0), f8)
    if params.ndim != 2 or params.shape[0] != N:
        raise ValueError(f"params must have shape (N, P) with N = {N}; got {params.shape}")
    ts = jnp.asarray(t_save, f8)
    if ts.ndim == 1:
        ts = jnp.broadcast_to(ts, (N, ts.shape[0]))
    if ts.ndim != 2 or ts.shape[0] != N or ts.shape[1] == 0:
        raise ValueError(f"t_save must have shape (m,) or (N, m) with N = {N}; got "
                         f"{jnp.shape(t_save)}")
    t0a = ts[:, 0] if t0 is None else jnp.broadcast_to(jnp.asarray(t0, f8), (N,))
    tea = ts[:, -1] if t_end is None else jnp.broadcast_to(jnp.asarray(t_end, f8), (N,))
    h0 = jnp.full((N,), jnp.nan, f8) if first_step is None else \
        jnp.broadcast_to(jnp.asarray(first_step, f8), (N,))
    # static options: the same checks as validate_inputs, on a dummy problem of the same size
    probe = validate_inputs(np.zeros((1, n)), [0.0], np.zeros((1, 0)), rtol, atol, None, None,
                            error_weights, max_steps, None)
    return (y0, t0a, tea, ts, params, h0), probe.atol, probe.weights


def _solve_impl(rhs, y0, t_save, params, *, args, rtol, atol, t0, t_end, sparsity,
                error_weights, max_steps, first_step, controller, tableau, probe, jit_eager):
    import jax
    import jax.numpy as jnp

    if not probe and jax.default_backend() != "gpu":
        raise CudaBackendUnavailable(
            f"solver.cuda_ffi needs JAX on a CUDA GPU (default backend: {jax.default_backend()})")
    if not jax.config.jax_enable_x64:
        raise RuntimeError("solver.cuda_ffi needs float64: jax.config.update('jax_enable_x64', "
                           "True) (importing solver does it)")
    ops, atol_a, w = _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights,
                              max_steps, first_step)
    y0, t0a, tea, ts, params, h0 = ops
    N, n = y0.shape
    P = params.shape[1]
    if P == 0:  # the kernel reads a (N, >=1) params array
        params = jnp.zeros((N, 1), jnp.float64)
    leaves = _args_leaves(rhs, args)
    cfg = _config(rhs, n, P, args is not None, rtol, atol_a, w, max_steps, sparsity, controller,
                  tableau, probe)
    if leaves and not probe and not any(_is_tracer(x) for x in (y0, t0a, params, leaves[0])):
        with jax.ensure_compile_time_eval():  # concrete values, perhaps inside an outer trace
            cfg.check_split(y0, t0a, params, leaves[0])
    if jit_eager and not any(_is_tracer(x) for x in (*ops, *leaves)):
        if cfg.jitted is None:
            cfg.jitted = jax.jit(cfg.core)
        return cfg.jitted(y0, t0a, tea, ts, params, h0, leaves), cfg
    return cfg.core(y0, t0a, tea, ts, params, h0, leaves), cfg


def solve_jax(rhs, y0, t_save, params, *, args=None, rtol: float = 1e-6, atol=1e-9, t0=None,
              t_end=None, sparsity=None, error_weights=None, max_steps: int = 100_000,
              first_step=None, controller=None, tableau=RODAS5P):
    """The CUDA ensemble solve as a JAX computation: ``(ys, t_final, status, n_accepted,
    n_rejected)`` with shapes (N, m, n), (N,), (N,) int32 ×3.

    Arguments as :func:`solver.solve` (``args``: None, or one numeric array -- the tables, read
    through ``rhs.table_split`` as in :mod:`solver.cuda_backend` -- shared by the launch).
    Usable under ``jax.jit``; ``jax.vmap`` over the per-trajectory inputs adds trajectories to
    one launch (leading batch axes fold into N; a vmap over ``args`` falls back to one launch per
    batch element).  Not differentiable.
    """
    return _solve_impl(rhs, y0, t_save, params, args=args, rtol=rtol, atol=atol, t0=t0,
                       t_end=t_end, sparsity=sparsity, error_weights=error_weights,
                       max_steps=max_steps, first_step=first_step, controller=controller,
                       tableau=tableau, probe=False, jit_eager=True)[0]


def solve(rhs, y0, t_save, params, *, args=None, rtol=1e-6, atol=1e-9, t0=None, t_end=None,
          sparsity=None, error_weights=None, max_steps=100_000, first_step=None,
          linear_solver="auto", controller=None, tableau=RODAS5P):
    """``solver.solve(..., backend="cuda")`` through the XLA custom call: a Solution with the
    same contract as :func:`solver.cuda_backend.solve` (ys / t_final stay JAX arrays on the GPU,
    as with the JAX backend)."""
    from .api import Solution

    if linear_solver not in ("auto", "dense", "sparse"):
        raise ValueError(f"linear_solver must be one of ('auto', 'dense', 'sparse'), got "
                         f"{linear_solver!r}")
    regs = COUNTERS["kernels_registered"]
    t_start = time.perf_counter()
    (ys, t, st, nacc, nrej), cfg = _solve_impl(
        rhs, y0, t_save, params, args=args, rtol=rtol, atol=atol, t0=t0, t_end=t_end,
        sparsity=sparsity, error_weights=error_weights, max_steps=max_steps,
        first_step=first_step, controller=controller, tableau=tableau, probe=False,
        jit_eager=True)
    st = np.asarray(st)  # waits for the launch (one custom call writes every output)
    elapsed = time.perf_counter() - t_start
    kern = next(iter(cfg.kernels.values()))  # one args structure per configuration here
    plan = kern.plan
    registered_now = COUNTERS["kernels_registered"] > regs
    info = {"linear_solver": "sparse", "launch": "xla-ffi",
            "jacobian_colors": int(plan.jac_plan.n_colors), "lu_slots": int(plan.linear.nslots),
            "kernel_seconds": elapsed,
            # this call compiled the kernel (numba-cuda-mlir + Enzyme + link) / only loaded it
            # from the on-disk kernel cache; kernel_seconds includes that time
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
    return Solution(ys=ys, status=st.astype(np.int32), t_final=t, n_accepted=np.asarray(nacc),
                    n_rejected=np.asarray(nrej), backend="cuda", info=info)


def bench(N: int = 1024, batches: int = 4, reps: int = 3, log=print) -> dict:
    """Timings on the GPU: the 64-variable van der Pol lattice (t in [0, 3], rtol 1e-6), N
    trajectories through the custom call (first call = compile + run; warm), ``jit(vmap)`` over
    ``batches`` x N/batches (launches counted), and the plain numba launch of the same kernel."""
    import jax
    import jax.numpy as jnp

    from models.stiff import van_der_pol_lattice

    from . import cuda_backend

    prob = van_der_pol_lattice(32)
    ts, rtol, atol = np.linspace(0.0, 3.0, 4), 1e-6, 1e-9
    rng = np.random.default_rng(0)
    y0 = np.tile(prob.y0, (N, 1))
    params = prob.params[None, :] * (1.0 + 0.2 * (rng.random((N, prob.params.size)) - 0.5))
    rec = {"N": N, "n": prob.n, "device": str(jax.devices()[0])}

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        return out, time.perf_counter() - t0

    sol, rec["ffi_first_s"] = timed(lambda: solve(prob.rhs, y0, ts, params, rtol=rtol,
                                                  atol=atol).ys)
    rec["ffi_compile_s"] = COUNTERS["compile_seconds"]
    rec["ffi_kernel_cache_hits"] = COUNTERS["cache_hits"]
    rec["ffi_kernel_load_s"] = COUNTERS["load_seconds"]
    rec["ffi_warm_s"] = min(timed(lambda: solve(prob.rhs, y0, ts, params, rtol=rtol,
                                                atol=atol).ys)[1] for _ in range(reps))
    nb = N // batches
    run = jax.jit(jax.vmap(lambda y, p: solve_jax(prob.rhs, y, ts, p, rtol=rtol, atol=atol)))
    yb = jnp.asarray(y0[:nb * batches].reshape(batches, nb, -1))
    pb = jnp.asarray(params[:nb * batches].reshape(batches, nb, -1))
    before = launch_count()
    outv, rec["vmap_first_s"] = timed(lambda: run(yb, pb))
    rec["vmap_launches"] = launch_count() - before
    rec["vmap_warm_s"] = min(timed(lambda: run(yb, pb))[1] for _ in range(reps))
    old = os.environ.get("BOLTZMANN_CUDA_LAUNCH")
    os.environ["BOLTZMANN_CUDA_LAUNCH"] = "numba"
    try:
        ref, rec["numba_first_s"] = timed(lambda: cuda_backend.solve(
            prob.rhs, y0, ts, params, rtol=rtol, atol=atol))
        rec["numba_warm_s"] = min(timed(lambda: cuda_backend.solve(
            prob.rhs, y0, ts, params, rtol=rtol, atol=atol))[1] for _ in range(reps))
    finally:
        if old is None:
            os.environ.pop("BOLTZMANN_CUDA_LAUNCH")
        else:
            os.environ["BOLTZMANN_CUDA_LAUNCH"] = old
    a, b = np.asarray(sol), np.asarray(ref.ys)
    rec["max_diff_over_tol_vs_numba"] = float(np.nanmax(np.abs(a - b) / (rtol * np.abs(b) + atol)))
    rec["vmap_equals_unbatched"] = bool(np.array_equal(
        np.asarray(outv[0]).reshape(nb * batches, *a.shape[1:]), a[:nb * batches],
        equal_nan=True))
    for k, v in rec.items():
        log(f"{k:>28}: {v}")
    return rec


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Build / check the XLA FFI handler of the CUDA "
                                             "backend (solver/csrc/rodas_ffi.cc).")
    ap.add_argument("--build", metavar="DIR", help="compile into DIR and print the .so path "
                                                   "(use with BOLTZMANN_FFI_LIB)")
    ap.add_argument("--check", action="store_true",
                    help="build/load the library, list its symbols' presence and the CUDA "
                         "driver status")
    ap.add_argument("--bench", type=int, metavar="N", help="GPU timings with N trajectories")
    ap.add_argument("--clear-kernel-cache", action="store_true",
                    help="delete the cached kernel images ($BOLTZMANN_CUDA_CACHE/cubin)")
    a = ap.parse_args(argv)
    if a.clear_kernel_cache:
        print(f"removed {clear_kernel_cache()} files from {kernel_cache_dir()}")
        if not (a.build or a.check or a.bench):
            return 0
    if a.build:
        out = build_library(Path(a.build) / f"rodas_ffi_{_source_digest()}.so")
        print(out)
    if a.check or not (a.build or a.bench):
        lib = load_library()
        print("library:", library_path())
        print("abi:", lib.rodas_ffi_abi_version())
        status = lib.rodas_ffi_driver_status().decode()
        print("cuda driver:", status or "ok")
    if a.bench:
        bench(a.bench)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
