#!/usr/bin/env python
"""Compile a config's warp kernels for a GPU architecture without a GPU, and report their cost.

numba-cuda-mlir compiles to PTX and links a cubin without touching a device once it is told the
compute capability, so the kernels' compile time, registers, stack and spills (``ptxas -v``) can
be measured on a development machine: a check of the generated text before any device time is
spent.  Needs numba-cuda-mlir importable (on the CPU machine: Python 3.12 with the unpacked
``shared/device/b.tar.xz`` on PYTHONPATH) and, for the resource report, a CUDA ``ptxas`` that
reads the PTX version numba-cuda-mlir writes (``--ptxas``).

    PYTHONPATH=/tmp/devb python3.12 scripts/compile_warp_kernels.py --config lcdm --ptxas PTXAS
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def examples(plan, n, P, table):
    """Argument values with the kernels' types (tiny shapes) for ``kernel`` and ``sens_kernel``."""
    f, i32 = np.zeros, np.int32
    plain = [f((1, n)), f(1), f(1), f((1, 1)), f((1, P)), table, 1e-5, f(n), f((1, n)), f(1), 1.0,
             f((1, 1, n)), f(1), f(1, i32), f(1, i32), f(1, i32), np.int64(1), plan.sched,
             plan.sched_f]
    sens = [f((1, n)), f(1), f(1), f((1, 1)), f((1, P)), table, f((1, 1, n)), f((1, 1, P)),
            f((1,) + table.shape), 1e-5, f(n), f(n), f((1, n)), f((1, n)), f(1), 1.0, f((1, 1, n)),
            f((1, 1, 1, n)), f((1, 1)), f((1, 1), i32), f((1, 1), i32), f((1, 1), i32),
            np.int64(1), np.int64(1), plan.sched, plan.sched_f]
    return {"kernel": plain, "sens_kernel": sens}


def ptxas_report(ptxas, ptx: str, arch: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([ptxas, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines()
             if "stack frame" in ln or "Used" in ln]
    return "; ".join(lines[:2]) if lines else (out.stderr.strip() or "no report")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 for an H100/H200")
    ap.add_argument("--ptxas", default=None, help="a ptxas for the resource report")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import numba_cuda_mlir.tools as nctools

    major, minor = (int(x) for x in args.cc.split("."))
    nctools._cached_cc = (major, minor)   # no device is queried for the target
    from boltzmann import modes
    from boltzmann.params import load_config
    from solver.backends.cuda.warp_plan import build_warp_plan

    cfg = load_config(args.config)
    model = modes.model_for(cfg.cosmology, cfg.precision)
    n, P = model.n, len(model.param_names)
    table = np.zeros((1, len(model.table_columns), 2, 64))
    t0 = time.perf_counter()
    plan = build_warp_plan(model.rhs, n, P, args=table)
    rows = {"config": args.config, "n": n, "host_setup_s": time.perf_counter() - t0,
            "source_lines": len(plan.source.splitlines()),
            "shared_bytes": {"kernel": plan.spec.shared_bytes(False),
                             "sens_kernel": plan.spec.shared_bytes(True)}}
    with tempfile.TemporaryDirectory() as mod_dir:
        for entry, ex in examples(plan, n, P, table).items():
            disp = plan.kernel(mod_dir, entry)
            t0 = time.perf_counter()
            cres = disp.compile_for(*ex)
            rows[entry] = {"compile_s": round(time.perf_counter() - t0, 1),
                           "cubin_bytes": len(cres.metadata["cubin"])}
            if args.ptxas:
                # timed alone: how much of the compile is the assembler's (-O3, ptxas's default)
                t0 = time.perf_counter()
                rows[entry]["ptxas"] = ptxas_report(args.ptxas, cres.metadata["ptx"],
                                                    f"sm_{major}{minor}")
                rows[entry]["ptxas_s"] = round(time.perf_counter() - t0, 1)
            print(entry, json.dumps(rows[entry]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
