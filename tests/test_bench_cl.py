"""scripts/bench_cl.py without running the C_ℓ: its refusal of a config without output.cl, and
the table and JSON it makes from the measured runs (the measurement itself is faked here; the
real one is in docs/benchmarks.md, "CMB spectra")."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from boltzmann import runtime

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cl_under_test",
                                                  REPO / "scripts" / "bench_cl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_refuses_a_config_without_cl(bench, capsys):
    with pytest.raises(SystemExit) as err:
        bench.main(["--config", str(REPO / "configs" / "lcdm.yaml")])
    assert err.value.code == 2
    assert "output.cl" in capsys.readouterr().err


def test_table_and_json(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runtime, "configure", lambda settings: None)

    def fake_runs(config, backend, runs, los_batch=None):
        return [{"run": i + 1, "total_s": 1.0 + i, **{f"{s}_s": 0.25 for s in bench.STAGES},
                 "los_batch": "auto" if los_batch is None else los_batch,
                 "info": {"k_source": 3}} for i in range(runs)]

    monkeypatch.setattr(bench, "time_ours", fake_runs)
    bench.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--runs", "2",
                "--backend", "jax", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| line-of-sight batch | run | total [s] | tables | sources | bessel |" in out
    assert "| auto | 2 | 2.00 | 0.25 |" in out
    data = json.loads((tmp_path / "bench_cl.json").read_text())
    assert data["l_max"] == 2500 and data["lensing"] is True and len(data["runs"]) == 2
    bench.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--runs", "1",
                "--backend", "jax", "--los-batch", "1,auto"])
    out = capsys.readouterr().out
    assert "| 1 | 1 | 1.00 |" in out and "| auto | 1 | 1.00 |" in out


def test_gradients_table_and_json(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runtime, "configure", lambda settings: None)
    seen = {}

    def fake(config, backend, runs, parameters, sampling, sec=None, keep=None,
             direction_block=None):
        seen.update(l_max=config.output.l_max, lensing=config.output.lensing,
                    parameters=parameters, step=sampling.q_step, sec=sec, block=direction_block)
        keep["d_TT"] = [[1.0, 2.0]]
        return {"setup_s": 1.0, "parameters": parameters, "modes": 90, "samples": 400,
                "value_s": [40.0, 4.0], "jacobian_s": [300.0, 50.0],
                "direction_block": direction_block,
                "jacobian_stages_s": [{"inputs": 1.0, "sources": 2.0, "spectra": 3.5}],
                "sensitivity_launch": [{"kernel_seconds": 0.5, "copy_in_seconds": 0.01,
                                        "copy_out_seconds": 0.2, "callback_seconds": 0.8,
                                        "output_bytes": 1.5e9}]}

    monkeypatch.setattr(bench, "time_gradients", fake)
    bench.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--gradients",
                "--parameters", "h", "tau_reio", "--l-max", "60", "--lensing", "off",
                "--coarser", "2", "--runs", "2", "--backend", "jax", "--sec-weight", "0.1",
                "--direction-block", "3", "--out", str(tmp_path)])
    assert seen == {"l_max": 60, "lensing": False, "parameters": ["h", "tau_reio"],
                    "step": 0.25, "sec": 0.1, "block": 3}
    with np.load(tmp_path / "bench_cl_jacobian.npz") as jac:
        assert jac["parameters"].tolist() == ["h", "tau_reio"]
        assert jac["d_TT"].tolist() == [[1.0, 2.0]]
    out = capsys.readouterr().out
    assert "| 3 | 40.00 / 4.00 | 300.00 / 50.00 | 12.50 |" in out
    assert "(direction block 3)" in out and "1: inputs 1.000, sources 2.000, spectra 3.500" in out
    assert ("the sources' sensitivity launch: kernel 0.500, copy_in 0.010, copy_out 0.200, "
            "callback 0.800, 1.50 GB out") in out
    data = json.loads((tmp_path / "bench_cl_gradients.json").read_text())
    assert data["gradients"]["modes"] == 90 and data["coarser"] == 2.0
    # several direction blocks: a ClFunction each, one row each, in the order given
    bench.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--gradients",
                "--parameters", "h", "--l-max", "60", "--runs", "2", "--backend", "jax",
                "--direction-block", "2,9", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.index("| 2 | 40.00") < out.index("| 9 | 40.00")
    data = json.loads((tmp_path / "bench_cl_gradients.json").read_text())
    assert [r["direction_block"] for r in data["by_direction_block"]] == [2, 9]
    with pytest.raises(SystemExit):
        bench.main(["--config", str(REPO / "configs" / "planck_cl.yaml"), "--coarser", "2"])
