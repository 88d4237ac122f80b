#!/usr/bin/env python
"""The P(k) Jacobian with the CUDA sensitivity kernel launched both ways, side by side.

One process, one kernel cache: ``PowerSpectrumFunction.jacobian`` on a CUDA backend whose
tangents come from the host callback (``sensitivity_launch="host"``) and on one whose tangents
come from the XLA FFI custom call (``"ffi"``); prints each launch's first and warm seconds and
stages against a value call of the same object, and whether the two Jacobians are equal bit for bit (else their largest difference
relative to each output's scale). Needs a GPU.

    python scripts/compare_sens_launch.py --config lcdm_reduced --repeats 3
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default=None, help="the CUDA kernel cache (default: a new "
                    "temporary folder, so the first launch compiles the kernels)")
    args = ap.parse_args(argv)

    import jax

    from boltzmann import runtime
    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config
    from solver import CudaBackend

    runtime.configure(runtime.Settings.from_environment())
    cfg = load_config(args.config)
    root = args.cache_dir or tempfile.mkdtemp(prefix="sens_launch_")
    print(f"# {jax.devices()[0].device_kind}: {args.config}, kernel cache {root}", flush=True)
    jac = {}
    for launch in ("host", "ffi"):
        fn = PowerSpectrumFunction(cfg, backend=CudaBackend(cache_root=root,
                                                            sensitivity_launch=launch))
        vt = []
        for _ in range(1 + args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            vt.append(time.perf_counter() - t0)
        times = []
        for _ in range(1 + args.repeats):
            t0 = time.perf_counter()
            _, d = fn.jacobian()
            jax.block_until_ready(d)
            times.append(time.perf_counter() - t0)
        jac[launch] = {k: np.asarray(v) for k, v in d.items()
                       if np.asarray(v).dtype.kind == "f"}
        stages = ", ".join(f"{k} {v:.3f}" for k, v in (fn.last_stage_seconds or {}).items())
        print(f"{launch}: value first {vt[0]:.1f} s, warm {np.median(vt[1:]):.3f} s; Jacobian "
              f"first {times[0]:.1f} s, warm {min(times[1:]):.3f} s (median "
              f"{np.median(times[1:]):.3f}) = {np.median(times[1:]) / np.median(vt[1:]):.2f}x; "
              f"last stages: {stages}", flush=True)
    worst = {}
    for name, a in jac["host"].items():
        b = jac["ffi"][name]
        if not np.array_equal(a, b, equal_nan=True):
            scale = max(float(np.nanmax(np.abs(a))), 1e-300)
            worst[name] = float(np.nanmax(np.abs(a - b))) / scale
    print("Jacobians equal bit for bit" if not worst else f"differences / scale: {worst}")


if __name__ == "__main__":
    main()
