"""Shared pytest configuration: float64 JAX, and clean skipping of GPU tests."""
import os

os.environ.setdefault("JAX_ENABLE_X64", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


def _cuda_available() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop compiled programs after every test module.

    The suite compiles hundreds of XLA CPU programs; kept alive by JAX's caches and by the
    project's plan caches, their JIT-mapped code eventually exhausted the process (an abort in
    XLA's compiler late in the full run, 2026-11-30). Each module starts from clean caches.
    """
    yield
    from boltzmann import perturbations, pipeline
    from solver import api, cuda_backend, sensitivity

    api._PLANS.clear()
    cuda_backend._PLANS.clear()
    sensitivity.clear_caches()
    pipeline._TABLE_FNS.clear()
    perturbations._model_for.cache_clear()
    perturbations._initial_states_fn.cache_clear()
    jax.clear_caches()
