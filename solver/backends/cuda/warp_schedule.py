"""Host-side tables that let the lanes of one warp share a trajectory's linear algebra.

The warp kernel (``codegen.warp``) runs one trajectory on ``lanes`` threads.  What each lane does
is data, built here once per plan and passed to the kernel as one int32 array (``table``, its
sections at the offsets in ``offsets``, which the kernel text holds as literals):

* ``own``/``ownp`` (lanes × K): the states a lane owns -- their stage vectors live in its local
  memory, it computes their rows of f = J y and writes their entries of every right-hand side
  -- and their positions in elimination order (-1 pads a lane with fewer than K).  Rows are
  dealt largest first to the least loaded lane, by the row's count of Jacobian entries.
* ``jrow``/``jcol``: J's entries in CSR form (row-major, the order of the declared entries).
* ``wslot``: per LU slot, ``2 (e + 1) + diagonal``: the entry e that fills it (-1: fill) and
  whether 1/(hγ) is added, for W = I/(hγ) − J.
* factorisation levels: every operation of ``sparse_lu.factor_schedule`` placed at the first
  level where its inputs are final.  Within a level the operations into one slot commute and
  form one task (dst, count, pairs) run by one lane, so no two lanes write a slot in a level and
  no lane reads a slot another writes in it (:func:`check_levels`).  A scale is
  (dst, -1, s_kk), a pivot (dst, -2).
* triangular-solve levels: a forward task (k, count, (slot, j)…) subtracts the row's final
  z_j; a backward task (k, diagonal slot, count, (slot, j)…) finishes x_k.

Lanes take the tasks of a level round robin, heaviest first; a ``syncwarp`` separates levels.
:func:`run_factor` / :func:`run_solve` execute the tables in Python (tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...linalg.sparse_lu import factor_schedule

__all__ = ["WarpSchedule", "build_warp_schedule", "check_levels", "run_factor", "run_solve"]


@dataclass(frozen=True)
class WarpSchedule:
    """The int32 ``table`` and what the kernel text needs to read it (module docstring)."""

    lanes: int
    n: int
    per_lane: int            # K: owned states per lane (padded with -1)
    nslots: int
    n_entries: int
    n_factor_levels: int
    n_forward_levels: int
    n_backward_levels: int
    offsets: dict
    table: np.ndarray = field(repr=False)
    #: (tasks, pairs) per level, for tests and the cost estimate
    factor_levels: tuple = field(repr=False, default=())

    def section(self, name: str) -> np.ndarray:
        """A section of the table as a view (tests)."""
        names = list(self.offsets)
        start = self.offsets[name]
        later = [self.offsets[m] for m in names if self.offsets[m] > start]
        return self.table[start:min(later) if later else len(self.table)]


def _deal_rows(cost: np.ndarray, lanes: int) -> np.ndarray:
    """(lanes, K) owned rows: largest cost first to the least loaded lane with room."""
    n = cost.size
    K = -(-n // lanes)
    own = -np.ones((lanes, K), dtype=np.int64)
    load = np.zeros(lanes)
    count = np.zeros(lanes, dtype=np.int64)
    for r in sorted(range(n), key=lambda r: (-cost[r], r)):
        room = np.nonzero(count < K)[0]
        lane = room[np.argmin(load[room])]
        own[lane, count[lane]] = r
        count[lane] += 1
        load[lane] += cost[r]
    for lane in range(lanes):   # ascending within a lane: neighbouring rows, nicer memory order
        own[lane, :count[lane]] = np.sort(own[lane, :count[lane]])
    return own


def _factor_tasks(sym):
    """Levels of factor tasks: [(dst, kind, pairs)], kind 'update' | 'scale' | 'pivot'."""
    nnz = sym.nnz
    row_of_slot = np.repeat(np.arange(sym.n), np.diff(sym.row_ptr))
    is_upper = sym.col_idx > row_of_slot
    pending = np.zeros(nnz, dtype=np.int64)   # level of the last update into a slot so far
    final = np.zeros(nnz, dtype=np.int64)     # level after which a lower/diagonal slot is final

    def ready(s):
        return pending[s] if is_upper[s] else final[s]

    levels: dict[int, dict] = {}
    for op in factor_schedule(sym):
        if op[0] == "update":
            _, s, s_ik, s_kj = op
            lv = int(max(ready(s_ik), ready(s_kj)) + 1)
            pending[s] = max(pending[s], lv)
            task = levels.setdefault(lv, {}).setdefault(s, ["update", []])
            task[1].append((s_ik, s_kj))
        elif op[0] == "scale":
            _, s, s_kk = op
            lv = int(max(pending[s], final[s_kk]) + 1)
            final[s] = lv
            levels.setdefault(lv, {})[s] = ["scale", [(s_kk,)]]
        else:
            _, s = op
            lv = int(pending[s] + 1)
            final[s] = lv
            levels.setdefault(lv, {})[s] = ["pivot", []]
    return [[(dst, kind, pairs) for dst, (kind, pairs) in levels[lv].items()]
            for lv in sorted(levels)]


def _solve_tasks(sym):
    """(forward levels, backward levels): lists of row tasks in permuted indices."""
    n = sym.n
    lower = [[] for _ in range(n)]
    upper = [[] for _ in range(n)]
    diag = np.empty(n, dtype=np.int64)
    for k in range(n):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                lower[k].append((s, j))
            elif j > k:
                upper[k].append((s, j))
            else:
                diag[k] = s
    fl = np.zeros(n, dtype=np.int64)
    for k in range(n):
        for _, j in lower[k]:
            fl[k] = max(fl[k], fl[j] + 1)
    bl = np.zeros(n, dtype=np.int64)
    for k in reversed(range(n)):
        for _, j in upper[k]:
            bl[k] = max(bl[k], bl[j] + 1)
    fwd = [[(k, lower[k]) for k in range(n) if fl[k] == lv and lower[k]]
           for lv in range(1, int(fl.max()) + 1)]
    bwd = [[(k, int(diag[k]), upper[k]) for k in range(n) if bl[k] == lv]
           for lv in range(int(bl.max()) + 1)]
    return fwd, bwd


def _pack_levels(levels, encode, cost):
    """(level boundaries, task offsets, data) of task levels, heaviest task first in a level."""
    bounds, offsets, data = [0], [], []
    for tasks in levels:
        for task in sorted(tasks, key=lambda t: -cost(t)):
            offsets.append(len(data))
            data += encode(task)
        bounds.append(len(offsets))
    offsets.append(len(data))
    return bounds, offsets, data


def build_warp_schedule(linear, entry_rows, entry_cols, entry_slots, lanes: int) -> WarpSchedule:
    """The tables for a sparse :class:`LinearSolver` (with ``symbolic``) and a declared
    Jacobian's entries (row-major; ``entry_slots`` their LU slots), for ``lanes`` lanes."""
    sym = linear.symbolic
    if sym is None:
        raise ValueError("the warp kernel needs the sparse LU's symbolic factorisation")
    n = sym.n
    rows = np.asarray(entry_rows, np.int64)
    cols = np.asarray(entry_cols, np.int64)
    m = rows.size
    if m and np.any(np.diff(rows * n + cols) <= 0):
        raise ValueError("the declared Jacobian's entries must be row-major and distinct")
    jrow = np.zeros(n + 1, dtype=np.int64)
    jrow[1:] = np.cumsum(np.bincount(rows, minlength=n))
    own = _deal_rows(np.diff(jrow) + 1.0, lanes)
    ownp = np.where(own >= 0, sym.position[np.maximum(own, 0)], -1)
    wslot = np.zeros(sym.nnz, dtype=np.int64)
    wslot[np.asarray(entry_slots, np.int64)] = 2 * (np.arange(m) + 1)
    wslot[np.asarray(linear.diag_slots, np.int64)] += 1

    flevels = _factor_tasks(sym)

    def enc_factor(task):
        dst, kind, pairs = task
        if kind == "update":
            return [dst, len(pairs)] + [x for pr in pairs for x in pr]
        return [dst, -1, pairs[0][0]] if kind == "scale" else [dst, -2]

    fb, fo, fd = _pack_levels(flevels, enc_factor, lambda t: len(t[2]))
    fwd, bwd = _solve_tasks(sym)
    vb, vo, vd = _pack_levels(fwd, lambda t: [t[0], len(t[1])] + [x for pr in t[1] for x in pr],
                              lambda t: len(t[1]))
    bb, bo, bd = _pack_levels(bwd, lambda t: [t[0], t[1], len(t[2])]
                              + [x for pr in t[2] for x in pr], lambda t: len(t[2]))
    sections = [("own", own.ravel()), ("ownp", ownp.ravel()), ("jrow", jrow), ("jcol", cols),
                ("wslot", wslot), ("flev", fb), ("ftask", fo), ("fdata", fd),
                ("vlev", vb), ("vtask", vo), ("vdata", vd),
                ("blev", bb), ("btask", bo), ("bdata", bd)]
    offsets, parts, at = {}, [], 0
    for name, values in sections:
        values = np.asarray(values, np.int64)
        offsets[name] = at
        parts.append(values)
        at += values.size
    table = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if table.size and (table.max() >= 2 ** 31 or table.min() < -2):
        raise ValueError("warp schedule does not fit int32")
    return WarpSchedule(lanes=lanes, n=n, per_lane=own.shape[1], nslots=sym.nnz, n_entries=m,
                        n_factor_levels=len(flevels), n_forward_levels=len(fwd),
                        n_backward_levels=len(bwd), offsets=offsets,
                        table=np.ascontiguousarray(table.astype(np.int32)),
                        factor_levels=tuple((len(t), sum(len(x[2]) for x in t))
                                            for t in flevels))


