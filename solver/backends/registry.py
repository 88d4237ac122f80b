"""The one place a ``backend=`` argument becomes a backend object.

``"jax"`` and ``"cuda"`` name shared default instances (so their plans and compiled kernels are
reused across calls), ``"auto"`` picks CUDA where it can run (``availability.pick_backend``), and
a :class:`~solver.backends.base.Backend` object is used as it is (a ``CudaBackend`` with its own
launch or cache settings, say).
"""
from __future__ import annotations

from .availability import pick_backend
from .base import Backend

__all__ = ["resolve_backend", "default_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("jax", "cuda", "auto")
_DEFAULTS: dict = {}


def default_backend(name: str) -> Backend:
    """The shared instance for "jax" or "cuda" (default settings), created on first use."""
    backend = _DEFAULTS.get(name)
    if backend is None:
        if name == "jax":
            from .jax import JaxBackend
            backend = JaxBackend()
        elif name == "cuda":
            from .cuda import CudaBackend
            backend = CudaBackend()
        else:
            raise ValueError(f"no default backend named {name!r}")
        _DEFAULTS[name] = backend
    return backend


def resolve_backend(backend) -> Backend:
    """A Backend for ``backend``: "jax", "cuda", "auto" or a Backend object."""
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES} or a Backend object "
                         f"(solver.JaxBackend(), solver.CudaBackend(...)), got {backend!r}")
    if backend == "auto":
        backend = pick_backend()
    return default_backend(backend)
