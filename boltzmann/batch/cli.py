"""The batch command: ``boltzmann-batch --config CONFIG --params PARAMS.csv --out OUT.h5``
(also ``python scripts/batch.py``).

Exit codes: 0 every row has its final status (ok, or failed with a recorded reason); 1 rows are
left that a rerun would compute (an error such as a lost worker), or the run could not go on;
2 bad usage or input (config, table header, output path, devices); 130 interrupted (what was
written is kept: rerun the same command). Failures print one line ``boltzmann-batch: error:
...``; ``--debug`` re-raises with a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import runtime
from .errors import BatchError

__all__ = ["main", "build_parser"]

PROG = "boltzmann-batch"


def _chunk_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="P(k), sigma8 and derived numbers for a table of cosmologies, "
        "into one HDF5 file; resumable (rerun the same command), failures recorded per row. "
        "See docs/batch.md.")
    parser.add_argument("--config", required=True,
                        help="YAML config (a path, or a name in configs/): precision, output "
                             "grid, and every cosmology key the table leaves out")
    parser.add_argument("--params", required=True, metavar="PARAMS.csv",
                        help="comma-separated table: a header of cosmology keys (h, omega_b, "
                             "omega_cdm, A_s or ln10^{10}A_s, n_s, tau_reio, m_ncdm, w0_fld, ...), "
                             "one cosmology a row; an empty cell takes the config's value")
    parser.add_argument("--out", required=True, metavar="OUT.h5",
                        help="HDF5 output; an existing file of the same config and table is "
                             "resumed")
    parser.add_argument("--chunk-size", type=_chunk_size, metavar="N",
                        help="cosmologies per launch (default: 1024 on a GPU or with "
                             "--scheduler, 16 on a CPU; a resumed file keeps its own)")
    parser.add_argument("--devices", default="all",
                        help="local devices: 'all' (default) or ids such as 0 or 0,1")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="Dask scheduler address (tcp://host:8786) or scheduler file: run "
                             "the chunks on its workers instead of the local devices")
    parser.add_argument("--backend", choices=("auto", "jax", "cuda"), default="auto",
                        help="perturbation solver backend (default: auto)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    cache = parser.add_argument_group(
        "compilation cache", "as for boltzmann-transfer: $XDG_CACHE_HOME/boltzmann-gpu by "
        "default, BOLTZMANN_CACHE_DIR moves it, BOLTZMANN_CACHE=0 turns it off")
    cache.add_argument("--cache-dir", metavar="DIR", help="cache folder for this run")
    cache.add_argument("--no-cache", action="store_true", help="compile afresh, keep nothing")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout=None, stderr=None) -> int:
    """Run the batch command; returns the exit code."""
    out_stream = sys.stdout if stdout is None else stdout
    err_stream = sys.stderr if stderr is None else stderr
    args = build_parser().parse_args(argv)
    if args.scheduler is not None and args.devices != "all":
        err_stream.write(f"{PROG}: note: --devices is ignored with --scheduler (each Dask worker "
                         f"uses its own device)\n")
    try:
        settings = runtime.Settings.from_environment(cache_root=args.cache_dir,
                                                     no_cache=args.no_cache)
        runtime.configure(settings)
        from .driver import run_batch
        from .progress import BatchProgress

        progress = BatchProgress(0, stream=err_stream, enabled=not args.quiet)
        summary = run_batch(args.config, args.params, args.out, chunk_size=args.chunk_size,
                            devices=args.devices, scheduler=args.scheduler,
                            backend=args.backend, settings=settings, progress=progress)
    except BatchError as exc:
        if args.debug:
            raise
        err_stream.write(f"{PROG}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        err_stream.write(f"\n{PROG}: interrupted; every finished chunk is saved in {args.out}: "
                         f"rerun the same command to continue\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for users; --debug shows the traceback
        if args.debug:
            raise
        err_stream.write(f"{PROG}: error: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return 1
    out_stream.write(f"{summary.describe()}; this run: {summary.computed} rows in "
                     f"{summary.chunks} chunks, {summary.seconds:.1f} s\n")
    if summary.n_left:
        err_stream.write(f"{PROG}: {summary.n_left} rows are not done (see the message "
                         f"dataset); rerun the same command to retry them\n")
        return 1
    return 0
