"""The batch driver: a table of cosmologies to one HDF5 file, resumable, on every local device or
on a Dask cluster.

``run_batch(config, params, out)`` reads and checks the table, creates the output file or
resumes into it (refusing a file made from a different config or table), writes the rows that
cannot be read, plans the chunks (plan.py), hands the unfinished ones to an executor
(executors.py) and writes each result as it arrives (store.py), with a progress line. Only this
thread touches the file.

A batch stops early only when it cannot do anything useful: if the first chunks of a run all
fail with an error (a missing GPU backend, say), it raises instead of marking a million rows
failed.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from solver.caches import Cache

from .. import runtime
from ..params import Config, ConfigError, load_config
from . import identity
from .compute import ChunkTask
from .errors import BatchError
from .executors import DaskExecutor, LocalExecutor, resolve_devices
from .plan import default_chunk_size, plan_chunks
from .progress import BatchProgress
from .store import ERROR, INVALID, OK, PENDING, STATUS, BatchFile
from .table import base_block, check_columns, read_table

__all__ = ["run_batch", "BatchSummary"]

#: a run whose first this-many chunks (at least one per worker) all raise stops there
FAIL_FAST_CHUNKS = 3


@dataclass
class BatchSummary:
    """What a run did: ``counts`` {status: rows} over the whole file after the run."""

    path: Path
    n_rows: int
    counts: dict
    computed: int                 # rows written by this run
    chunks: int                   # chunks launched by this run
    seconds: float
    backends: list = field(default_factory=list)

    @property
    def n_ok(self) -> int:
        return self.counts.get(OK, 0)

    @property
    def n_failed(self) -> int:
        return sum(n for code, n in self.counts.items() if code not in (OK, PENDING))

    @property
    def n_left(self) -> int:
        """Rows a rerun would compute (never computed, or failed by an error)."""
        return self.counts.get(PENDING, 0) + self.counts.get(ERROR, 0)

    def describe(self) -> str:
        parts = [f"{self.n_ok} ok"]
        parts += [f"{n} {STATUS[code].split(' (')[0]} (status {code})"
                  for code, n in sorted(self.counts.items()) if code not in (OK, PENDING)]
        if self.counts.get(PENDING):
            parts.append(f"{self.counts[PENDING]} not computed")
        return f"{self.path}: {self.n_rows} rows: " + ", ".join(parts)


def _load(config) -> Config:
    if isinstance(config, Config):
        return config
    try:
        return load_config(config)
    except ConfigError as exc:
        raise BatchError(f"invalid config {config}: {' '.join(str(exc).split())}") from exc


def _check_out_path(out: Path) -> None:
    if out.exists():
        return
    parent = out.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise BatchError(f"cannot write {out}: {parent} {what}; create the folder or choose "
                         f"another --out path")


def _open_store(out: Path, table, cfg: Config, chunk_size: int | None, attrs: dict) -> BatchFile:
    """Resume into ``out`` when it matches, else create it; returns the open file."""
    if not out.exists():
        n_k = len(cfg.output.k_grid(1.0))
        return BatchFile.create(out, names=table.names, values=table.values, z=cfg.output.z,
                                n_k=n_k, attrs=attrs)
    store = BatchFile.open(out)
    try:
        if store.attrs.get("config_hash") != attrs["config_hash"]:
            diff = identity.describe_difference(store.attrs.get("config", ""), cfg)
            raise BatchError(f"{out} was made with a different config ({diff}); a batch file "
                             f"holds one config only: use that config to resume, or another "
                             f"--out for this one")
        if store.attrs.get("table_hash") != attrs["table_hash"]:
            raise BatchError(f"{out} was made from a different parameter table (stored: "
                             f"{store.attrs.get('params_file')}, {store.n_rows} rows; now "
                             f"{table.source}, {table.n_rows} rows); resume with the table it was "
                             f"made from, or use another --out for the new table")
        stored = int(store.attrs["chunk_size"])
        if chunk_size is not None and chunk_size != stored:
            raise BatchError(f"{out} was started with --chunk-size {stored}; resume with the same "
                             f"value (or leave the option out) so the unfinished chunks are the "
                             f"same as in the first run")
        store.add_to_list_attr("code_versions", attrs["code_version"])
    except BaseException:
        store.close()
        raise
    return store


#: one solver backend per (name, settings, device) in a process. A new backend object registers
#: its kernels and traces its launch program again, which cost every run_batch call seconds on
#: its first chunk (an H200: +8.9 % over bare launches for 4096 cosmologies, docs/benchmarks.md)
_BACKENDS = Cache("batch.backends", maxsize=16)


def _backend_for(name: str, settings, device):
    key = (name, settings, device.platform, device.id)
    return _BACKENDS.get_or_build(key, lambda: runtime.backend_for(name, settings))


def _executor(scheduler, devices, backend: str, settings):
    if scheduler is not None:
        return DaskExecutor(scheduler)
    settings = settings if settings is not None else runtime.Settings()
    return LocalExecutor(resolve_devices(devices),
                         lambda device: _backend_for(backend, settings, device))


def run_batch(config, params, out, *, chunk_size: int | None = None, devices="all",
              scheduler=None, backend: str = "auto", settings: runtime.Settings | None = None,
              progress: BatchProgress | None = None, on_chunk: Callable | None = None,
              ensemble: Callable | None = None, executor=None) -> BatchSummary:
    """Compute every row of ``params`` (a CSV path) with ``config`` into ``out`` (HDF5).

    chunk_size: rows per launch (default: the file's, else 1024 on a GPU, 16 on a CPU);
    devices: "all" or device ids "0,1" (local runs); scheduler: a Dask scheduler address, scheduler
    file or ``distributed.Client`` (then chunks run on its workers); backend: the solver backend
    name; settings: where the CUDA backend keeps its kernels (``runtime.Settings``); progress:
    a BatchProgress (default: one on stderr); on_chunk(result): called after each chunk is
    written; ensemble: the driver to call per chunk (default ``run_ensemble``); executor: an
    executor object in place of the local/Dask one.
    Raises BatchError for anything that stops the batch before or while it runs.
    """
    t_start = time.perf_counter()
    out = Path(out)
    cfg = _load(config)
    table = read_table(params)
    check_columns(table.names, cfg)
    _check_out_path(out)
    attrs = {"config": identity.config_yaml(cfg), "config_hash": identity.config_hash(cfg),
             "table_hash": identity.table_hash(table), "params_file": str(table.source),
             "code_version": identity.code_version(),
             "code_versions": json.dumps([identity.code_version()]),
             "chunk_size": int(chunk_size or default_chunk_size(
                 "gpu" if scheduler is not None else jax.default_backend())),
             "backends": "[]"}
    store = _open_store(out, table, cfg, chunk_size, attrs)
    try:
        size = int(store.attrs["chunk_size"])
        store.write_failures({r: f"invalid parameters: {m}" for r, m in table.errors.items()},
                             INVALID)
        chunks = plan_chunks(table, cfg, size)
        todo = [c for c in chunks if store.needs(c.rows).size]
        n_todo_rows = sum(int(store.needs(c.rows).size) for c in todo)
        if progress is None:
            progress = BatchProgress(store.n_rows)
        progress.total = store.n_rows

        def finished() -> int:
            return int(np.sum((store.status != PENDING) & (store.status != ERROR)))

        def failed() -> int:
            return int(np.sum(store.status > OK))

        if not todo:
            progress.note(f"batch: all {store.n_rows} rows of {out} are done; nothing to compute")
            return _summary(store, 0, 0, t_start)
        progress.note(f"batch: {n_todo_rows} of {store.n_rows} rows to compute in {len(todo)} "
                      f"chunks of up to {size} ({len({c.structure for c in todo})} species "
                      f"structure(s)) -> {out}")
        executor = executor or _executor(scheduler, devices, backend, settings)
        base = base_block(cfg.cosmology)
        tasks = (ChunkTask(index=c.index, rows=c.rows, values=table.values[c.rows],
                           names=table.names, base=base, precision=cfg.precision,
                           output=cfg.output, pad_to=c.pad_to, backend=backend,
                           ensemble=ensemble) for c in todo)
        return _run(executor, tasks, store, progress, on_chunk, finished, failed, t_start)
    finally:
        store.close()
        if progress is not None:
            progress.close()


def _run(executor, tasks, store, progress, on_chunk, finished, failed, t_start):
    computed = n_chunks = 0
    errors_only = []
    workers = max(getattr(executor, "n_workers", 1), 1)
    fail_fast = max(FAIL_FAST_CHUNKS, workers)
    results = executor.run(tasks)
    try:
        for result in results:
            computed += store.write(result)
            n_chunks += 1
            if result.backend:
                store.add_to_list_attr("backends", result.backend)
            progress.rows(finished(), failed())
            if on_chunk is not None:
                on_chunk(result)
            if len(errors_only) < fail_fast:
                status = np.asarray(result.status)
                errors_only.append(bool((status == ERROR).any() and not (status == OK).any()))
                if len(errors_only) == fail_fast and all(errors_only):
                    first = result.messages[int(np.argmax(status == ERROR))]
                    raise BatchError(f"the first {fail_fast} chunks all failed, the last with: "
                                     f"{first}; nothing else was computed. Fix the cause and "
                                     f"rerun the same command to continue", exit_code=1)
    finally:
        results.close()
    return _summary(store, computed, n_chunks, t_start)


def _summary(store: BatchFile, computed: int, chunks: int, t_start: float) -> BatchSummary:
    return BatchSummary(path=store.path, n_rows=store.n_rows, counts=store.counts(),
                        computed=computed, chunks=chunks,
                        seconds=time.perf_counter() - t_start,
                        backends=json.loads(store.attrs.get("backends", "[]")))
