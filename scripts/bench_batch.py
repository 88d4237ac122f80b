#!/usr/bin/env python
"""Batch mode's benchmark: its overhead over bare ensemble launches, and its device scaling.

(a) Overhead. N cosmologies (``ensemble.fiducial_ensemble``: a ±5 % Latin hypercube in ω_b,
    ω_cdm, h, n_s, A_s around the config's cosmology) are computed twice on one device, warm:
    bare — ``run_ensemble`` over the chunks batch mode would launch (same sizes, the last one
    padded the same way), results kept in memory; batch — ``run_batch`` from a CSV of the same
    numbers to an HDF5 file (reading and validating the table, the file, the progress line).
    overhead = batch / bare − 1 (the target on one H200: ≤ 5 % for 10⁴ cosmologies of
    configs/lcdm.yaml).
(b) Scaling. ``run_batch`` of the same table with ``--devices 0`` and with every visible
    device, each warm (every device compiled by a warm-up run first); speed-up = rows/s on all
    devices over rows/s on one (the target on two H200s: ≥ 1.8×).

Each measurement prints one markdown row with the machine, the date and this command; ``--out
DIR`` also writes them to DIR/bench_batch.md.

    python scripts/bench_batch.py --config lcdm --n 10000          # the GPU measurement
    python scripts/bench_batch.py --quick --n 8 --chunk-size 4      # CPU smoke test (minutes)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from boltzmann import runtime  # noqa: E402
from boltzmann.batch import run_batch  # noqa: E402
from boltzmann.batch.progress import BatchProgress  # noqa: E402
from boltzmann.ensemble import SPREAD_PARAMETERS, fiducial_ensemble, run_ensemble  # noqa: E402
from boltzmann.params import load_config  # noqa: E402

HEADER = ("| measurement | cosmologies | chunk | devices | backend | seconds | rows/s | result | "
          "machine | date | command |\n|---|---|---|---|---|---|---|---|---|---|---|")


def quick_config(cfg):
    """The test-sized config: 6 k values up to 0.5 h/Mpc, ℓmax 4, a short table grid."""
    prec = dataclasses.replace(cfg.precision, l_max_g=4, l_max_pol_g=4, l_max_ur=4,
                               l_max_ncdm=4, n_q_ncdm=1, bg_n_lna=300, rtol=1e-4)
    out = dataclasses.replace(cfg.output, k_min=1e-3, k_max=0.5, k_per_decade=1.85,
                              k_values=None, k_file=None, z=(0.0, 1.0))
    return dataclasses.replace(cfg, precision=prec, output=out)


def machine() -> str:
    devices = jax.devices()
    if devices[0].platform == "cpu":
        return f"{os.cpu_count()}-core CPU ({platform.processor() or platform.machine()})"
    kinds = sorted({d.device_kind for d in devices})
    return f"{len(devices)}× {', '.join(kinds)}"


def write_table(path: Path, cosmologies) -> Path:
    """The cosmologies as a batch CSV (exact: repr of the floats)."""
    lines = [",".join(SPREAD_PARAMETERS)]
    lines += [",".join(repr(float(getattr(c, p))) for p in SPREAD_PARAMETERS)
              for c in cosmologies]
    path.write_text("\n".join(lines) + "\n")
    return path


def bare(cosmologies, cfg, chunk: int, backend) -> tuple[float, str]:
    """Seconds of run_ensemble over batch mode's chunks (the last padded to ``chunk``), and the
    backend that ran."""
    t0 = time.perf_counter()
    for start in range(0, len(cosmologies), chunk):
        part = list(cosmologies[start:start + chunk])
        part += [part[-1]] * (chunk - len(part))
        result = run_ensemble(part, cfg.precision, cfg.output, backend=backend)
        np.asarray(result.spectra.pk_m)
    return time.perf_counter() - t0, str(result.backend)


def batch(cfg, table: Path, out: Path, chunk: int, devices: str, backend, settings) -> tuple:
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    summary = run_batch(cfg, table, out, chunk_size=chunk, devices=devices, backend=backend,
                        settings=settings, progress=BatchProgress(0, enabled=False))
    return time.perf_counter() - t0, summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="lcdm")
    parser.add_argument("--n", type=int, default=10_000, help="cosmologies (default 10000)")
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--backend", choices=("auto", "jax", "cuda"), default="auto")
    parser.add_argument("--parts", default="ab", help="a: overhead, b: device scaling")
    parser.add_argument("--quick", action="store_true", help="the test-sized config (CPU)")
    parser.add_argument("--out", metavar="DIR", help="also write DIR/bench_batch.md")
    args = parser.parse_args(argv)

    settings = runtime.Settings.from_environment()
    runtime.configure(settings)
    cfg = load_config(args.config)
    if args.quick:
        cfg = quick_config(cfg)
    backend_name = args.backend
    backend = runtime.backend_for(backend_name, settings)   # for the bare launches
    chunk = min(args.chunk_size, args.n)
    cosmologies = fiducial_ensemble(args.n, cfg, seed=0)
    command = "python scripts/bench_batch.py " + " ".join(sys.argv[1:] if argv is None else argv)
    date = datetime.date.today().isoformat()
    where = machine()
    rows = [HEADER]

    def row(what, n, devices, seconds, result, ran):
        line = (f"| {what} | {n} | {chunk} | {devices} | {ran} | {seconds:.1f} | "
                f"{n / seconds:.3g} | {result} | {where} | {date} | `{command}` |")
        rows.append(line)
        print(line, flush=True)

    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        table = write_table(tmp / "params.csv", cosmologies)
        warm = write_table(tmp / "warm.csv", cosmologies[:chunk])
        t0 = time.perf_counter()
        batch(cfg, warm, tmp / "warm.h5", chunk, "0", backend_name, settings)
        bare(cosmologies[:chunk], cfg, chunk, backend)   # the bare path warm too
        print(f"warm-up (compile, one device): {time.perf_counter() - t0:.1f} s", flush=True)
        one = None
        if "a" in args.parts:
            t_bare, ran = bare(cosmologies, cfg, chunk, backend)
            row("bare run_ensemble over the chunks", args.n, 1, t_bare, "", ran)
            t_batch, summary = batch(cfg, table, tmp / "one.h5", chunk, "0", backend_name,
                                     settings)
            one = t_batch
            row("batch mode, --devices 0", args.n, 1, t_batch,
                f"overhead {100 * (t_batch / t_bare - 1):+.1f} %; {summary.n_ok} ok",
                ",".join(summary.backends))
        if "b" in args.parts:
            n_dev = len(jax.devices())
            if one is None:
                one, summary = batch(cfg, table, tmp / "one.h5", chunk, "0", backend_name,
                                     settings)
                row("batch mode, --devices 0", args.n, 1, one, f"{summary.n_ok} ok",
                    ",".join(summary.backends))
            if n_dev == 1:
                print("one device visible: no scaling to measure", flush=True)
            else:
                warm_all = write_table(tmp / "warm_all.csv", cosmologies[:chunk * n_dev])
                batch(cfg, warm_all, tmp / "warm_all.h5", chunk, "all", backend_name, settings)
                t_all, summary = batch(cfg, table, tmp / "all.h5", chunk, "all", backend_name,
                                       settings)
                row("batch mode, --devices all", args.n, n_dev, t_all,
                    f"speed-up {one / t_all:.2f}× over one device; {summary.n_ok} ok",
                    ",".join(summary.backends))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_batch.md").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
