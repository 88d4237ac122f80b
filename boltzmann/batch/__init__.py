"""Batch mode: P(k), σ8 and derived numbers for a table of cosmologies, into one HDF5 file.

Emulator training sets, Fisher grids and simulation suites are tables of 10⁴–10⁶ cosmologies.
``run_batch(config, "params.csv", "out.h5")`` (or ``boltzmann-batch`` / scripts/batch.py)
computes them many per launch through ``ensemble.run_ensemble``, on every local device or on a
Dask cluster, writes chunk by chunk, resumes after an interruption and records every failing
row with its reason (docs/batch.md).

Modules, one job each: ``table`` (the CSV and its rows as cosmologies), ``identity`` (config and
table hashes, code version), ``store`` (the HDF5 layout and crash-safe writes), ``plan``
(grouping by species structure, chunks), ``compute`` (one chunk: validate, launch, check),
``executors`` (device threads, Dask), ``progress`` (rate and ETA), ``driver`` (run_batch),
``cli`` (the command).
"""
from __future__ import annotations

from .driver import BatchSummary, run_batch
from .errors import BatchError
from .store import STATUS

__all__ = ["run_batch", "BatchSummary", "BatchError", "STATUS"]
