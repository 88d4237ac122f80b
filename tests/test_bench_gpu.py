"""scripts/bench_gpu.py on the CPU: operation counting, the time budget, one real row, files.

The whole ``--quick`` run (all three parts, JAX backend) took 112-240 s wall on the shared 2-core
dev machine (depending on its load) — mostly XLA compilation of five programs — so it is not run
here; the tests below cover its pieces (one compiled row; every other row through the budget path).
"""
import importlib.util
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def grad(bench):
    """scripts/bench_grad.py (part (d)), as bench_gpu.py imported it."""
    return sys.modules["bench_grad"]


def test_count_ops():
    from solver.cost import count_ops

    c = count_ops(lambda x, y: x * y + jnp.exp(x) - y ** 3 / 2.0, 1.0, 2.0)
    # mul, add, sub, div + 2 multiplies for y**3; one exp
    assert c == {"arith": 6, "transcendental": 1}
    v = count_ops(lambda a, b: a @ b, jnp.ones((3, 4)), jnp.ones(4))
    assert v["arith"] == 2 * 3 * 4


def test_work_estimate_lattice():
    from solver.cost import work_estimate
    from stiff_problems import van_der_pol_lattice

    prob = van_der_pol_lattice(4)
    w = work_estimate(prob.rhs, prob.n, 2, p=prob.params)
    assert w["n"] == 8 and w["colours"] >= 2 and w["rhs_transcendental"] == 0
    assert w["flops_per_step"] == sum(w["per_step"].values()) > 7 * w["rhs_arith"]


def test_gradient_agreement_is_per_parameter(grad):
    """(d)'s CUDA-vs-JAX line: each parameter's error is scaled by that parameter's own largest
    |∂ln P/∂θ|, so a small derivative is not judged against a large one."""
    import numpy as np

    ref = np.zeros((2, 3, 2))
    ref[..., 0], ref[..., 1] = 100.0, 0.01
    got = ref.copy()
    got[1, 2, 0] += 0.1          # 1e-3 of parameter 0's scale
    got[0, 0, 1] += 1e-6         # 1e-4 of parameter 1's scale
    np.testing.assert_allclose(grad.gradient_agreement(got, ref), [1e-3, 1e-4])


def test_grad_part_rows_and_agreement_lines(bench, grad, monkeypatch, tmp_path):
    """(d) with --grad-sec both: a row per backend and SEC setting (the SEC flag reaches the
    row), the SEC-off-vs-on line and the CUDA-vs-JAX line (SEC on), from the rows' Jacobians.
    The rows themselves are stubbed (a real one is a ~10-minute CPU compile)."""
    import numpy as np
    from boltzmann.params import load_config

    seen = []

    def fake_row(row, backend, cfg, names, batch, budget, sec=True, device_inputs=False):
        seen.append((backend, sec))
        row.update(status="ok", value_first_s=1.0, value_warm_s=0.5, jacobian_first_s=2.0,
                   jacobian_warm_s=1.0, ratio=2.0, jacobian_finite=True, note="")
        d = np.ones((1, 3, len(names)))
        return d * (1.0 + (1e-3 if backend == "cuda" and not sec else 0.0)
                    + (1e-6 if backend == "jax" else 0.0))

    monkeypatch.setattr(grad, "_grad_row", fake_row)
    monkeypatch.setattr("boltzmann.tables.host_cpu", lambda: None)
    args = bench.build_parser().parse_args(["--parts", "d", "--backends", "cuda,jax",
                                            "--grad-sec", "both", "--config", "lcdm_reduced"])
    args.backends = ["cuda", "jax"]
    report = bench.Report(str(tmp_path))
    grad.run_grad(args, report, bench.Budget(1e6, 1e6), load_config("lcdm_reduced"), {})
    assert seen == [("cuda", True), ("cuda", False), ("jax", True), ("jax", False)]
    assert [r["backend"] for r in report.data["grad"]] == ["cuda", "cuda (SEC off)", "jax",
                                                           "jax (SEC off)"]
    assert max(report.data["grad_sec_0_vs_1"].values()) == pytest.approx(1e-3)
    assert "|" not in bench._short("a | b", 260)
    assert max(report.data["grad_agreement"].values()) == pytest.approx(1e-6, rel=1e-4)


def test_grad_sec_choices(grad):
    """(d)'s sensitivity error weights: the config's by default, the named pairs, a list of
    numbers; a weight outside [0, 1] or a word is refused with what to give."""
    from boltzmann.params import load_config

    cfg = load_config("lcdm_reduced")
    assert grad._sec_weights("config", cfg) == (cfg.precision.sensitivity_error_weight,)
    assert grad._sec_weights("both", cfg) == (1.0, 0.0)
    assert grad._sec_weights("1,0.1,0", cfg) == (1.0, 0.1, 0.0)
    for bad in ("2", "sometimes"):
        with pytest.raises(SystemExit, match="weights in"):
            grad._sec_weights(bad, cfg)


