"""A stable, process-independent description of Python functions and the values they read.

Two persistent caches must not hand out a program built from other code: the CUDA backend's
cubin cache (``backends.cuda.kernel_cache``) and the persisted traced JAX programs
(``solver.persisted``). Both key their entries by :func:`fingerprint` of the functions
compiled into them -- bytecode, constants, defaults, closure cells and the globals their code
names, recursively -- which uses no ids and no file names, so a later process computes the same
digest. Anything whose behaviour it cannot pin down raises :class:`Unfingerprintable`, and the
caller then does not persist that program. It lives here, outside either backend, because both
use it.
"""
from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["Unfingerprintable", "fingerprint", "digest_of"]


class Unfingerprintable(Exception):
    """A value the fingerprint cannot describe stably."""


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def fingerprint(obj, h, seen: dict) -> None:
    """Feed a stable (process-independent) description of ``obj`` -- a device function and what
    it reads: its code, defaults, closure cells and the globals its code names -- into ``h``.
    Raises Unfingerprintable for anything whose behaviour it cannot pin down."""
    import types

    def put(tag, text=""):
        h.update(f"{tag}\x00{text}\x01".encode())

    if isinstance(obj, _PLAIN):
        put(type(obj).__name__, repr(obj))
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise Unfingerprintable("an object array")
        put("ndarray", f"{obj.dtype.str}{obj.shape}")
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        put("npscalar", f"{obj.dtype.str}:{obj.tobytes().hex()}")
    elif isinstance(obj, (tuple, list)):
        put(type(obj).__name__, str(len(obj)))
        for x in obj:
            fingerprint(x, h, seen)
    elif isinstance(obj, (set, frozenset)):
        parts = []
        for x in obj:
            sub = hashlib.sha256()
            fingerprint(x, sub, seen)
            parts.append(sub.hexdigest())
        put(type(obj).__name__, ",".join(sorted(parts)))
    elif isinstance(obj, dict):
        put("dict", str(len(obj)))
        for k in sorted(obj, key=repr):
            fingerprint(k, h, seen)
            fingerprint(obj[k], h, seen)
    elif isinstance(obj, types.ModuleType):
        put("module", f"{obj.__name__}={getattr(obj, '__version__', '')}")
    elif isinstance(obj, types.CodeType):
        # not co_filename / line numbers / qualname: generated code gets a new pseudo-file name
        # per process (linecache registration), which does not change what it computes
        put("code", f"{obj.co_argcount},{obj.co_posonlyargcount},{obj.co_kwonlyargcount},"
                    f"{obj.co_flags},{obj.co_names},{obj.co_varnames},{obj.co_freevars},"
                    f"{obj.co_cellvars}")
        h.update(obj.co_code)
        fingerprint(tuple(obj.co_consts), h, seen)
    elif isinstance(obj, types.FunctionType):
        if id(obj) in seen:  # recursion / shared helpers
            put("ref", str(seen[id(obj)]))
            return
        seen[id(obj)] = len(seen)
        put("function", obj.__name__)
        fingerprint(obj.__code__, h, seen)
        fingerprint(obj.__defaults__, h, seen)
        fingerprint(obj.__kwdefaults__, h, seen)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                put("empty-cell")
                continue
            fingerprint(value, h, seen)
        names, todo = set(), [obj.__code__]
        while todo:
            code = todo.pop()
            names.update(code.co_names)
            todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        g = obj.__globals__
        for name in sorted(names):
            if name in g:
                put("global", name)
                fingerprint(g[name], h, seen)
    elif isinstance(obj, types.SimpleNamespace):
        # a namespace of helpers a generated rhs names as a global (models.tables' ``T``)
        put("namespace", str(len(vars(obj))))
        fingerprint(vars(obj), h, seen)
    elif isinstance(obj, types.BuiltinFunctionType):
        put("builtin", f"{getattr(obj, '__module__', '')}.{obj.__qualname__}")
    elif isinstance(obj, type) and obj.__module__ == "builtins":
        put("builtin-type", obj.__qualname__)
    elif isinstance(getattr(obj, "py_func", None), types.FunctionType):  # a numba dispatcher
        put("dispatcher", type(obj).__qualname__)
        fingerprint(obj.py_func, h, seen)
    else:
        raise Unfingerprintable(f"{type(obj).__module__}.{type(obj).__qualname__}")


def digest_of(*objs) -> str:
    """sha256 (hex) of the fingerprints of ``objs`` in order (Unfingerprintable propagates)."""
    h = hashlib.sha256()
    seen: dict = {}
    for obj in objs:
        fingerprint(obj, h, seen)
    return h.hexdigest()
