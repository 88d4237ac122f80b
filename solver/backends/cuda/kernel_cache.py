"""The on-disk kernel-image cache: a compiled cubin reused by a later process.

The first solve in a new process otherwise recompiles the kernel (numba-cuda-mlir + nvJitLink:
minutes for the EB model; Enzyme's derivatives are cached by numba-enzyme-cuda itself). The linked
cubin is stored as ``<root>/<key>.cubin`` with ``<key>.json`` (entry name, parameter layout and
count, image size and sha256, the original compile seconds, local memory / registers per thread,
created-at, versions), each written atomically, the JSON last (the commit marker).

The key (:func:`key_components`, :func:`cache_key`) is the sha256 of the generated kernel source,
a fingerprint of the device functions compiled with it (``fingerprint``), the entry, the
numba-cuda-mlir / numba-enzyme-cuda / numba / Python versions, the GPU's compute capability, the
kernel's argument types, ``THREADS_PER_BLOCK`` and ``CACHE_FORMAT``. Corrupt or mismatched entries
warn and are treated as misses (the caller compiles and overwrites them); an unknown compute
capability or an rhs reading objects the fingerprint cannot pin down disables the cache for that
kernel.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path

import numpy as np

from ...files import atomic_write
from .fingerprint import Unfingerprintable, device_code_digest
from .toolchain import THREADS_PER_BLOCK

__all__ = ["KernelCache", "default_cache_root", "key_components", "cache_key", "CACHE_FORMAT"]

#: Bump when the entry format or anything the key must cover changes meaning.
CACHE_FORMAT = 1
#: What ``Plan.kernel`` compiles: ``module("gpu")``'s function ``kernel``.
KERNEL_ENTRY = "kernel"
KERNEL_MODULE_TAG = "gpu"


def default_cache_root() -> Path:
    """The conventional per-user cache directory, ``$XDG_CACHE_HOME/boltzmann-gpu`` (default
    ``~/.cache/boltzmann-gpu``), for callers that want a persistent cache and have no better
    place: ``CudaBackend(cache_root=default_cache_root())``."""
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "boltzmann-gpu"


def dist_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - PackageNotFoundError, broken metadata
        return "unknown"


def compute_capability() -> str | None:
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


def arg_types(kernel_args, example) -> str:
    """The argument types ``ffi_kernel.compile_result`` compiles for (from its example values)."""
    parts = []
    for name, v in zip(kernel_args, example):
        if isinstance(v, np.ndarray):
            order = "C" if v.flags.c_contiguous else ("F" if v.flags.f_contiguous else "A")
            parts.append(f"{name}:{v.dtype.str}[{v.ndim}d,{order}]")
        elif isinstance(v, tuple):
            parts.append(f"{name}:({arg_types(range(len(v)), v)})")
        elif isinstance(v, np.generic):
            parts.append(f"{name}:{v.dtype.str}")
        else:
            parts.append(f"{name}:{type(v).__name__}")
    return ";".join(parts)


def key_components(plan, kernel_args, example, entry: str | None = None) -> dict | None:
    """Everything the linked cubin depends on; None when the cache cannot be used (no compute
    capability, or a device function whose globals/closure cannot be pinned down).  ``plan``: a
    plain ``Plan`` or a ``SensPlan`` (its device functions are its plain plan's); ``entry``: the
    kernel's name in the plan's module (default the plain kernel's)."""
    cc = compute_capability()
    if cc is None:
        return None
    try:
        device_code = device_code_digest(getattr(plan, "plain", plan))
    except Unfingerprintable:
        return None
    return {"format": CACHE_FORMAT, "source": plan.source, "device_code": device_code,
            "entry": f"{KERNEL_MODULE_TAG}:{entry or KERNEL_ENTRY}",
            "numba_cuda_mlir": dist_version("numba-cuda-mlir"),
            "numba_enzyme_cuda": dist_version("numba-enzyme-cuda"),
            "numba": dist_version("numba"),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "compute_capability": cc, "arg_types": arg_types(kernel_args, example),
            "threads_per_block": int(getattr(plan, "threads_per_block", THREADS_PER_BLOCK))}


def cache_key(components: dict) -> str:
    """sha256 of the key components (:func:`key_components`), hex."""
    import json

    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()


class KernelCache:
    """Kernel images under ``root`` (created on first store). ``stats``: ``hits`` (images
    registered from the cache without compiling), ``misses``, ``stores`` and ``load_seconds``
    (the hits' read + register time)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.stats = {"hits": 0, "misses": 0, "stores": 0, "load_seconds": 0.0}

    def __repr__(self) -> str:
        return f"KernelCache({str(self.root)!r})"

    def paths(self, key: str):
        """(``<key>.cubin``, ``<key>.json``)."""
        return self.root / f"{key}.cubin", self.root / f"{key}.json"

    def clear(self) -> int:
        """Delete every cached kernel image; returns how many files were removed."""
        count = 0
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.suffix in (".cubin", ".json", ".tmp"):
                    p.unlink(missing_ok=True)
                    count += 1
        return count

    def store(self, key: str, image: bytes, meta: dict) -> Path | None:
        """Write ``<key>.cubin`` then ``<key>.json`` (the commit marker), each atomically.  Returns
        the json path, or None (with a warning) if the directory cannot be written."""
        import datetime
        import json
        import warnings

        cubin, js = self.paths(key)
        record = dict(meta, format=CACHE_FORMAT, key=key, image_bytes=len(image),
                      image_sha256=hashlib.sha256(image).hexdigest(),
                      created_at=datetime.datetime.now(datetime.timezone.utc).isoformat())
        try:
            cubin.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cubin, bytes(image))
            atomic_write(js, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        except OSError as exc:
            warnings.warn(f"could not write the kernel cache entry {js}: {exc}", RuntimeWarning,
                          stacklevel=2)
            return None
        return js

    def load(self, key: str, layout=None, n_params=None):
        """(image bytes, metadata dict) of a valid entry, or None.  A missing entry is a silent
        miss; a corrupt or mismatched one (unreadable JSON, other format/key, size or checksum
        mismatch, entry name not in the image, another argument layout) warns and is a miss (the
        caller then compiles and overwrites it)."""
        import json
        import warnings

        cubin, js = self.paths(key)
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
