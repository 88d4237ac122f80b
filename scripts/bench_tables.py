#!/usr/bin/env python
"""The tables stage (background + thermodynamics) in different loop shapes, side by side.

The thermodynamics integrates the recombination equations node to node (``lax.scan`` over
≈ 1440 nodes, a Radau step with six Newton iterations each, then ≈ 680 nodes of the baryon
temperature). On a GPU every iteration of those loops runs at kernel-launch latency, whatever
the number of cosmologies; ``boltzmann.thermodynamics.LoopShape`` writes the Newton iterations
out and puts several nodes into one iteration. For each shape and each number of cosmologies this
prints the first call (compilation included), the warm time (median of ``--repeats``) and the
largest relative difference of the model table from the first shape's.

    python scripts/bench_tables.py --cosmologies 1 128 256 --out DIR        # default device
    python scripts/bench_tables.py --device cpu --cosmologies 1 16          # host CPU
    python scripts/bench_tables.py --device cpu --cosmologies 1 --shapes n0u1i --strides 1,2

``--strides`` sets the table cells per Radau step of the recombination equations
(``modes.Grid.thermo_stride``, which ``precision.thermo_ode_step`` sets); the first row of each cosmology count is the reference of
the max-rel-diff column.

A shape is ``rolled`` (Newton iterations in a loop, the small systems through LAPACK), or
``n<N>u<U>`` with an optional ``i``: Newton unrolled when N is 1, scan unroll U, and with ``i``
the small systems solved inline (e.g. ``n1u4i``); the CPU default is ``n0u1i``, an
accelerator's ``n1u1i``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from boltzmann import modes  # noqa: E402
from boltzmann.ensemble import fiducial_ensemble, stack_cosmologies  # noqa: E402
from boltzmann.params import load_config  # noqa: E402
from boltzmann.runtime import configure  # noqa: E402
from boltzmann.tables import compute_tables  # noqa: E402
from boltzmann.thermodynamics import LoopShape  # noqa: E402


def parse_shape(name: str) -> LoopShape:
    if name == "rolled":            # the loops rolled and the small systems through LAPACK
        return LoopShape(inline_solves=False)
    inline = name.endswith("i")
    try:
        n, u = name[1:].rstrip("i").split("u")
        assert name[0] == "n"
        return LoopShape(newton_unrolled=bool(int(n)), scan_unroll=int(u), inline_solves=inline)
    except (ValueError, AssertionError):
        raise SystemExit(f"--shapes: {name!r} is not 'rolled' or n<0|1>u<U>[i] (e.g. n1u4i)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--cosmologies", type=int, nargs="+", default=[1, 128, 256])
    ap.add_argument("--shapes", default="rolled,n1u1,n1u4,n1u8")
    ap.add_argument("--device", choices=("default", "cpu"), default="default",
                    help="default: the default JAX device (the GPU where there is one); "
                         "cpu: the host CPU")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=None,
                    help="most cosmologies per tables program (default: boltzmann.tables.TABLE_CHUNK)")
    ap.add_argument("--strides", default=None,
                    help="comma-separated table cells per recombination step "
                         "(Grid.thermo_stride; default: the config's thermo_ode_step)")
    ap.add_argument("--out", default=None, help="folder for tables.json")
    args = ap.parse_args(argv)
    configure()
    cfg = load_config(args.config)
    model = modes.model_for(cfg.cosmology, cfg.precision)
    grid = modes.make_grid(cfg.precision)
    shapes = [(s, parse_shape(s)) for s in args.shapes.split(",")]
    strides = ([grid.thermo_stride] if args.strides is None
               else [int(v) for v in args.strides.split(",")])
    on_host = args.device == "cpu"
    rows = []
    chunk = {} if args.chunk is None else {"chunk": args.chunk}
    print(f"device {jax.devices()[0].device_kind if not on_host else 'host cpu'}; "
          f"{args.config}, {grid.nodes.size} nodes", flush=True)
    for C in args.cosmologies:
        cosmos = stack_cosmologies(fiducial_ensemble(C, cfg))
        ref = None
        for stride, (name, shape) in ((st, sh) for st in strides for sh in shapes):
            grid = dataclasses.replace(grid, thermo_stride=stride)
            t0 = time.perf_counter()
            tab = compute_tables(cosmos, grid, model, on_host=on_host, loops=shape, **chunk)
            first = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                tab = compute_tables(cosmos, grid, model, on_host=on_host, loops=shape, **chunk)
                times.append(time.perf_counter() - t0)
            table = np.asarray(tab.model_table)
            if ref is None:
                ref, diff = table, 0.0
            else:
                diff = float(np.max(np.abs(table - ref) / np.maximum(np.abs(ref), 1e-300)))
            row = {"cosmologies": C, "shape": name, "thermo_stride": stride, "first_s": first,
                   "warm_s": statistics.median(times), "max_rel_diff": diff, "chunk": args.chunk,
                   "device": tab.device, "finite": bool(np.isfinite(table).all())}
            rows.append(row)
            print(f"C={C:5d} {name:7s} stride {stride} first {first:7.2f} s  warm {row['warm_s'] * 1e3:8.1f} ms "
                  f" ({row['warm_s'] / C * 1e3:7.2f} ms/cosmology)  max rel diff {diff:.1e}  "
                  f"on {tab.device}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "host": platform.node(),
                "device": str(jax.devices()[0]), "argv": sys.argv, "jax": jax.__version__}
        with open(os.path.join(args.out, "tables.json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
