"""Launching a cached kernel image through the CUDA driver, on device arrays it allocates itself.

The sensitivity kernel is launched from the host (a ``jax.pure_callback``), not through the XLA
FFI handler.  numba-cuda-mlir's own launch compiles the kernel in every new process (minutes for
the EB model), so when the backend has a kernel cache the image is taken from it
(``ffi_kernel.obtain_image``: compiled and stored on a miss) and launched here with
``cuLaunchKernel`` (ctypes, ``libcuda.so.1``) in device 0's primary context, on
:class:`DeviceBuffer` copies of the host arrays (``cuMemAlloc``/``cuMemcpy``): a process whose
kernel image comes from the cache then imports neither numba-cuda-mlir (which imports torch
where it is installed) nor numba-enzyme-cuda, 2.7 s of a GPU process (docs/benchmarks.md).
Any object with ``__cuda_array_interface__`` (numba's device arrays too) can be passed.

Parameters are packed exactly as numba-cuda-mlir's launcher packs them (``ffi_kernel``'s module
docstring): an array of rank r is 3 + 2r eight-byte parameters (allocated pointer, aligned
pointer, offset, sizes, strides in elements), a float a double, an integer an int64.  Where the
driver can say (``cuFuncGetParamInfo``), the count and sizes are checked before the launch.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from .toolchain import CudaBackendUnavailable

__all__ = ["CubinFunction", "DeviceBuffer", "pack_parameters", "parameter_count", "DriverError",
           "column_runs"]


class DriverError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the driver's error)."""


_DRIVER = None
_LOCK = threading.Lock()


def _driver():
    global _DRIVER
    if _DRIVER is None:
        try:
            _DRIVER = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaBackendUnavailable(f"the CUDA driver (libcuda.so.1) cannot be loaded: "
                                         f"{exc}") from exc
    return _DRIVER


def _check(rc: int, call: str) -> None:
    if rc == 0:
        return
    name = ctypes.c_char_p()
    text = ctypes.c_char_p()
    drv = _driver()
    drv.cuGetErrorName(rc, ctypes.byref(name))
    drv.cuGetErrorString(rc, ctypes.byref(text))
    raise DriverError(f"{call} failed: {(name.value or b'?').decode()} ({rc}): "
                      f"{(text.value or b'').decode()}")


class _Memcpy2D(ctypes.Structure):
    """The driver's CUDA_MEMCPY2D (cuda.h): a copy of ``Height`` rows of ``WidthInBytes``
    bytes, each side with its own pitch."""
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
                ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
                ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
                ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
                ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


_DEVICE_MEMORY = 2     # CUmemorytype


def column_runs(columns) -> list[tuple[int, int, int]]:
    """(first column, first position in the output, count) of each run of consecutive entries
    of ``columns`` (increasing indices): one strided copy per run."""
    cols = [int(c) for c in columns]
    runs: list[tuple[int, int, int]] = []
    for pos, c in enumerate(cols):
        if runs and c == runs[-1][0] + runs[-1][2]:
            first, at, count = runs[-1]
            runs[-1] = (first, at, count + 1)
        else:
            runs.append((c, pos, 1))
    return runs


