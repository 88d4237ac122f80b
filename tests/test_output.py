"""The output contract (boltzmann.output): file layouts, headers, number format, readers."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from boltzmann import output

DATA = Path(__file__).parent / "data"


def _last_comment_line(path):
    comments = [line for line in Path(path).read_text().splitlines() if line.startswith("#")]
    return comments[-1]


def test_z_label_is_python_g_format():
    assert [output.z_label(z) for z in (0, 1, 0.5, 2.0, 1e-3, 10)] == ["0", "1", "0.5", "2", "0.001", "10"]


def test_pk_csv_header_order_and_numbers(tmp_path):
    k = np.logspace(-3, 0, 7)
    zs = [0.0, 1.0, 0.5]
    rng = np.random.default_rng(1)
    pk_m = {z: rng.uniform(1, 1e4, k.size) for z in zs}
    pk_cb = {z: rng.uniform(1, 1e4, k.size) for z in zs}
    path = output.write_pk_csv(tmp_path / "pk.csv", k, pk_m, pk_cb, zs)
    assert _last_comment_line(path) == (
        "# k_1/Mpc,P_m_z0_Mpc3,P_m_z1_Mpc3,P_m_z0.5_Mpc3,P_cb_z0_Mpc3,P_cb_z1_Mpc3,P_cb_z0.5_Mpc3")
    table = np.loadtxt(path, delimiter=",")  # plain numpy reads it
    assert table.shape == (k.size, 1 + 2 * len(zs))
    np.testing.assert_allclose(table[:, 0], k, rtol=5e-10)
    np.testing.assert_allclose(table[:, 3], pk_m[0.5], rtol=5e-10)
    np.testing.assert_allclose(table[:, 6], pk_cb[0.5], rtol=5e-10)
    first_row = next(line for line in path.read_text().splitlines() if not line.startswith("#"))
    mantissas = [field.split("e")[0].replace("-", "").replace(".", "") for field in first_row.split(",")]
    assert all(len(m) == 10 for m in mantissas)  # 10 significant digits
    k_read, cols = output.read_pk_csv(path)
    np.testing.assert_array_equal(k_read, table[:, 0])
    assert list(cols) == output.pk_column_names(zs)[1:]


def test_pk_csv_without_cb_and_duplicate_z_labels(tmp_path):
    k = np.logspace(-3, 0, 5)
    path = output.write_pk_csv(tmp_path / "pk.csv", k, {0: np.ones(5)})
    assert _last_comment_line(path) == "# k_1/Mpc,P_m_z0_Mpc3"
    with pytest.raises(ValueError, match="distinct"):
        output.write_pk_csv(tmp_path / "bad.csv", k, {1: np.ones(5), 1.0000001: np.ones(5)})
    with pytest.raises(ValueError, match="shape"):
        output.write_pk_csv(tmp_path / "bad.csv", k, {0: np.ones(4)})


@pytest.mark.parametrize("name", ["class_lcdm_pk.csv", "camb_lcdm_pk.csv", "class_lcdm_tk.csv",
                                  "class_lcdm_massless_tk.csv"])
def test_read_pk_csv_reads_reference_files(name):
    spec = yaml.safe_load((DATA / "params.yaml").read_text())["files"][name]
    k, cols = output.read_pk_csv(DATA / name)
    assert k.size == spec["rows"]
    assert ["k_1/Mpc", *cols] == spec["columns"]
    assert np.all(np.diff(k) > 0)


def test_read_pk_csv_accepts_uncommented_header_and_rejects_headerless(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text("k_1/Mpc,P_m_z0_Mpc3\n0.1,2.0\n0.2,3.0\n")
    k, cols = output.read_pk_csv(plain)
    np.testing.assert_array_equal(k, [0.1, 0.2])
    np.testing.assert_array_equal(cols["P_m_z0_Mpc3"], [2.0, 3.0])
    bare = tmp_path / "bare.csv"
    bare.write_text("0.1,2.0\n")
    with pytest.raises(ValueError, match="no header"):
        output.read_pk_csv(bare)


def test_tk_csv_blocks_per_z_in_class_order(tmp_path):
    k = np.logspace(-3, 0, 4)
    names = ["t_b", "d_m", "eta", "d_ncdm[0]", "d_cdm", "h_prime", "d_b", "d_g", "custom"]
    transfers = {z: {n: np.full(k.size, i + 10 * j) for i, n in enumerate(names)} for j, z in enumerate([0, 1])}
    path = output.write_tk_csv(tmp_path / "tk.csv", k, transfers)
    expected_order = ["d_g", "d_b", "d_cdm", "d_ncdm[0]", "d_m", "h_prime", "eta", "t_b", "custom"]
    header = _last_comment_line(path)[2:].split(",")
    assert header == ["k_1/Mpc"] + [f"{n}_z0" for n in expected_order] + [f"{n}_z1" for n in expected_order]
    _, cols = output.read_pk_csv(path)
    np.testing.assert_array_equal(cols["d_ncdm[0]_z1"], transfers[1]["d_ncdm[0]"])
    assert "<name>_z<z>" in path.read_text()  # the naming is documented in the file


def test_summary_json_contents(tmp_path):
    zs = [0.0, 0.5]
    path = output.write_summary_json(
        tmp_path / "summary.json", zs=zs, sigma8={0.0: np.float64(0.81), 0.5: 0.6},
        sigma8_cb={0.0: 0.815, 0.5: 0.61}, parameters={"h": np.float64(0.67), "m_ncdm": np.array([0.06])},
        backend="jax", solver_stats={"steps": np.array([10, 12]), "max_err": math.inf},
        timings={"background": 0.1, "perturbations": 2.0}, k=np.array([1e-4, 1.0]), extra={"name": "lcdm"})
    summary = json.loads(path.read_text())
    assert summary["z"] == ["0", "0.5"]
    assert summary["sigma8"] == {"0": 0.81, "0.5": 0.6}
    assert summary["sigma8_cb"] == {"0": 0.815, "0.5": 0.61}
    assert summary["parameters"] == {"h": 0.67, "m_ncdm": [0.06]}
    assert summary["backend"] == "jax"
    assert summary["solver_stats"] == {"steps": [10, 12], "max_err": "inf"}
    assert summary["timings_s"] == {"background": 0.1, "perturbations": 2.0}
    assert summary["k_range_1/Mpc"] == [1e-4, 1.0] and summary["n_k"] == 2
    assert summary["name"] == "lcdm"
