"""The GPU benchmark: every backend side by side, in one process.

(a) Stiff ensembles: the 64-variable van der Pol lattice (tests/stiff_problems.py, t in [0, 3], the
    problem of scripts/bench_solver.py) at N = 1e3, 1e4, 1e5 trajectories: our CUDA backend vs our
    JAX backend vs diffrax (Rodas5p if the installed diffrax has it, else Kvaerno5), same
    rtol = atol.
(b) ΛCDM P(k) (configs/lcdm.yaml: one 0.06 eV neutrino, default precision, its k grid and
    redshifts) for 1, 16, 128, 1024 cosmologies per launch through boltzmann/ensemble.py
    (fiducial_ensemble: ±5% Latin hypercube in omega_b, omega_cdm, h, n_s, A_s), CUDA vs JAX.
(c) One cosmology, params -> P(k) and σ8, wall time end to end, warm.
(d) Gradients: the full Jacobian ∂P(k)/∂θ of one cosmology (all parameters of
    boltzmann.gradients.PARAMETERS that the config has) against ONE P(k) from the same
    PowerSpectrumFunction, per backend (target: Jacobian <= 2x one P(k) on one H200), and the
    throughput of value-and-Jacobian over ``--grad-batch`` cosmologies in one joint solve
    (``boltzmann.gradients_batch.PowerSpectrumBatch``: C·K modes × directions in one CUDA
    launch; CUDA rows only), with its fiducial row against the single-cosmology Jacobian.
    With both backends it prints their agreement: per parameter, max |∂ln P_cuda - ∂ln P_jax|
    over the Jacobian's largest |∂ln P/∂θ| (the tests' bound is 1e-4). The rows use the config's
    sensitivity error weight; ``--grad-sec`` picks others (``both``: 1 and 0, the latter's
    threads taking the plain solve's steps, and the SEC-off Jacobian's difference from the
    SEC-on one in the same units). The CUDA row's note
    gives the launches' steps and kernel seconds, and which (k, parameter) the slowest
    sensitivity thread integrated: a launch lasts as long as that thread.

Every row: the first call (compilation included) and warm calls (compilation excluded, median of
repeats), ms per launch, trajectories (or cosmologies) per second, accepted steps per trajectory
(median, max). The work is estimated from operation counts (jaxpr equations of the RHS and of one
JVP sweep, the compiled sparse LU's operation counts, the Rodas5P tableau; see ``work_estimate``)
and turned into achieved GFLOP/s against the H200's fp64 peak (34 TFLOP/s vector, 67 TFLOP/s on
tensor cores, which scalar per-thread code cannot use).

The parts run in the order of ``--parts`` (default "bca": the ΛCDM ensembles first, since they
are what the solver is for). A global time budget (``--budget``, default 480 s) keeps the run inside
a 10-minute device call: each part but the last may use only a share of what is left
(SECTION_SHARE); before each row its time is projected from the rows already measured (or a prior
guess), and a row that would not fit, or would exceed ``--row-limit``, is printed as "skipped:
projected X s" instead of being run. A row that fails (CUDA backend unavailable, not implemented
for tables, any error) prints its reason and the run goes on. Each row is printed (flushed) as
soon as it is done, and ``--out DIR`` gets bench_gpu.json and bench_gpu.md rewritten after every
row (so a run killed from outside keeps what it measured).

    python scripts/bench_gpu.py --out $OUT                  # the GPU run (all defaults)
    python scripts/bench_gpu.py --backends jax --quick      # CPU smoke test (tiny sizes)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("JAX_ENABLE_X64", "1")
# numba (the CUDA backend) allocates next to XLA: do not let XLA take 75% of the GPU up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the stiff test problems (van der Pol lattice) live with the solver's tests
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

from solver import sec_weight  # noqa: E402
from solver.cost import TRANSCENDENTAL_FLOPS, work_estimate  # noqa: E402

#: H200 SXM fp64 peaks [FLOP/s] (NVIDIA datasheet): vector units, and DMMA tensor cores
H200_FP64_VECTOR = 34e12
H200_FP64_TENSOR = 67e12

VDP_T_END = 3.0
VDP_TOL = 1e-6
ALL_BACKENDS = ("cuda", "jax", "diffrax")

#: first-row guesses [s] (compile + one run) before anything was measured, per (part, backend);
#: from docs/benchmarks.md (H200: lattice JAX first call 25.6 s, CUDA 24.9 s; EB JAX ~40 s)
#: share of the remaining budget a part may use when other parts follow it
SECTION_SHARE = {"a": 0.5, "b": 0.75, "c": 0.3, "d": 0.6}
PRIOR_FIRST_S = {"vdp:cuda": 30.0, "vdp:jax": 30.0, "vdp:diffrax": 40.0, "eb:cuda": 90.0,
                 "eb:jax": 90.0, "grad:cuda": 300.0, "grad:jax": 200.0}


# =========================================================================== output
class Report:
    """Prints rows as they come (flushed) and keeps everything for the JSON/Markdown files."""

    def __init__(self, out_dir: str | None = None):
        self.out_dir = out_dir
        self.lines: list[str] = []
        self.data: dict = {"vdp": [], "eb": [], "one": [], "grad": [], "notes": []}

    def print(self, line: str = ""):
        print(line, flush=True)
        self.lines.append(line)

    def row(self, part: str, row: dict, line: str):
        """Record a finished row, print it, and rewrite the files (a killed run keeps them)."""
        self.data[part].append(row)
        self.print(line)
        self.write()

    def note(self, text: str):
        self.data["notes"].append(text)
        self.print(f"note: {text}")

    def write(self):
        if not self.out_dir:
            return
        os.makedirs(self.out_dir, exist_ok=True)
        tmp = os.path.join(self.out_dir, ".bench_gpu.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(self.data, fh, indent=1, default=_json_default)
        os.replace(tmp, os.path.join(self.out_dir, "bench_gpu.json"))
        with open(os.path.join(self.out_dir, "bench_gpu.md"), "w") as fh:
            fh.write("\n".join(self.lines) + "\n")


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


class Budget:
    """Wall-clock budget of the whole run, with an optional earlier deadline per section."""

    def __init__(self, total_s: float, row_limit_s: float):
        self.t0 = time.perf_counter()
        self.total = float(total_s)
        self.row_limit = float(row_limit_s)
        self.section_end = self.total

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return min(self.total, self.section_end) - self.elapsed()

    def start_section(self, share: float):
        """This section may run until ``share`` of what is left of the whole budget is used."""
        self.section_end = self.elapsed() + share * (self.total - self.elapsed())

    def end_section(self):
        self.section_end = self.total

    def refuse(self, projected: float) -> str | None:
        """None if a row projected to take ``projected`` s may run, else the reason."""
        if projected > self.row_limit:
            return f"skipped: projected {projected:.0f} s > row limit {self.row_limit:.0f} s"
        if projected > self.left():
            return (f"skipped: projected {projected:.0f} s > {max(self.left(), 0):.0f} s left "
                    f"in the time budget")
        return None


def project(history: list, key: str, n: int, prior_first: float) -> float:
    """Projected seconds of a row (first call + one warm call) at size ``n`` for ``key``.

    From the largest measured size of the same key: its compilation time (first - warm) again —
    a new shape recompiles the XLA programs; the CUDA kernel is shape-independent, so "vdp:cuda"
    has none and "eb:cuda" only its XLA stages' (tables, ICs, spectra) — plus two runs of the warm time scaled as size**alpha. alpha is fitted
    to the two largest measured sizes when there are two (clipped to [0.3, 1.2]), else 1 on a
    CPU and 0.6 on a GPU (whose throughput grows with N until the device is full).
    """
    done = sorted((r for r in history if r.get("key") == key and r.get("status") == "ok"),
                  key=lambda r: r["size"])
    if not done:
        return prior_first
    last = done[-1]
    alpha = 1.0 if jax.default_backend() == "cpu" else 0.6
    if len(done) >= 2 and done[-2]["size"] < last["size"] and done[-2]["warm_s"] > 0:
        alpha = math.log(last["warm_s"] / done[-2]["warm_s"]) / math.log(
            last["size"] / done[-2]["size"])
        alpha = min(max(alpha, 0.3), 1.2)
    warm = last["warm_s"] * max(n / last["size"], 1.0) ** alpha
    if key == "vdp:cuda":
        compile_s = 0.0
    elif key == "eb:cuda" and "first_timings" in last:
        # the CUDA kernel is compiled once; only the XLA stages recompile for a new shape
        compile_s = sum(max(last["first_timings"][k] - last["timings"][k], 0.0)
                        for k in ("tables", "initial_conditions", "spectra"))
    else:
        compile_s = max(last["first_s"] - last["warm_s"], 0.0)
    return compile_s + 2.0 * warm


def _warm_calls(call, first_s, min_total=0.5, max_repeats=5):
    """Median warm time of repeated calls (more repeats for fast launches), and the last result."""
    times, res = [], None
    repeats = 1 if first_s > min_total else max_repeats
    for _ in range(repeats):
        t = time.perf_counter()
        res = call()
        times.append(time.perf_counter() - t)
        if sum(times) > min_total and len(times) >= 1:
            break
    return float(np.median(times)), len(times), res


def _unavailable_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# =========================================================================== work estimate
def _gflops(work, steps_total, seconds):
    if not work or not seconds or not steps_total:
        return None
    return work["flops_per_step"] * steps_total / seconds / 1e9


def _print_work(report, label, w):
    p = w["per_step"]
    report.print(f"work/step {label}: n={w['n']}, pattern nnz {w['pattern_nnz']}, LU slots "
                 f"{w['lu_slots']}, colours {w['colours']}; RHS {w['rhs_arith']} arith + "
                 f"{w['rhs_transcendental']} transc., JVP sweep {w['jvp_sweep_arith']} + "
                 f"{w['jvp_sweep_transcendental']}; LU factor {w['lu_factor_ops']}, solve "
                 f"{w['lu_solve_ops']} ops -> {w['flops_per_step']:,} flop/step (Jacobian "
                 f"{p['jacobian']:,}, LU {p['lu_factor']:,}, 8 solves {p['triangular_solves']:,},"
                 f" 7 RHS {p['stage_rhs']:,}, vectors {p['stage_combinations'] + p['error_norm']:,}"
                 f"); transcendental = {TRANSCENDENTAL_FLOPS} flop")


# =========================================================================== (a) VdP lattice
def _vdp_params(N, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(3.0, 10.0, N), rng.uniform(0.1, 3.0, N)])


#: the solver backend objects of this run, by name (``main`` fills it from the environment's
#: settings, so the CUDA kernels come from and go to the persistent cache like the CLI's)
SOLVER_BACKENDS: dict = {}


def solver_backend(name):
    """The backend object for a backend name (the name itself where none was configured)."""
    return SOLVER_BACKENDS.get(name, name)


def _vdp_call(backend, prob, N):
    from solver import solve

    params = _vdp_params(N)
    y0 = np.tile(prob.y0, (N, 1))
    ts = np.array([0.0, VDP_T_END])
    if backend in ("jax", "cuda"):
        def call():
            sol = solve(prob.rhs, y0, ts, params, rtol=VDP_TOL, atol=VDP_TOL, backend=solver_backend(backend))
            ys = sol.ys
            if isinstance(ys, jax.Array):
                ys.block_until_ready()
            return {"ys": np.asarray(ys), "status": np.asarray(sol.status),
                    "n_acc": np.asarray(sol.n_accepted), "n_rej": np.asarray(sol.n_rejected),
                    "info": dict(sol.info)}
        return call, None

    import diffrax

    solver_cls = getattr(diffrax, "Rodas5p", None) or diffrax.Kvaerno5

    def one(p):
        term = diffrax.ODETerm(lambda t, y, args: jnp.stack(prob.rhs(y, t, args)))
        sol = diffrax.diffeqsolve(
            term, solver_cls(), 0.0, VDP_T_END, None, jnp.asarray(prob.y0), args=p,
            stepsize_controller=diffrax.PIDController(rtol=VDP_TOL, atol=VDP_TOL),
            max_steps=100_000, saveat=diffrax.SaveAt(t1=True), throw=False)
        ok = sol.result == diffrax.RESULTS.successful
        return (sol.ys[-1], ok, sol.stats["num_accepted_steps"],
                sol.stats["num_rejected_steps"])

    f = jax.jit(jax.vmap(one))
    pj = jnp.asarray(params)

    def call():
        ys, ok, acc, rej = f(pj)
        ys.block_until_ready()
        return {"ys": np.asarray(ys), "status": np.where(np.asarray(ok), 0, 1),
                "n_acc": np.asarray(acc), "n_rej": np.asarray(rej), "info": {}}
    return call, solver_cls.__name__


def run_vdp(args, report, budget, work):
    from stiff_problems import van_der_pol_lattice

    prob = van_der_pol_lattice(32)
    backends = [b for b in args.backends if b in ALL_BACKENDS]
    report.print(f"\n## (a) {prob.name} (n = {prob.n}), t in [0, {VDP_T_END}], rtol = atol = "
                 f"{VDP_TOL}; sizes {args.sizes}")
    w = None
    if not args.no_work:
        try:
            w = work_estimate(prob.rhs, prob.n, 2, p=prob.params)
            work["vdp"] = w
            _print_work(report, prob.name, w)
        except Exception as exc:  # a side show: never stop the benchmark for it
            report.note(f"work estimate for the lattice failed: {_unavailable_reason(exc)}")
    report.print("| N | backend | first call [s] | warm [ms/launch] | trajectories/s | steps "
                 "median / max | GFLOP/s (est.) | % fp64 peak | note |")
    report.print("|---|---|---|---|---|---|---|---|---|")
    rows = report.data["vdp"]
    dead = {}
    for N in args.sizes:
        for b in backends:
            key = f"vdp:{b}"
            row = {"key": key, "size": N, "backend": b}
            if b in dead:
                row.update(status="skipped", note=dead[b])
            else:
                projected = project(rows, key, N, PRIOR_FIRST_S[key])
                why = budget.refuse(projected)
                if why:
                    row.update(status="skipped", note=why, projected_s=projected)
                else:
                    _vdp_row(row, b, prob, N, w, dead)
            report.row("vdp", row, _vdp_line(row))


def _vdp_row(row, backend, prob, N, work, dead):
    try:
        call, name = _vdp_call(backend, prob, N)
        t = time.perf_counter()
        res = call()
        first = time.perf_counter() - t
        warm, repeats, res = _warm_calls(call, first)
    except ImportError as exc:
        dead[backend] = f"unavailable: {_unavailable_reason(exc)}"
        row.update(status="skipped", note=dead[backend])
        return
    except Exception as exc:  # CudaBackendUnavailable, NotImplementedError, anything: go on
        reason = _unavailable_reason(exc)
        if type(exc).__name__ in ("CudaBackendUnavailable", "NotImplementedError"):
            dead[backend] = f"unavailable: {reason}"
        row.update(status="error", note=reason, traceback=traceback.format_exc())
        return
    acc, rej = res["n_acc"], res["n_rej"]
    steps_total = int(acc.sum() + rej.sum())
    failed = int(np.sum(res["status"] != 0))
    row.update(status="ok", first_s=first, warm_s=warm, warm_repeats=repeats,
               ms_per_launch=1e3 * warm, per_s=N / warm,
               steps_median=float(np.median(acc)), steps_max=int(acc.max()),
               steps_total=steps_total, failed=failed,
               solver=name or "Rodas5P (ours)",
               kernel_s=res["info"].get("kernel_seconds"))
    if backend != "diffrax":
        g = _gflops(work, steps_total, warm)
        row.update(gflops=g, peak_fraction=None if g is None else g * 1e9 / H200_FP64_VECTOR)
    notes = []
    if name:
        notes.append(name)
    if row["kernel_s"] is not None:
        notes.append(f"kernel {1e3 * row['kernel_s']:.1f} ms of it")
    if failed:
        notes.append(f"{failed} trajectories failed")
    row["note"] = "; ".join(notes)


def _fmt(x, spec, none="—"):
    return none if x is None else format(x, spec)


def _short(note: str, limit: int = 160) -> str:
    note = (note or "").replace("|", "/")
    return note if len(note) <= limit else note[:limit - 3] + "..."


def _vdp_line(r) -> str:
    if r["status"] != "ok":
        return (f"| {r['size']} | {r['backend']} | — | — | — | — | — | — | "
                f"{_short(r['note'])} |")
    peak = None if r.get("peak_fraction") is None else 100 * r["peak_fraction"]
    return (f"| {r['size']} | {r['backend']} | {r['first_s']:.2f} | {r['ms_per_launch']:.1f}"
            f" | {r['per_s']:.3g} | {r['steps_median']:.0f} / {r['steps_max']} | "
            f"{_fmt(r.get('gflops'), '.1f')} | {_fmt(peak, '.2f')} | {_short(r['note'])} |")


# =========================================================================== (b), (c) ΛCDM P(k)
def _eb_setup(args):
    from boltzmann.params import load_config

    cfg = load_config(args.config)
    if args.quick:
        prec = dataclasses.replace(cfg.precision, l_max_g=8, l_max_pol_g=6, l_max_ur=8,
                                   l_max_ncdm=6, n_q_ncdm=2, bg_n_lna=1000)
        out = dataclasses.replace(cfg.output, k_min=1e-3, k_max=1.0, k_per_decade=5 / 3,
                                  z=(0.0,))
        cfg = dataclasses.replace(cfg, precision=prec, output=out)
    return cfg


def _eb_work(cfg, report, work):
    from boltzmann import ensemble, modes

    try:
        model = modes.model_for(cfg.cosmology, cfg.precision)
        grid = modes.make_grid(cfg.precision)
        # a representative table and parameter row: shapes are what the counts need
        tab = jnp.zeros((1, len(model.table_columns), 2, grid.n)).at[:, :, 0, :].set(-1.0)
        p = np.asarray(modes.mode_rows(model, ensemble.stack_cosmologies([cfg.cosmology]),
                                       [[0.1]], grid)[0])
        w = work_estimate(model.rhs, model.n, len(model.param_names), args=tab,
                          y=np.full(model.n, 0.1), p=p)
        work["eb"] = w
        _print_work(report, "EB model", w)
        return w
    except Exception as exc:
        report.note(f"work estimate for the EB model failed: {_unavailable_reason(exc)}")
        return None


def run_eb(args, report, budget, work):
    from boltzmann import ensemble

    cfg = _eb_setup(args)
    K = len(cfg.output.k_grid(float(cfg.cosmology.h)))
    backends = [b for b in args.backends if b in ("cuda", "jax")]
    report.print(f"\n## (b) ΛCDM P(k): {args.config}{' (quick: reduced precision)' if args.quick else ''}"
                 f", {K} k, z = {list(cfg.output.z)}, rtol {cfg.precision.rtol:g}; cosmologies "
                 f"per launch {args.cosmologies}; fiducial_ensemble ±5%")
    w = None if args.no_work else _eb_work(cfg, report, work)
    report.print("| cosmologies | backend | trajectories | first call [s] | warm [ms/launch] | "
                 "ms/cosmology | cosmologies/s | trajectories/s | steps median / max | tables / "
                 "ICs / solve / spectra [ms] | GFLOP/s (est.) | note |")
    report.print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = report.data["eb"]
    dead = {}
    for C in args.cosmologies:
        cosmos = ensemble.fiducial_ensemble(C, cfg)
        for b in backends:
            key = f"eb:{b}"
            row = {"key": key, "size": C, "backend": b, "trajectories": C * K}
            if b in dead:
                row.update(status="skipped", note=dead[b])
            elif b == "jax" and C > args.jax_max_cosmologies:
                row.update(status="skipped",
                           note=f"skipped: JAX backend only up to {args.jax_max_cosmologies} "
                                f"cosmologies (--jax-max-cosmologies)")
            else:
                projected = project(rows, key, C, PRIOR_FIRST_S[key])
                why = budget.refuse(projected)
                if why:
                    row.update(status="skipped", note=why, projected_s=projected)
                else:
                    _eb_row(row, b, cfg, cosmos, w, dead)
            report.row("eb", row, _eb_line(row))
    return cfg, dead


def _eb_call(backend, cfg, cosmos, check_coverage=False):
    from boltzmann import ensemble

    def call():
        return ensemble.run_ensemble(cosmos, cfg.precision, cfg.output, backend=solver_backend(backend),
                                     check_sigma8_coverage=check_coverage)
    return call


def _eb_row(row, backend, cfg, cosmos, work, dead):
    call = _eb_call(backend, cfg, cosmos)
    try:
        t = time.perf_counter()
        res = call()
        first = time.perf_counter() - t
        first_timings = _timings(res)
        warm, repeats, res = _warm_calls(call, first, min_total=1.0, max_repeats=3)
    except Exception as exc:
        reason = _unavailable_reason(exc)
        if type(exc).__name__ in ("CudaBackendUnavailable", "NotImplementedError", "TypeError"):
            dead[backend] = f"unavailable: {reason}"
        row.update(status="error", note=reason, traceback=traceback.format_exc())
        return
    C = len(cosmos)
    st = res.solver_stats()
    row.update(status="ok", first_s=first, first_timings=first_timings, warm_s=warm,
               warm_repeats=repeats,
               ms_per_launch=1e3 * warm, ms_per_cosmology=1e3 * warm / C, per_s=C / warm,
               trajectories_per_s=res.k.size / warm,
               steps_median=st["accepted_steps_median"], steps_max=st["accepted_steps_max"],
               steps_total=st["steps_total"], failed=len(res.failures()),
               timings=_timings(res),
               sigma8_fiducial=_sigma8_low_z(res),
               kernel_s=st.get("kernel_seconds"))
    g = _gflops(work, st["steps_total"], res.transfers.timings["solve"])
    row.update(gflops_solve=g, peak_fraction=None if g is None else g * 1e9 / H200_FP64_VECTOR)
    notes = []
    if st.get("tables_device"):
        notes.append(f"tables on {st['tables_device']}")
    if row["kernel_s"] is not None:
        notes.append(f"kernel {1e3 * row['kernel_s']:.0f} ms of the solve")
    failed = res.failures()
    if failed:
        notes.append(f"{len(failed)} modes failed ({failed[0][2]})")
    row["note"] = "; ".join(notes)


def _sigma8_low_z(res) -> float:
    """σ8 of the first cosmology at the lowest output redshift."""
    return float(res.spectra.sigma8[0, int(np.argmin(res.z))])


def _split(t) -> str:
    return " / ".join(f"{1e3 * t[k]:.0f}" for k in ("tables", "initial_conditions", "solve",
                                                    "spectra"))


def _timings(res) -> dict:
    """Seconds per stage, the perturbation stage split into initial conditions, solve and
    observables."""
    return {k: float(v) for k, v in {**res.timings, **res.transfers.timings}.items()}


def _eb_line(r) -> str:
    if r["status"] != "ok":
        return (f"| {r['size']} | {r['backend']} | {r['trajectories']} | — | — | — | — | — |"
                f" — | — | — | {_short(r['note'])} |")
    return (f"| {r['size']} | {r['backend']} | {r['trajectories']} | {r['first_s']:.1f} | "
            f"{r['ms_per_launch']:.0f} | {r['ms_per_cosmology']:.1f} | {r['per_s']:.3g} | "
            f"{r['trajectories_per_s']:.3g} | {r['steps_median']:.0f} / {r['steps_max']} | "
            f"{_split(r['timings'])} | {_fmt(r.get('gflops_solve'), '.1f')} | "
            f"{_short(r['note'])} |")


def run_one(args, report, budget, cfg, dead):
    from boltzmann import ensemble

    report.print(f"\n## (c) one cosmology ({args.config} fiducial), params -> P(k) and σ8, "
                 "warm wall time end to end (σ8 k-coverage check on)")
    report.print("| backend | first call [s] | warm params -> P(k) [ms] | tables / ICs / solve / "
                 "spectra [ms] | σ8(z=0) | note |")
    report.print("|---|---|---|---|---|---|")
    fid = [ensemble.fiducial_ensemble(1, cfg)[0]]
    for b in [b for b in args.backends if b in ("cuda", "jax")]:
        row = {"key": f"one:{b}", "size": 1, "backend": b}
        compiled = any(r["backend"] == b and r["size"] == 1 and r["status"] == "ok"
                       for r in report.data["eb"])
        if b in dead:
            row.update(status="skipped", note=dead[b])
        else:
            eb_rows = [r for r in report.data["eb"] if r["backend"] == b]
            projected = 3.0 if compiled else project(eb_rows, f"eb:{b}", 1,
                                                     PRIOR_FIRST_S[f"eb:{b}"])
            why = budget.refuse(projected)
            if why:
                row.update(status="skipped", note=why)
            else:
                call = _eb_call(b, cfg, fid, check_coverage=True)
                try:
                    t = time.perf_counter()
                    res = call()
                    first = time.perf_counter() - t
                    warm, repeats, res = _warm_calls(call, first, min_total=1.0, max_repeats=5)
                    row.update(status="ok", first_s=first, warm_s=warm, warm_repeats=repeats,
                               timings=_timings(res),
                               sigma8=_sigma8_low_z(res),
                               note="; ".join(p[3] for p in res.spectra.problems[:1]))
                except Exception as exc:
                    row.update(status="error", note=_unavailable_reason(exc),
                               traceback=traceback.format_exc())
        if row["status"] == "ok":
            line = (f"| {b} | {row['first_s']:.1f} | {1e3 * row['warm_s']:.0f} | "
                    f"{_split(row['timings'])} | {row['sigma8']:.6f} | {_short(row['note'])} |")
        else:
            line = f"| {b} | — | — | — | — | {_short(row['note'])} |"
        report.row("one", row, line)


# =========================================================================== (d) gradients
def grad_parameters(cfg) -> list:
    """Every parameter of boltzmann.gradients.PARAMETERS this config can be differentiated in."""
    from boltzmann.gradients import available_parameters

    return list(available_parameters(cfg.cosmology))


def run_grad(args, report, budget, cfg, dead):
    from boltzmann.tables import host_cpu

    names = grad_parameters(cfg)
    K = len(cfg.output.k_grid(float(cfg.cosmology.h)))
    report.print(f"\n## (d) gradients: {args.config}, {K} k, z = {list(cfg.output.z)}, "
                 f"{len(names)} parameters ({', '.join(names)}); Jacobian vs one P(k) of the same "
                 f"PowerSpectrumFunction; batch {args.grad_batch}")
    report.print("| backend | value first / warm [s] | Jacobian first / warm [s] | Jacobian / "
                 "value | batch of B: warm [s] | value+Jacobian per s | note |")
    report.print("|---|---|---|---|---|---|---|")
    dlnp = {}   # (backend, SEC) -> ∂ln P_m/∂θ at the fiducial (n_z, n_k, n_θ)
    secs = _sec_weights(args.grad_sec, cfg)
    for b in [b for b in args.backends if b in ("cuda", "jax")]:
        for sec in secs:
            key = f"grad:{b}"
            row = {"key": key, "size": 1, "backend": b, "parameters": names,
                   "sensitivity_error_control": sec}
            why = dead.get(b) or budget.refuse(PRIOR_FIRST_S[key])
            if why:
                row.update(status="skipped", note=why)
            elif b == "jax" and host_cpu() is not None:
                # the JAX joint solve is a chain of small dependent ops per step: on the GPU it
                # runs at launch latency (on an H200 it had not finished after 17 min), so the
                # JAX row of (d) is measured on this host's CPU and labelled so
                row["backend"] = "jax (host CPU)"
                with jax.default_device(host_cpu()):
                    dlnp[b, sec] = _grad_row(row, b, cfg, names, args.grad_batch, budget, sec)
            else:
                dlnp[b, sec] = _grad_row(row, b, cfg, names, args.grad_batch, budget, sec,
                                         args.device_inputs)
            if sec != 1.0:
                row["backend"] += " (SEC off)" if sec == 0.0 else f" (SEC weight {sec:g})"
            report.row("grad", row, _grad_line(row))
    for b in ("cuda", "jax"):
        for sec in secs[1:]:
            _agreement_line(report, f"grad_sec_{sec:g}_vs_{secs[0]:g}" + ("_jax" if b == "jax"
                                                                           else ""),
                            f"{b.upper()}, SEC weight {sec:g} vs {secs[0]:g}, same units",
                            dlnp.get((b, sec)), dlnp.get((b, secs[0])), names)
    _agreement_line(report, "grad_agreement",
                    "CUDA vs JAX ∂ln P_m/∂θ, max |difference| over k and z / the JAX "
                    "Jacobian's largest |∂ln P/∂θ| for that parameter",
                    dlnp.get(("cuda", secs[0])), dlnp.get(("jax", secs[0])), names)


def _sec_weights(choice: str, cfg) -> tuple:
    """The sensitivity error weights of (d)'s rows: "config" (the precision's
    ``sensitivity_error_weight``), "on" (1), "off" (0), "both" (1 and 0) or numbers, comma-separated."""
    named = {"config": (float(cfg.precision.sensitivity_error_weight),), "on": (1.0,),
             "off": (0.0,), "both": (1.0, 0.0)}
    if choice in named:
        return named[choice]
    try:
        return tuple(sec_weight(float(w)) for w in choice.split(","))
    except ValueError as err:
        raise SystemExit(f"--grad-sec {choice!r}: give config, on, off, both or weights in [0, 1] "
                         f"separated by commas ({err})") from None


def _agreement_line(report, key, title, got, ref, names):
    """Print and record ``gradient_agreement(got, ref)`` per parameter (when both exist)."""
    if got is None or ref is None:
        return
    err = gradient_agreement(got, ref)
    report.data[key] = dict(zip(names, err.tolist()))
    report.print(f"\n{title}: " + ", ".join(f"{n} {e:.1e}" for n, e in zip(names, err))
                 + f"; worst {err.max():.1e}")


def gradient_agreement(got, ref) -> np.ndarray:
    """Per parameter (last axis): max |got - ref| / max |ref| over every other axis."""
    got, ref = np.asarray(got), np.asarray(ref)
    axes = tuple(range(ref.ndim - 1))
    return np.abs(got - ref).max(axis=axes) / np.maximum(np.abs(ref).max(axis=axes), 1e-300)


def _grad_row(row, backend, cfg, names, batch, budget, sec=True, device_inputs=False):
    """Fills ``row``; returns ∂ln P_m/∂θ at the fiducial (None if the row failed)."""
    from boltzmann.gradients import PowerSpectrumFunction

    try:
        # the default chunks: one solve on CUDA (threads are independent), lock-step chunks
        # sorted by k on the JAX backend (one chunk would run every mode for the slowest one's
        # steps: about twice the warm Jacobian on the 2-core CPU)
        fn = PowerSpectrumFunction(cfg, parameters=names, backend=solver_backend(backend),
                                   sensitivity_error_control=sec)

        def value():
            return jax.block_until_ready(fn())

        def jac():
            return jax.block_until_ready(fn.jacobian())

        t = time.perf_counter()
        value()
        v_first = time.perf_counter() - t
        v_warm, _, _ = _warm_calls(value, v_first, min_total=1.0, max_repeats=3)
        t = time.perf_counter()
        val, jc = jac()
        j_first = time.perf_counter() - t
        j_warm, _, (val, jc) = _warm_calls(jac, j_first, min_total=1.0, max_repeats=3)
        finite = bool(np.all(np.isfinite(np.asarray(jc["P_m"]))))
        row["jacobian_stage_s"] = dict(fn.last_stage_seconds)
        if (device_inputs and getattr(fn, "inputs_on_host", False)
                and not budget.refuse(150.0 + 4 * j_warm)):
            row.update(_device_inputs_side_by_side(fn, value, jac))
        row.update(status="ok", value_first_s=v_first, value_warm_s=v_warm,
                   jacobian_first_s=j_first, jacobian_warm_s=j_warm,
                   ratio=j_warm / v_warm, jacobian_finite=finite)
        launches = _slowest_thread(fn, backend, sec) if backend == "cuda" else None
        if launches:
            row["launches"] = launches
        if batch > 1 and backend == "cuda" and not budget.refuse(6 * j_warm + 120.0):
            row.update(_batch_row(fn, batch, np.asarray(jc["P_m"])))
        row["note"] = "; ".join(
            ([] if finite else ["non-finite Jacobian entries (a mode failed)"])
            + ([launches["text"]] if launches else [])
            + ["Jacobian stages " + ", ".join(f"{k} {v:.2f}" for k, v in
                                              row["jacobian_stage_s"].items()) + " s"]
            + ([f"inputs on the GPU instead: value {row['device_inputs_value_warm_s']:.3f} s, "
                f"Jacobian {row['device_inputs_jacobian_warm_s']:.3f} s"]
               if "device_inputs_value_warm_s" in row else []))
        return np.asarray(jc["P_m"]) / np.asarray(val["P_m"])[..., None]
    except Exception as exc:
        row.update(status="error", note=_unavailable_reason(exc),
                   traceback=traceback.format_exc())
        return None


def _device_inputs_side_by_side(fn, value, jac) -> dict:
    """The same value and Jacobian with the inputs stage (tables, rows, initial states and their
    tangents) on the GPU instead of the host CPU (``PowerSpectrumFunction.inputs_on_host``):
    warm times after one compiling call each."""
    fn.inputs_on_host = False
    try:
        value()
        v_warm, _, _ = _warm_calls(value, 1.0, min_total=1.0, max_repeats=3)
        jac()
        j_warm, _, _ = _warm_calls(jac, 1.0, min_total=1.0, max_repeats=3)
        return {"device_inputs_value_warm_s": v_warm, "device_inputs_jacobian_warm_s": j_warm,
                "device_inputs_jacobian_stage_s": dict(fn.last_stage_seconds)}
    finally:
        fn.inputs_on_host = True


def _batch_row(fn, batch, jac_p_m) -> dict:
    """Value-and-Jacobian of ``batch`` cosmologies in one joint solve (C·K modes × directions
    in one launch, ``boltzmann.gradients_batch``): first call, warm time, cosmologies per second,
    and row 0 (the fiducial) against the single-cosmology Jacobian ``jac_p_m``."""
    from boltzmann.gradients_batch import PowerSpectrumBatch

    pb = PowerSpectrumBatch(fn)
    thetas = fn.theta0[None, :] * (1.0 + 0.01 * jnp.linspace(0.0, 1.0, batch)[:, None])
    t = time.perf_counter()
    pb.value_and_jacobian(thetas)
    first = time.perf_counter() - t
    warm, _, (val, jac) = _warm_calls(lambda: pb.value_and_jacobian(thetas), first,
                                      min_total=0.0, max_repeats=2)
    ref = np.asarray(jac_p_m)
    diff = np.abs(np.asarray(jac["P_m"])[0] - ref).max() / max(np.abs(ref).max(), 1e-300)
    return {"batch": batch, "batch_first_s": first, "batch_warm_s": warm,
            "value_and_jacobian_per_s": batch / warm,
            "batch_stage_s": dict(pb.last_stage_seconds),
            "batch_ok": int(np.sum(val["ok"])),
            "batch_vs_single_max_rel": float(diff)}


def _slowest_thread(fn, backend, sec) -> dict | None:
    """The sensitivity launch of ``fn``'s Jacobian, once more as an explicit joint solve: its
    threads' steps and which (k, parameter) the slowest thread integrated (a launch lasts as long
    as that thread)."""
    from solver import joint_solve

    prob = fn.sensitivity_problem()
    prob.pop("observables")
    _, _, info = joint_solve(**prob, backend=solver_backend(backend), sensitivity_error_control=sec)
    return launch_note(info, list(fn.parameters), fn.k)


def launch_note(info: dict, names, k) -> dict | None:
    """Summary of a CUDA joint solve's ``info`` (``solver.joint_solve``): the slowest thread's
    steps, its (k, parameter), the threads and the kernel seconds; None without thread data."""
    steps = info.get("thread_n_accepted")
    if steps is None:
        return None
    steps = np.asarray(steps)                       # (directions, trajectories)
    d, i = np.unravel_index(int(np.argmax(steps)), steps.shape)
    where = (f"k = {k[i]:.3g}/Mpc, {names[d]}" if i < len(k) and d < len(names)
             else f"trajectory {i}, direction {d}")
    kernel = (info.get("launch") or {}).get("kernel_seconds")
    rec = {"steps_max": int(steps.max()), "steps_median": float(np.median(steps)),
           "threads": int(steps.size), "slowest_trajectory": int(i), "slowest_direction": int(d),
           "kernel_seconds": kernel}
    rec["text"] = (f"tangent: max {rec['steps_max']} steps over {rec['threads']} threads"
                   + (f", kernel {kernel:.2f} s" if kernel is not None else "")
                   + f", slowest {where}")
    return rec


def _grad_line(r) -> str:
    if r["status"] != "ok":
        return f"| {r['backend']} | — | — | — | — | — | {_short(r['note'])} |"
    batch = (f"{r['batch_warm_s']:.2f} (B = {r['batch']}, one solve; first "
             f"{r['batch_first_s']:.0f} s; {r['batch_ok']}/{r['batch']} ok; row 0 vs single "
             f"{r['batch_vs_single_max_rel']:.1e})" if "batch_warm_s" in r else "—")
    per_s = f"{r['value_and_jacobian_per_s']:.3g}" if "value_and_jacobian_per_s" in r else "—"
    return (f"| {r['backend']} | {r['value_first_s']:.1f} / {r['value_warm_s']:.3f} | "
            f"{r['jacobian_first_s']:.1f} / {r['jacobian_warm_s']:.3f} | {r['ratio']:.2f} | "
            f"{batch} | {per_s} | {_short(r['note'], 260)} |")


# =========================================================================== main
def environment(report):
    import importlib.metadata as md

    dev = jax.devices()[0]
    env = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
           "python": sys.version.split()[0], "platform": platform.platform(),
           "jax_backend": dev.platform, "device": getattr(dev, "device_kind", str(dev)),
           "n_devices": jax.device_count(), "cpu_count": os.cpu_count()}
    for pkg in ("jax", "jaxlib", "diffrax", "numba-cuda-mlir", "numba-enzyme-cuda", "numpy"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    try:
        import diffrax
        env["diffrax_solver"] = "Rodas5p" if hasattr(diffrax, "Rodas5p") else "Kvaerno5"
    except ImportError:
        env["diffrax_solver"] = None
    from solver.backends import cuda_available
    env["cuda_available"] = list(cuda_available())
    report.data["env"] = env
    report.print(f"# bench_gpu {env['date']}: {env['device']} ({env['jax_backend']}, "
                 f"{env['n_devices']} device(s)), JAX {env['jax']}, diffrax {env['diffrax']} "
                 f"({env['diffrax_solver']}), numba-cuda-mlir {env['numba-cuda-mlir']}, "
                 f"numba-enzyme-cuda {env['numba-enzyme-cuda']}; CUDA backend: "
                 f"{'yes' if env['cuda_available'][0] else 'no'} ({env['cuda_available'][1]}); "
                 f"{platform.processor() or platform.machine()}, {env['cpu_count']} CPUs")


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="cuda,jax,diffrax",
                    help="comma-separated subset of cuda,jax,diffrax (diffrax only in part a)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="(a) lattice ensemble sizes (default 1000 10000 100000)")
    ap.add_argument("--cosmologies", type=int, nargs="+", default=None,
                    help="(b) cosmologies per launch (default 1 16 128 1024)")
    ap.add_argument("--parts", default="bca",
                    help="which parts to run, in this order (default bca: the ΛCDM ensembles "
                         "first, as they matter most; any of a, b, c, d)")
    ap.add_argument("--grad-batch", type=int, default=64,
                    help="(d) cosmologies in the batched value-and-Jacobian row (1: skip it)")
    ap.add_argument("--grad-sec", default="config",
                    help="(d) sensitivity error weight of the Jacobian rows: config (the "
                         "precision's sensitivity_error_weight), on (1), off (0), both (a row each "
                         "and their difference) or weights, e.g. 1,0.1,0 (docs/gradients.md)")
    ap.add_argument("--device-inputs", action="store_true",
                    help="(d): also time the value and Jacobian with their inputs stage on the GPU "
                         "instead of the host CPU")
    ap.add_argument("--config", default="lcdm", help="config for (b), (c), (d) (default lcdm; "
                    "lcdm_reduced: the reduced-precision model, n = 64)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and a reduced-precision EB model (smoke test)")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="global wall-time budget [s]; rows that would not fit are skipped")
    ap.add_argument("--row-limit", type=float, default=150.0,
                    help="skip a row projected to take longer than this [s]")
    ap.add_argument("--jax-max-cosmologies", type=int, default=16,
                    help="run the JAX backend in (b) only up to this many cosmologies")
    ap.add_argument("--no-work", action="store_true", help="skip the operation-count estimate")
    ap.add_argument("--out", metavar="DIR", default=None,
                    help="write bench_gpu.json and bench_gpu.md here")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in args.backends if b not in ALL_BACKENDS]
    if bad:
        raise SystemExit(f"bench_gpu: unknown backend(s) {bad}; choose from {ALL_BACKENDS}")
    if args.grad_batch < 1:
        raise SystemExit(f"bench_gpu: --grad-batch must be >= 1, got {args.grad_batch}")
    if args.sizes is None:
        args.sizes = [16, 64] if args.quick else [1000, 10000, 100000]
    if args.cosmologies is None:
        args.cosmologies = [1, 2] if args.quick else [1, 16, 128, 1024]
    report = Report(args.out)
    budget = Budget(args.budget, args.row_limit)
    from boltzmann.runtime import Settings, backend_for, configure

    settings = Settings.from_environment()
    configure(settings)  # float64, JAX's persistent compilation cache
    if "cuda" in args.backends:
        SOLVER_BACKENDS["cuda"] = backend_for("cuda", settings)
    work: dict = {}
    report.data["args"] = {k: v for k, v in vars(args).items()}
    report.data["work"] = work
    environment(report)
    report.print(f"budget {args.budget:.0f} s (row limit {args.row_limit:.0f} s); warm = median "
                 "of repeated calls after the first (compilation excluded); GFLOP/s from the "
                 "operation count per step x steps taken (accepted + rejected) / warm time of "
                 f"the solve; peak = H200 fp64 vector {H200_FP64_VECTOR / 1e12:.0f} TFLOP/s "
                 f"(tensor cores {H200_FP64_TENSOR / 1e12:.0f}, not usable by per-thread code)")
    cfg, dead = None, {}
    parts = [c for c in args.parts if c in "abcd"]
    try:
        for i, part in enumerate(parts):
            # every part but the last may use only its share of what is left
            budget.start_section(1.0 if i == len(parts) - 1 else SECTION_SHARE[part])
            if part == "a":
                run_vdp(args, report, budget, work)
            elif part == "b":
                cfg, dead = run_eb(args, report, budget, work)
            elif part == "c":
                run_one(args, report, budget, cfg or _eb_setup(args), dead)
            else:
                run_grad(args, report, budget, cfg or _eb_setup(args), dead)
            budget.end_section()
    finally:
        report.print(f"\ntotal wall time {budget.elapsed():.1f} s")
        report.data["total_s"] = budget.elapsed()
        report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
