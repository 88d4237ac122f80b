"""A stable description of the Python device functions compiled into a kernel.

The on-disk kernel cache must not hand out a cubin compiled from other code, and a kernel's code
is not only its generated text: the RHS (or the table split's core and lookups) is compiled with
it. :func:`device_code_digest` hashes those functions -- bytecode, constants, defaults, closure
cells and the globals their code names, recursively -- independently of the process (no ids, no
file names). Anything whose behaviour it cannot pin down raises :class:`Unfingerprintable`, and
the kernel cache is then not used for that kernel. ``fingerprint`` itself lives in
``solver.digest`` (the persisted JAX programs use it too) and is re-exported here.
"""
from __future__ import annotations

import hashlib

from ...digest import Unfingerprintable, fingerprint
from .modules import device_functions

__all__ = ["Unfingerprintable", "fingerprint", "device_code_digest"]


def device_code_digest(plan) -> str:
    """sha256 of what ``modules.bind_gpu`` compiles into the kernel besides ``plan.source``."""
    h = hashlib.sha256()
    seen: dict = {}
    for label, fn in sorted(device_functions(plan).items()):
        h.update(label.encode() + b"\x02")
        fingerprint(fn, h, seen)
    return h.hexdigest()
