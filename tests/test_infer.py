"""Inference through a host callback (boltzmann.likelihood) and scripts/infer.py.

* the callback log-likelihood (pure_callback + custom_jvp, exact Jacobian) has the gradient of
  the direct JAX log-likelihood, eagerly, under jit and inside lax.while_loop; a value followed
  by a gradient at the same θ solves once;
* numpyro's NUTS through the callback recovers a known linear-Gaussian posterior, and
  ``infer.nuts`` (whitening, box prior, summary, figure) runs end to end on an analytic P(k);
* the Boltzmann model (``PowerSpectrumModel``, tiny precision, analytic A_s, n_s; ω_cdm through
  the joint solve in the slow test): the callback log-likelihood's gradient equals central
  differences of its values, and the analytic primordial scaling equals
  ``spectra.power_from_transfer`` of the model's own transfer function;
* the CLI's argument checks.

Cost on the 2-core dev machine: ~1 min by default (numpyro's samplers and the tiny model's value
program); ``-m slow`` adds the ω_cdm test (~1.5 min, the Jacobian program's compile).
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boltzmann.likelihood import CachedJacobian, callback_function, gaussian_loglike

REPO = Path(__file__).resolve().parents[1]


def _load_infer():
    spec = importlib.util.spec_from_file_location("infer_script", REPO / "scripts" / "infer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["infer_script"] = mod
    spec.loader.exec_module(mod)
    return mod


infer = _load_infer()

# ----------------------------------------------------------------------------- a toy model
X = jnp.linspace(0.0, 2.0, 12)


def toy(theta):
    return theta[0] * jnp.exp(-theta[1] * X) + theta[2] * X ** 2


TH0 = jnp.array([2.0, 0.7, 0.3])
SIG = 0.05 * (1.0 + X)
DATA = toy(TH0) + SIG * jnp.asarray(np.random.default_rng(1).standard_normal(X.size))


def _toy_callback():
    vj = jax.jit(lambda th: (toy(th), jax.jacfwd(toy)(th)))   # a jitted JAX call in the callback
    cached = CachedJacobian(vj, (X.size,), 3)
    return callback_function(cached), cached


def test_callback_gradient_equals_direct_gradient():
    f_cb, cached = _toy_callback()
    L_cb, L_d = gaussian_loglike(f_cb, DATA, SIG), gaussian_loglike(toy, DATA, SIG)
    th = TH0 * jnp.array([1.1, 0.9, 1.3])
    g_d = jax.grad(L_d)(th)
    assert np.max(np.abs(g_d)) > 1.0                               # a non-trivial gradient
    np.testing.assert_allclose(jax.grad(L_cb)(th), g_d, rtol=1e-12, atol=0)
    v, g = jax.jit(jax.value_and_grad(L_cb))(th)
    assert float(v) == pytest.approx(float(L_d(th)), rel=1e-13)
    np.testing.assert_allclose(g, g_d, rtol=1e-12, atol=0)
    # forward mode too (jvp of the custom rule)
    np.testing.assert_allclose(jax.jacfwd(f_cb)(th), jax.jacfwd(toy)(th), rtol=1e-12, atol=0)

    # inside a while loop (how numpyro calls it): a few gradient-descent steps, both ways
    def descend(L):
        def body(c):
            i, t = c
            return i + 1, t + 1e-4 * jax.grad(L)(t)
        return jax.jit(lambda t: jax.lax.while_loop(lambda c: c[0] < 5, body, (0, t))[1])
    np.testing.assert_allclose(descend(L_cb)(th), descend(L_d)(th), rtol=1e-12)


def test_value_then_gradient_solves_once():
    f_cb, cached = _toy_callback()
    L = gaussian_loglike(f_cb, DATA, SIG)
    th = TH0 * 1.01
    L(th)
    assert (cached.n_solves, cached.n_hits) == (1, 0)
    jax.grad(L)(th)
    assert (cached.n_solves, cached.n_hits) == (1, 1)
    jax.value_and_grad(L)(th * 1.01)
    assert cached.n_solves == 2
    with pytest.raises(ValueError, match="shape"):
        f_cb(jnp.ones(4))


def test_jitted_model_is_compiled_once():
    """The callback restores the default-device setting: the model's jitted program compiled on
    the main thread is reused from inside the callback (JAX sets the CPU device as default in
    callbacks, which is part of the jit cache key: without the fix it is traced again)."""
    traces = []

    def vj_py(th):
        traces.append(1)
        return toy(th), jax.jacfwd(toy)(th)

    vj = jax.jit(vj_py)
    vj(TH0)                                                        # compiled here
    f_cb = callback_function(CachedJacobian(vj, (X.size,), 3))
    L = gaussian_loglike(f_cb, DATA, SIG)
    jax.grad(L)(TH0 * 1.01)                                        # eager
    jax.jit(jax.value_and_grad(L))(TH0 * 1.02)                     # from a compiled program
    assert len(traces) == 1


def test_numpyro_nuts_through_callback_recovers_linear_gaussian_posterior():
    """y = A θ + noise, flat prior: posterior N((AᵀC⁻¹A)⁻¹AᵀC⁻¹y, (AᵀC⁻¹A)⁻¹) exactly."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS, init_to_value

    A = jnp.stack([jnp.ones_like(X), X, X ** 2], axis=1)
    lin = lambda th: A @ th                                        # noqa: E731
    cached = CachedJacobian(jax.jit(lambda th: (lin(th), A)), (X.size,), 3)
    f_cb = callback_function(cached)
    y = lin(TH0) + SIG * jnp.asarray(np.random.default_rng(2).standard_normal(X.size))
    Aw = np.asarray(A / SIG[:, None])
    cov = np.linalg.inv(Aw.T @ Aw)
    mean = cov @ Aw.T @ np.asarray(y / SIG)

    def model():
        th = numpyro.sample("th", dist.ImproperUniform(dist.constraints.real_vector, (), (3,)))
        numpyro.sample("y", dist.Normal(f_cb(th), SIG), obs=y)

    mcmc = MCMC(NUTS(model, init_strategy=init_to_value(values={"th": TH0}), dense_mass=True),
                num_warmup=300, num_samples=600, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    s = np.asarray(mcmc.get_samples()["th"])
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(s.mean(0) - mean) < 0.25 * sd)
    np.testing.assert_allclose(s.std(0), sd, rtol=0.2)
    assert cached.n_solves > 600                                  # really went through the host


