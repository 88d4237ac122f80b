"""The helper process of ``boltzmann.kernel_helper``: ``python -m boltzmann.kernel_helper_run SPEC``
rebuilds the caller's ``PowerSpectrumFunction`` from the pickled SPEC on its own ``CudaBackend``
(JAX on the host CPU), compiles or finds the sensitivity kernel by ``warm_sensitivity_kernel``,
and writes the marker naming the kernel-cache entry. Exit status 0 on success.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import sys
import time
from pathlib import Path

from solver import CudaBackend
from solver.files import atomic_write

from . import runtime
from .gradients import PowerSpectrumFunction
from .kernel_helper import helper_key, kernel_stored

__all__ = ["main"]


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created) for the block: one helper of a key at a time."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv=None) -> int:
    """The helper: build the function the spec describes, compile (or find) its sensitivity
    kernel by ``warm_sensitivity_kernel`` and write the marker; 0 on success."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m boltzmann.kernel_helper_run SPEC", file=sys.stderr)
        return 2
    spec = pickle.loads(Path(argv[0]).read_bytes())
    began = spec.get("started_at", time.time())     # when the caller launched this process
    timeline = {"imports_s": time.time() - began}
    marker = Path(spec["marker"])
    backend = CudaBackend(**spec["backend"])
    with _locked(marker.with_suffix(".lock")):
        if kernel_stored(marker, backend.kernel_cache):
            return 0                                    # another helper stored it meanwhile
        timeline["lock_s"] = time.time() - began - timeline["imports_s"]
        runtime.configure(runtime.Settings(cache_root=spec["cache_root"]))
        t0 = time.time()
        fn = PowerSpectrumFunction(spec["config"], backend=backend, **spec["kwargs"])
        timeline["build_s"] = time.time() - t0
        if helper_key(fn) != spec["key"]:   # not the caller's function: its kernel may differ
            print("the rebuilt function's key differs from the caller's (another code or "
                  "construction); nothing compiled", file=sys.stderr)
            return 1
        t0 = time.time()
        info = fn.warm_sensitivity_kernel(spec["theta"])
        timeline["warm_s"] = time.time() - t0
        timeline["inputs_s"] = info.get("inputs_seconds")
        timeline["total_s"] = time.time() - began
        if not info.get("kernel_cache_key"):
            print(f"the launch reported no kernel-cache entry: {info}", file=sys.stderr)
            return 1
        atomic_write(marker, json.dumps({
            "kernel_cache_key": info["kernel_cache_key"],
            "compile_seconds": info.get("compile_seconds"),
            "kernel_from_cache": info.get("kernel_from_cache"),
            "timeline": timeline,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
