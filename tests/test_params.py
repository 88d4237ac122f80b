"""Configuration loading and validation (boltzmann.params)."""
from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from boltzmann import ncdm
from boltzmann.params import ConfigError, CosmoParams, PrecisionSpec, load_config
from boltzmann.schema import COSMOLOGY_TABLE, OUTPUT_TABLE, PRECISION_TABLE

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]
REF = yaml.safe_load((DATA / "params.yaml").read_text())

BASE = {
    "cosmology": {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9,
                  "n_s": 0.9649, "tau_reio": 0.0544, "N_ur": 2.0308, "m_ncdm": [0.06]},
    "output": {"z": [0.0, 1.0]},
}


def patched(block: str, **changes) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg.setdefault(block, {})
    for key, val in changes.items():
        if val is _DELETE:
            cfg[block].pop(key, None)
        else:
            cfg[block][key] = val
    return cfg


_DELETE = object()


# ----------------------------------------------------------------------------- loading
@pytest.mark.parametrize("source", ["lcdm", "lcdm.yaml", REPO / "configs" / "lcdm.yaml",
                                    str(REPO / "configs" / "lcdm.yaml")])
def test_lcdm_config_resolves_and_matches_reference_inputs(source):
    cfg = load_config(source)
    assert cfg.name == "lcdm"
    assert cfg.source_path == (REPO / "configs" / "lcdm.yaml").resolve()
    c = cfg.cosmology
    common = REF["class_input"]["common"]
    massive = REF["class_input"]["neutrinos"]["massive"]
    for key in ("h", "omega_b", "omega_cdm", "A_s", "n_s", "k_pivot", "tau_reio", "YHe", "T_cmb"):
        assert float(getattr(c, key)) == pytest.approx(common[key], rel=1e-15), key
    assert float(c.N_ur) == massive["N_ur"]
    assert c.n_ncdm == massive["N_ncdm"]
    assert np.asarray(c.m_ncdm).tolist() == [massive["m_ncdm"]]
    assert not c.use_fld
    assert cfg.output.z == (0.0, 1.0)
    assert (cfg.output.k_min, cfg.output.k_max) == (1e-4, 10.0)
    assert cfg.output.dir == Path("out/lcdm")


def test_derived_numbers_match_class():
    c = load_config("lcdm").cosmology
    derived = REF["derived"]["class_massive"]
    # omega_ncdm from the exact FD integral (CLASS uses slightly different G, Mpc constants)
    assert float(c.omega_ncdm[0]) == pytest.approx(derived["Omega_ncdm_h2"], rel=2e-6)
    assert float(c.Omega_Lambda) == pytest.approx(derived["Omega0_lambda"], rel=1e-7)
    assert float(c.Omega_m) == pytest.approx(derived["Omega_m"], rel=1e-6)
    assert float(c.N_eff) == pytest.approx(derived["Neff"], rel=1e-7)
    c0 = load_config("lcdm_massless").cosmology
    d0 = REF["derived"]["class_massless"]
    assert c0.n_ncdm == 0 and float(c0.omega_ncdm_tot) == 0.0
    assert float(c0.Omega_Lambda) == pytest.approx(d0["Omega0_lambda"], rel=1e-7)
    assert float(c0.N_eff) == pytest.approx(d0["Neff"], rel=1e-12)


def test_ncdm_density_is_not_the_9314_rule_but_close():
    c = load_config("lcdm").cosmology
    # the 93.14 eV rule is the non-relativistic limit; the exact value is slightly larger
    assert float(c.omega_ncdm[0]) * 93.14 / 0.06 == pytest.approx(1.0, abs=5e-3)


def test_wcdm_example_config():
    cfg = load_config("wcdm_heavy_nu")
    c = cfg.cosmology
    assert c.use_fld and c.n_ncdm == 2
    assert float(c.w0_fld) == -0.9 and float(c.wa_fld) == 0.1
    assert float(c.N_eff) == pytest.approx(3.044, abs=1e-4)
    assert float(c.Omega_Lambda) == 0.0 and 0.6 < float(c.Omega_fld) < 0.75
    assert float(c.ln10_10_A_s) == pytest.approx(3.0445, rel=1e-14)


