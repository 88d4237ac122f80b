"""The Cobaya theory (boltzmann.cobaya): a Cobaya model's products equal the pipeline's numbers,
a cosmology the code cannot compute is a rejected point (-inf, no exception), unsupported
requests are refused at set-up, and the Cobaya-free conversions (boltzmann.cobaya_products).

One test-sized set-up (massless neutrinos, short hierarchies, k to 0.5/Mpc at 4 per decade): a
Gaussian likelihood on σ8(z), H(z), D_A, f σ8, r_d and P(k) is evaluated at two points through
``cobaya.model.get_model``, and every number it read is compared with ``boltzmann.compute`` on
the same CLASS parameters (the config the classy facade would build). Same pipeline, same
compiled programs: the numbers agree to rounding (1e-10 asked).
"""
import subprocess
import sys

import numpy as np
import pytest

import boltzmann
from boltzmann import derived
from boltzmann.class_input import to_config
from boltzmann.cmb import ClSpectra
from boltzmann.cobaya_products import ClRequest, cl_dict, derived_value, pk_redshifts

COSMOLOGY = {"omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9, "n_s": 0.9649,
             "tau_reio": 0.0544}
EXTRA = {"YHe": 0.2454, "N_ur": 3.044, "l_max_g": 6, "l_max_pol_g": 4, "l_max_ur": 6,
         "tol_perturbations_integration": 1e-4, "bg_n_lna": 600, "k_per_decade_for_pk": 4}
Z_S8, Z_H, Z_PK, K_MAX = [0.0, 0.5], [0.5, 1.0], [0.0, 0.5], 0.5
#: the likelihood's data: (mean, σ) of each number it reads
DATA = {"s8": ([0.80, 0.62], 0.02), "H": ([2.9e-4, 4.0e-4], 1e-5), "D_A": ([1300.0], 20.0),
        "fs8": ([0.47], 0.03), "rd": ([147.0], 1.0), "pk": ([6500.0], 300.0)}
K_PROBE_INDEX = 5                        # P(k) is read at this node of the k grid, at z = 0.5


def _chi2(seen):
    return sum(np.sum(((np.asarray(seen[n]) - np.asarray(m)) / s) ** 2)
               for n, (m, s) in DATA.items())


@pytest.fixture(scope="module")
def cobaya():
    return pytest.importorskip("cobaya")


def _model(cobaya, likelihood_requirements=None, prior_h=(0.3, 1.9), extra=EXTRA):
    from cobaya.likelihood import Likelihood
    from cobaya.model import get_model

    from boltzmann.cobaya import BoltzmannTheory

    class Probe(Likelihood):
        """Reads what a BAO + RSD + P(k) likelihood reads and keeps it for the test."""

        def get_requirements(self):
            return likelihood_requirements or {
                "sigma8_z": {"z": Z_S8}, "Hubble": {"z": Z_H},
                "angular_diameter_distance": {"z": [0.5]}, "fsigma8": {"z": [0.5]},
                "rdrag": None,
                "Pk_interpolator": {"z": Z_PK, "k_max": K_MAX, "nonlinear": False,
                                    "vars_pairs": [["delta_tot", "delta_tot"]]},
                "Pk_grid": {"z": Z_PK, "k_max": K_MAX, "nonlinear": False,
                            "vars_pairs": [["delta_tot", "delta_tot"],
                                           ["delta_nonu", "delta_nonu"]]}}

        def logp(self, **params):
            p = self.provider
            k, z, pk = p.get_Pk_grid(("delta_tot", "delta_tot"), nonlinear=False)
            interp = p.get_Pk_interpolator(("delta_tot", "delta_tot"), nonlinear=False)
            self.seen = {"s8": p.get_sigma8_z(Z_S8), "H": p.get_Hubble(Z_H, units="1/Mpc"),
                         "D_A": p.get_angular_diameter_distance([0.5]),
                         "fs8": p.get_fsigma8([0.5]), "rd": [p.get_param("rdrag")],
                         "pk": [interp.P(0.5, k[K_PROBE_INDEX])]}
            self.grid = {"k": k, "z": z, "pk": pk,
                         "pk_cb": p.get_Pk_grid(("delta_nonu", "delta_nonu"), nonlinear=False),
                         "H_kms": p.get_Hubble(Z_H)}
            return -0.5 * _chi2(self.seen)

    info = {"params": {"h": {"prior": {"min": prior_h[0], "max": prior_h[1]}}, **COSMOLOGY,
                       "sigma8": {"derived": True}, "theta_s_100": {"derived": True},
                       "rs_drag": {"derived": True}},
            "likelihood": {"probe": {"external": Probe}},
            "theory": {"boltzmann": {"external": BoltzmannTheory, "backend": "jax",
                                     "extra_args": extra}}}
    return get_model(info)


