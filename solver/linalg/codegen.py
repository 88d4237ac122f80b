"""Helpers for generated straight-line code: unique pseudo-filenames, linecache, exec.

Generated source (the unrolled sparse LU, generated RHS) is compiled with a pseudo-filename such as
``<generated sparse_lu n=50 nnz=300 1a2b3c4d>`` and its text is registered with :mod:`linecache`,
so a traceback through generated code prints the generated line (not "source unavailable"), and
``inspect.getsource`` works on the generated functions.  The same source text is kept so that other
backends (numba-cuda device functions) can compile exactly what the JAX backend runs.
"""
from __future__ import annotations

import hashlib
import itertools
import linecache
from typing import Any

__all__ = ["unique_filename", "register_source", "compile_functions"]

#: a process-wide sequence number: pseudo-filenames stay unique however often a text is compiled
_SEQUENCE = itertools.count(1)


def unique_filename(label: str, source: str) -> str:
    """Pseudo-filename ``<generated {label} {hash}>``; hash of the source plus a process counter.

    The counter keeps two compilations of identical text distinct in ``linecache`` (harmless either
    way, but it keeps ``linecache.checkcache`` from evicting one while the other is alive).
    """
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    return f"<generated {label} {digest}-{next(_SEQUENCE)}>"


def register_source(filename: str, source: str) -> None:
    """Put ``source`` into :mod:`linecache` under ``filename`` (mtime None: never invalidated)."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def compile_functions(source: str, names: list[str] | tuple[str, ...], label: str,
                      namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile ``source`` under a unique pseudo-filename and return the named functions.

    ``label`` describes the code (e.g. ``"sparse_lu n=50 nnz=300"``); ``namespace`` seeds the
    globals the source may use (generated straight-line code normally needs none).
    """
    filename = unique_filename(label, source)
    register_source(filename, source)
    code = compile(source, filename, "exec")
    ns: dict[str, Any] = {} if namespace is None else dict(namespace)
    exec(code, ns)  # noqa: S102 - our own generated code
    missing = [name for name in names if name not in ns]
    if missing:
        raise ValueError(f"generated source does not define {missing}")
    out = {name: ns[name] for name in names}
    out["__filename__"] = filename
    return out