class _AnalyticPk:
    """A PowerSpectrumModel stand-in: analytic P(k; ω_cdm, ln10^{10}A_s, n_s), exact J."""
    parameters = ("omega_cdm", "ln10^{10}A_s", "n_s")
    solve_parameters = ("omega_cdm",)
    theta0 = np.array([0.12, 3.044, 0.965])

    def __init__(self):
        self.k = np.geomspace(0.01, 0.2, 8) * 0.67
        self.z = [0.0, 1.0]
        self.out_shape = (2, 8)
        k = jnp.asarray(self.k)

        def pk(th):
            keq = 0.015 * th[0] / 0.12                               # 1/Mpc
            T2 = 1.0 / (1.0 + (k / keq) ** 2) ** 2
            shape = jnp.exp(th[1] - 3.044) * (k / 0.05) ** (th[2] - 1) * 2e7 * k * T2
            return jnp.stack([shape, 0.4 * shape * (th[0] / 0.12) ** 0.3])

        self._vj = jax.jit(lambda th: (pk(th), jax.jacfwd(pk)(th)))

    def __call__(self, theta):
        P, J = self._vj(jnp.asarray(theta))
        return np.asarray(P), np.asarray(J)


def test_infer_nuts_end_to_end_on_analytic_model(tmp_path):
    pytest.importorskip("numpyro")
    model = _AnalyticPk()
    args = infer.build_parser().parse_args(
        ["--config", "lcdm", "--nuts", "150", "--warmup", "100", "--max-tree-depth", "3",
         "--priors", "tau_reio", "--seed", "3", "--volume", "40"])
    P0, J0 = model(model.theta0)
    fis = infer.fisher(model, 0.67, args, P0, J0)
    res = infer.nuts(model, 0.67, args, tmp_path, fis, P0)
    assert res["recovered_within_2sd"]
    assert np.all(np.abs(np.array(res["deviation_in_sd"])) <= 2)
    ratio = np.array(res["sd_over_fisher_sigma"])
    assert np.all((ratio > 0.7) & (ratio < 1.4)), ratio
    # the noisy data's posterior mean is where the linear-Gaussian algebra puts it
    lin = np.array(res["linear_prediction_of_mean"])
    dev_lin = (np.array(res["mean"]) - lin) / np.array(res["sd"])
    assert np.all(np.abs(dev_lin) < 0.5), dev_lin
    assert res["divergences"]["sampling"] <= 3
    assert res["gradient_evaluations"]["sampling"] >= 150
    assert (tmp_path / "corner.png").stat().st_size > 10_000
    with np.load(tmp_path / "samples.npz") as z:
        assert z["theta"].shape == (150, 3)


class _FailingPk(_AnalyticPk):
    """The analytic model whose "solve" fails (NaN values and Jacobian, as a failed mode gives)
    above an ω_cdm threshold."""

    def __init__(self, threshold):
        super().__init__()
        self.threshold = threshold

    def __call__(self, theta):
        P, J = super().__call__(theta)
        if theta[0] > self.threshold:
            return np.full_like(P, np.nan), np.full_like(J, np.nan)
        return P, J


