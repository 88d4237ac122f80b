"""Batched values and Jacobians (boltzmann.gradients_batch): C cosmologies in one joint solve give,
row by row, each cosmology's own values and derivatives.

One reduced-precision model (configs/lcdm_reduced.yaml), three k, two cosmologies, two
parameters, no σ8: the check is of the batching (shared directions E_j, the per-cosmology table
rows and tangents, the outputs' layout), not of the physics. The references cost no program of
their own beyond one: the omega_cdm column against central differences of the batch's own values
(the values program, which the test of ``values`` compiles anyway), the ln10^{10}A_s column
against its exact value (P ∝ A_s; nothing else depends on it), and the values of the second
cosmology against ``PowerSpectrumFunction`` itself. CPU cost: ~4 min of compiling.
"""
from __future__ import annotations

import numpy as np
import pytest

from boltzmann.gradients import PowerSpectrumFunction
from boltzmann.gradients_batch import PowerSpectrumBatch, _finite_per_cosmology
from boltzmann.params import ConfigError, load_config

PARAMS = ("omega_cdm", "ln10^{10}A_s")
#: central-difference step in omega_cdm (2e-3 of it: truncation ~4e-6, solver noise at rtol 1e-7
#: ~1e-8 / 5e-4 in ln P against ∂ln P/∂omega_cdm of order ten)
FD_STEP = 2e-3 * 0.12


def _function():
    return PowerSpectrumFunction(load_config("lcdm_reduced"), parameters=PARAMS,
                                 k=np.array([0.01, 0.1, 0.5]), with_sigma8=False,
                                 z_background=(0.5,), derived=("100*theta_s", "z_reio"),
                                 n_chunks=1)


@pytest.fixture(scope="module")
def batch():
    fn = _function()
    th = np.asarray(fn.theta0)
    # the first cosmology far enough away that a mix-up of rows or directions shows
    thetas = np.stack([th * np.array([1.06, 0.97]), th])
    pb = PowerSpectrumBatch(fn, n_chunks=1)
    val, jac = pb.value_and_jacobian(thetas)
    plain = pb.values(thetas)
    shift = np.zeros_like(thetas)
    shift[:, 0] = FD_STEP
    fd = {name: (np.asarray(pb.values(thetas + shift)[name])
                 - np.asarray(pb.values(thetas - shift)[name])) / (2 * FD_STEP)
          for name in ("P_m", "d_m", "H", "100*theta_s")}
    swapped = pb.values(thetas[::-1])
    return {"fn": fn, "thetas": thetas, "val": val, "jac": jac, "plain": plain, "fd": fd,
            "swapped": swapped}


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def test_shapes_and_statuses(batch):
    val, jac = batch["val"], batch["jac"]
    assert val["P_m"].shape == (2, 1, 3) and jac["P_m"].shape == (2, 1, 3, len(PARAMS))
    assert jac["z_reio"].shape == (2, len(PARAMS))
    assert list(val["ok"]) == [True, True] and list(batch["plain"]["ok"]) == [True, True]


def test_rows_are_each_cosmologys_values(batch):
    val, plain, swapped = batch["val"], batch["plain"], batch["swapped"]
    # the single-cosmology function at the second row's θ: the same outputs to a few solver
    # tolerances (rtol 1e-7; the batch's modes share a launch and a vmapped step loop, not step
    # sizes, so accept/reject decisions can differ by rounding)
    single = batch["fn"](batch["thetas"][1])
    for name in ("P_m", "P_cb", "d_m", "H", "100*theta_s", "z_reio"):
        assert _rel(plain[name][1], single[name]) < 1e-6, name
        # the joint sensitivity solve's states: the same values to the solver tolerance
        assert _rel(val[name], plain[name]) < 1e-5, name
        # rows follow their θ: reversing the cosmologies reverses the rows
        assert _rel(swapped[name][::-1], plain[name]) < 1e-10, name
    assert _rel(plain["P_m"][0], plain["P_m"][1]) > 1e-2   # the rows differ


def test_omega_cdm_column_is_each_cosmologys_derivative(batch):
    jac, fd = batch["jac"], batch["fd"]
    for name in fd:
        got = np.asarray(jac[name])[..., 0]
        for c in range(2):
            assert np.abs(got[c] - fd[name][c]).max() < 1e-4 * np.abs(fd[name][c]).max(), (c, name)
    assert _rel(jac["P_m"][0, ..., 0], jac["P_m"][1, ..., 0]) > 1e-2


def test_amplitude_column_is_exact(batch):
    # P ∝ A_s = 1e-10 e^{ln10^{10}A_s}: ∂P/∂ln10^{10}A_s = P, and nothing else moves
    val, jac = batch["val"], batch["jac"]
    for name in ("P_m", "P_cb"):
        assert _rel(np.asarray(jac[name])[..., 1], val[name]) < 1e-10, name
    for name in ("d_m", "H", "100*theta_s", "z_reio"):
        assert np.abs(np.asarray(jac[name])[..., 1]).max() <= 1e-12 * np.abs(
            np.asarray(val[name])).max(), name


def test_bad_thetas_are_a_clear_error():
    fn = _function()
    pb = PowerSpectrumBatch(fn)
    with pytest.raises(ConfigError, match=r"shape \(C, 2\)"):
        pb.value_and_jacobian(np.zeros(2))
    with pytest.raises(ConfigError, match="omega_cdm"):
        pb.values(np.zeros((3, 5)))


def test_a_failed_cosmology_is_flagged_alone():
    out = {"P_m": np.array([[1.0, 2.0], [np.nan, 1.0], [3.0, 4.0]]),
           "sigma8": np.array([0.8, 0.8, np.inf])}
    assert list(_finite_per_cosmology(out)) == [True, False, False]