def test_launch_note_names_the_slowest_thread(grad):
    """(d)'s note on the CUDA row: the slowest sensitivity thread's steps, and which k and
    parameter it integrated (from solver.joint_solve's per-thread info)."""
    import numpy as np

    assert grad.launch_note({}, ["h", "omega_b"], np.array([0.1, 1.0])) is None
    info = {"thread_n_accepted": np.array([[500, 913], [900, 2300]]),   # (direction, k)
            "launch": {"kernel_seconds": 8.25}}
    note = grad.launch_note(info, ["h", "omega_b"], np.array([0.1, 1.0]))
    assert note["steps_max"] == 2300 and note["threads"] == 4
    assert note["text"] == ("tangent: max 2300 steps over 4 threads, kernel 8.25 s, "
                            "slowest k = 1/Mpc, omega_b")


def test_budget_skips_rows_with_reason(bench, tmp_path):
    """A budget too small for anything: every row of every part is skipped with a projection."""
    rc = bench.main(["--backends", "jax,diffrax", "--budget", "0.5", "--no-work",
                     "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_gpu.json").read_text())
    rows = data["vdp"] + data["eb"] + data["one"]
    assert len(data["vdp"]) == 6 and len(data["eb"]) == 4 and len(data["one"]) == 1
    assert all(r["status"] == "skipped" for r in rows)
    assert all("skipped: " in r["note"] for r in rows)
    # JAX beyond --jax-max-cosmologies is skipped by rule, the rest by projection
    assert any("--jax-max-cosmologies" in r["note"] for r in data["eb"])
    assert any("projected" in r["note"] for r in data["eb"])
    md = (tmp_path / "bench_gpu.md").read_text()
    assert "## (a)" in md and "## (b)" in md and "## (c)" in md


def test_projection_from_measured_rows(bench):
    hist = [{"key": "vdp:jax", "status": "ok", "size": 1000, "first_s": 30.0, "warm_s": 2.0}]
    # compile again (28 s) + two warm runs scaled x10 (linearly on a CPU)
    assert bench.project(hist, "vdp:jax", 10000, 99.0) == pytest.approx(28.0 + 40.0)
    hist.append({"key": "vdp:jax", "status": "ok", "size": 10000, "first_s": 33.0, "warm_s": 5.0})
    # two sizes: alpha = log(5/2)/log(10) fitted; 1e5 -> 5 s x 10**alpha = 12.5 s per run
    assert bench.project(hist, "vdp:jax", 100000, 99.0) == pytest.approx(28.0 + 25.0)
    assert bench.project(hist, "vdp:cuda", 10000, 99.0) == 99.0
    # CUDA EB: the kernel's compilation (inside the first solve) is not paid again
    eb = [{"key": "eb:cuda", "status": "ok", "size": 1, "first_s": 200.0, "warm_s": 1.0,
           "first_timings": {"tables": 20.0, "initial_conditions": 2.0, "solve": 170.0,
                             "spectra": 5.0},
           "timings": {"tables": 0.3, "initial_conditions": 0.01, "solve": 0.6, "spectra": 0.09}}]
    assert bench.project(eb, "eb:cuda", 16, 99.0) == pytest.approx(26.6 + 2 * 16.0)
    b = bench.Budget(100.0, row_limit_s=60.0)
    assert "row limit" in b.refuse(68.0)
    assert b.refuse(10.0) is None


@pytest.mark.slow  # ~30 s (XLA compiles); the CI budget is 20 min; `pytest -m slow` runs it
def test_quick_vdp_row_runs(bench, tmp_path):
    """One real row: the JAX backend on a small lattice ensemble (compiles the solver once)."""
    rc = bench.main(["--quick", "--backends", "jax", "--parts", "a", "--sizes", "8",
                     "--budget", "150", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_gpu.json").read_text())
    (row,) = data["vdp"]
    assert row["status"] == "ok", row.get("note")
    assert row["failed"] == 0 and row["steps_max"] >= row["steps_median"] > 50
    assert row["warm_s"] <= row["first_s"]
    assert data["work"]["vdp"]["flops_per_step"] > 0 and row["gflops"] > 0


@pytest.mark.skip(reason="the full --quick run takes 2-4 min on the 2-core dev machine (five XLA "
                         "compilations); run `python scripts/bench_gpu.py --backends jax --quick` "
                         "by hand")
def test_full_quick_mode(bench, tmp_path):
    assert bench.main(["--quick", "--backends", "jax", "--out", str(tmp_path)]) == 0
