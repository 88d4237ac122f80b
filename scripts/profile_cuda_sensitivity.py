"""Per-step cost of the CUDA sensitivity kernel against the plain kernel, on the EB model.

Takes the end-to-end gradient case of tests/test_cuda_sensitivity.py (reduced-precision ΛCDM,
12 k from 1e-3 to 1 h/Mpc, 4 parameters) as ``PowerSpectrumFunction.sensitivity_problem()`` hands
it out -- the solve and tangents that the Jacobian runs -- and launches both kernels on truncated
time intervals (a fraction of each trajectory's span), so per-step costs come out in seconds even
when a full launch would take minutes. Prints and writes (``--out``) a JSON record: steps taken,
wall time per launch and the launches' own statistics (kernel seconds, compile, local memory and
registers per thread).

    python scripts/profile_cuda_sensitivity.py --out $OUT                 # the test's case
    python scripts/profile_cuda_sensitivity.py --config lcdm --out $OUT   # default model, n = 217
    python scripts/profile_cuda_sensitivity.py --emulate --fractions 0.001  # CPU, kernel text
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


def _scalars(info: dict) -> dict:
    return {k: v for k, v in (info or {}).items() if isinstance(v, (int, float, bool, str))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="h,omega_cdm,tau_reio,m_ncdm")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.02, 0.02, 0.1, 0.3])
    ap.add_argument("--config", default="lcdm_reduced",
                    help="a named config (lcdm_reduced: n = 64; lcdm: the default model, n = 217)")
    ap.add_argument("--emulate", action="store_true", help="CPU: the emulated kernels")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config
    from solver import CudaBackend, joint_solve, solve

    # the numba launch reports the kernel's local memory and registers with every solve
    backend = CudaBackend(launch="emulated" if a.emulate else "numba")
    cfg = load_config(a.config)
    k = np.logspace(-3.0, 0.0, 12) * float(cfg.cosmology.h)
    fn = PowerSpectrumFunction(cfg, parameters=tuple(a.params.split(",")), k=k, z=[0.0],
                               n_chunks=1, with_sigma8=False)
    prob = fn.sensitivity_problem()
    y0, params = np.asarray(prob["y0"]), np.asarray(prob["params"])
    N = y0.shape[0]
    t0 = np.broadcast_to(np.asarray(prob["t0"], float), (N,))
    ts = np.asarray(prob["t_save"], float)
    t_last = ts[:, -1] if ts.ndim == 2 else np.full(N, ts[-1])
    common = dict(args=prob["args"], rtol=prob["rtol"], atol=prob["atol"],
                  error_weights=prob["error_weights"], max_steps=prob["max_steps"],
                  backend=backend)
    rec = {"config": a.config, "N": N, "n": int(y0.shape[1]),
           "directions": int(np.asarray(prob["dparams"]).shape[0]), "runs": []}
    print(json.dumps({k_: v for k_, v in rec.items() if k_ != "runs"}), flush=True)
    for frac in a.fractions:
        te = t0 + frac * (t_last - t0)
        for kind in ("plain", "sens"):
            t = time.perf_counter()
            if kind == "sens":
                _, _, info = joint_solve(prob["rhs"], y0, te[:, None], params, dy0=prob["dy0"],
                                         dparams=prob["dparams"], dargs=prob["dargs"], t0=t0,
                                         t_end=te, **common)
                steps = info["thread_n_accepted"] + info["thread_n_rejected"]
                status, launch = info["thread_status"], info["launch"]
            else:
                sol = solve(prob["rhs"], y0, te[:, None], params, t0=t0, t_end=te, **common)
                steps = np.asarray(sol.n_accepted) + np.asarray(sol.n_rejected)
                status, launch = sol.status, sol.info
            wall = time.perf_counter() - t
            row = dict(kind=kind, fraction=frac, wall_s=wall, steps_max=int(steps.max()),
                       steps_median=float(np.median(steps)),
                       ms_per_step_of_slowest=1e3 * wall / max(int(steps.max()), 1),
                       statuses=np.unique(status).tolist(), launch=_scalars(launch))
            rec["runs"].append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "profile_cuda_sensitivity.json"), "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