@pytest.mark.parametrize("w0,wa,crosses", [
    (-0.9, -0.2, True),     # w = -1 at a = 0.5 (the old example config)
    (-1.1, 0.3, True),      # phantom today, quintessence early
    (-0.7, -0.9, True),     # DESI-like: crosses at a ~ 0.67
    (-0.9, 0.1, False), (-1.1, -0.1, False), (-0.9, -0.1, False),
    (-0.8, -0.2, False),    # touches -1 only as a -> 0
])
def test_fluid_crossing_minus_one_is_rejected(w0, wa, crosses):
    """Without PPF (use_ppf: false) the rest-frame fluid refuses a crossing; the PPF closure,
    the default, takes every one of these."""
    assert load_config(patched("cosmology", w0_fld=w0, wa_fld=wa)).cosmology.use_ppf
    cfg = patched("cosmology", w0_fld=w0, wa_fld=wa, use_ppf=False)
    if not crosses:
        assert load_config(cfg).cosmology.use_fld
        return
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    msg = str(info.value)
    for needle in ("cosmology.w0_fld", "cosmology.wa_fld", "crosses -1", "use_ppf: true"):
        assert needle in msg, (needle, msg)
    a_cross = 1.0 + (w0 + 1.0) / wa
    assert f"a = {a_cross:.4g}" in msg and 0.0 < a_cross < 1.0


