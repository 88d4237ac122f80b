"""Batched values and Jacobians (boltzmann.gradients_batch): C cosmologies in one joint solve give,
row by row, what the single-cosmology PowerSpectrumFunction gives at each θ.

One reduced-precision model (configs/lcdm_reduced.yaml), three k, two cosmologies, two
parameters, no σ8: the check is of the batching (shared directions E_j, the per-cosmology table
rows and tangents, the outputs' layout), not of the physics. CPU cost: ~3 min of compiling.
"""
from __future__ import annotations

import numpy as np
import pytest

from boltzmann.gradients import PowerSpectrumFunction
from boltzmann.gradients_batch import PowerSpectrumBatch, _finite_per_cosmology
from boltzmann.params import ConfigError, load_config

PARAMS = ("omega_cdm", "tau_reio")


def _function():
    return PowerSpectrumFunction(load_config("lcdm_reduced"), parameters=PARAMS,
                                 k=np.array([0.01, 0.1, 0.5]), with_sigma8=False,
                                 z_background=(0.5,), derived=("100*theta_s", "z_reio"),
                                 n_chunks=1)


@pytest.fixture(scope="module")
def batch_and_single():
    fn = _function()
    th = np.asarray(fn.theta0)
    # the second cosmology far enough away that a mix-up of rows or directions shows
    thetas = np.stack([th * np.array([1.06, 0.8]), th])
    pb = PowerSpectrumBatch(fn, n_chunks=1)
    val, jac = pb.value_and_jacobian(thetas)
    single = [fn.jacobian(t) for t in thetas]
    return thetas, val, jac, single


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def test_each_row_is_that_cosmologys_value_and_jacobian(batch_and_single):
    thetas, val, jac, single = batch_and_single
    assert val["P_m"].shape == (2, 1, 3) and jac["P_m"].shape == (2, 1, 3, len(PARAMS))
    assert jac["z_reio"].shape == (2, len(PARAMS))
    assert list(val["ok"]) == [True, True]
    for c, (v, j) in enumerate(single):
        for name in ("P_m", "P_cb", "d_m", "H", "100*theta_s", "z_reio"):
            # values: the joint solves' own states (both take the same steps per mode)
            assert _rel(val[name][c], v[name]) < 1e-8, (c, name)
            # derivatives: agree to the solver tolerance (rtol 1e-7), per parameter; a
            # derivative that is zero to rounding (100θ_s in tau_reio) is measured against the
            # value's scale instead
            for p in range(len(PARAMS)):
                got, ref = np.asarray(jac[name][c][..., p]), np.asarray(j[name][..., p])
                scale = max(np.abs(ref).max(), 1e-9 * np.abs(np.asarray(v[name])).max())
                assert np.abs(got - ref).max() < 1e-5 * scale, (c, name, PARAMS[p])
    # and the two cosmologies differ, so rows were not copied
    assert _rel(val["P_m"][0], val["P_m"][1]) > 1e-2
    assert _rel(jac["P_m"][0], jac["P_m"][1]) > 1e-2


def test_tau_reio_moves_nothing_but_the_thermal_history(batch_and_single):
    # at fixed A_s, tau_reio changes P(k) only through the late baryon temperature and
    # ionisation (~1e-3), omega_cdm by order ten; z_reio grows with tau_reio (by ~100): the
    # directions are not swapped between parameters
    _, val, jac, _ = batch_and_single
    dlnp = np.asarray(jac["P_m"]) / np.asarray(val["P_m"])[..., None]
    assert np.abs(dlnp[..., 1]).max() < 1e-2 < 0.3 < np.abs(dlnp[..., 0]).min()
    assert np.all(np.asarray(jac["z_reio"])[:, 1] > 10.0)


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
