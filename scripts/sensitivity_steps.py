"""Steps and accuracy of each parameter direction's sensitivity solve, with and without
sensitivity error control (SEC), on the JAX backend (any machine).

Why: on the CUDA backend every (mode, direction) pair is one thread, and a launch lasts as long as
its slowest thread, so the cost of the P(k) Jacobian is set by the direction that needs the most
steps at the highest k.  With SEC on a thread controls RMS_y² + RMS_s² and takes the steps its
sensitivity needs; with SEC off it takes exactly the plain solve's steps (docs/gradients.md).
This script measures, per parameter and k, both step counts (``joint_solve`` with m = 1: the
CUDA thread's error norm) and what SEC off costs in accuracy: the error of ∂ln P_m/∂θ (z of the
config's first save time, through the solve's states only — the table and initial-state paths do
not depend on SEC) against a reference solve with SEC on at ``rtol / --ref-factor``, in units of
that parameter's largest |∂ln P_m/∂θ| over the k given (the unit of the gradient tests' bounds).

    python scripts/sensitivity_steps.py --config lcdm --k 0.1 1 3 10 --ref-factor 30 --out DIR

(docs/gradients.md, the SEC section, has that run's table.)

Prints a Markdown table; ``--out DIR`` also writes sensitivity_steps.json.
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


def direction(prob, d):
    """The joint_solve tangents of parameter d alone (m = 1)."""
    return dict(dy0=prob["dy0"][d:d + 1], dparams=prob["dparams"][d:d + 1],
                dargs=prob["dargs"][d:d + 1])


def dlnp_from_states(prob, ys, dys, d):
    """∂ln P_m/∂θ_d (n_k,) at the first save time from the states' tangent dys (n_k, ns, n) plus
    the direction's row and table tangents: 2 δ̇_m / δ_m."""
    obs = prob["observables"]
    val, tan = jax.jvp(obs, (ys, prob["params"], prob["args"]),
                       (dys, prob["dparams"][d], prob["dargs"][d]))
    return np.asarray(2.0 * tan["d_m"][:, -1] / val["d_m"][:, -1])


def run(cfg_name, k_over_h, names, ref_factor, max_steps, sec_weights=(1.0, 0.0)):
    from boltzmann.gradients import PowerSpectrumFunction, available_parameters
    from boltzmann.params import load_config
    from solver import joint_solve

    cfg = load_config(cfg_name)
    names = names or list(available_parameters(cfg.cosmology))
    k = np.asarray(k_over_h, float) * float(cfg.cosmology.h)
    fn = PowerSpectrumFunction(cfg, parameters=names, k=k, z=[cfg.output.z[0]], n_chunks=1,
                               with_sigma8=False)
    prob = fn.sensitivity_problem()
    base = dict(args=prob["args"], t0=prob["t0"], atol=prob["atol"],
                error_weights=prob["error_weights"], max_steps=max_steps)
    rec = {"config": cfg_name, "k_h_per_Mpc": list(map(float, k_over_h)), "n": fn.model.n,
           "rtol": prob["rtol"], "ref_rtol": prob["rtol"] / ref_factor, "parameters": {}}

    def js(d, rtol, sec):
        t = time.perf_counter()
        ys, dys, info = joint_solve(prob["rhs"], prob["y0"], prob["t_save"], prob["params"],
                                    rtol=rtol, sensitivity_error_control=sec,
                                    **direction(prob, d), **base)
        if not np.all(info["status"] == 0):
            raise RuntimeError(f"{names[d]}: joint solve failed, statuses {info['status']}")
        return ys, dys[0], info, time.perf_counter() - t

    print(f"# {cfg_name}: n = {fn.model.n}, k = {list(k_over_h)} h/Mpc, rtol {prob['rtol']:g} "
          f"(reference: SEC on at {prob['rtol'] / ref_factor:g}); per SEC weight: steps per k, "
          "error", flush=True)
    labels = [f"{w:g}" for w in sec_weights]
    print("| parameter | " + " | ".join(f"steps, SEC {lb} | err SEC {lb}" for lb in labels)
          + " |\n|---|" + "---|---|" * len(labels), flush=True)
    for d, name in enumerate(names):
        out = {}
        for label, rtol, sec in ([(lb, prob["rtol"], w) for lb, w in zip(labels, sec_weights)]
                                 + [("ref", prob["rtol"] / ref_factor, 1.0)]):
            ys, dys, info, wall = js(d, rtol, sec)
            out[label] = dict(steps=(info["n_accepted"] + info["n_rejected"]).tolist(),
                              wall_s=wall, dlnp=dlnp_from_states(prob, ys, dys, d))
        ref = out["ref"]["dlnp"]
        scale = max(float(np.abs(ref).max()), 1e-300)
        row = {"scale": scale, "dlnp_ref": ref.tolist()}
        for label in labels:
            row[f"steps_{label}"] = out[label]["steps"]
            row[f"err_{label}"] = float(np.abs(out[label]["dlnp"] - ref).max() / scale)
        rec["parameters"][name] = row
        print(f"| {name} | " + " | ".join(f"{row['steps_' + lb]} | {row['err_' + lb]:.1e}"
                                          for lb in labels) + " |", flush=True)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--k", type=float, nargs="+", default=[0.05, 0.3, 1.0],
                    help="wavenumbers [h/Mpc], ascending (default 0.05 0.3 1)")
    ap.add_argument("--parameters", default=None,
                    help="comma-separated (default: every parameter the config has)")
    ap.add_argument("--ref-factor", type=float, default=100.0,
                    help="the reference solve's rtol is rtol / this (default 100)")
    ap.add_argument("--max-steps", type=int, default=200_000)
    ap.add_argument("--sec-weights", default="1,0",
                    help="comma-separated weights of the sensitivities in the error norm to "
                         "compare (1: SEC on, 0: off; default 1,0)")
    ap.add_argument("--out", default=None, help="directory for sensitivity_steps.json")
    a = ap.parse_args(argv)
    if sorted(a.k) != list(a.k) or min(a.k) <= 0:
        raise SystemExit("sensitivity_steps: --k must be positive and ascending")
    names = a.parameters.split(",") if a.parameters else None
    rec = run(a.config, a.k, names, a.ref_factor, a.max_steps,
              [float(w) for w in a.sec_weights.split(",")])
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "sensitivity_steps.json"), "w") as fh:
            json.dump(rec, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
