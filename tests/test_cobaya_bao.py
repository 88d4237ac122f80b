"""DESI DR2 BAO (boltzmann.bao, boltzmann.cobaya_bao): the data as DESI distributes them, the
likelihood through Cobaya equal to the same χ² computed from the pipeline's own background, a
short Cobaya MCMC of configs/cobaya_desi_bao.yaml, and the likelihood differentiable in JAX."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from boltzmann.bao import desi_dr2

REPO = Path(__file__).resolve().parents[1]
POINT = {"h": 0.6766, "omega_b": 0.02218, "omega_cdm": 0.1190, "A_s": 2.1e-9, "n_s": 0.9649,
         "tau_reio": 0.0544}


def test_data_vector_and_covariance():
    d = desi_dr2()
    assert d.mean.shape == (13,) and d.cov.shape == (13, 13)
    assert d.z.tolist() == [0.295, 0.51, 0.706, 0.934, 1.321, 1.484, 2.33]
    assert d.kinds[0] == "DV_over_rd" and d.kinds.count("DM_over_rd") == 6
    np.testing.assert_allclose(d.cov, d.cov.T)
    assert np.all(np.linalg.eigvalsh(d.cov) > 0)
    # block diagonal: tracers are independent; LRG1's D_M/D_H correlation is DESI's -0.45
    assert d.cov[1, 3] == 0.0
    assert d.cov[1, 2] / np.sqrt(d.cov[1, 1] * d.cov[2, 2]) == pytest.approx(-0.452, abs=2e-3)


def _our_chi2(point):
    """−2 ln L from the classy facade's background (D_A, H at the DESI redshifts, r_d)."""
    from boltzmann.classy import Class

    cosmo = Class()
    cosmo.set(dict(point, N_ur=3.044))
    cosmo.compute(["thermodynamics"])
    d = desi_dr2()
    d_m = np.array([cosmo.angular_distance(z) * (1 + z) for z in d.z])
    hub = np.array([cosmo.Hubble(z) for z in d.z])
    r_d = cosmo.get_current_derived_parameters(["rs_d"])["rs_d"]
    return -2.0 * d.log_likelihood(d_m, hub, r_d)


def test_cobaya_likelihood_equals_our_chi2_and_mcmc_runs(tmp_path, monkeypatch):
    cobaya = pytest.importorskip("cobaya")
    from cobaya.model import get_model

    import boltzmann

    def no_solve(*args, **kwargs):
        raise AssertionError("a BAO likelihood must not start a perturbation solve")

    monkeypatch.setattr(boltzmann, "compute", no_solve)

    info = yaml.safe_load((REPO / "configs" / "cobaya_desi_bao.yaml").read_text())
    info.pop("output")
    sampler = info.pop("sampler")
    model = get_model(dict(info))
    loglikes, _ = model.loglikes({"h": POINT["h"], "omega_cdm": POINT["omega_cdm"]})
    assert -2.0 * loglikes[0] == pytest.approx(_our_chi2(POINT), rel=1e-8)
    # a plausible fit: DESI DR2 alone prefers Omega_m ≈ 0.30, so chi2 / 13 is of order one
    assert 3.0 < -2.0 * loglikes[0] < 60.0
    # a short chain (test-sized): the sampler runs through the theory and this likelihood
    sampler["mcmc"].update(max_samples=40, burn_in=0, learn_proposal=False)
    _, mcmc = cobaya.run(dict(info, sampler=sampler, output=str(tmp_path / "chain")))
    samples = mcmc.products()["sample"]
    assert len(samples) >= 10 and np.all(np.isfinite(samples["minuslogpost"]))
    assert 0.6 < samples["h"].mean() < 0.75


def test_log_likelihood_is_differentiable():
    d = desi_dr2()
    d_m = jnp.asarray(1.0 + d.z) * 1500.0 * d.z / (1.0 + 0.3 * d.z)
    hub = 2.25e-4 * jnp.sqrt(0.3 * (1 + d.z) ** 3 + 0.7)

    def f(r_d):
        return d.log_likelihood(d_m, hub, r_d, xp=jnp)

    g = jax.grad(f)(147.0)
    eps = 1e-4
    fd = (f(147.0 + eps) - f(147.0 - eps)) / (2 * eps)
    assert np.isfinite(g) and g == pytest.approx(float(fd), rel=1e-5)


@pytest.mark.slow  # a PowerSpectrumFunction's background program and its gradient: minutes
def test_bao_log_likelihood_of_theta_is_differentiable_and_equals_cobayas_input():
    """ln L(θ) through PowerSpectrumFunction's background outputs: equal to the facade's χ² and
    its gradient equal to central differences (what a NUTS potential needs)."""
    from boltzmann.bao import log_likelihood_function
    from boltzmann.class_input import to_config
    from boltzmann.params import load_config

    cfg = load_config(to_config(dict(POINT, N_ur=3.044))[0])
    loglike, theta0 = log_likelihood_function(cfg, ("h", "omega_cdm"))
    assert -2.0 * float(loglike(theta0)) == pytest.approx(_our_chi2(POINT), rel=1e-8)
    g = np.asarray(jax.grad(loglike)(theta0))
    for j, step in enumerate((1e-4, 1e-4)):
        e = np.zeros(2)
        e[j] = step
        fd = (float(loglike(theta0 + e)) - float(loglike(theta0 - e))) / (2 * step)
        assert g[j] == pytest.approx(fd, rel=1e-4, abs=1e-3)
