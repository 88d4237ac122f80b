"""One chunk of a batch: its rows' cosmologies validated, then one ensemble launch.

``ChunkTask`` is everything a chunk needs, plain and picklable, so the same task runs in a
device thread of this process or as a Dask task on another machine. ``compute_chunk`` is
``solve_chunk(prepare(task))``; the local executor runs the two halves in different threads so
that validating the next chunk overlaps the current launch.

Every launch of a group has the same number of cosmologies, ``task.pad_to``: rows that failed
validation, and the missing rows of a group's last chunk, are filled with copies of the chunk's
last valid cosmology (computed and dropped). Each launch shape is compiled once, and a chunk
gives bit-for-bit the same numbers whichever run, device or worker computes it, which is what
makes a resumed file equal to an uninterrupted one.

Every failure is per row and final in the result — a validation message, the solver's reasons,
a non-finite number — except an exception of the launch itself, which marks the chunk's rows
``ERROR`` (retried by a restart). No NaN is ever returned for a row with status ``OK``.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from ..ensemble import run_ensemble
from ..params import ConfigError
from ..tables import DERIVED, host_cpu
from .store import ERROR, INVALID, NONFINITE, OK, SOLVER
from .table import row_cosmology

__all__ = ["ChunkTask", "Prepared", "ChunkResult", "prepare", "solve_chunk", "compute_chunk",
           "failed_result", "result_names"]


@dataclass
class ChunkTask:
    """One chunk: ``rows`` of the table with their ``values`` (n, P) under ``names``.

    base: the config's cosmology block; precision, output: the config's blocks; pad_to: the
    launch size of the chunk's group; backend: "auto", "jax" or "cuda"; ensemble: the driver
    to call (``run_ensemble``; tests pass a stand-in with its signature).
    """

    index: int
    rows: np.ndarray
    values: np.ndarray
    names: tuple
    base: dict
    precision: Any
    output: Any
    pad_to: int
    backend: str = "auto"
    ensemble: Callable | None = None


@dataclass
class Prepared:
    """A task with its rows validated: cosmologies of the valid rows, messages of the others."""

    task: ChunkTask
    valid: list            # positions (in task.rows) of the valid rows
    cosmologies: list      # their CosmoParams, in the same order
    invalid: dict          # position -> validation message
    seconds: float = 0.0


@dataclass
class ChunkResult:
    """Per-row results of a chunk, in the order of ``rows``.

    status: (n,) codes (store.STATUS); messages: n strings; arrays: {dataset name: (n, ...)}
    with NaN in every row that is not OK; timings: seconds of validation and launch.
    """

    index: int
    rows: np.ndarray
    status: np.ndarray
    messages: list
    arrays: dict
    backend: str = ""
    timings: dict = field(default_factory=dict)


def result_names(n_z: int, n_k: int) -> dict[str, tuple]:
    """Dataset name -> per-row shape of what a chunk returns."""
    names = {"k": (n_k,), "pk_m": (n_z, n_k), "pk_cb": (n_z, n_k), "sigma8": (n_z,),
             "sigma8_cb": (n_z,)}
    names.update({f"derived/{d}": () for d in DERIVED})
    return names


def _empty_arrays(task: ChunkTask) -> dict:
    n_z, n_k = len(task.output.z), len(task.output.k_grid(1.0))
    n = len(task.rows)
    return {name: np.full((n,) + shape, np.nan) for name, shape in result_names(n_z, n_k).items()}


def failed_result(task: ChunkTask, exc: BaseException, code: int = ERROR) -> ChunkResult:
    """Every row of the task failed with ``exc`` (one line: type and message)."""
    text = " ".join(str(exc).split()) or "no message"
    n = len(task.rows)
    return ChunkResult(index=task.index, rows=np.asarray(task.rows),
                       status=np.full(n, code, np.int8),
                       messages=[f"{type(exc).__name__}: {text}"] * n,
                       arrays=_empty_arrays(task))


def prepare(task: ChunkTask) -> Prepared:
    """Validate the task's rows (on the host CPU: a GPU's queue must not wait for it)."""
    t0 = time.perf_counter()
    valid, cosmologies, invalid = [], [], {}
    cpu = host_cpu()
    with jax.default_device(cpu) if cpu is not None else nullcontext():
        for i, row in enumerate(np.asarray(task.values)):
            try:
                cosmologies.append(row_cosmology(task.base, task.names, row))
                valid.append(i)
            except ConfigError as exc:
                invalid[i] = f"invalid parameters: {' '.join(str(exc).split())}"
    return Prepared(task=task, valid=valid, cosmologies=cosmologies, invalid=invalid,
                    seconds=time.perf_counter() - t0)


def _check_row(arrays: dict, i: int) -> str | None:
    """Why row i of an ok launch is unusable (a non-finite or non-positive number), or None."""
    for name, values in arrays.items():
        v = values[i]
        if not np.all(np.isfinite(v)):
            return f"non-finite {name}"
        if name.startswith(("pk_", "sigma8", "k")) and not np.all(v > 0):
            return f"non-positive {name}"
    return None


def _launch_arrays(result, output) -> dict:
    """{dataset name: (C, ...)} of a launch, at the config's redshifts (a launch may solve more:
    redshifts asked for elsewhere in the config come after them)."""
    zs = [float(z) for z in result.spectra.z]
    iz = [zs.index(float(z)) for z in output.z]
    spectra = result.spectra
    out = {"k": np.asarray(result.k), "pk_m": np.asarray(spectra.pk_m)[:, iz],
           "pk_cb": np.asarray(spectra.pk_cb)[:, iz], "sigma8": np.asarray(spectra.sigma8)[:, iz],
           "sigma8_cb": np.asarray(spectra.sigma8_cb)[:, iz]}
    for d in DERIVED:
        out[f"derived/{d}"] = np.asarray(result.tables.derived[d])
    return out


def _solver_message(result, c: int) -> str:
    failed = [(k, why) for cc, k, why in result.failures() if cc == c]
    ks = ", ".join(f"{k:.4g}" for k, _ in failed[:6]) + (", ..." if len(failed) > 6 else "")
    reasons = "; ".join(sorted({why for _, why in failed}))
    return (f"perturbation solve failed for {len(failed)} of {result.transfers.k.shape[1]} k modes "
            f"(k = {ks} 1/Mpc): {reasons}")


def solve_chunk(prepared: Prepared, backend=None) -> ChunkResult:
    """One ensemble launch of the prepared rows, padded to ``pad_to``; per-row results.

    backend: a solver backend object or name (default: the task's name).
    """
    task = prepared.task
    n = len(task.rows)
    arrays = _empty_arrays(task)
    status = np.full(n, OK, np.int8)
    messages = [""] * n
    for i, text in prepared.invalid.items():
        status[i], messages[i] = INVALID, text
    timings = {"prepare": prepared.seconds}
    used = ""
    if prepared.cosmologies:
        cosmos = list(prepared.cosmologies)
        cosmos += [cosmos[-1]] * max(task.pad_to - len(cosmos), 0)
        ensemble = task.ensemble or run_ensemble
        t0 = time.perf_counter()
        try:
            result = ensemble(cosmos, task.precision, task.output,
                              backend=task.backend if backend is None else backend)
        except Exception as exc:  # noqa: BLE001 - a launch error fails its rows, not the batch
            failed = failed_result(task, exc)
            for i in prepared.invalid:
                failed.status[i], failed.messages[i] = INVALID, messages[i]
            return failed
        timings["launch"] = time.perf_counter() - t0
        used = str(result.backend)
        launch = _launch_arrays(result, task.output)
        ok = np.asarray(result.ok())
        sigma8_notes = {}
        for c, name, z, text in getattr(result.spectra, "problems", []):
            sigma8_notes.setdefault(c, f"sigma8 ({name}, z = {z:g}): {' '.join(text.split())}")
        for c, i in enumerate(prepared.valid):
            if not ok[c]:
                status[i], messages[i] = SOLVER, _solver_message(result, c)
                continue
            problem = _check_row(launch, c)
            if problem is not None:
                why = sigma8_notes.get(c) if "sigma8" in problem else None
                status[i] = NONFINITE
                messages[i] = f"{problem}: {why}" if why else \
                    f"{problem} although every mode finished"
                continue
            for name, values in launch.items():
                arrays[name][i] = values[c]
            messages[i] = f"warning: {sigma8_notes[c]}" if c in sigma8_notes else ""
    return ChunkResult(index=task.index, rows=np.asarray(task.rows), status=status,
                       messages=messages, arrays=arrays, backend=used, timings=timings)


def compute_chunk(task: ChunkTask, backend=None) -> ChunkResult:
    """Validate and launch one chunk (a Dask task, or both halves in one thread)."""
    return solve_chunk(prepare(task), backend)
