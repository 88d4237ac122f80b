"""The w0-wa dark-energy fluid end to end against CLASS (tests/data/generate_extra.py).

Two cosmologies, each one pipeline run (module-scoped) at the default precision:
  wcdm_massless   configs/wcdm_heavy_nu.yaml's fluid (w0 = -0.9, wa = 0.1, c_s^2 = 1, no PPF)
                  with massless neutrinos only: the fluid alone;
  wcdm_heavy_nu   the config itself (plus two 0.1 eV neutrinos).
Reference: CLASS v3.4.1 at the raised precision of generate.py, and for the massive neutrinos
without CLASS's ncdm fluid approximation (see tests/data/README.md).  Redshifts reduced to 0 and
1, k dense (20/decade) only where sigma8's window lives.  Tolerances are issue #3's.  Marked slow:
about 4 CPU-minutes for both cosmologies on the 2-core machine (JIT compilation included).
"""
import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.interpolate import CubicSpline

from boltzmann import pipeline
from boltzmann.output import read_pk_csv
from boltzmann.params import load_config
from boltzmann.spectra import power_from_transfer, sigma8

DATA = Path(__file__).parent / "data"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "wcdm_heavy_nu.yaml"
NCDM_KEYS = ("m_ncdm", "deg_ncdm", "T_ncdm", "N_ncdm")

pytestmark = pytest.mark.slow


def _config(case):
    raw = yaml.safe_load(CONFIG.read_text())
    cosmo = dict(raw["cosmology"])
    if case == "wcdm_massless":
        cosmo = {k: v for k, v in cosmo.items() if k not in NCDM_KEYS}
        cosmo["N_ur"] = 3.044
    return load_config({"name": case, "cosmology": cosmo, "output": {"z": [0.0, 1.0]}})


def _k_grid(h):
    """k [1/Mpc], 49 values over 1e-4..10 h/Mpc: 20/decade over 0.01..1 h/Mpc where sigma8's
    window lives (quadrature error on sigma8 < 1e-5, checked on the CLASS P(k)), 2.5/decade
    below, 3 values above."""
    dense = np.logspace(-2, 0, 41)
    low = np.logspace(-4, -2, 6)[:-1]
    high = np.logspace(0, 1, 4)[1:]
    return np.concatenate([low, dense, high]) * h


def _spline_ref(k_ref, values, k):
    return np.exp(CubicSpline(np.log(k_ref), np.log(values))(np.log(k)))


#: the fluid with massless neutrinos (class_wcdm_massless_*) isolates the fluid; it is left out
#: of the default run to keep CI within its time budget:
#: WCDM_CASES=wcdm_massless,wcdm_heavy_nu python -m pytest tests/test_wcdm.py runs both
_CASES = [c for c in os.environ.get("WCDM_CASES", "wcdm_heavy_nu").split(",") if c]


@pytest.fixture(scope="module", params=_CASES)
def case(request):
    name = request.param
    cfg = _config(name)
    assert cfg.cosmology.use_fld
    h = float(cfg.cosmology.h)
    cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, k_values=tuple(_k_grid(h))))
    res = pipeline.run(cfg, backend="jax")
    return name, cfg, res


def _field(res, name, z):
    """Transfer function ``name`` of the run's one cosmology at redshift z."""
    return res.transfers.fields[name][0, list(res.z).index(z)]


def _pk(res, cfg, z, which="d_m"):
    c = cfg.cosmology
    return np.asarray(power_from_transfer(res.k[0], _field(res, which, z), float(c.A_s),
                                          float(c.n_s), float(c.k_pivot)))


def test_config_matches_reference_inputs():
    """The CLASS reference was made from this very config (guards against silent drift)."""
    ref = yaml.safe_load((DATA / "class_wcdm_heavy_nu.yaml").read_text())["class_input"]
    c = load_config(CONFIG).cosmology
    assert (float(c.w0_fld), float(c.wa_fld)) == (ref["w0_fld"], ref["wa_fld"])
    assert ref["Omega_Lambda"] == 0.0 and ref["cs2_fld"] == 1.0 and ref["use_ppf"] == "no"
    assert not c.use_ppf and c.cs2_fld == 1.0     # the config's fluid is the reference's
    assert np.asarray(c.m_ncdm).tolist() == [float(m) for m in ref["m_ncdm"].split(",")]
    assert float(c.N_ur) == ref["N_ur"] and float(c.h) == ref["h"]


def test_no_failed_modes(case):
    _, _, res = case
    assert res.failures() == []


@pytest.mark.parametrize("z", [0.0, 1.0])
def test_pk_matches_class(case, z):
    name, cfg, res = case
    k_ref, cols = read_pk_csv(DATA / f"class_{name}_pk.csv")
    kh = res.k[0] / float(cfg.cosmology.h)
    low = (kh >= 1e-4) & (kh <= 1.0)
    which = [("d_m", "P_m")] + ([("d_cb", "P_cb")] if cfg.cosmology.n_ncdm else [])
    for obs, col in which:
        ratio = _pk(res, cfg, z, obs) / _spline_ref(k_ref, cols[f"{col}_z{z:g}_Mpc3"], res.k[0]) - 1.0
        assert np.abs(ratio[low]).max() <= 1e-3, \
            f"{name} {col} z={z}: max |P/P_CLASS - 1| = {np.abs(ratio[low]).max():.2e} (k <= 1 h/Mpc)"
        assert np.abs(ratio).max() <= 3e-3, \
            f"{name} {col} z={z}: max |P/P_CLASS - 1| = {np.abs(ratio).max():.2e} (k <= 10 h/Mpc)"


def test_sigma8_matches_class(case):
    name, cfg, res = case
    ref = yaml.safe_load((DATA / f"class_{name}.yaml").read_text())["derived"]
    h = float(cfg.cosmology.h)
    s8 = float(sigma8(res.k[0], _pk(res, cfg, 0.0), h))
    assert abs(s8 / ref["sigma8"] - 1.0) <= 5e-4, f"sigma8 {s8:.6f} vs CLASS {ref['sigma8']:.6f}"
    if "sigma8_cb" in ref:
        s8cb = float(sigma8(res.k[0], _pk(res, cfg, 0.0, "d_cb"), h))
        assert abs(s8cb / ref["sigma8_cb"] - 1.0) <= 5e-4, \
            f"sigma8_cb {s8cb:.6f} vs CLASS {ref['sigma8_cb']:.6f}"
