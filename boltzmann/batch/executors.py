"""Where chunks run: one thread per local device, or Dask tasks on a cluster.

Both executors take an iterable of ``ChunkTask`` and yield ``ChunkResult`` in completion order;
only the driver's thread writes the file, so neither needs to know about HDF5.

``LocalExecutor`` gives every device its own thread, which takes the next chunk from a shared
queue (a faster device simply takes more chunks) and launches it under
``jax.default_device(device)``, so each chunk's arrays, compiled programs and solver launch
live on that device. A separate thread validates the rows of the coming chunks meanwhile
(``compute.prepare``), so that work overlaps the launches instead of adding to them. With one
device the launches run without a device context at all: JAX keys compiled programs by the
default-device setting, and the batch then reuses what a plain ``run_ensemble`` compiled.

``DaskExecutor`` submits chunks to a ``distributed`` scheduler, a bounded window at a time so a
million-row table is not queued at once; each worker validates and launches on its own default
device (one worker per GPU). A lost worker or any error fails only that chunk's rows, as
``ERROR`` (a restart retries them).
"""
from __future__ import annotations

import queue
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterable, Iterator

import jax

from .. import runtime
from .compute import ChunkTask, compute_chunk, failed_result, prepare, solve_chunk
from .errors import BatchError

__all__ = ["LocalExecutor", "DaskExecutor", "resolve_devices", "worker_compute"]

_DONE = object()


def resolve_devices(spec="all") -> list:
    """JAX devices from ``--devices``: "all", or device ids like "0" or "0,1" (as
    CUDA_VISIBLE_DEVICES, but counted among the devices JAX sees)."""
    devices = jax.devices()
    text = "all" if spec is None else str(spec).strip().lower()
    if text == "all":
        return list(devices)
    listing = ", ".join(f"{i}: {d}" for i, d in enumerate(devices))
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
            raise IndexError
        return [devices[i] for i in ids]
    except (ValueError, IndexError):
        raise BatchError(f"--devices {spec!r}: give 'all' or distinct device ids such as 0 or "
                         f"0,1; visible devices are {listing}") from None


