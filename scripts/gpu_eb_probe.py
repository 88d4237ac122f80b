#!/usr/bin/env python
"""Compile-time and first-run probe of the CUDA backend on the Einstein-Boltzmann model.

    python scripts/gpu_eb_probe.py [--sizes small,default] [--nk 8]

For each model size (``small``: ℓmax 8/6/8, one massive ν with 3 momentum nodes and ℓmax 6;
``default``: configs/lcdm.yaml's precision) runs the full pipeline (background, thermodynamics,
perturbations, transfers) with backend="cuda" on a few k modes, twice (first call = compile + run,
second = warm), and prints stage timings, kernel info (local memory, registers) and step counts,
flushing as it goes so that a time-limited run still reports what finished.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.time()
SIZES = {"small": dict(l_max_g=8, l_max_pol_g=6, l_max_ur=8, l_max_ncdm=6, n_q_ncdm=3),
         "default": {}}


def log(*args):
    print(f"[{time.time() - T0:7.1f} s]", *args, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="small,default")
    ap.add_argument("--nk", type=int, default=8)
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args(argv)

    import yaml

    from boltzmann import pipeline
    from boltzmann.params import load_config

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/lcdm.yaml").read_text())
    for size in args.sizes.split(","):
        raw["precision"] = dict(SIZES[size])
        raw["output"] = {"z": [0.0], "k_min": 1e-4, "k_max": 1.0,
                         "k_per_decade": max(1, (args.nk - 1) // 4)}
        cfg = load_config(raw)
        for attempt in ("first", "warm"):
            t = time.perf_counter()
            res = pipeline.run(cfg, backend=args.backend)
            wall = time.perf_counter() - t
            st = res.solver_stats
            log(f"{size} {attempt}: wall {wall:.2f} s, n_k {st['n_k']}, n {st['state_size']}, "
                f"backend {res.backend}, steps median {st['accepted_steps_median']} max "
                f"{st['accepted_steps_max']}, failed {st['failed_k']}")
            log("   timings", {k: round(v, 3) for k, v in res.timings.items()})
            log("   solver info", st.get("solver_info"))
            d_m = res.transfers[0.0]["d_m"]
            log("   d_m[z=0]", np.array2string(np.asarray(d_m), precision=6))


if __name__ == "__main__":
    main()
