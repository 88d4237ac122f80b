"""Bounded caches with one place to clear them all.

Everything the solver derives from an RHS (sparsity, colouring, LU code, jitted solve loops,
compiled kernels) is expensive to build and cheap to reuse, so it is kept in a :class:`Cache`.
Every cache registers itself on creation, and :func:`clear_caches` empties all of them at once
(tests do so between modules: compiled programs held by the caches otherwise accumulate until
the process runs out of JIT-mapped memory). Callers outside the solver (the boltzmann package)
use the same class for their own caches, so ``solver.clear_caches()`` covers those too.

The registry holds its caches weakly: a cache owned by an object (e.g. one backend's launch
configurations) disappears with its owner.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable

__all__ = ["Cache", "clear_caches", "registered_caches"]

_REGISTRY: "weakref.WeakSet[Cache]" = weakref.WeakSet()
_MISSING = object()


class Cache:
    """A least-recently-used mapping of at most ``maxsize`` entries, registered for clearing.

    ``get_or_build(key, build)`` is the usual access: it returns the cached value or calls
    ``build()`` (outside the lock, so a build may itself use caches) and stores the result.
    """

    def __init__(self, name: str, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"Cache {name!r}: maxsize must be >= 1, got {maxsize}")
        self.name = name
        self.maxsize = int(maxsize)
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        _REGISTRY.add(self)

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._data.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = build()
            self.put(key, value)
        return value

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __repr__(self) -> str:
        return f"Cache({self.name!r}, {len(self)}/{self.maxsize})"


def registered_caches() -> list[Cache]:
    """Every live cache, by name (diagnostics)."""
    return sorted(_REGISTRY, key=lambda c: c.name)


def clear_caches(jax_caches: bool = True) -> None:
    """Empty every registered cache, and JAX's own compilation caches unless ``jax_caches`` is
    False (the cached plans own jitted functions; dropping only our references would leave
    their compiled programs in JAX's caches)."""
    for cache in list(_REGISTRY):
        cache.clear()
    if jax_caches:
        import jax

        jax.clear_caches()
