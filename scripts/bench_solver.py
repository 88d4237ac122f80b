"""Benchmark the JAX backend on the stiff van der Pol lattice ensemble (64 variables).

Side by side in one run, same tolerances: our Rodas5P ensemble solve (JAX backend), scipy's Radau
looping over trajectories (timed on a subset and scaled, since it is serial), and diffrax
(Rodas5p if the installed diffrax has it, else Kvaerno5) vmapped over the ensemble.
Prints wall times and ratios; the numbers in docs/benchmarks.md come from this script.

    python scripts/bench_solver.py [--n 256 1024] [--rtol 1e-6] [--radau-subset 4]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

# the stiff test problems live with the solver's tests
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from solver import solve  # noqa: E402
from stiff_problems import van_der_pol_lattice  # noqa: E402

T_END = 3.0


def _params(N, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(3.0, 10.0, N), rng.uniform(0.1, 3.0, N)])


def bench_ours(prob, params, rtol, atol):
    y0 = np.broadcast_to(prob.y0, (len(params), prob.n))
    ts = np.array([0.0, T_END])
    t0 = time.perf_counter()
    sol = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    np.asarray(sol.ys)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    np.asarray(sol.ys)
    warm = time.perf_counter() - t0
    assert np.all(sol.ok), sol.failures()[:5]
    return first, warm, sol


def bench_radau(prob, params, rtol, atol, subset):
    from scipy.integrate import solve_ivp
    jac = jax.jit(jax.jacfwd(lambda y, p: jnp.stack(prob.rhs(y, 0.0, p))))
    f = jax.jit(lambda y, p: jnp.stack(prob.rhs(y, 0.0, p)))
    jac(jnp.asarray(prob.y0), jnp.asarray(params[0])).block_until_ready()
    t0 = time.perf_counter()
    for p in params[:subset]:
        pj = jnp.asarray(p)
        r = solve_ivp(lambda t, y: np.asarray(f(y, pj)), (0.0, T_END), prob.y0, method="Radau",
                      rtol=rtol, atol=atol, jac=lambda t, y: np.asarray(jac(y, pj)))
        assert r.success
    return (time.perf_counter() - t0) / subset


def bench_diffrax(prob, params, rtol, atol):
    try:
        import diffrax
    except ImportError:
        return None, "diffrax not installed"
    solver_cls = getattr(diffrax, "Rodas5p", None) or getattr(diffrax, "Kvaerno5")
    name = solver_cls.__name__

    def one(p):
        term = diffrax.ODETerm(lambda t, y, args: jnp.stack(prob.rhs(y, t, args)))
        sol = diffrax.diffeqsolve(term, solver_cls(), 0.0, T_END, None, jnp.asarray(prob.y0),
                                  args=p, stepsize_controller=diffrax.PIDController(
                                      rtol=rtol, atol=atol), max_steps=100_000,
                                  saveat=diffrax.SaveAt(t1=True))
        return sol.ys[-1]

    f = jax.jit(jax.vmap(one))
    t0 = time.perf_counter()
    f(jnp.asarray(params)).block_until_ready()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    f(jnp.asarray(params)).block_until_ready()
    return (first, time.perf_counter() - t0), name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--radau-subset", type=int, default=4)
    ap.add_argument("--no-diffrax", action="store_true")
    args = ap.parse_args()
    prob = van_der_pol_lattice(32)
    rtol, atol = args.rtol, args.rtol
    dev = jax.devices()[0]
    print(f"# bench_solver: {prob.name} (n={prob.n}), t in [0, {T_END}], rtol=atol={rtol}; "
          f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind}); "
          f"{platform.processor() or platform.machine()}, {jax.local_device_count()} device(s)")
    print("| N | ours first call [s] | ours warm [s] | steps median/max | scipy Radau [s] "
          "(scaled) | diffrax [s] warm | Radau/ours | diffrax/ours |")
    print("|---|---|---|---|---|---|---|---|")
    for N in args.n:
        params = _params(N)
        first, warm, sol = bench_ours(prob, params, rtol, atol)
        radau = bench_radau(prob, params, rtol, atol, args.radau_subset) * N
        if args.no_diffrax:
            dfx, name = None, "skipped"
        else:
            dfx, name = bench_diffrax(prob, params, rtol, atol)
        d_warm = dfx[1] if dfx else float("nan")
        print(f"| {N} | {first:.2f} | {warm:.2f} | {np.median(sol.n_accepted):.0f}/"
              f"{sol.n_accepted.max()} | {radau:.1f} | {d_warm:.2f} ({name}) | "
              f"{radau / warm:.1f}x | {d_warm / warm:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
