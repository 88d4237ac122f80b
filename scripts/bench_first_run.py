#!/usr/bin/env python
"""Time to first result: the main job in fresh processes, first with an empty cache, then again.

Each run is a new process (``python scripts/transfer.py --config ... --cache-dir DIR``), as a user
or a sampler's worker starts it; the first finds an empty cache (everything compiles), the later
ones find what the first stored. Prints a Markdown table (wall seconds, peak memory of the process)
and writes ``first_run.json`` with ``--out``.

    python scripts/bench_first_run.py --config lcdm                       # 2 runs, CPU or auto
    python scripts/bench_first_run.py --config lcdm --backend cuda --runs 2 --out DIR
    python scripts/bench_first_run.py --config lcdm --gradients
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: runs a script and, at exit, writes the process's own peak RSS [kB] to the file named first
_WRAP = ("import atexit, resource, runpy, sys; f = sys.argv.pop(1); "
         "atexit.register(lambda: open(f, 'w').write(str(resource.getrusage("
         "resource.RUSAGE_SELF).ru_maxrss))); sys.argv.pop(0); "
         "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_once(args, cache_dir: Path, out_dir: Path) -> dict:
    """One job in a fresh process: wall seconds, peak RSS [MB], exit code, last lines."""
    rss_file = out_dir.parent / f"{out_dir.name}.rss"
    cmd = [sys.executable, "-c", _WRAP, str(rss_file), str(REPO / "scripts" / "transfer.py"),
           "--config", args.config,
           "--backend", args.backend, "--cache-dir", str(cache_dir), "--out", str(out_dir),
           "--no-plot"] + (["--gradients"] if args.gradients else [])
    env = {k: v for k, v in os.environ.items() if k not in ("BOLTZMANN_CACHE",)}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.perf_counter() - t
    peak = float(rss_file.read_text()) if rss_file.is_file() else None
    summary = out_dir / "summary.json"
    record = json.loads(summary.read_text()) if summary.is_file() else {}
    return {"wall_s": wall, "max_rss_mb": None if peak is None else peak / 1024.0,
            "rc": proc.returncode, "sigma8": record.get("sigma8"),
            "stages_s": record.get("timings_s"), "solver_stats": record.get("solver_stats"),
            # the Jacobian's own stages (inputs, solve, outputs) and, on CUDA, the sensitivity
            # kernel's compile or cache-load seconds: where a --gradients run waits
            "gradients": {k: v for k, v in (record.get("gradients") or {}).items()
                          if k in ("seconds", "stage_seconds", "sensitivity_kernel")},
            "tail": (proc.stdout + proc.stderr).strip().splitlines()[-12:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="lcdm")
    parser.add_argument("--backend", default="auto", choices=("auto", "jax", "cuda"))
    parser.add_argument("--gradients", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cache-dir", help="cache folder (default: a new empty one)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", help="folder for first_run.json")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_first_run_"))
    cache = Path(args.cache_dir) if args.cache_dir else work / "cache"
    rows = []
    for i in range(args.runs):
        empty = not cache.is_dir() or not any(cache.iterdir())
        row = run_once(args, cache, work / f"out{i}")
        row["run"] = i + 1
        row["cache"] = "empty" if empty else "warm"
        rows.append(row)
        print(f"run {i + 1}: {row['wall_s']:.1f} s, peak {row['max_rss_mb'] or float('nan'):.0f} MB,"
              f" rc {row['rc']}; stages [s]: " + ", ".join(
                  f"{k} {v:.1f}" for k, v in (row["stages_s"] or {}).items())
              + "".join(f"; gradients' {k} {v:.1f}" for k, v in (
                  row["gradients"].get("stage_seconds") or {}).items()), flush=True)
        if row["rc"] != 0:
            print("\n".join(row["tail"]), flush=True)
            break
    same = len({json.dumps(r["sigma8"]) for r in rows if r["rc"] == 0}) <= 1
    machine = os.environ.get("BENCH_MACHINE") or f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    what = f"{args.config}{' --gradients' if args.gradients else ''}, backend {args.backend}"
    print(f"\n{what}; {machine}; {datetime.date.today()}; "
          f"`python scripts/bench_first_run.py --config {args.config} --backend {args.backend}"
          f"{' --gradients' if args.gradients else ''} --runs {args.runs}`")
    print("| run | cache | wall [s] | peak RSS [MB] | σ8 identical |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['cache']} | "
              f"{r['wall_s']:.1f} | {r['max_rss_mb'] or float('nan'):.0f} | {same} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "first_run.json").write_text(json.dumps(
            {"what": what, "machine": machine, "date": str(datetime.date.today()), "rows": rows},
            indent=1))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