class LocalExecutor:
    """A thread per device; see the module docstring.

    backend_for(device) makes that device's solver backend (one each: a backend object keeps
    per-launch state). prepare/solve: the two halves of a chunk (compute.py).
    """

    def __init__(self, devices: list, backend_for: Callable, *, prepare_fn=prepare,
                 solve_fn=solve_chunk):
        if not devices:
            raise BatchError("no device to run on")
        self.devices = list(devices)
        self.backend_for = backend_for
        self.prepare_fn = prepare_fn
        self.solve_fn = solve_fn
        self._stop = threading.Event()

    @property
    def n_workers(self) -> int:
        return len(self.devices)

    def _context(self, device):
        if len(self.devices) == 1 and device == jax.devices()[0] \
                and jax.config.jax_default_device is None:
            return nullcontext()
        return jax.default_device(device)

    def _put(self, q: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _prepare_all(self, tasks, ready: queue.Queue, results: queue.Queue) -> None:
        try:
            for task in tasks:
                if self._stop.is_set():
                    break
                try:
                    item = self.prepare_fn(task)
                except Exception as exc:  # noqa: BLE001 - recorded for the chunk's rows
                    results.put(failed_result(task, exc))
                    continue
                if not self._put(ready, item):
                    break
        finally:
            for _ in self.devices:
                self._put(ready, None)

    def _launch_all(self, device, ready: queue.Queue, results: queue.Queue) -> None:
        try:
            with self._context(device):
                backend = self.backend_for(device)
                while not self._stop.is_set():
                    try:
                        item = ready.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    if item is None:
                        break
                    try:
                        results.put(self.solve_fn(item, backend))
                    except Exception as exc:  # noqa: BLE001 - recorded for the chunk's rows
                        results.put(failed_result(item.task, exc))
        except Exception as exc:  # noqa: BLE001 - the backend itself failed: stop the batch
            results.put(exc)
        finally:
            results.put(_DONE)

    def run(self, tasks: Iterable[ChunkTask]) -> Iterator:
        self._stop.clear()
        ready: queue.Queue = queue.Queue(maxsize=len(self.devices))
        results: queue.Queue = queue.Queue()
        threads = [threading.Thread(target=self._prepare_all, args=(iter(tasks), ready, results),
                                    name="batch-prepare", daemon=True)]
        threads += [threading.Thread(target=self._launch_all, args=(d, ready, results),
                                     name=f"batch-{d}", daemon=True) for d in self.devices]
        for t in threads:
            t.start()
        finished = 0
        try:
            while finished < len(self.devices):
                try:
                    item = results.get(timeout=0.2)   # a timeout keeps Ctrl-C responsive
                except queue.Empty:
                    continue
                if item is _DONE:
                    finished += 1
                elif isinstance(item, Exception):
                    raise BatchError(f"cannot launch on this device: {type(item).__name__}: "
                                     f"{item}", exit_code=1) from item
                else:
                    yield item
            while not results.empty():  # results of the preparer after the last launch
                item = results.get()
                if item is not _DONE and not isinstance(item, Exception):
                    yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop handing out chunks; a launch in progress finishes in its (daemon) thread."""
        self._stop.set()


# --------------------------------------------------------------------------- Dask
_WORKER_LOCK = threading.Lock()
_WORKER_STATE: dict = {}


def worker_compute(task: ChunkTask):
    """A chunk on a Dask worker: float64 and the compilation cache set up once per process
    (from the worker's environment: BOLTZMANN_CACHE_DIR, ...), one backend per name."""
    with _WORKER_LOCK:
        if "settings" not in _WORKER_STATE:
            settings = runtime.Settings.from_environment()
            runtime.configure(settings)
            _WORKER_STATE["settings"] = settings
        key = ("backend", task.backend)
        if key not in _WORKER_STATE:
            _WORKER_STATE[key] = runtime.backend_for(task.backend, _WORKER_STATE["settings"])
        backend = _WORKER_STATE[key]
    return compute_chunk(task, backend)


class DaskExecutor:
    """Chunks as tasks of a Dask ``distributed`` cluster; see the module docstring.

    scheduler: an address ("tcp://host:8786"), a scheduler file (a path to the JSON a
    ``dask scheduler --scheduler-file`` wrote) or a ``distributed.Client``.
    """

    def __init__(self, scheduler, *, window: int | None = None, compute_fn=worker_compute):
        try:
            import distributed
        except ImportError as exc:
            raise BatchError("--scheduler needs Dask distributed: pip install "
                             "'boltzmann-gpu[batch]'") from exc
        self._distributed = distributed
        self._own = not isinstance(scheduler, distributed.Client)
        if not self._own:
            self.client = scheduler
        else:
            try:
                if Path(str(scheduler)).is_file():
                    self.client = distributed.Client(scheduler_file=str(scheduler), timeout="60s")
                else:
                    self.client = distributed.Client(str(scheduler), timeout="60s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise BatchError(f"cannot reach the Dask scheduler {scheduler!r}: {exc}; start "
                                 f"it first (docs/batch.md) or check the address") from exc
        self.compute_fn = compute_fn
        self.window = window
        self._futures: dict = {}

    @property
    def n_workers(self) -> int:
        info = self.client.scheduler_info()
        return max(1, sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()))

    def run(self, tasks: Iterable[ChunkTask]) -> Iterator:
        tasks = iter(tasks)
        window = self.window or max(4, 2 * self.n_workers)
        pending = self._distributed.as_completed()

        def submit_next() -> bool:
            task = next(tasks, None)
            if task is None:
                return False
            future = self.client.submit(self.compute_fn, task, pure=False)
            self._futures[future] = task
            pending.add(future)
            return True

        for _ in range(window):
            if not submit_next():
                break
        try:
            for future in pending:
                task = self._futures.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - a lost worker fails its chunk only
                    result = failed_result(task, exc)
                future.release()
                submit_next()
                yield result
        finally:
            self.close()

    def close(self) -> None:
        """Cancel what is still queued; disconnect a client this executor made."""
        if self._futures:
            self.client.cancel(list(self._futures))
            self._futures.clear()
        if self._own and self.client.status not in ("closed", "closing"):
            self.client.close()
