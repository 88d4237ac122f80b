"""The Jacobian's CUDA sensitivity kernel, compiled by a helper process while the main job runs.

A first ``--gradients`` run on a GPU compiles, one after another: the main job's CUDA kernel
(48 s on an H100), XLA:CPU's inputs program of the Jacobian (72 s) and the sensitivity kernel
(121 s, 60 % of that run's 201-s Jacobian; docs/benchmarks.md). The sensitivity kernel depends on
the model and the solver options only, not on anything the main job computes, and its compile
(numba-cuda-mlir, Enzyme, nvJitLink) is one core's work — so ``start`` hands it to a second
Python process as soon as the Jacobian's function is built. That process computes the solve's
inputs at the fiducial θ with JAX on the host CPU (the GPU's memory stays the main process's),
solves one mode with zero tangents on the same ``CudaBackend`` settings — which compiles the
kernel and stores it in the kernel cache — and exits. The main process waits for it before its
own sensitivity solve (``KernelHelper.wait``) and then loads the kernel from the cache: the same
cache entry, since the key covers the kernel's source, device code, argument types and GPU.

Only where it pays: a ``CudaBackend`` that launches real kernels and keeps a kernel cache. A
helper that succeeded leaves a marker (``<cuda cache>/helpers/<key>.json``, the key over the
project's code, everything the function was built from and the backend's options) naming the
cache entry it stored; a later process that finds both starts nothing. Helpers of one key take
a lock, so a sampler's workers starting together compile the kernel once. A helper that fails
or does not finish costs nothing but its time: the main process then compiles the kernel itself,
as it would without one, and warns with the helper's log.

The helper process runs ``boltzmann.kernel_helper_run`` (``python -m boltzmann.kernel_helper_run
SPEC``), a module of its own so that this one, which ``boltzmann.gradients`` imports, imports
no ``gradients``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from solver.backends.registry import resolve_backend
from solver.files import atomic_write

log = logging.getLogger(__name__)

__all__ = ["KernelHelper", "start", "helper_key", "kernel_stored", "WAIT_LIMIT_S"]

#: bump when what a helper does or writes changes meaning
HELPER_FORMAT = 1
#: folder of the markers, specs, locks and logs under the CUDA backend's cache root
HELPERS_DIR = "helpers"
#: the longest the main process waits for its helper before compiling the kernel itself
WAIT_LIMIT_S = 1800.0


def helper_key(fn) -> str:
    """sha256 (hex) over what decides the helper's kernel: the project's code, everything
    ``fn`` (a ``PowerSpectrumFunction``) was built from, and its backend's options."""
    from solver.persisted import code_digest

    backend = resolve_backend(fn.backend)
    h = hashlib.sha256()
    for item in (HELPER_FORMAT, code_digest(), type(fn).__name__, fn.MAX_STEPS,
                 *fn._construction, backend.launch, backend.kernel):
        h.update(repr(item).encode() + b"\x00")
    return h.hexdigest()


def kernel_stored(marker: Path, kernel_cache) -> bool:
    """Whether ``marker`` names a kernel-cache entry that is present (its files exist; a
    damaged entry is found and replaced by the launch that reads it)."""
    try:
        key = json.loads(marker.read_text())["kernel_cache_key"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(key, str) and all(p.is_file() for p in kernel_cache.paths(key))


def _usable(backend) -> bool:
    return (getattr(backend, "name", None) == "cuda" and not backend.emulated
            and backend.kernel_cache is not None)


class KernelHelper:
    """A running helper process (``start``): ``wait`` before the sensitivity solve."""

    def __init__(self, process: subprocess.Popen, spec: Path, log_path: Path,
                 marker_path: Path | None = None):
        self.process = process
        self.marker_path = marker_path
        self.spec = spec
        self.log_path = log_path
        self.started = time.perf_counter()
        #: None while running; then True (the kernel is stored) or False
        self.succeeded: bool | None = None
        #: the helper's seconds by phase (imports, lock, build, inputs, warm, total) from its
        #: marker, once it succeeded: what a first Jacobian's wait was made of
        self.timeline: dict | None = None

    def wait(self, timeout: float = WAIT_LIMIT_S) -> bool:
        """Wait for the helper (at most ``timeout`` seconds, then stop it); True when it stored
        the kernel. A failure warns with the end of its log; the caller then compiles the kernel
        itself."""
        if self.succeeded is not None:
            return self.succeeded
        try:
            rc = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            rc = self.process.wait()
            why = f"did not finish in {timeout:.0f} s"
        else:
            why = f"exited with status {rc}"
        self.succeeded = rc == 0
        self.spec.unlink(missing_ok=True)
        if self.succeeded:
            self.log_path.unlink(missing_ok=True)
            self.timeline = _marker_timeline(self.marker_path)
            log.info("the sensitivity kernel's helper finished after %.1f s",
                     time.perf_counter() - self.started)
        else:
            try:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-12:]
            except OSError:
                tail = []
            warnings.warn("the helper process compiling the sensitivity kernel " + why
                          + "; the Jacobian compiles it itself. Its log (" + str(self.log_path)
                          + ") ends:\n" + "\n".join(tail), RuntimeWarning, stacklevel=2)
        return self.succeeded


def start(fn, theta=None) -> KernelHelper | None:
    """Start a helper process compiling ``fn``'s sensitivity kernel (module docstring), or
    return None where none is needed: not a real ``CudaBackend`` with a kernel cache, or a
    marker naming a stored kernel is there."""
    backend = resolve_backend(fn.backend)
    if not _usable(backend):
        return None
    key = helper_key(fn)
    folder = backend.cache_root / HELPERS_DIR
    marker = folder / f"{key}.json"
    if kernel_stored(marker, backend.kernel_cache):
        return None
    from . import runtime

    tag = f"{key}.{os.getpid()}.{id(fn):x}"
    spec, log_path = folder / f"{tag}.spec", folder / f"{tag}.log"
    theta = fn.theta0 if theta is None else theta
    atomic_write(spec, pickle.dumps({
        "config": fn.config, "kwargs": fn.construction_kwargs, "theta": np.asarray(theta),
        "backend": {"launch": backend.launch, "cache_root": backend.cache_root,
                    "kernel": backend.kernel, "direction_warps": backend.direction_warps},
        "cache_root": runtime.persistent_dir(""), "marker": marker, "key": key,
        "started_at": time.time()}))
    # JAX on the host only: no GPU memory taken, and the backend's "auto" sensitivity launch
    # takes the host callback there (the kernel-cache entry it stores serves the custom call)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    project = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project, env.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "boltzmann.kernel_helper_run", str(spec)],
                                   stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
    log.info("compiling the sensitivity kernel in a helper process (pid %d)", process.pid)
    return KernelHelper(process, spec, log_path, marker)


def _marker_timeline(marker: Path | None) -> dict | None:
    """The ``timeline`` a successful helper wrote into its marker, or None."""
    try:
        return json.loads(marker.read_text()).get("timeline")
    except (OSError, ValueError, AttributeError, TypeError):
        return None
