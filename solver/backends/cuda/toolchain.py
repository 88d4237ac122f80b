"""The CUDA toolchain, imported on first use: numba-cuda-mlir compiles the generated kernel and
numba-enzyme-cuda differentiates the RHS inside it.

Both are optional (the ``cuda`` extra), so nothing in the CUDA backend imports them at module
level: importing the backend on a machine without them is harmless, and using it raises
:class:`CudaBackendUnavailable` with the reason.
"""
from __future__ import annotations

__all__ = ["CudaBackendUnavailable", "cuda_modules", "THREADS_PER_BLOCK", "kernel_attr"]

#: threads per block of every launch: one warp. Trajectories share no data, so larger blocks
#: buy nothing, and one warp keeps divergence between finished and running threads local.
THREADS_PER_BLOCK = 32


class CudaBackendUnavailable(RuntimeError):
    """The CUDA backend cannot run here (no GPU, or numba-cuda-mlir / numba-enzyme-cuda missing)."""


def cuda_modules():
    """(numba_cuda_mlir.cuda, numba_cuda_mlir.types, numba_enzyme.jvp), imported on first use."""
    try:
        from numba_cuda_mlir import cuda, types
    except Exception as exc:  # ImportError, or a CUDA/driver error raised at import
        raise CudaBackendUnavailable(
            "backend='cuda' needs numba-cuda-mlir (>=0.5.1,<0.6) and a CUDA GPU: "
            f"importing numba_cuda_mlir failed: {type(exc).__name__}: {exc}") from exc
    try:
        from numba_enzyme import jvp
    except Exception as exc:
        raise CudaBackendUnavailable(
            "backend='cuda' needs numba-enzyme-cuda 0.2.x (Linux x86_64, glibc >= 2.39) for the "
            f"Jacobian sweeps: importing numba_enzyme failed: {type(exc).__name__}: {exc}") from exc
    return cuda, types, jvp


def check_cuda_packages() -> None:
    """Raise ``CudaBackendUnavailable`` naming what is missing when numba-cuda-mlir or
    numba-enzyme-cuda is not installed — without importing them: a launch whose kernel image
    comes from the on-disk cache needs neither (importing numba-cuda-mlir, which imports torch
    where it is installed, was seconds of every new process)."""
    from importlib.util import find_spec

    for module, need in (("numba_cuda_mlir", "numba-cuda-mlir (>=0.5.1,<0.6) and a CUDA GPU"),
                         ("numba_enzyme", "numba-enzyme-cuda 0.2.x (Linux x86_64, glibc >= 2.39) "
                                          "for the Jacobian sweeps")):
        if find_spec(module) is None:
            raise CudaBackendUnavailable(f"backend='cuda' needs {need}: {module} is not "
                                         "installed")


def kernel_attr(kernel, getter):
    """A compiled-kernel attribute, e.g. ``get_local_mem_per_thread`` (bytes) or
    ``get_regs_per_thread`` (max over compiled overloads; None if numba cannot say)."""
    try:
        v = getattr(kernel, getter)()
        return int(max(v.values())) if isinstance(v, dict) else int(v)
    except Exception:  # noqa: BLE001 - diagnostics only
        return None
