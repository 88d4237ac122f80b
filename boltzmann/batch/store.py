"""The batch's HDF5 file: its layout, its creation, resuming into it, and writing one chunk.

Layout (N rows of the table, P columns, Z redshifts, K wavenumbers; docs/batch.md):

    params (N, P)        the table as read; NaN = empty cell (the config's value); attrs names
    status (N,) int8     STATUS codes: -1 not computed yet, 0 ok, > 0 failed (why: message)
    message (N,) S256    UTF-8 reason of a failure, "warning: ..." on an ok row, else empty
    z (Z,)               redshifts;  k (N, K) [1/Mpc]
    pk_m, pk_cb (N, Z, K) [Mpc^3];  sigma8, sigma8_cb (N, Z)
    derived/<name> (N,)  z_reio, z_rec, z_star, z_drag
    attrs                format, config (YAML), config_hash, table_hash, code_version(s), ...

Crash safety comes from never changing the file's structure after it is made: every dataset is
contiguous and allocated (filled with NaN, status -1) when the file is created — under a
temporary name, renamed into place when complete — so writing a chunk only overwrites bytes in
place. A chunk writes its numbers, flushes, then writes its status and flushes again: status is
the commit mark, so a process killed at any moment leaves a readable file in which every row
marked done is complete, and a restart recomputes the rest.
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import numpy as np

from ..tables import DERIVED
from .errors import BatchError

__all__ = ["BatchFile", "StoreError", "STATUS", "PENDING", "OK", "INVALID", "SOLVER",
           "NONFINITE", "ERROR", "FORMAT", "MESSAGE_BYTES", "h5py_module", "read_messages"]

FORMAT = "boltzmann-batch 1"
PENDING, OK, INVALID, SOLVER, NONFINITE, ERROR = -1, 0, 1, 2, 3, 4
#: what each status code means (also stored in the file's attributes)
STATUS = {
    PENDING: "not computed yet (a restart computes it)",
    OK: "ok",
    INVALID: "invalid input row (unreadable cell or failed validation; final)",
    SOLVER: "a perturbation mode failed to integrate (final)",
    NONFINITE: "the solver finished but a result is not finite/positive (final)",
    ERROR: "the chunk raised an error, e.g. out of memory or a lost worker (a restart retries)",
}
#: length of one message; longer messages are cut with "..."
MESSAGE_BYTES = 256


class StoreError(BatchError):
    """The output file cannot be made, opened or resumed; the message says what to change."""


def h5py_module():
    """h5py, or a StoreError telling how to install it."""
    try:
        import h5py
    except ImportError as exc:
        raise StoreError("batch mode writes HDF5 through h5py, which is not installed: "
                         "pip install 'boltzmann-gpu[batch]'") from exc
    return h5py


def encode_message(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) <= MESSAGE_BYTES:
        return raw
    return raw[:MESSAGE_BYTES - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."


def _rows_index(rows: np.ndarray):
    """A slice for consecutive rows (fast), else the sorted row list."""
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows.tolist()


class BatchFile:
    """An open batch file: create with ``create``, resume with ``open``; ``write(result)``."""

    def __init__(self, path: Path, handle):
        self.path = path
        self.h5 = handle
        self.status = np.asarray(handle["status"][...])

    # ------------------------------------------------------------------ create
    @classmethod
    def create(cls, path, *, names, values, z, n_k: int, attrs: dict) -> "BatchFile":
        """Make the file with every dataset allocated, under a temporary name, then rename."""
        h5py = h5py_module()
        path = Path(path)
        tmp = path.with_name(f".{path.name}.creating")
        N = int(values.shape[0])
        Z = len(z)
        try:
            with h5py.File(tmp, "w") as f:
                def dataset(name, shape, dtype, fill):
                    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
                    return f.create_dataset(name, shape=shape, dtype=dtype, fillvalue=fill,
                                            dcpl=dcpl, fill_time="alloc")

                f.create_dataset("params", data=np.asarray(values, np.float64))
                f["params"].attrs["names"] = json.dumps(list(names))
                dataset("status", (N,), np.int8, PENDING)
                dataset("message", (N,), f"S{MESSAGE_BYTES}", b"")
                f.create_dataset("z", data=np.asarray(z, np.float64))
                dataset("k", (N, n_k), np.float64, np.nan)
                dataset("pk_m", (N, Z, n_k), np.float64, np.nan)
                dataset("pk_cb", (N, Z, n_k), np.float64, np.nan)
                dataset("sigma8", (N, Z), np.float64, np.nan)
                dataset("sigma8_cb", (N, Z), np.float64, np.nan)
                for name in DERIVED:
                    dataset(f"derived/{name}", (N,), np.float64, np.nan)
                f.attrs.update({"format": FORMAT, "status_codes": json.dumps(STATUS),
                                "created": datetime.datetime.now().isoformat(timespec="seconds"),
                                "n_rows": N, **attrs})
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
            raise StoreError(f"cannot write the output file {path} ({reason}); choose a "
                             f"writable --out path") from exc
        return cls.open(path)

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, path) -> "BatchFile":
        h5py = h5py_module()
        path = Path(path)
        try:
            handle = h5py.File(path, "r+")
        except OSError as exc:
            text = str(exc)
            if "lock" in text.lower():
                raise StoreError(f"{path} is open in another process (is a batch still running "
                                 f"on it?); wait for it or stop it first") from exc
            if not os.access(path, os.W_OK):
                raise StoreError(f"{path} is not writable: {text}; choose another --out "
                                 f"path") from exc
            raise StoreError(f"{path} cannot be opened as HDF5 ({text}); it is not a batch file "
                             f"or it is damaged: choose another --out path") from exc
        found = handle.attrs.get("format")
        if found != FORMAT:
            handle.close()
            raise StoreError(f"{path} exists but is not a batch file of this version "
                             f"(format {found!r}, expected {FORMAT!r}); choose another --out "
                             f"path")
        return cls(path, handle)

    @property
    def attrs(self):
        return self.h5.attrs

    @property
    def n_rows(self) -> int:
        return int(self.status.shape[0])

    def add_to_list_attr(self, name: str, value: str) -> None:
        """Append ``value`` to a JSON list attribute unless it is there already."""
        items = json.loads(self.attrs.get(name, "[]"))
        if value not in items:
            items.append(value)
            self.attrs[name] = json.dumps(items)
            self.h5.flush()

    # ------------------------------------------------------------------ write
    def needs(self, rows: np.ndarray) -> np.ndarray:
        """The rows (of ``rows``) whose result is missing: not computed, or failed by an error."""
        s = self.status[rows]
        return rows[(s == PENDING) | (s == ERROR)]

    def write_failures(self, failures: dict, code: int) -> None:
        """Status ``code`` and the message for rows given as {row: message} (still pending)."""
        rows = np.array(sorted(r for r in failures if self.status[r] in (PENDING, ERROR)),
                        dtype=np.int64)
        if rows.size == 0:
            return
        self._commit(rows, np.full(rows.size, code, np.int8),
                     [failures[int(r)] for r in rows])

    def write(self, result) -> int:
        """Store a chunk's result (a ``compute.ChunkResult``): the rows that still need it.

        The numbers first and flushed, then the status (the commit mark). Returns the number of
        rows written.
        """
        rows = np.asarray(result.rows, np.int64)
        keep = np.isin(rows, self.needs(rows))
        if not keep.any():
            return 0
        order = np.argsort(rows[keep], kind="stable")
        sel = rows[keep][order]
        index = _rows_index(sel)
        for name, values in result.arrays.items():
            if name in self.h5:
                self.h5[name][index] = np.asarray(values)[keep][order]
        self.h5.flush()
        status = np.asarray(result.status, np.int8)[keep][order]
        messages = [result.messages[i] for i in np.flatnonzero(keep)[order]]
        self._commit(sel, status, messages)
        return int(sel.size)

    def _commit(self, rows: np.ndarray, status: np.ndarray, messages: list) -> None:
        index = _rows_index(rows)
        self.h5["message"][index] = np.array([encode_message(m) for m in messages],
                                             dtype=f"S{MESSAGE_BYTES}")
        self.h5.flush()
        self.h5["status"][index] = status
        self.h5.flush()
        self.status[rows] = status

    def counts(self) -> dict[int, int]:
        """{status code: number of rows}."""
        codes, n = np.unique(self.status, return_counts=True)
        return {int(c): int(k) for c, k in zip(codes, n)}

    def close(self) -> None:
        if self.h5 is not None and self.h5.id.valid:
            self.h5.flush()
            self.h5.close()


def read_messages(dataset) -> list[str]:
    """The message dataset as Python strings."""
    return [m.decode("utf-8", "replace") for m in dataset[...]]
