"""Exact C_ℓ derivatives (boltzmann.cmb.gradients.ClFunction) against central finite differences
of the same function: the grids are held fixed (the fiducial cosmology's), so the differences
see only the cosmology. The issue's bar: each parameter's derivatives within 1e-3 of its largest
|∂ln D_ℓ/∂θ| (over ℓ and spectra; TE as ∂D_ℓ/∂θ relative to √(TT·EE)).

``-m slow`` (compiling the joint solve alone takes minutes on the 2-core CPU): first,
configs/planck_cl.yaml's cosmology with configs/lcdm_reduced.yaml's short hierarchies,
unlensed TT, EE, TE, PP to ℓ = 60 on a coarsened sampling with every mode in one solver group
(compiling the joint solve is most of the test's time), three parameters that enter through
different stages (h: distances and the Bessel arguments; omega_cdm: the perturbations; tau_reio:
reionisation in the thermodynamics) and the two primordial ones, which skip the solve; second, the lensed spectra to ℓ = 300 (docs/cmb.md,
Gradients). The default suite checks the refusals of bad requests.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from boltzmann.cmb.gradients import LOG_SPECTRA, ClFunction
from boltzmann.cmb.sampling import ClSampling
from boltzmann.params import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _config(name, **output):
    c = load_config(CONFIGS / name)
    return dataclasses.replace(c, output=dataclasses.replace(c.output, **output))


def _fd_errors(f, values, jac, rel_step=1e-3):
    """{parameter: max over spectra and ℓ of |exact − FD| / the parameter's largest |exact|},
    on ln C_ℓ (TE: C_ℓ/√(TT·EE))."""
    theta0 = np.asarray(f.theta0)
    values = {k: np.asarray(v) for k, v in values.items()}
    norm = {k: (np.abs(v) if k in LOG_SPECTRA or k == "PP" else
                np.sqrt(values["lensed_TT" if k.startswith("lensed") else "TT"]
                        * values["lensed_EE" if k.startswith("lensed") else "EE"]))
            for k, v in values.items()}
    out = {}
    for i, name in enumerate(f.parameters):
        h = rel_step * max(abs(theta0[i]), 1e-2)
        tp, tm = theta0.copy(), theta0.copy()
        tp[i] += h
        tm[i] -= h
        vp, vm = f(tp), f(tm)
        exact, fd = [], []
        for k in values:
            exact.append(np.asarray(jac[k])[:, i] / norm[k])
            fd.append((np.asarray(vp[k]) - np.asarray(vm[k])) / (2 * h) / norm[k])
        exact, fd = np.concatenate(exact), np.concatenate(fd)
        out[name] = float(np.max(np.abs(exact - fd)) / np.max(np.abs(exact)))
    return out


def test_bad_requests_are_refused_before_any_work():
    config = _config("planck_cl.yaml", cl=("TT", "EE", "TE", "PP"), l_max=60, lensing=False)
    with pytest.raises(ValueError, match="l_max = 10: supported range"):
        ClFunction(config, l_max=10)
    with pytest.raises(ValueError, match="add PP to output.cl"):
        ClFunction(config, spectra=("TT", "EE"), lensing=True)
    with pytest.raises(Exception, match="no massive neutrino species"):
        ClFunction(config, parameters=("h", "m_ncdm"))
    with pytest.raises(Exception, match="unknown parameter 'omega_x'"):
        ClFunction(config, parameters=("omega_x",))
    with pytest.raises(ValueError, match="lensing method must be one of"):
        ClFunction(config, lensing_method="fft")
    with pytest.raises(ValueError, match="direction_block = 0: give the number"):
        ClFunction(config, direction_block=0)


@pytest.mark.slow
def test_cl_jacobian_matches_finite_differences():
    """~5.5 min on the 2-core CPU, most of it compiling (docs/benchmarks.md, CMB spectra): too
    long for the default suite's 20-minute budget, so under ``-m slow``."""
    config = dataclasses.replace(
        _config("planck_cl.yaml", cl=("TT", "EE", "TE", "PP"), l_max=60, lensing=False),
        precision=load_config(CONFIGS / "lcdm_reduced.yaml").precision)
    # every mode in one solver group (photons controlled): one joint-solve program to compile
    sampling = dataclasses.replace(ClSampling().coarser(2.0), k_photon_control=10.0)
    # A_s and n_s: no direction in the joint solve (ParameterMap.solve_directions), their
    # columns from the transfer functions on
    f = ClFunction(config, parameters=("h", "omega_cdm", "tau_reio", "ln10^{10}A_s", "n_s"),
                   sampling=sampling)
    assert len({controlled for _, _, controlled in f._chunks}) == 1
    assert f._map.solve_directions.tolist() == [0, 1, 2]
    assert f.direction_block == 2       # on a CPU: two directions per line-of-sight pass
    values, jac = f.jacobian()
    plain = f()
    for k in values:       # the joint solve's values against the plain solve's
        assert np.allclose(np.asarray(values[k]), np.asarray(plain[k]), rtol=1e-4,
                           atol=1e-6 * np.max(np.abs(np.asarray(plain[k])))), k
        assert np.asarray(jac[k]).shape == (59, 5)
        # unlensed C_ℓ ∝ A_s: ∂C_ℓ/∂ln(10^10 A_s) = C_ℓ
        np.testing.assert_allclose(np.asarray(jac[k])[:, 3], np.asarray(values[k]), rtol=1e-12)
    errors = _fd_errors(f, plain, jac)
    assert max(errors.values()) < 1e-3, errors


@pytest.mark.slow
def test_lensed_cl_jacobian_matches_finite_differences():
    """The lensed spectra (the lensing scan's jvp on top of the rest), configs/planck_cl.yaml to
    ℓ = 300 (unlensed and sources to 1300), three parameters; ~15 min on the 2-core CPU."""
    config = _config("planck_cl.yaml", cl=("TT", "EE", "TE", "PP"), l_max=300, lensing=True)
    f = ClFunction(config, parameters=("h", "omega_cdm", "ln10^{10}A_s"),
                   sampling=ClSampling().coarser(2.0))
    values, jac = f.jacobian()
    assert {"lensed_TT", "lensed_EE", "lensed_TE", "lensed_BB"} <= set(values)
    errors = _fd_errors(f, f(), jac)
    assert max(errors.values()) < 1e-3, errors
