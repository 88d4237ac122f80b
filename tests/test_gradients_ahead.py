"""``boltzmann.gradients_ahead``: the Jacobian's inputs computed ahead on an accelerator's host.

The mixin is exercised through a stand-in with the attributes ``PowerSpectrumFunction`` gives
it (the real inputs program is the subject of tests/test_gradients.py and, on a GPU,
tests/test_cuda_sensitivity.py); the host CPU is made to look like an accelerator's host.
"""
from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from boltzmann import gradients_ahead


class _NothingStored:
    """A PersistedProgram with an empty store."""

    def stored_output_shapes(self, *args):
        return None


class _Standin(gradients_ahead.AheadOfCall):
    def __init__(self, inputs_on_host=True, fail=False):
        self.theta0 = np.array([0.7, 0.12])
        self.inputs_on_host = inputs_on_host
        self._jit_inputs_jvp = _NothingStored()
        self._jit_solve_jvp = None
        self._chunk_groups = None
        self.calls = []
        self.release = threading.Event()
        self.fail = fail

    def _host_inputs(self, program, theta):
        self.calls.append(threading.current_thread().name)
        self.release.wait(10)
        if self.fail and self.calls[-1].startswith("boltzmann-inputs"):
            raise RuntimeError("prefetch failed")
        return ("inputs at", tuple(np.asarray(theta)))


@pytest.fixture
def accelerator_host(monkeypatch):
    monkeypatch.setattr(gradients_ahead, "host_cpu", lambda: jax.devices("cpu")[0])


def test_preload_computes_the_inputs_in_the_background_once(accelerator_host):
    fn = _Standin()
    assert fn.preload() is True
    fn.release.set()
    assert fn._inputs_at(fn.theta0) == ("inputs at", (0.7, 0.12))
    assert len(fn.calls) == 1 and fn.calls[0].startswith("boltzmann-inputs")
    # taken once: a second Jacobian computes its inputs in the caller's thread
    fn._inputs_at(fn.theta0)
    assert fn.calls[1] == threading.current_thread().name


def test_inputs_at_another_theta_are_computed_now(accelerator_host):
    fn = _Standin()
    fn.preload()
    fn.release.set()
    assert fn._inputs_at(np.array([0.6, 0.12])) == ("inputs at", (0.6, 0.12))
    assert fn.calls[-1] == threading.current_thread().name


def test_a_failed_prefetch_is_computed_again_by_the_caller(accelerator_host):
    fn = _Standin(fail=True)
    fn.preload()
    fn.release.set()
    assert fn._inputs_at(fn.theta0) == ("inputs at", (0.7, 0.12))
    assert fn.calls[-1] == threading.current_thread().name


def test_nothing_ahead_without_an_accelerator(accelerator_host):
    fn = _Standin(inputs_on_host=False)
    assert fn.preload() is False
    assert fn.calls == []


def test_wait_for_preload_waits_for_the_inputs(accelerator_host):
    fn = _Standin()
    fn.preload()
    threading.Timer(0.2, fn.release.set).start()
    fn._wait_for_preload()
    assert fn._prefetched[1].done()
