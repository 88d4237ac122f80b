"""Which backend ``backend="auto"`` runs: CUDA when a CUDA GPU and the cuda extra are present."""
from __future__ import annotations

import importlib.util

import jax


def cuda_available() -> tuple[bool, str]:
    """(available, reason). The reason says what is missing when it is not."""
    try:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        gpus = []
    if not gpus:
        return False, "no CUDA GPU visible to JAX"
    # import names of the cuda extra's distributions numba-cuda-mlir and numba-enzyme-cuda
    for mod in ("numba_cuda_mlir", "numba_enzyme"):
        if importlib.util.find_spec(mod) is None:
            return False, f"the cuda extra is not installed ({mod} missing): pip install '.[cuda]'"
    if importlib.util.find_spec("solver.backends.cuda") is None:
        return False, "this build has no CUDA backend"
    return True, f"{gpus[0].device_kind}"


def pick_backend() -> str:
    """The backend name ``backend="auto"`` resolves to: "cuda" where it can run, else "jax"."""
    ok, _ = cuda_available()
    return "cuda" if ok else "jax"