@pytest.fixture(scope="module")
def model(cobaya):
    return _model(cobaya)


def _reference(h):
    """The pipeline on the same CLASS parameters: output mPk to 0.5/Mpc at the requested z."""
    pars = {**COSMOLOGY, **EXTRA, "h": h, "output": "mPk", "P_k_max_1/Mpc": K_MAX,
            "z_pk": ",".join(str(z) for z in sorted(set(Z_S8 + Z_PK)))}
    config = boltzmann.load_config(to_config(pars)[0])
    return config, boltzmann.compute(config, backend="jax")


@pytest.mark.parametrize("h", [0.6736, pytest.param(0.70, marks=pytest.mark.slow)])
def test_products_equal_the_pipeline(model, h):
    point = model.logposterior({"h": h})
    assert np.isfinite(point.logpost)
    probe = model.likelihood["probe"]
    config, result = _reference(h)
    zs = [float(z) for z in result.z]
    s8 = np.array([result.spectra.sigma8[0, zs.index(z)] for z in Z_S8])
    table = derived.background_table(config.cosmology, [0.5], sigma8=s8[1:])
    values = derived.result_values(result)
    iz = zs.index(0.5)
    want = {"s8": s8, "H": derived.background_table(config.cosmology, Z_H)["H_1/Mpc"],
            "D_A": table["D_A_Mpc"], "fs8": table["fsigma8"], "rd": [values["rs_d"]],
            "pk": [result.spectra.pk_m[0, iz, K_PROBE_INDEX]]}
    for name, value in want.items():
        np.testing.assert_allclose(probe.seen[name], value, rtol=1e-10, err_msg=name)
    # the grids: k [1/Mpc] and z ascending, P[z, k] in Mpc^3, P_cb from delta_nonu
    order = np.argsort(zs)
    np.testing.assert_allclose(probe.grid["k"], result.k[0], rtol=1e-14)
    np.testing.assert_allclose(probe.grid["z"], np.asarray(zs)[order], rtol=1e-14)
    np.testing.assert_allclose(probe.grid["pk"], result.spectra.pk_m[0][order], rtol=1e-10)
    np.testing.assert_allclose(probe.grid["pk_cb"][2], result.spectra.pk_cb[0][order],
                               rtol=1e-10)
    np.testing.assert_allclose(probe.grid["H_kms"], want["H"] * 299792.458, rtol=1e-12)
    # the derived parameters and the log-likelihood itself
    assert point.derived == pytest.approx([values["sigma8"], values["100*theta_s"],
                                           values["rs_d"]], rel=1e-10)
    assert point.loglikes[0] == pytest.approx(-0.5 * _chi2(want), rel=1e-10)