def _current_context() -> ctypes.c_void_p:
    """The calling thread's current context, else device 0's primary context (the one numba's
    and JAX's arrays live in)."""
    drv = _driver()
    ctx = ctypes.c_void_p()
    _check(drv.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        return ctx
    _check(drv.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(drv.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    _check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


class DeviceBuffer:
    """A device copy of a host array, allocated and copied through the driver in the current
    context (``_current_context``), freed with the object; ``copy_to_host`` reads it back.
    Carries ``__cuda_array_interface__`` (C-contiguous), which ``pack_parameters`` reads."""

    def __init__(self, host, *, copy: bool = True):
        a = np.ascontiguousarray(host)
        self.shape, self.dtype, self.nbytes = a.shape, a.dtype, int(a.nbytes)
        drv = _driver()
        _current_context()
        ptr = ctypes.c_uint64()
        _check(drv.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(self.nbytes, 1))),
               "cuMemAlloc")
        self.ptr = int(ptr.value)
        if self.nbytes and copy:
            _check(drv.cuMemcpyHtoD_v2(ctypes.c_uint64(self.ptr),
                                       a.ctypes.data_as(ctypes.c_void_p),
                                       ctypes.c_size_t(self.nbytes)), "cuMemcpyHtoD")
        elif self.nbytes:
            # every byte 0xFF: NaN in a float64, -1 in an integer
            _check(drv.cuMemsetD8_v2(ctypes.c_uint64(self.ptr), ctypes.c_ubyte(0xFF),
                                     ctypes.c_size_t(self.nbytes)), "cuMemsetD8")
        self.__cuda_array_interface__ = {"shape": tuple(a.shape), "typestr": a.dtype.str,
                                         "data": (self.ptr, False), "strides": None,
                                         "version": 3}

    @classmethod
    def unwritten(cls, like: np.ndarray) -> "DeviceBuffer":
        """An output buffer of ``like``'s shape and type, not copied from the host: every
        byte 0xFF (NaN, or -1), so a value the kernel does not write shows. ``like`` may be
        ``np.empty`` (its pages are never touched)."""
        return cls(like, copy=False)

    def copy_to_host(self, leading: int | None = None) -> np.ndarray:
        """The buffer on the host; ``leading``: only its first rows along axis 0 (one
        contiguous piece, read alone)."""
        shape = self.shape if leading is None else (int(leading),) + tuple(self.shape[1:])
        out = np.empty(shape, self.dtype)
        if out.nbytes:
            _check(_driver().cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p),
                                             ctypes.c_uint64(self.ptr),
                                             ctypes.c_size_t(out.nbytes)), "cuMemcpyDtoH")
        return out

    def copy_columns_to_host(self, columns, leading: int | None = None) -> np.ndarray:
        """The buffer's entries at ``columns`` (increasing indices into its last axis) on the
        host, shape (…, len(columns)); ``leading`` as for ``copy_to_host``. Only those bytes
        cross the bus: they are gathered on the device into a compact buffer — one strided
        device-to-device copy (``cuMemcpy2D``) per run of consecutive columns, the rows being
        every index of the other axes — which is copied to the host in one piece. (Strided
        copies straight to the host move 64-byte rows over PCIe at a fraction of its rate:
        0.34 GB took 0.62–0.66 s on an H100 host, docs/benchmarks.md.)"""
        shape = self.shape if leading is None else (int(leading),) + tuple(self.shape[1:])
        n, itemsize = int(shape[-1]), self.dtype.itemsize
        out_shape = tuple(shape[:-1]) + (len(columns),)
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        if not rows or not len(columns):
            return np.empty(out_shape, self.dtype)
        runs = column_runs(columns)
        for first, _, count in runs:
            if first < 0 or first + count > n:
                raise ValueError(f"columns {first}..{first + count - 1} outside 0..{n - 1}")
        staging = DeviceBuffer.unwritten(np.empty(out_shape, self.dtype))
        try:
            for first, at, count in runs:
                _check(_driver().cuMemcpy2D_v2(ctypes.byref(_Memcpy2D(
                    srcXInBytes=first * itemsize, srcMemoryType=_DEVICE_MEMORY,
                    srcDevice=self.ptr, srcPitch=n * itemsize,
                    dstXInBytes=at * itemsize, dstMemoryType=_DEVICE_MEMORY,
                    dstDevice=staging.ptr, dstPitch=len(columns) * itemsize,
                    WidthInBytes=count * itemsize, Height=rows))), "cuMemcpy2D")
            return staging.copy_to_host()
        finally:
            staging.free()

    def free(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            _driver().cuMemFree_v2(ctypes.c_uint64(ptr))

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone
            pass


def parameter_count(values) -> int:
    """How many kernel parameters ``values`` pack into (``pack_parameters``), for host or device
    arrays alike: 3 + 2·rank per array, one per scalar."""
    count = 0
    for v in values:
        cai = getattr(v, "__cuda_array_interface__", None)
        rank = len(cai["shape"]) if cai is not None else (
            v.ndim if isinstance(v, np.ndarray) else None)
        count += 1 if rank is None else 3 + 2 * rank
    return count


def pack_parameters(values) -> list:
    """ctypes values, one per kernel parameter, for the kernel arguments ``values`` in order:
    device arrays (anything with ``__cuda_array_interface__``) expand to
    ``data, data, 0, shape..., strides/itemsize...``; floats become doubles, integers int64."""
    out = []
    for v in values:
        cai = getattr(v, "__cuda_array_interface__", None)
        if cai is not None:
            ptr = int(cai["data"][0])
            shape = tuple(int(s) for s in cai["shape"])
            itemsize = np.dtype(cai["typestr"]).itemsize
            strides = cai.get("strides")
            if strides is None:  # C-contiguous
                strides, acc = [], itemsize
                for s in reversed(shape):
                    strides.insert(0, acc)
                    acc *= max(s, 1)
            out += [ctypes.c_uint64(ptr), ctypes.c_uint64(ptr), ctypes.c_int64(0)]
            out += [ctypes.c_int64(s) for s in shape]
            out += [ctypes.c_int64(int(s) // itemsize) for s in strides]
        elif isinstance(v, (bool, np.bool_)):
            raise TypeError("a boolean kernel argument has no fixed parameter layout")
        elif isinstance(v, (int, np.integer)):
            out.append(ctypes.c_int64(int(v)))
        elif isinstance(v, (float, np.floating)):
            out.append(ctypes.c_double(float(v)))
        else:
            raise TypeError(f"cannot pass a {type(v).__name__} to a cached kernel image "
                            "(device arrays, floats and integers only)")
    return out


class CubinFunction:
    """One kernel image (cubin or NUL-terminated PTX) and its entry, loaded into each context
    it is launched in."""

    def __init__(self, image: bytes, func_name: str):
        self.image, self.func_name = bytes(image), str(func_name)
        self._loaded: dict = {}   # context handle -> (module, function, param sizes or None)

    def _function(self, ctx):
        key = int(ctx.value)
        with _LOCK:
            got = self._loaded.get(key)
            if got is not None:
                return got
            drv = _driver()
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            _check(drv.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(self.image)),
                   "cuModuleLoadData")
            _check(drv.cuModuleGetFunction(ctypes.byref(function), module,
                                           self.func_name.encode()),
                   f"cuModuleGetFunction({self.func_name!r})")
            sizes = None
            if hasattr(drv, "cuFuncGetParamInfo"):
                sizes = []
                off, size = ctypes.c_size_t(), ctypes.c_size_t()
                while len(sizes) < 65536 and drv.cuFuncGetParamInfo(
                        function, ctypes.c_size_t(len(sizes)), ctypes.byref(off),
                        ctypes.byref(size)) == 0:
                    sizes.append(int(size.value))
                sizes = sizes or None
            got = self._loaded[key] = (module, function, sizes)
            return got

    def launch(self, blocks: int, threads: int, args) -> None:
        """Launch on the legacy default stream (after the arguments' synchronous copies) and wait
        for it."""
        drv = _driver()
        ctx = _current_context()
        _, function, sizes = self._function(ctx)
        params = pack_parameters(args)
        if sizes is not None and (len(sizes) != len(params) or any(s != 8 for s in sizes)):
            raise DriverError(
                f"kernel {self.func_name}: the driver reports {len(sizes)} parameters of sizes "
                f"{sorted(set(sizes))} bytes; the arguments pack into {len(params)} of 8 bytes")
        ptrs = (ctypes.c_void_p * max(len(params), 1))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
        _check(drv.cuLaunchKernel(function, ctypes.c_uint(blocks), ctypes.c_uint(1),
                                  ctypes.c_uint(1), ctypes.c_uint(threads), ctypes.c_uint(1),
                                  ctypes.c_uint(1), ctypes.c_uint(0), ctypes.c_void_p(0), ptrs,
                                  ctypes.c_void_p(0)), "cuLaunchKernel")
        _check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
