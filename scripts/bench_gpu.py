"""The GPU benchmark: every backend side by side, in one process.

(a) Stiff ensembles: the 64-variable van der Pol lattice (tests/stiff_problems.py, t in [0, 3], the
    problem of scripts/bench_solver.py) at N = 1e3, 1e4, 1e5 trajectories: our CUDA backend vs our
    JAX backend vs diffrax (Rodas5p if the installed diffrax has it, else Kvaerno5), same
    rtol = atol.
(b) ΛCDM P(k) (configs/lcdm.yaml: one 0.06 eV neutrino, default precision, its k grid and
    redshifts) for 1, 16, 128, 1024 cosmologies per launch through boltzmann/ensemble.py
    (fiducial_ensemble: ±5% Latin hypercube in omega_b, omega_cdm, h, n_s, A_s), CUDA vs JAX;
    at each ``--k-solve-stride`` (precision.k_solve_stride: every mode solved, or every N-th
    above k_solve_dense_below and P splined there; default the config's), a row each.
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

Part (d) is scripts/bench_grad.py; the report, budget and timing helpers all parts share are
scripts/bench_report.py.

    python scripts/bench_gpu.py --out $OUT                  # the GPU run (all defaults)
    python scripts/bench_gpu.py --backends jax --quick      # CPU smoke test (tiny sizes)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("JAX_ENABLE_X64", "1")
# numba (the CUDA backend) allocates next to XLA: do not let XLA take 75% of the GPU up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the parts shared with bench_grad.py (part (d)) live next to this script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the stiff test problems (van der Pol lattice) live with the solver's tests
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

from bench_grad import run_grad  # noqa: E402
from bench_report import (PRIOR_FIRST_S, SOLVER_BACKENDS, Budget, Report, _fmt,  # noqa: E402
                          _gflops, _print_work, _short, _unavailable_reason, _warm_calls,
                          project, solver_backend)
from solver.cost import work_estimate  # noqa: E402

#: H200 SXM fp64 peaks [FLOP/s] (NVIDIA datasheet): vector units, and DMMA tensor cores
H200_FP64_VECTOR = 34e12
H200_FP64_TENSOR = 67e12

VDP_T_END = 3.0
VDP_TOL = 1e-6
ALL_BACKENDS = ("cuda", "jax", "diffrax")

#: share of the remaining budget a part may use when other parts follow it
SECTION_SHARE = {"a": 0.5, "b": 0.75, "c": 0.3, "d": 0.6}


# =========================================================================== (a) VdP lattice
def _vdp_params(N, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(3.0, 10.0, N), rng.uniform(0.1, 3.0, N)])


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


def _with_stride(cfg, stride: int):
    """``cfg`` with precision.k_solve_stride = ``stride`` (k_solve_dense_below its own)."""
    return dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision,
                                                                  k_solve_stride=int(stride)))


def _solved_modes(cfg) -> int:
    """Modes a launch solves per cosmology at the config's k_solve_stride (the fiducial's grid)."""
    from boltzmann import k_sampling

    h = float(cfg.cosmology.h)
    k = cfg.output.k_grid(h)
    k_h = cfg.output.k_grid(1.0) if cfg.output.k_values is None else None
    return int(k_sampling.choose(k[None], k_h, [h], cfg.precision).solved.size)


def run_eb(args, report, budget, work):
    from boltzmann import ensemble

    cfg = _eb_setup(args)
    K = len(cfg.output.k_grid(float(cfg.cosmology.h)))
    strides = args.k_solve_stride or [int(cfg.precision.k_solve_stride)]
    backends = [b for b in args.backends if b in ("cuda", "jax")]
    report.print(f"\n## (b) ΛCDM P(k): {args.config}{' (quick: reduced precision)' if args.quick else ''}"
                 f", {K} k, z = {list(cfg.output.z)}, rtol {cfg.precision.rtol:g}; cosmologies "
                 f"per launch {args.cosmologies}; fiducial_ensemble ±5%; k_solve_stride "
                 f"{strides} above {cfg.precision.k_solve_dense_below:g} h/Mpc (trajectories: "
                 f"the solved modes)")
    w = None if args.no_work else _eb_work(cfg, report, work)
    report.print("| cosmologies | k stride | backend | trajectories | first call [s] | "
                 "warm [ms/launch] | ms/cosmology | cosmologies/s | trajectories/s | steps "
                 "median / max | tables / ICs / solve / spectra [ms] | GFLOP/s (est.) | note |")
    report.print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = report.data["eb"]
    dead = {}
    for C, b, stride in ((C, b, s) for C in args.cosmologies for b in backends
                         for s in strides):
        cosmos = ensemble.fiducial_ensemble(C, cfg)
        run_cfg = _with_stride(cfg, stride)
        key = f"eb:{b}"
        row = {"key": key, "size": C, "backend": b, "k_solve_stride": stride,
               "trajectories": C * _solved_modes(run_cfg)}
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
                _eb_row(row, b, run_cfg, cosmos, w, dead)
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
               trajectories_per_s=res.transfers.k.size / warm,
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
        return (f"| {r['size']} | {r.get('k_solve_stride', 1)} | {r['backend']} | "
                f"{r['trajectories']} | — | — | — | — | — | — | — | — | {_short(r['note'])} |")
    return (f"| {r['size']} | {r.get('k_solve_stride', 1)} | {r['backend']} | "
            f"{r['trajectories']} | {r['first_s']:.1f} | "
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
    ap.add_argument("--k-solve-stride", type=int, nargs="+", default=None, metavar="N",
                    help="(b) precision.k_solve_stride of the ensemble rows, a row per value "
                         "(e.g. 1 4: every mode solved against every 4th above "
                         "k_solve_dense_below; default: the config's)")
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
    if args.k_solve_stride and any(not 1 <= n <= 16 for n in args.k_solve_stride):
        raise SystemExit(f"bench_gpu: --k-solve-stride values must be in 1..16 "
                         f"(precision.k_solve_stride), got {args.k_solve_stride}")
    if args.grad_batch < 1:
        raise SystemExit(f"bench_gpu: --grad-batch must be >= 1, got {args.grad_batch}")
    if args.sizes is None:
        args.sizes = [16, 64] if args.quick else [1000, 10000, 100000]
    if args.cosmologies is None:
        args.cosmologies = [1, 2] if args.quick else [1, 16, 128, 1024]
    report = Report(args.out)
    budget = Budget(args.budget, args.row_limit)
    from boltzmann.runtime import Settings, backend_for, configure, host_pool_description

    settings = Settings.from_environment()
    configure(settings)  # float64, JAX's persistent compilation cache
    if "cuda" in args.backends:
        SOLVER_BACKENDS["cuda"] = backend_for("cuda", settings)
    work: dict = {}
    report.data["args"] = {k: v for k, v in vars(args).items()}
    #: XLA:CPU's pool size (None: JAX's own, a thread per CPU; runtime.ACCELERATOR_HOST_THREADS)
    report.data["host_threads"] = settings.host_threads
    report.data["work"] = work
    environment(report)
    report.print(f"XLA:CPU pool: {host_pool_description(settings.host_threads)}")
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
