#!/usr/bin/env python
"""Wall time of CLASS and of our main job for the same output, side by side on this machine.

    nice -n 5 python scripts/bench_class.py [--config configs/lcdm.yaml] [--repeat 1] [--json FILE]

For the config's cosmology and output (P_m and P_cb at the config's redshifts on its k grid up to
k_max), in one run:
  (a) CLASS through classy, output mPk,mTk, at CLASS's default precision and at the raised
      precision of the references (tests/data/generate.py PRECISION_CLASS), each timed as wall and
      CPU seconds of compute() plus reading P_m, P_cb on the k grid;
  (b) our main job, ``python scripts/transfer.py --config ... --out <tmp> --no-plot --quiet`` as a
      subprocess (wall and CPU of the child, incl. Python start-up, imports and JIT compilation),
      with the per-stage times from its summary.json.
The 1-minute load average (os.getloadavg) before each measurement is printed: on a shared machine
other processes inflate wall times (CPU time is less affected).  Both codes use threads: CLASS
3.x parallelises over k with its own thread pool, XLA over its ops; CPU > wall means both
cores worked.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tests" / "data"))
from class_precision import PRECISION_CLASS as PRECISION_HIGH  # noqa: E402  the references' one


def _join(v):
    return ",".join(f"{x:.10g}" for x in v)


def class_params(cfg) -> dict:
    """CLASS input for a loaded Config (cosmology resolved by boltzmann.params)."""
    c = cfg.cosmology
    pars = {"h": float(c.h), "omega_b": float(c.omega_b), "omega_cdm": float(c.omega_cdm),
            "A_s": float(c.A_s), "n_s": float(c.n_s), "k_pivot": float(c.k_pivot),
            "tau_reio": float(c.tau_reio), "YHe": float(c.YHe), "T_cmb": float(c.T_cmb),
            "N_ur": float(c.N_ur)}
    if c.n_ncdm:
        t = np.broadcast_to(np.asarray(c.T_ncdm, float), (c.n_ncdm,))
        pars.update(N_ncdm=c.n_ncdm, m_ncdm=_join(np.asarray(c.m_ncdm)),
                    deg_ncdm=_join(np.asarray(c.deg_ncdm)), T_ncdm=_join(t))
    if c.use_fld:
        pars.update(Omega_Lambda=0.0, w0_fld=float(c.w0_fld), wa_fld=float(c.wa_fld),
                    cs2_fld=float(c.cs2_fld), use_ppf="yes" if c.use_ppf else "no")
    zs = [float(z) for z in cfg.output.z]
    k = cfg.output.k_grid(float(c.h))
    pars.update({"output": "mPk,mTk", "gauge": "synchronous", "z_pk": _join(zs),
                 "P_k_max_1/Mpc": 1.01 * float(np.max(k))})
    return pars


def time_class(pars: dict, k, zs, has_cb: bool) -> dict:
    from classy import Class
    load = os.getloadavg()[0]
    M = Class()
    M.set(pars)
    t0, c0 = time.perf_counter(), time.process_time()
    M.compute()
    pk = {z: np.array([M.pk_lin(kk, z) for kk in k]) for z in zs}
    if has_cb:
        pk.update({(z, "cb"): np.array([M.pk_cb_lin(kk, z) for kk in k]) for z in zs})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"wall_s": wall, "cpu_s": cpu, "load1_before": load, "sigma8": float(M.sigma8())}
    if has_cb:
        out["sigma8_cb"] = float(M.sigma8_cb())
    M.struct_cleanup()
    M.empty()
    return out


def time_ours(config: str) -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as tmp:
        cmd = [sys.executable, str(REPO / "scripts" / "transfer.py"), "--config", config,
               "--out", tmp, "--no-plot", "--quiet"]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"main job failed ({proc.returncode}): {proc.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load1_before": load, "command": " ".join(cmd[1:]),
            "stages_s": summary.get("timings_s", {}), "sigma8": summary.get("sigma8"),
            "sigma8_cb": summary.get("sigma8_cb"), "n_k": summary.get("n_k")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/lcdm.yaml")
    ap.add_argument("--repeat", type=int, default=1, help="repeat the whole comparison N times")
    ap.add_argument("--skip-ours", action="store_true", help="time CLASS only")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)

    import classy
    from boltzmann.params import load_config
    cfg = load_config(REPO / args.config if not Path(args.config).is_absolute() else args.config)
    k = cfg.output.k_grid(float(cfg.cosmology.h))
    zs = [float(z) for z in cfg.output.z]
    has_cb = cfg.cosmology.n_ncdm > 0
    base = class_params(cfg)
    runs = []
    for rep in range(args.repeat):
        res = {"class_default": time_class(base, k, zs, has_cb),
               "class_high": time_class({**base, **PRECISION_HIGH}, k, zs, has_cb)}
        if not args.skip_ours:
            res["ours"] = time_ours(args.config)
        runs.append(res)
        print(f"\nrun {rep + 1}/{args.repeat}: {args.config}, {len(k)} k values "
              f"({k[0]:.3g}..{k[-1]:.3g} 1/Mpc), z = {zs}")
        print(f"{'code':<22}{'wall [s]':>10}{'CPU [s]':>10}{'load1':>8}{'sigma8':>11}")
        for name, r in res.items():
            s8 = r["sigma8"]
            s8 = s8.get("0", next(iter(s8.values()))) if isinstance(s8, dict) else s8
            print(f"{name:<22}{r['wall_s']:>10.2f}{r['cpu_s']:>10.2f}{r['load1_before']:>8.2f}"
                  f"{s8:>11.6f}")
        if "ours" in res:
            st = res["ours"]["stages_s"]
            print("ours, stages [s]: " + ", ".join(f"{s} {t:.2f}" for s, t in st.items()))
    meta = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
            "classy": classy.__version__, "python": platform.python_version(),
            "config": args.config, "n_k": int(len(k)), "z": zs,
            "class_input": base, "class_high_precision": PRECISION_HIGH, "runs": runs}
    try:
        import jax
        meta["jax"] = jax.__version__
    except ImportError:
        pass
    if args.json:
        Path(args.json).write_text(json.dumps(meta, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
