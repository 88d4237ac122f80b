"""The CUDA backend, split by concern:

* ``codegen/``: the kernel text (plain and sensitivity kernels) from one ``KernelSpec``;
* ``plan``: per-RHS host-side build and the lazily compiled kernels;
* ``tables``: the ``rhs.table_split`` protocol for RHS that read tables;
* ``inputs`` / ``results``: kernel arguments and what kernels return;
* ``launch_numba``, ``launch_ffi`` (+ ``ffi_kernel``, ``ffi_library``, ``csrc/``): the two GPU
  launches; ``kernel_cache`` (+ ``fingerprint``): the on-disk cubin cache;
* ``emulation``: the kernel text run on the CPU;
* ``toolchain`` / ``modules``: the lazily imported numba-cuda-mlir / numba-enzyme-cuda and the
  generated modules they compile;
* ``backend``: :class:`CudaBackend`, the interface the rest of the solver uses.
"""
from .backend import LAUNCH_MODES, CudaBackend
from .ffi_library import FfiBuildError, FfiLibrary
from .kernel_cache import KernelCache, default_cache_root
from .toolchain import CudaBackendUnavailable

__all__ = ["CudaBackend", "CudaBackendUnavailable", "FfiBuildError", "FfiLibrary", "KernelCache",
           "default_cache_root", "LAUNCH_MODES"]