def test_a_failing_cosmology_is_a_rejected_point(model, monkeypatch):
    """h outside the code's range, a failed mode, a NaN: -inf and a logged reason, no
    exception; with stop_at_error the error is raised."""
    theory = model.theory["boltzmann"]
    before = theory.n_failures
    point = model.logposterior({"h": 1.6})
    assert point.logpost == -np.inf
    assert "cosmology.h = 1.6 is out of range" in theory.last_failure

    real = boltzmann.compute

    def failed_mode(config, **kw):
        result = real(config, **kw)
        result.failures = lambda: [(0, 0.123, "solver status 3 (too many steps)")]
        return result

    monkeypatch.setattr(boltzmann, "compute", failed_mode)
    assert model.logposterior({"h": 0.69}).logpost == -np.inf
    assert "k = 0.123 1/Mpc" in theory.last_failure

    def nan_power(config, **kw):
        result = real(config, **kw)
        result.spectra.pk_m[0, 0, 3] = np.nan
        return result

    monkeypatch.setattr(boltzmann, "compute", nan_power)
    assert model.logposterior({"h": 0.691}).logpost == -np.inf
    assert "non-finite" in theory.last_failure
    assert theory.n_failures == before + 3
    monkeypatch.undo()
    from cobaya.log import LoggedError

    theory.stop_at_error = True
    try:
        with pytest.raises(LoggedError):
            model.logposterior({"h": 1.7})
    finally:
        theory.stop_at_error = False


def _rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS"))


@pytest.mark.slow  # 50 points (~20 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_memory_stays_flat_over_a_chain_of_points(model):
    """50 points with a P(k) solve each (h changing every time): the resident memory after
    the first 10 grows by less than 20 MB (before σ8's fine grid took sizes from a ladder, every
    new h compiled a new σ8 program and kept it: 2 MB a point)."""
    rng = np.random.default_rng(1)
    points = rng.uniform(0.62, 0.76, 50)
    for h in points[:10]:
        model.logposterior({"h": float(h)})
    start = _rss_mb()
    for h in points[10:]:
        assert np.isfinite(model.logposterior({"h": float(h)}).logpost)
    assert _rss_mb() - start < 20.0


@pytest.mark.slow  # tests/test_cobaya_bao.py runs the default suite's BAO-only chain
def test_bao_only_mcmc_solves_no_perturbations(cobaya, monkeypatch):
    """A BAO likelihood (D_M/r_d, D_H/r_d) sampled by Cobaya's MCMC, the theory named as in a
    YAML input: only the background and thermodynamics run (a perturbation solve would raise
    here), and r_d of the chain is ``derived_from_thermodynamics``'s at each sample."""
    from cobaya.likelihood import Likelihood

    from boltzmann import modes

    z = np.array([0.51, 0.71])

    class BAO(Likelihood):
        def get_requirements(self):
            return {"rdrag": None, "Hubble": {"z": z}, "angular_diameter_distance": {"z": z}}

        def logp(self, **params):
            p = self.provider
            rd = p.get_param("rdrag")
            dm = (1 + z) * p.get_angular_diameter_distance(z) / rd
            dh = 1.0 / p.get_Hubble(z, units="1/Mpc") / rd
            return -0.5 * np.sum(((dm - [13.6, 17.4]) / 0.2) ** 2
                                 + ((dh - [21.0, 20.0]) / 0.4) ** 2)

    def no_solve(*args, **kwargs):
        raise AssertionError("a BAO likelihood must not start a perturbation solve")

    monkeypatch.setattr(boltzmann, "compute", no_solve)
    info = {"params": {"h": {"prior": {"min": 0.6, "max": 0.8}, "ref": 0.68, "proposal": 0.01},
                       "omega_cdm": {"prior": {"min": 0.08, "max": 0.16}, "ref": 0.12,
                                     "proposal": 0.005},
                       **{k: v for k, v in COSMOLOGY.items() if k != "omega_cdm"},
                       "rs_drag": {"derived": True}},
            "likelihood": {"bao": BAO},
            "theory": {"boltzmann.cobaya.BoltzmannTheory": {"extra_args": {"bg_n_lna": 600}}},
            "sampler": {"mcmc": {"max_samples": 6, "burn_in": 0, "learn_proposal": False,
                                 "seed": 3}}}
    _, sampler = cobaya.run(info, stop_at_error=True)
    chain = sampler.products()["sample"]
    assert len(chain) == 6
    row = {name: float(np.asarray(chain[name])[-1]) for name in ("h", "omega_cdm", "rs_drag")}
    config = boltzmann.load_config(to_config({**COSMOLOGY, "bg_n_lna": 600, "h": row["h"],
                                              "omega_cdm": row["omega_cdm"]})[0])
    grid = modes.make_grid(config.precision)
    ref = derived.derived_from_thermodynamics(config.cosmology, grid)
    assert row["rs_drag"] == pytest.approx(float(ref["rs_d"]), rel=1e-10)