# ------------------------------------------------------------------------------ Python runners
def _tasks(ws: WarpSchedule, lev: str, task: str, level: int):
    T, o = ws.table, ws.offsets
    a, b = T[o[lev] + level], T[o[lev] + level + 1]
    return [o[task.replace("task", "data")] + T[o[task] + t] for t in range(a, b)]


def run_factor(ws: WarpSchedule, w) -> np.ndarray:
    """The factorisation as the kernel runs it, level by level (tests)."""
    T = ws.table
    lu = np.array(w, np.float64)
    for lv in range(ws.n_factor_levels):
        new = {}
        for at in _tasks(ws, "flev", "ftask", lv):
            dst, cnt = T[at], T[at + 1]
            if cnt >= 0:
                acc = lu[dst]
                for q in range(cnt):
                    acc -= lu[T[at + 2 + 2 * q]] * lu[T[at + 3 + 2 * q]]
                new[dst] = acc
            elif cnt == -1:
                new[dst] = lu[dst] * lu[T[at + 2]]
            else:
                new[dst] = 1.0 / lu[dst]
        for dst, v in new.items():   # a level's writes land after all its reads
            lu[dst] = v
    return lu


def run_solve(ws: WarpSchedule, lu, b, position) -> np.ndarray:
    """W x = b through the solve levels (b, x in original order; tests)."""
    T = ws.table
    xv = np.empty(ws.n)
    xv[np.asarray(position)] = b
    for lv in range(ws.n_forward_levels):
        new = {}
        for at in _tasks(ws, "vlev", "vtask", lv):
            k, cnt = T[at], T[at + 1]
            new[k] = xv[k] - sum(lu[T[at + 2 + 2 * q]] * xv[T[at + 3 + 2 * q]]
                                 for q in range(cnt))
        for k, v in new.items():
            xv[k] = v
    for lv in range(ws.n_backward_levels):
        new = {}
        for at in _tasks(ws, "blev", "btask", lv):
            k, d, cnt = T[at], T[at + 1], T[at + 2]
            new[k] = (xv[k] - sum(lu[T[at + 3 + 2 * q]] * xv[T[at + 4 + 2 * q]]
                                  for q in range(cnt))) * lu[d]
        for k, v in new.items():
            xv[k] = v
    return xv[np.asarray(position)]