def test_nuts_rejects_failed_solves_and_goes_on(tmp_path):
    """A solve that fails inside the prior (NaN from the model) is a -inf log density: NUTS
    rejects those points and finishes; no sample lies where the model failed, none is NaN, and
    the failures are counted."""
    pytest.importorskip("numpyro")
    good = _AnalyticPk()
    args = infer.build_parser().parse_args(
        ["--config", "lcdm", "--nuts", "80", "--warmup", "60", "--max-tree-depth", "3",
         "--seed", "3", "--volume", "40", "--noiseless"])
    P0, J0 = good(good.theta0)
    fis = infer.fisher(good, 0.67, args, P0, J0)
    threshold = good.theta0[0] + 0.5 * fis["sigma"][0]
    res = infer.nuts(_FailingPk(threshold), 0.67, args, tmp_path, fis, P0)
    assert res["failed_solves"] > 0
    assert all(th[0] > threshold for th in res["failed_theta"])
    with np.load(tmp_path / "samples.npz") as z:
        theta = z["theta"]
    assert theta.shape == (80, 3) and np.all(np.isfinite(theta))
    assert np.all(theta[:, 0] < threshold)
    assert np.ptp(theta[:, 0]) > 0                       # the chain moved


@pytest.fixture(scope="module")
def desi_bao():
    """``--bao desi_dr2`` for the analytic model's parameters (distances through the real
    background and thermodynamics of configs/lcdm.yaml)."""
    from boltzmann.params import load_config

    args = infer.build_parser().parse_args(
        ["--config", "lcdm", "--nuts", "120", "--warmup", "80", "--max-tree-depth", "3",
         "--seed", "5", "--volume", "40", "--noiseless", "--bao", "desi_dr2"])
    return args, infer.bao_term(args, load_config("lcdm"), _AnalyticPk.parameters)


@pytest.mark.slow  # the thermodynamics' value, gradient and Jacobian programs: ~100 s on 2 cores
def test_desi_bao_fisher_and_potential(desi_bao):
    """``--bao desi_dr2``: its Fisher block Jᵀ C⁻¹ J (ω_cdm only: A_s and n_s do not move
    distances) and score enter the forecast; the ln L that NUTS adds to the potential has a
    (forward-mode) gradient equal to central differences."""
    numpyro = pytest.importorskip("numpyro")
    args, bao = desi_bao
    model = _AnalyticPk()
    P0, J0 = model(model.theta0)
    fis = infer.fisher(model, 0.67, args, P0, J0, bao=bao)
    F_bao = np.array(fis["bao"]["fisher"])
    i = model.parameters.index("omega_cdm")
    assert F_bao[i, i] > 1e4                        # DESI constrains ω_cdm (at fixed h) to < 1 %
    np.testing.assert_allclose(np.delete(F_bao[i], i), 0.0, atol=1e-12 * F_bao[i, i])
    args_no = infer.build_parser().parse_args(["--config", "lcdm", "--volume", "40"])
    F_pk = np.array(infer.fisher(model, 0.67, args_no, P0, J0)["fisher"])
    np.testing.assert_allclose(np.array(fis["fisher"]), F_pk + F_bao, rtol=1e-12)
    # DESI DR2 prefers a lower Ω_m than the Planck-like fiducial: the score points down in ω_cdm
    assert fis["bao"]["gradient_at_fiducial"][i] < 0
    th = jnp.asarray(model.theta0 * np.array([0.99, 1.0, 1.0]))
    g = float(jax.grad(bao)(th)[i])
    e = 1e-5
    fd = (float(bao(th.at[i].add(e))) - float(bao(th.at[i].add(-e)))) / (2 * e)
    assert g == pytest.approx(fd, rel=1e-5)
    assert float(bao(th)) == pytest.approx(bao.fisher_terms(th)[0], rel=1e-12)


@pytest.mark.slow  # ~200 NUTS iterations, each BAO gradient 0.25 s through the thermodynamics
def test_infer_nuts_with_desi_bao_on_analytic_model(desi_bao, tmp_path):
    """NUTS with the BAO factor: the posterior mean sits where the linear-Gaussian algebra with
    BAO's score puts it, below the fiducial ω_cdm."""
    pytest.importorskip("numpyro")
    args, bao = desi_bao
    model = _AnalyticPk()
    P0, J0 = model(model.theta0)
    fis = infer.fisher(model, 0.67, args, P0, J0, bao=bao)
    res = infer.nuts(model, 0.67, args, tmp_path, fis, P0, bao=bao)
    i = model.parameters.index("omega_cdm")
    assert np.all(np.abs(res["deviation_from_linear_prediction_in_sd"]) < 0.5), res
    assert res["mean"][i] < model.theta0[i]
    assert res["divergences"]["sampling"] <= 3


