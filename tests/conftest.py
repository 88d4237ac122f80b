"""Shared pytest configuration: float64 JAX, one session-wide XLA program cache shared by the
xdist workers, at most two workers, and clean skipping of GPU tests."""
import os
import shutil
import tempfile

os.environ.setdefault("JAX_ENABLE_X64", "1")
# in-process CLI runs keep nothing between tests (and never read a user's cache): every test
# compiles what it needs, so a persistent cache cannot hide a compile-time regression
os.environ.setdefault("BOLTZMANN_CACHE", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

#: JAX's persistent compilation cache, empty at the start of every session and removed at its
#: end: a program is compiled once per session (so a compile-time regression still shows in the
#: suite's time) and later modules that build the same program (the lcdm pipeline is built by a
#: dozen modules) load it instead of compiling it again. The in-process CLI runs keep
#: ``BOLTZMANN_CACHE=0`` above, so they never read or write a user's cache. Under pytest-xdist
#: the controller makes the directory and its workers (child processes, which inherit the
#: environment) share it: concurrent writers are safe (tests/test_compile_cache.py).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_SESSION_XLA_CACHE = os.environ.get("BOLTZMANN_TEST_XLA_CACHE") if _WORKER else None
if not _SESSION_XLA_CACHE:
    _SESSION_XLA_CACHE = tempfile.mkdtemp(prefix="boltzmann-test-xla-")
    os.environ["BOLTZMANN_TEST_XLA_CACHE"] = _SESSION_XLA_CACHE
jax.config.update("jax_compilation_cache_dir", _SESSION_XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_sessionfinish(session, exitstatus):
    if not _WORKER:      # the controller (or a run without xdist) owns the directory
        shutil.rmtree(_SESSION_XLA_CACHE, ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core, at most two. Each worker holds
    its own compiled programs (the Jacobian tests peak at a few GB while compiling), and the
    solver's while loops run on one core each, so two workers use a 2-core machine fully."""
    return max(1, min(2, os.cpu_count() or 1))


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
    project's plan caches, their JIT-mapped code eventually exhausts the process (an abort in
    XLA's compiler late in a full run). Each module starts from clean caches: every
    ``solver.caches.Cache`` (the solver's and the boltzmann package's) and JAX's own.
    """
    yield
    import solver

    solver.clear_caches()