def test_unsupported_requests_are_refused_at_set_up(cobaya):
    from cobaya.log import LoggedError

    with pytest.raises(LoggedError, match="linear P"):
        _model(cobaya, {"Pk_interpolator": {"z": [0.0, 1.0], "k_max": 1.0}})
    with pytest.raises(LoggedError, match="not provided by boltzmann"):
        _model(cobaya, {"Omega_b": {"z": [0.5]}})
    with pytest.raises(LoggedError, match="not computed by boltzmann"):
        _model(cobaya, {"Cl": {"tp": 100}})
    with pytest.raises(LoggedError, match="non_linear"):
        _model(cobaya, extra={**EXTRA, "non_linear": "halofit"})
    with pytest.raises(LoggedError, match="did you mean 'omega_cdm'"):
        _model(cobaya, extra={**EXTRA, "omega_cbm": 0.12})


def test_package_imports_without_cobaya():
    """``import boltzmann`` does not import Cobaya, and the theory module says how to get it."""
    code = ("import sys; sys.modules['cobaya'] = None\n"
            "import boltzmann\n"
            "assert 'boltzmann.cobaya' not in sys.modules\n"
            "try:\n    import boltzmann.cobaya\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "pip install" in out.stdout and "cobaya" in out.stdout


# ---------------------------------------------------------------- Cobaya-free conversions
def test_cl_request_and_dictionary():
    """The CMB stage is asked for what the lensing needs; the dictionary is CLASS's layout
    (index ℓ from 0, T and E spectra dimensionless, pp as is)."""
    req = ClRequest()
    req.add({"TT": 40, "te": 60}, lensed=True)
    req.add({"ee": 50, "pp": 80}, lensed=False)
    assert req.output_block() == {"cl": ["TT", "EE", "TE", "PP"], "l_max": 80, "lensing": True}
    assert req.names(False) == ["ee", "pp"]
    with pytest.raises(ValueError, match="tp"):
        req.add({"tp": 100}, lensed=True)
    ell = np.arange(2, 81)
    T = 2.7255
    unlensed = {"TT": 1e3 / ell**2, "EE": 1.0 / ell, "TE": -2.0 / ell, "PP": 1e-9 / ell**4}
    lensed = {"TT": 1.1e3 / ell**2, "EE": 1.1 / ell, "TE": -2.1 / ell, "BB": 1e-3 / ell}
    cl = ClSpectra(ell=ell, cl=unlensed, lensed=lensed, T_cmb=T)
    out = cl_dict(cl, req.names(True), lensed=True)
    assert out["ell"].tolist() == list(range(81)) and out["tt"][:2].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(out["tt"][2:] * (T * 1e6) ** 2, lensed["TT"], rtol=1e-14)
    np.testing.assert_allclose(out["bb"][2:] * (T * 1e6) ** 2, lensed["BB"], rtol=1e-14)
    np.testing.assert_array_equal(out["pp"][2:], unlensed["PP"])
    raw = cl_dict(cl, ["ee", "pp"], lensed=False)
    np.testing.assert_allclose(raw["ee"][2:] * (T * 1e6) ** 2, unlensed["EE"], rtol=1e-14)


def test_derived_aliases_and_redshift_nodes():
    values = {"rs_d": 147.1, "omega_b": 0.0224, "h": 0.7}
    assert derived_value("rs_drag", values) == 147.1 == derived_value("rdrag", values)
    assert derived_value("Omega_b", values) == pytest.approx(0.0224 / 0.49)
    assert derived_value("sigma8", values) is None
    assert pk_redshifts([0.0], True) == [0.0, 0.15]
    assert pk_redshifts([0.5, 1.0], True) == [0.0, 0.5, 1.0]
    # the grid class_input builds on these nodes has the 4 Cobaya's interpolator needs
    assert len(to_config({"z_pk": "0,0.15"})[0]["output"]["z"]) >= 4
