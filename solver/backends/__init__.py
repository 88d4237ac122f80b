"""Backends behind one interface (``base.Backend``): the JAX backend (``jax/``) and the CUDA
backend (``cuda/``); ``registry.resolve_backend`` turns a ``backend=`` argument into one, and
``availability`` says whether CUDA can run here."""
from .availability import cuda_available, pick_backend
from .base import Backend
from .registry import resolve_backend

__all__ = ["Backend", "resolve_backend", "cuda_available", "pick_backend"]