@pytest.mark.parametrize("w0,wa,needle", [
    (-1.0, 0.3, "reaches -1 today"),          # 1 + w = 0 at a = 1: the fluid equations divide by it
    (-1.0, 0.0, "cosmological constant"),     # Λ written as a fluid
])
def test_fluid_at_minus_one_today_is_rejected(w0, wa, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(patched("cosmology", w0_fld=w0, wa_fld=wa, use_ppf=False))
    assert load_config(patched("cosmology", w0_fld=w0, wa_fld=wa)).cosmology.use_ppf


def test_dict_source_and_ln10As_equivalence():
    a = load_config(BASE).cosmology
    cfg2 = patched("cosmology", A_s=_DELETE, **{"ln10^{10}A_s": math.log(1e10 * 2.1e-9)})
    b = load_config(cfg2).cosmology
    assert float(b.A_s) == pytest.approx(float(a.A_s), rel=1e-14)
    assert load_config(BASE).name == "config"
    assert load_config({**BASE, "name": "mine"}).output.dir == Path("out/mine")


def test_yaml_reads_exponent_without_dot_as_float(tmp_path):
    text = yaml.safe_dump(BASE).replace("2.1e-09", "2.1e-9")
    text += "precision:\n  rtol: 1e-6\n  l_max_g: 20\n"
    path = tmp_path / "x.yaml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.precision.rtol == 1e-6 and cfg.precision.l_max_g == 20
    assert cfg.name == "x"


def test_defaults_and_precision_table_is_the_single_source():
    cfg = load_config(BASE)
    c = cfg.cosmology
    assert float(c.YHe) == 0.2454 and float(c.T_cmb) == 2.7255 and float(c.k_pivot) == 0.05
    assert np.asarray(c.T_ncdm).tolist() == [0.71611] and np.asarray(c.deg_ncdm).tolist() == [1.0]
    fields = {f.name: f.default for f in dataclasses.fields(PrecisionSpec)}
    assert fields == {k: v.default for k, v in PRECISION_TABLE.items()}
    assert cfg.precision == PrecisionSpec()


def test_every_parameter_is_documented():
    doc = (REPO / "docs" / "parameters.md").read_text()
    for table in (COSMOLOGY_TABLE, OUTPUT_TABLE, PRECISION_TABLE):
        for key in table:
            assert f"`{key}`" in doc, key


def test_k_grid_range_and_file(tmp_path):
    out = load_config(BASE).output
    k = out.k_grid(0.6736)
    assert k.size == 101  # 5 decades x 20 per decade + 1
    assert k[0] == pytest.approx(1e-4 * 0.6736, rel=1e-13)
    assert k[-1] == pytest.approx(10.0 * 0.6736, rel=1e-13)
    kfile = tmp_path / "k.txt"
    np.savetxt(kfile, [0.01, 0.1, 1.0])
    cfgpath = tmp_path / "c.yaml"
    cfgpath.write_text(yaml.safe_dump({**BASE, "output": {"k_file": "k.txt"}}))
    out2 = load_config(cfgpath).output
    assert out2.k_grid(0.7).tolist() == [0.01, 0.1, 1.0]  # already 1/Mpc: h not applied


# ----------------------------------------------------------------------------- errors
ERROR_CASES = [
    # (block, changes, substrings the message must contain)
    ("cosmology", {"omega_cmd": 0.1}, ["cosmology.omega_cmd", "omega_cdm"]),
    ("output", {"kmax": 3.0}, ["output.kmax", "k_max"]),
    ("precision", {"lmax_g": 3}, ["precision.lmax_g", "l_max_g"]),
    ("cosmology", {"h": _DELETE}, ["cosmology.h", "missing"]),
    ("cosmology", {"tau_reio": _DELETE}, ["cosmology.tau_reio"]),
    ("cosmology", {"A_s": _DELETE}, ["A_s", "neither"]),
    ("cosmology", {"ln10^{10}A_s": 3.0}, ["A_s", "both"]),
    ("cosmology", {"h": "0.7"}, ["cosmology.h", "'0.7'", "number"]),
    ("cosmology", {"omega_b": True}, ["cosmology.omega_b", "number"]),
    ("precision", {"l_max_g": 12.5}, ["precision.l_max_g", "integer"]),
    ("cosmology", {"m_ncdm": "0.06"}, ["cosmology.m_ncdm"]),
    ("cosmology", {"deg_ncdm": [1.0, 1.0]}, ["cosmology.deg_ncdm", "cosmology.m_ncdm"]),
    ("cosmology", {"T_ncdm": [0.7, 0.7]}, ["cosmology.T_ncdm"]),
    ("cosmology", {"N_ncdm": 2}, ["cosmology.N_ncdm", "m_ncdm"]),
    ("cosmology", {"m_ncdm": [-0.06]}, ["cosmology.m_ncdm", "-0.06", "[0, 100]"]),
    ("cosmology", {"omega_cdm": -0.1}, ["cosmology.omega_cdm", "-0.1"]),
    ("cosmology", {"h": 1.7}, ["cosmology.h", "1.7", "(0.2, 1.5)"]),
    ("cosmology", {"h": 0.1}, ["cosmology.h", "0.1"]),
    ("cosmology", {"tau_reio": -0.01}, ["cosmology.tau_reio", "[0, 0.5]"]),
    ("cosmology", {"tau_reio": 0.7}, ["cosmology.tau_reio"]),
    ("cosmology", {"YHe": 0.6}, ["cosmology.YHe", "(0, 0.5)"]),
    ("cosmology", {"T_cmb": 0.0}, ["cosmology.T_cmb"]),
    ("cosmology", {"N_ur": -1.0}, ["cosmology.N_ur"]),
    ("cosmology", {"h": 0.3}, ["Omega_Lambda", "< 0"]),
    ("cosmology", {"w0_fld": -0.2, "wa_fld": 0.5}, ["w0_fld + cosmology.wa_fld", "<= 0"]),
    ("cosmology", {"use_ppf": True}, ["cosmology.use_ppf", "w0_fld"]),
    ("cosmology", {"cs2_fld": 0.5}, ["cosmology.cs2_fld", "w0_fld"]),
    ("cosmology", {"w0_fld": -0.9, "cs2_fld": 1.5}, ["cosmology.cs2_fld", "[0, 1]"]),
    ("cosmology", {"w0_fld": -0.9, "use_ppf": "yes"}, ["cosmology.use_ppf", "true or false"]),
    ("cosmology", {"n_s": float("nan")}, ["cosmology.n_s", "finite"]),
    ("output", {"z": [0.0, -1.0]}, ["output.z", "-1.0"]),
    ("output", {"k_min": 1.0, "k_max": 0.5}, ["output.k_min", "output.k_max"]),
    ("output", {"k_file": "k.txt", "k_min": 0.01}, ["output.k_file", "output.k_min"]),
    ("output", {"k_file": "/nonexistent/k.txt"}, ["output.k_file"]),
    ("precision", {"rtol": 0.5}, ["precision.rtol", "0.5"]),
]


@pytest.mark.parametrize("block,changes,needles", ERROR_CASES,
                         ids=[f"{b}-{'-'.join(c)}" for b, c, _ in ERROR_CASES])
def test_bad_input_raises_clear_config_error(block, changes, needles):
    with pytest.raises(ConfigError) as info:
        load_config(patched(block, **changes))
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert isinstance(info.value, ValueError)


def test_structural_errors():
    with pytest.raises(ConfigError, match="cosmology"):
        load_config({"output": {}})
    with pytest.raises(ConfigError, match="did you mean precision"):
        load_config({**BASE, "precison": {}})
    with pytest.raises(ConfigError, match="mapping"):
        load_config({**BASE, "output": [1, 2]})
    with pytest.raises(ConfigError, match="not found"):
        load_config("no_such_config_anywhere")
    with pytest.raises(ConfigError, match="path or a dict"):
        load_config(42)


# ----------------------------------------------------------------------------- pytree / AD
def test_cosmoparams_is_a_pytree_with_float_leaves():
    c = load_config("wcdm_heavy_nu").cosmology
    leaves, treedef = jax.tree_util.tree_flatten(c)
    assert len(leaves) == 15
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.use_fld and back.n_ncdm == 2
    doubled = jax.tree_util.tree_map(lambda x: 2 * jnp.asarray(x), c)
    assert float(doubled.h) == pytest.approx(2 * 0.6736)
    # different static structure -> different treedef
    assert jax.tree_util.tree_structure(load_config("lcdm").cosmology) != treedef


def test_grad_of_derived_quantities_matches_finite_differences():
    c = load_config("lcdm").cosmology
    g = jax.grad(lambda p: p.omega_ncdm_tot)(c)
    eps = 1e-6
    up = dataclasses.replace(c, m_ncdm=np.asarray(c.m_ncdm) + eps)
    dn = dataclasses.replace(c, m_ncdm=np.asarray(c.m_ncdm) - eps)
    fd = (float(up.omega_ncdm_tot) - float(dn.omega_ncdm_tot)) / (2 * eps)
    assert float(g.m_ncdm[0]) == pytest.approx(fd, rel=1e-7)
    assert float(g.m_ncdm[0]) == pytest.approx(1 / 93.14, rel=1e-2)
    gl = jax.grad(lambda p: p.Omega_Lambda)(c)
    assert float(gl.omega_cdm) == pytest.approx(-1 / 0.6736**2, rel=1e-12)
    assert float(gl.T_cmb) < 0  # more radiation, less Lambda


def test_make_without_validation_and_resolved_dict():
    c = CosmoParams.make(h=0.7, omega_b=0.022, omega_cdm=0.12, n_s=0.96, tau_reio=0.05,
                         ln10_10_A_s=3.0)
    r = c.resolved()
    assert r["N_ncdm"] == 0 and r["m_ncdm"] == []
    assert r["A_s"] == pytest.approx(1e-10 * math.exp(3.0))
    assert r["H0_1/Mpc"] == pytest.approx(70e3 / 299792458.0, rel=1e-14)
    assert all(isinstance(v, (float, int, bool, list)) for v in r.values())
    assert float(c.omega_ur) == pytest.approx(3.044 * 7 / 8 * (4 / 11) ** (4 / 3)
                                              * float(c.omega_g), rel=1e-14)
    assert ncdm.omega_ncdm(0.0, 1.0, 1.0) > 0