def check_levels(ws: WarpSchedule) -> None:
    """Within every level no slot (factor) or row (solves) is written twice, and none is read
    that another task of the level writes: lanes may run a level's tasks in any order."""
    T = ws.table

    def check(lev, task, reads_writes, what):
        count = {"flev": ws.n_factor_levels, "vlev": ws.n_forward_levels,
                 "blev": ws.n_backward_levels}[lev]
        for lv in range(count):
            writes, reads = set(), set()
            for at in _tasks(ws, lev, task, lv):
                r, wr = reads_writes(at)
                if wr in writes:
                    raise AssertionError(f"{what} level {lv}: {wr} written twice")
                writes.add(wr)
                reads |= r
            if reads & writes:
                raise AssertionError(f"{what} level {lv}: reads {sorted(reads & writes)[:5]} "
                                     "written in the same level")

    def factor_rw(at):
        dst, cnt = T[at], T[at + 1]
        if cnt >= 0:
            r = {int(T[at + 2 + q]) for q in range(2 * cnt)}
        elif cnt == -1:
            r = {int(T[at + 2])}
        else:
            r = set()
        return r, int(dst)

    def fwd_rw(at):
        return {int(T[at + 3 + 2 * q]) for q in range(T[at + 1])}, int(T[at])

    def bwd_rw(at):
        return {int(T[at + 4 + 2 * q]) for q in range(T[at + 2])}, int(T[at])

    check("flev", "ftask", factor_rw, "factor")
    check("vlev", "vtask", fwd_rw, "forward solve")
    check("blev", "btask", bwd_rw, "backward solve")
