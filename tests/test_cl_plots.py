"""cl.png and ``--compare`` for the CMB spectra (boltzmann.plots.plot_cl, boltzmann.cli_compare,
boltzmann.class_reference), on synthetic spectra: fast. The end-to-end run (the CLI on a real
C_ℓ run, CLASS through classy for the ratio row) is in tests/test_classy_facade.py.
"""
import io
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from boltzmann import class_input, class_reference, cli, cli_compare, plots
from boltzmann.cmb import ClSpectra
from boltzmann.params import load_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def _spectra(scale=1.0, lensed=True):
    """Smooth, positive, acoustic-looking spectra (TE changes sign) in μK²."""
    ell = np.arange(2, 401)
    f = ell * (ell + 1.0) / (2 * math.pi)
    shape = 1.0 + 0.3 * np.cos(ell / 40.0)
    cl = {"TT": scale * 3e3 * shape / f, "EE": scale * 20 * shape / f,
          "TE": scale * 60 * np.sin(ell / 40.0) / f,
          "PP": scale * 1e-7 * shape / f / (ell * (ell + 1.0))}
    out = {n: v * (1 + 1e-3 * np.cos(ell / 20.0)) for n, v in cl.items() if n != "PP"}
    out["BB"] = scale * 0.05 * ell / 400 / f
    return ClSpectra(ell=ell, cl=cl, lensed=out if lensed else None)


def test_plot_cl_panels_and_ratio_row(tmp_path):
    fig = plots.plot_cl(tmp_path / "cl.png", _spectra(), title="test")
    assert (tmp_path / "cl.png").stat().st_size > 10_000 and len(fig.axes) == 5
    assert [ax.get_title() for ax in fig.axes][3].startswith(r"$D_\ell^{BB}")
    # lensed curves drawn with the unlensed beside (PP: one curve, it is not lensed)
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2, 2, 1, 1]
    fig = plots.plot_cl(tmp_path / "cl_ratio.png", _spectra(1.002), reference=_spectra(),
                        reference_label="CLASS 3.4.1")
    assert len(fig.axes) == 10
    tt = fig.axes[5].get_lines()[0].get_ydata() * plots.RATIO_UNIT
    np.testing.assert_allclose(tt, 2e-3, rtol=1e-9)
    te = fig.axes[7].get_lines()[0]
    # TE against √(TT·EE) of the reference, not TE itself (it crosses zero)
    ref = _spectra().d_ell(lensed=True)
    expected = 2e-3 * ref["TE"] / np.sqrt(ref["TT"] * ref["EE"])
    np.testing.assert_allclose(te.get_ydata() * plots.RATIO_UNIT, expected, rtol=1e-9,
                               atol=1e-15)
    fig = plots.plot_cl(tmp_path / "cl_unlensed.png", _spectra(lensed=False), note="no CLASS")
    assert len(fig.axes) == 4 and fig.texts[-1].get_text() == "no CLASS"      # TT EE TE PP


def test_cl_ratio_uses_the_shared_multipoles():
    ours = {"TT": np.full(9, 2.0)}
    ref = {"TT": np.full(4, 1.0)}
    ell, ratio = plots.cl_ratio(ours, ref, "TT", np.arange(2, 11), np.array([2, 5, 10, 20]))
    np.testing.assert_array_equal(ell, [2, 5, 10]) and np.testing.assert_allclose(ratio, 1.0)


def _plot(tmp_path, compare, run_class=None, monkeypatch=None):
    if run_class is not None:
        monkeypatch.setattr(class_reference, "run_class", run_class)
    k = np.logspace(-3, 0, 40)
    pk = {0.0: 1e4 * (k / 0.02) / (1 + (k / 0.02) ** 2.5)}
    err = io.StringIO()
    result = SimpleNamespace(cl=_spectra())
    written = cli_compare.plot_results(SimpleNamespace(), result, tmp_path, k, pk, pk, [0.0],
                                       compare, "test", ["c"], err)
    return written, err.getvalue()


def test_compare_without_classy_writes_the_plots_with_a_note(tmp_path, monkeypatch):
    def missing(*args, **kwargs):
        raise class_reference.ClassUnavailable("classy is not installed: pip install classy")

    written, err = _plot(tmp_path, str(DATA / "class_lcdm_pk.csv"), missing, monkeypatch)
    assert [p.name for p in written] == ["pk.png", "cl.png"] and all(p.is_file() for p in written)
    assert "note: no CLASS comparison: classy is not installed" in err


def test_compare_with_class_writes_its_tables(tmp_path, monkeypatch):
    """CLASS's numbers (here a stand-in for classy's) are written in our layouts and plotted."""
    def fake(config, k=None, zs=None):
        pk = {z: np.full(len(k), 1e4) for z in zs}
        return class_reference.ClassReference(parameters={"h": 0.7}, version="v-test",
                                              pk_m=pk, pk_cb=pk, cl=_spectra(0.999))

    written, err = _plot(tmp_path, cli_compare.COMPARE_CLASS, fake, monkeypatch)
    assert err == ""
    assert [p.name for p in written] == ["class_pk.csv", "class_cl.csv", "class_cl_lensed.csv",
                                         "pk.png", "cl.png"]
    text = (tmp_path / "class_cl.csv").read_text()
    assert "CLASS v-test" in text and "# ell,TT,EE,TE,BB,PP" in text
    assert cli.COMPARE_CLASS == cli_compare.COMPARE_CLASS


def test_bare_compare_without_classy_stops_before_the_run(monkeypatch, tmp_path):
    monkeypatch.setattr(class_reference, "available", lambda: False)

    def run(*args, **kwargs):
        raise AssertionError("the run must not start")

    err = io.StringIO()
    code = cli.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--out",
                     str(tmp_path), "--compare"], run=run, stderr=err)
    assert code == 2 and "classy" in err.getvalue() and "pip install" in err.getvalue()


@pytest.mark.parametrize("name", ["planck_cl", "wcdm_heavy_nu"])
def test_class_parameters_translate_back_to_the_config(name):
    """class_parameters is the inverse of the facade's translation: the same cosmology,
    redshifts and C_ℓ request come back."""
    config = load_config(REPO / "configs" / f"{name}.yaml")
    pars = class_reference.class_parameters(config)
    again = load_config(class_input.to_config(pars)[0])
    assert again.cosmology.resolved() == pytest.approx(config.cosmology.resolved(), rel=1e-12)
    assert again.cosmology.use_fld == config.cosmology.use_fld
    assert (again.output.cl, again.output.l_max, again.output.lensing) == \
        (config.output.cl, config.output.l_max, config.output.lensing)
    assert set(config.output.z) <= set(again.output.z)
    assert pars["recombination"] == "RECFAST"
