"""docs/tutorial.py runs, in its test-sized form (``--quick``), and draws its four figures."""
import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _tutorial():
    spec = importlib.util.spec_from_file_location("tutorial", REPO / "docs" / "tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tutorial_runs_quick(tmp_path):
    tutorial = _tutorial()
    out = tutorial.main(["--quick", "--figures", str(tmp_path)])
    names = {p.name for p in out["figures"]}
    assert names == {"tutorial_pk.png", "tutorial_compare.png", "tutorial_dlnpk.png",
                     "tutorial_fisher.png"}
    assert all(p.stat().st_size > 10_000 for p in out["figures"])
    assert out["result"].failures() == [] and out["other"].failures() == []
    # the quick Jacobian is in ln10^10 A_s and n_s: exactly 1 and ln(k / k_pivot) in ln P
    config = out["result"]
    k = tutorial.settings(True)["jacobian_k"]
    h = float(config.cosmologies[0].h)
    k = np.logspace(np.log10(k[0]), np.log10(k[1]), k[2]) * h
    p = np.asarray(out["pk_values"])
    dlnp = out["jacobian"] / p[:, None]
    np.testing.assert_allclose(dlnp[:, 0], 1.0, rtol=1e-10)
    np.testing.assert_allclose(dlnp[:, 1], np.log(k / 0.05), rtol=1e-8)
    assert np.all(np.isfinite(out["errors"])) and np.all(out["errors"] > 0)