# ----------------------------------------------------------------------------- Boltzmann model
def _tiny_model(parameters):
    from boltzmann.likelihood import PowerSpectrumModel
    from boltzmann.params import load_config

    config = load_config({
        "cosmology": {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9,
                      "n_s": 0.9649, "k_pivot": 0.05, "tau_reio": 0.0544, "YHe": 0.2454,
                      "T_cmb": 2.7255, "N_ur": 3.044},
        "output": {"z": [0.0]},
        "precision": {"l_max_g": 6, "l_max_pol_g": 4, "l_max_ur": 6, "bg_n_lna": 800,
                      "rtol": 1e-8},
    })
    k = np.array([0.02, 0.06, 0.15]) * 0.6736
    return PowerSpectrumModel(config, parameters, k, n_chunks=1)


def _check_gradient_and_scaling(m, shift, steps, transfer):
    """jax.grad of the callback log-likelihood = central differences of its values; P = the
    project's power_from_transfer with the shifted A_s, n_s; the analytic J columns."""
    from boltzmann import spectra

    f_cb, cached = m.callback()
    P0, _ = m(m.theta0)
    data = P0 * np.array([1.03, 0.98, 1.01])
    L = gaussian_loglike(f_cb, data, 0.01 * P0)
    th = m.theta0 + shift
    g = np.asarray(jax.grad(L)(jnp.asarray(th)))
    fd = np.array([(float(L(th + s * e)) - float(L(th - s * e))) / (2 * s)
                   for s, e in zip(steps, np.eye(len(th)))])
    assert np.min(np.abs(fd)) > 10.0                              # every component non-trivial
    np.testing.assert_allclose(g, fd, rtol=2e-4)

    P, J = m(th)
    names = list(m.parameters)
    A_s = 1e-10 * np.exp(th[names.index("ln10^{10}A_s")])
    n_s = th[names.index("n_s")]
    ref = spectra.power_from_transfer(m.k, transfer(th), A_s, n_s, 0.05)
    np.testing.assert_allclose(P, np.asarray(ref), rtol=1e-12)
    np.testing.assert_allclose(J[..., names.index("ln10^{10}A_s")], P, rtol=1e-14)
    np.testing.assert_allclose(J[..., names.index("n_s")], P * np.log(m.k / 0.05), rtol=1e-14)


@pytest.mark.slow  # a second compiled Jacobian model (~30 s): outside the default run
def test_primordial_parameters_through_callback():
    """ln10^{10}A_s, n_s only: the value program once (~30 s compile), analytic Jacobian."""
    m = _tiny_model(("n_s", "ln10^{10}A_s"))
    assert m.solve_parameters == ()
    _check_gradient_and_scaling(
        m, np.array([0.03, -0.1]), np.array([1e-4, 1e-4]),
        lambda th: np.asarray(m.fn(m.fn.theta0)["d_m"]))


@pytest.mark.slow
def test_boltzmann_callback_gradient_equals_central_differences():
    """ω_cdm through the joint solve (+ A_s, n_s analytic): ~75 s compile on 2 cores, hence slow."""
    m = _tiny_model(("n_s", "omega_cdm", "ln10^{10}A_s"))
    assert m.solve_parameters == ("omega_cdm",)
    _check_gradient_and_scaling(
        m, np.array([0.01, 0.002, -0.02]), np.array([1e-3, 1e-4, 1e-3]),
        lambda th: np.asarray(m.fn.jacobian(np.array([th[1]]))[0]["d_m"]))


# ----------------------------------------------------------------------------- CLI checks
@pytest.mark.parametrize("argv, message", [
    (["--params", "omega_cdm,foo"], "unknown parameter 'foo'"),
    (["--params", "h,h"], "repeated"),
    (["--params", " , "], "empty"),
    (["--params", "A_s,ln10^{10}A_s"], "not both"),
    (["--nuts", "-5"], "--nuts must be ≥ 0"),
    (["--nuts", "10", "--warmup", "-1"], "--warmup must be ≥ 0"),
    (["--max-tree-depth", "0"], "--max-tree-depth must be ≥ 1"),
    (["--nk", "1"], "--nk must be ≥ 2"),
    (["--kmin", "0.3", "--kmax", "0.2"], "0 < --kmin < --kmax"),
    (["--volume", "-1"], "--volume and --nbar must be > 0"),
    (["--priors", "tau_reio,bogus"], "no prior width for 'bogus'"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        infer.main(["--config", "lcdm", "--out", str(tmp_path / "o")] + argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()                          # failed before any work


def test_cli_accepts_good_arguments():
    parser = infer.build_parser()
    args = parser.parse_args(["--config", "lcdm", "--params", "omega_cdm, h,ln10^{10}A_s",
                              "--nuts", "0", "--priors", "tau_reio,h"])
    infer.validate_args(parser, args)                              # no exit
    assert infer._names(args.params) == ("omega_cdm", "h", "ln10^{10}A_s")
