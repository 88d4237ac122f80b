"""Per-step cost of the CUDA sensitivity kernel against the plain kernel, on the EB model.

Runs the end-to-end gradient case of tests/test_cuda_sensitivity.py (reduced-precision ΛCDM,
12 k from 1e-3 to 1 h/Mpc, 4 parameters), intercepts the sensitivity launch that
``PowerSpectrumFunction.dlnpk()`` makes, and instead launches both kernels on truncated time
intervals (a fraction of each trajectory's span), so per-step costs come out in seconds even
when a full launch would take minutes.  Prints and writes (``--out``) a JSON record:
compile times, local memory and registers per thread, steps taken and wall time per launch.

    python scripts/profile_cuda_sensitivity.py --out $OUT                 # the test's case
    python scripts/profile_cuda_sensitivity.py --config lcdm --out $OUT   # default model, n = 217

On the device set BOLTZMANN_CUDA_LAUNCH=numba. With the FFI launch, this script's direct
``solve`` call (made after an exception escaped a host callback) failed with "No FFI handler
registered for boltzmann_rodas_solve on a platform Host" (H200, 2026-11-30; not investigated).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)


class _Captured(Exception):
    pass


def _case(params, config=None):
    """The end-to-end GPU test's case: ``config`` (default configs/lcdm_reduced.yaml) on 12 k
    from 1e-3 to 1 h/Mpc at z = 0."""
    from boltzmann.params import load_config

    cfg = load_config(config or "lcdm_reduced")
    k = np.logspace(-3.0, 0.0, 12) * float(cfg.cosmology.h)
    return cfg, dict(parameters=params, k=k, z=[0.0], n_chunks=1, with_sigma8=False)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="h,omega_cdm,tau_reio,m_ncdm")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.02, 0.02, 0.1, 0.3])
    ap.add_argument("--config", default=None,
                    help="a named config (default lcdm_reduced, n = 64; lcdm: the default model, n = 217)")
    ap.add_argument("--emulate", action="store_true", help="CPU: the emulated kernels")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from boltzmann.gradients import PowerSpectrumFunction
    from solver import cuda_backend as cb

    if a.emulate:
        cb._cuda_modules = lambda: None
        cb._solve_numba = cb._emulate_plain
    real = cb.sensitivity_emulated if a.emulate else cb.solve_sensitivities
    captured = {}

    def capture(rhs, y0, t_save, params, **kw):
        captured.update(rhs=rhs, y0=np.asarray(y0), t_save=np.asarray(t_save),
                        params=np.asarray(params), kw=kw)
        raise _Captured

    cb.solve_sensitivities = capture
    cfg, kw = _case(tuple(a.params.split(",")), a.config)
    fn = PowerSpectrumFunction(cfg, backend="cuda", **kw)
    t = time.perf_counter()
    jax.block_until_ready(fn())
    rec = {"value_first_s": time.perf_counter() - t, "runs": []}
    try:
        fn.dlnpk()
    except Exception as exc:   # the callback wraps it
        if not captured:
            raise
        del exc
    c = captured
    kw = dict(c["kw"])
    t0 = np.broadcast_to(np.asarray(kw.pop("t0"), float), (c["y0"].shape[0],))
    kw.pop("t_end", None)
    ts = np.asarray(c["t_save"], float)
    ts2 = ts if ts.ndim == 2 else np.broadcast_to(ts, (c["y0"].shape[0], ts.size))
    rec.update(N=int(c["y0"].shape[0]), n=int(c["y0"].shape[1]),
               directions=int(np.asarray(kw["dparams"] if kw.get("dparams") is not None
                                         else kw["s0"]).shape[0]))
    print(json.dumps({k: v for k, v in rec.items() if k != "runs"}), flush=True)
    plain_kw = {k: kw[k] for k in ("args", "rtol", "atol", "error_weights", "max_steps",
                                   "controller", "tableau", "sparsity") if k in kw}
    from solver import solve

    for frac in a.fractions:
        te = t0 + frac * (ts2[:, -1] - t0)
        tsv = te[:, None] * np.ones((1, 1))
        for kind in ("plain", "sens"):
            t = time.perf_counter()
            if kind == "sens":
                r = real(c["rhs"], c["y0"], tsv, c["params"], t0=t0, t_end=te, **kw)
                steps = np.asarray(r.n_accepted) + np.asarray(r.n_rejected)
                info = {k: v for k, v in r.info.items() if isinstance(v, (int, float, bool))}
                status = np.asarray(r.status)
            else:
                sol = solve(c["rhs"], c["y0"], tsv, c["params"], t0=t0, t_end=te,
                            backend="jax" if a.emulate else "cuda", **plain_kw)
                steps = np.asarray(sol.n_accepted) + np.asarray(sol.n_rejected)
                info = {k: v for k, v in (sol.info or {}).items()
                        if isinstance(v, (int, float, bool))}
                status = np.asarray(sol.status)
            wall = time.perf_counter() - t
            row = dict(kind=kind, fraction=frac, wall_s=wall, steps_max=int(steps.max()),
                       steps_median=float(np.median(steps)),
                       ms_per_step_of_slowest=1e3 * wall / max(int(steps.max()), 1),
                       statuses=np.unique(status).tolist(), info=info)
            rec["runs"].append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "profile_cuda_sensitivity.json"), "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
