#!/usr/bin/env python
"""One GPU process for the issue-4 numbers: the main job on the CUDA backend, then bench_gpu.

    python scripts/gpu_session.py --out DIR [--budget S] [bench_gpu options after --]

Running both in one process compiles the Einstein-Boltzmann CUDA kernel once (the model and the
solver plan are cached by structure), which is what a device call with a wall-clock limit needs.
Writes DIR/cuda_main (pk.csv, tk.csv, summary.json of scripts/transfer.py --backend cuda) and
bench_gpu's DIR/bench_gpu.{json,md}.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything")
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--skip-main", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = Path(args.out)
    if not args.skip_main:
        from boltzmann import cli
        for attempt in ("first", "warm"):
            t = time.perf_counter()
            code = cli.main(["--config", args.config, "--backend", "cuda", "--no-plot",
                             "--out", str(out / f"cuda_main_{attempt}")])
            print(f"main job ({attempt}, --backend cuda): exit {code}, "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
            if code != 0:
                break
    import bench_gpu
    left = args.budget - (time.time() - t0)
    bench_gpu.main(["--out", str(out), "--budget", f"{max(left, 10):.0f}", *rest])


if __name__ == "__main__":
    main()
