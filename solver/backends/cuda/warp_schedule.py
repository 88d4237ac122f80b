"""Host-side tables that let the lanes of one warp share a trajectory's linear algebra.

The warp kernel (``codegen.warp``) runs one trajectory on ``lanes`` threads.  What each lane does
is data, laid out so that the kernel text can be straight-line: every *field* is one row of
``lanes`` values (lane l reads ``table[offset + l]``, the offset a literal of the text), and
every phase is a sequence of *rounds*, each a fixed number of fields that every lane reads,
padded where a lane has less to do.  Two arrays carry them: ``ints`` (uint32) and ``reals``
(float64, the Jacobian's term constants).

* ownership: each lane owns up to K rows (states), rows sorted by their count of Jacobian terms
  and dealt round robin, so that the q-th rows of all lanes cost about the same; a lane's
  stage vectors, f and ∂f/∂t live in its local memory for its rows;
* the entries of the owned rows: per entry its column, its index (for W) and its (constant,
  monomial) terms (``solver.linalg.entry_terms``), so f_r = Σ_e (Σ_t c_t G_m) y_col;
* factorisation levels: every operation of ``sparse_lu.factor_schedule`` at the first level
  where its inputs are final; updates into one slot in one level form one task; a task is
  (dst | op << 16, aux, pairs) with op 0 update, 1 scale by ``aux``, 2 pivot;
* the scaling of U's rows by the reciprocal pivots (U' = D⁻¹U, unit upper), then the solves as
  column-oriented *update levels*: z_i −= L_ik z_k as soon as z_k is final, the updates into one
  row in one level one task -- a dense block costs one level per column, not a dot product per
  row; between the two solves each lane scales its rows by 1/u_kk.

Pairs of 16-bit slot/row indices share one uint32.  Padding points at a scratch slot (written,
never read) and a zero slot.  :func:`check_levels` shows that no level lets two lanes write one
place or one lane read what another writes; :func:`run_factor` / :func:`run_solve` execute the
programs in Python (tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...linalg.sparse_lu import factor_schedule

__all__ = ["WarpSchedule", "Round", "build_warp_schedule", "check_levels", "run_factor",
           "run_solve"]

_MASK = 0xFFFF


@dataclass(frozen=True)
class Round:
    """One round of a phase: ``head`` (and ``aux``) field offsets, ``pairs`` the offsets of
    its packed-pair fields; ``ops``: the operations any lane does in it (factor: 0/1/2)."""

    head: int
    aux: int
    pairs: tuple
    ops: frozenset = frozenset()


@dataclass(frozen=True)
class OwnedEntry:
    """Entry ``j`` of every lane's q-th row: fields of the column, its elimination position,
    the entry index and the terms (constant offsets in ``reals``, monomial offsets in
    ``ints``)."""

    col: int
    colpos: int
    index: int
    coefs: tuple
    monos: tuple


@dataclass(frozen=True)
class WarpSchedule:
    lanes: int
    n: int
    per_lane: int                      # K
    nslots: int
    n_entries: int
    own_row: tuple                     # K field offsets: the q-th owned row (n = none)
    own_pos: tuple                     # its position in elimination order (n = none)
    own_diag: tuple                    # its diagonal slot (scratch for none)
    entries: tuple                     # K tuples of OwnedEntry
    wslot: int                         # per-slot field rows: ceil(nslots / lanes) fields
    factor: tuple                      # levels: tuples of Round
    uscale: tuple                      # rounds of (slot, diagonal slot)
    forward: tuple                     # levels of Rounds (row | 0, pairs (slot, k))
    backward: tuple
    ints: np.ndarray = field(repr=False)
    reals: np.ndarray = field(repr=False)

    @property
    def scratch(self) -> int:
        return self.nslots           # LU slot written by padding, never read

    @property
    def zero(self) -> int:
        return self.nslots + 1       # LU slot holding 0.0

    @property
    def n_factor_levels(self) -> int:
        return len(self.factor)

    @property
    def n_forward_levels(self) -> int:
        return len(self.forward)

    @property
    def n_backward_levels(self) -> int:
        return len(self.backward)


class _Fields:
    """Rows of ``lanes`` values appended to a uint32 or float64 table."""

    def __init__(self, lanes):
        self.lanes = lanes
        self.ints: list = []
        self.reals: list = []

    def int_row(self, values, pad) -> int:
        row = list(values) + [pad] * (self.lanes - len(values))
        at = len(self.ints)
        self.ints += [int(v) for v in row]
        return at

    def real_row(self, values) -> int:
        row = list(values) + [0.0] * (self.lanes - len(values))
        at = len(self.reals)
        self.reals += [float(v) for v in row]
        return at


def _pack(a, b) -> int:
    if not (0 <= a <= _MASK and 0 <= b <= _MASK):
        raise ValueError("warp schedule: an index does not fit 16 bits")
    return int(a) | (int(b) << 16)


def _factor_levels(sym):
    """Levels of factor tasks (dst, op, aux, pairs)."""
    nnz = sym.nnz
    row_of_slot = np.repeat(np.arange(sym.n), np.diff(sym.row_ptr))
    is_upper = sym.col_idx > row_of_slot
    pending = np.zeros(nnz, dtype=np.int64)
    final = np.zeros(nnz, dtype=np.int64)

    def ready(s):
        return pending[s] if is_upper[s] else final[s]

    levels: dict[int, dict] = {}
    for op in factor_schedule(sym):
        if op[0] == "update":
            _, s, s_ik, s_kj = op
            lv = int(max(ready(s_ik), ready(s_kj)) + 1)
            pending[s] = max(pending[s], lv)
            levels.setdefault(lv, {}).setdefault(s, [0, None, []])[2].append((s_ik, s_kj))
        elif op[0] == "scale":
            _, s, s_kk = op
            lv = int(max(pending[s], final[s_kk]) + 1)
            final[s] = lv
            levels.setdefault(lv, {})[s] = [1, s_kk, []]
        else:
            _, s = op
            lv = int(pending[s] + 1)
            final[s] = lv
            levels.setdefault(lv, {})[s] = [2, None, []]
    return [[(dst, op, aux, pairs) for dst, (op, aux, pairs) in levels[lv].items()]
            for lv in sorted(levels)]


def _update_levels(rows, order, n):
    """Column-oriented levels of z_i -= a_s z_k: rows[i] = [(s, k)], i processed in ``order``
    (every k before the rows that need it); tasks (i, pairs)."""
    final = np.zeros(n, dtype=np.int64)
    levels: dict[int, dict] = {}
    for i in order:
        top = 0
        for s, k in rows[i]:
            lv = int(final[k]) + 1
            levels.setdefault(lv, {}).setdefault(i, []).append((s, k))
            top = max(top, lv)
        final[i] = top
    return [[(i, pairs) for i, pairs in levels[lv].items()] for lv in sorted(levels)]


def _rounds(fields, tasks, lanes, encode_head, pad_head, pad_pair, aux_of=None):
    """Rounds of ``lanes`` tasks (heaviest first); a task is (head values, aux, pairs)."""
    out = []
    tasks = sorted(tasks, key=lambda t: -len(t[2]))
    for r in range(0, len(tasks), lanes):
        chunk = tasks[r:r + lanes]
        head = fields.int_row([encode_head(t) for t in chunk], pad_head)
        aux = -1
        if aux_of is not None and any(t[1] is not None for t in chunk):
            aux = fields.int_row([aux_of(t) for t in chunk], pad_pair & _MASK)
        width = max(len(t[2]) for t in chunk)
        pairs = tuple(fields.int_row([_pack(*t[2][j]) if j < len(t[2]) else pad_pair
                                      for t in chunk], pad_pair) for j in range(width))
        out.append(Round(head=head, aux=aux, pairs=pairs,
                         ops=frozenset(t[3] for t in chunk) if len(chunk[0]) > 3 else
                         frozenset()))
    return tuple(out)


def build_warp_schedule(linear, entry_rows, entry_cols, entry_slots, terms,
                        lanes: int) -> WarpSchedule:
    """The tables for a sparse :class:`LinearSolver` (with ``symbolic``), a declared Jacobian's
    entries (row-major; ``entry_slots`` their LU slots; ``terms`` its EntryTerms), ``lanes``."""
    sym = linear.symbolic
    if sym is None:
        raise ValueError("the warp kernel needs the sparse LU's symbolic factorisation")
    n, ns = sym.n, sym.nnz
    rows = np.asarray(entry_rows, np.int64)
    cols = np.asarray(entry_cols, np.int64)
    m = rows.size
    if m and np.any(np.diff(rows * n + cols) <= 0):
        raise ValueError("the declared Jacobian's entries must be row-major and distinct")
    F = _Fields(lanes)
    scratch, zero = ns, ns + 1
    zpair = _pack(zero, zero)

    # ownership and the owned rows' entries ---------------------------------------------------
    by_row = [[] for _ in range(n)]
    for e, r in enumerate(rows):
        by_row[int(r)].append(e)
    cost = [sum(len(terms.terms[e]) for e in by_row[r]) + 1 for r in range(n)]
    K = -(-n // lanes)
    order = sorted(range(n), key=lambda r: (-cost[r], r))
    owned = [[order[q * lanes + ln] if q * lanes + ln < n else None for ln in range(lanes)]
             for q in range(K)]
    own_row = tuple(F.int_row([n if r is None else r for r in owned[q]], n) for q in range(K))
    own_pos = tuple(F.int_row([n if r is None else int(sym.position[r]) for r in owned[q]], n)
                    for q in range(K))
    own_diag = tuple(F.int_row([zero if r is None else int(linear.diag_slots[r])
                                for r in owned[q]], zero) for q in range(K))
    entries = []
    for q in range(K):
        lists = [by_row[r] if r is not None else [] for r in owned[q]]
        width = max(len(x) for x in lists)
        row_entries = []
        for j in range(width):
            ej = [x[j] if j < len(x) else None for x in lists]
            col = F.int_row([n if e is None else int(cols[e]) for e in ej], n)
            colpos = F.int_row([n if e is None else int(sym.position[cols[e]]) for e in ej], n)
            idx = F.int_row([m if e is None else e for e in ej], m)
            nt = max(len(terms.terms[e]) if e is not None else 0 for e in ej)
            coefs = tuple(F.real_row([terms.terms[e][t][0] if e is not None and
                                      t < len(terms.terms[e]) else 0.0 for e in ej])
                          for t in range(nt))
            monos = tuple(F.int_row([terms.terms[e][t][1] if e is not None and
                                     t < len(terms.terms[e]) else 0 for e in ej], 0)
                          for t in range(nt))
            row_entries.append(OwnedEntry(col, colpos, idx, coefs, monos))
        entries.append(tuple(row_entries))

    # W = I/(hγ) - J by slots: code 2 (e + 1) + diagonal ----------------------------------------
    code = np.zeros(ns, dtype=np.int64)
    code[np.asarray(entry_slots, np.int64)] = 2 * (np.arange(m) + 1)
    code[np.asarray(linear.diag_slots, np.int64)] += 1
    wslot = F.int_row(code[:lanes], 0)
    for start in range(lanes, ns, lanes):
        F.int_row(code[start:start + lanes], 0)

    # factorisation, U' = D^-1 U, solves ----------------------------------------------------------
    factor = tuple(_rounds(F, [((d, op), aux, pairs, op) for d, op, aux, pairs in tasks], lanes,
                           lambda t: t[0][0] | (t[0][1] << 16), scratch, zpair,
                           aux_of=lambda t: zero if t[1] is None else t[1])
                   for tasks in _factor_levels(sym))
    row_of_slot = np.repeat(np.arange(n), np.diff(sym.row_ptr))
    diag_perm = np.empty(n, dtype=np.int64)
    lower = [[] for _ in range(n)]
    upper = [[] for _ in range(n)]
    for k in range(n):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                lower[k].append((s, j))
            elif j > k:
                upper[k].append((s, j))
            else:
                diag_perm[k] = s
    up_slots = [s for s in range(ns) if sym.col_idx[s] > row_of_slot[s]]
    uscale = tuple(F.int_row([_pack(s, diag_perm[row_of_slot[s]]) for s in up_slots[i:i + lanes]],
                             zpair) for i in range(0, len(up_slots), lanes))
    fwd = tuple(_rounds(F, [(k, None, pairs) for k, pairs in tasks], lanes, lambda t: t[0], n,
                        _pack(zero, n)) for tasks in _update_levels(lower, range(n), n))
    bwd = tuple(_rounds(F, [(k, None, pairs) for k, pairs in tasks], lanes, lambda t: t[0], n,
                        _pack(zero, n)) for tasks in _update_levels(upper, reversed(range(n)), n))
    ints = np.asarray(F.ints, dtype=np.int64)
    if ints.size and (ints.min() < 0 or ints.max() >= 2 ** 32):
        raise ValueError("warp schedule does not fit uint32")
    return WarpSchedule(lanes=lanes, n=n, per_lane=K, nslots=ns, n_entries=m, own_row=own_row,
                        own_pos=own_pos, own_diag=own_diag, entries=tuple(entries), wslot=wslot,
                        factor=factor, uscale=uscale, forward=fwd, backward=bwd,
                        ints=np.ascontiguousarray(ints.astype(np.uint32)),
                        reals=np.ascontiguousarray(np.asarray(F.reals or [0.0], np.float64)))


# ------------------------------------------------------------------------------ Python runners
def _lanes(ws, at):
    return ws.ints[at:at + ws.lanes].astype(np.int64)


def _unpack(v):
    return v & _MASK, v >> 16


def run_factor(ws: WarpSchedule, w) -> np.ndarray:
    """The factorisation and the U scaling as the kernel runs them (tests); slot layout."""
    lu = np.zeros(ws.nslots + 2)
    lu[:ws.nslots] = w
    for level in ws.factor:
        writes = {}
        for rd in level:
            head = _lanes(ws, rd.head)
            aux = _lanes(ws, rd.aux) if rd.aux >= 0 else None
            pairs = [_unpack(_lanes(ws, p)) for p in rd.pairs]
            for ln in range(ws.lanes):
                dst, op = head[ln] & _MASK, head[ln] >> 16
                acc = lu[dst] - sum(lu[a[ln]] * lu[b[ln]] for a, b in pairs)
                if op == 1:
                    acc = acc * lu[aux[ln]]
                elif op == 2:
                    acc = 1.0 / acc
                writes[dst] = acc
        for dst, v in writes.items():
            if dst < ws.nslots:
                lu[dst] = v
    for at in ws.uscale:
        s, d = _unpack(_lanes(ws, at))
        lu[s] = lu[s] * lu[d]
    lu[ws.zero] = 0.0
    return lu


def run_solve(ws: WarpSchedule, lu, b, position) -> np.ndarray:
    """W x = b through the solve programs (b, x in original order; tests)."""
    n = ws.n
    xv = np.zeros(n + 1)
    xv[np.asarray(position)] = b
    for levels, scale in ((ws.forward, False), (ws.backward, True)):
        if scale:
            for q in range(ws.per_lane):
                pos, d = _lanes(ws, ws.own_pos[q]), _lanes(ws, ws.own_diag[q])
                for ln in range(ws.lanes):
                    if pos[ln] < n:
                        xv[pos[ln]] *= lu[d[ln]]
        for level in levels:
            writes = {}
            for rd in level:
                head = _lanes(ws, rd.head)
                pairs = [_unpack(_lanes(ws, p)) for p in rd.pairs]
                for ln in range(ws.lanes):
                    writes[head[ln]] = xv[head[ln]] - sum(lu[s[ln]] * xv[k[ln]]
                                                          for s, k in pairs)
            for k, v in writes.items():
                if k < n:
                    xv[k] = v
    return xv[np.asarray(position)]


def check_levels(ws: WarpSchedule) -> None:
    """In every level no place (slot or row) other than the scratch is written by two tasks, and
    none is read that a task of the level writes: lanes may run a level in any order."""
    def check(levels, what, limit, extra_reads):
        for lv, level in enumerate(levels):
            writes, reads = [], set()
            for rd in level:
                head = _lanes(ws, rd.head) & _MASK
                writes += [int(h) for h in head if h < limit]
                for p in rd.pairs:
                    a, b = _unpack(_lanes(ws, p))
                    reads |= set(extra_reads(a, b))
                if rd.aux >= 0:
                    reads |= set(int(v) for v in _lanes(ws, rd.aux))
            if len(set(writes)) != len(writes):
                raise AssertionError(f"{what} level {lv}: a place written twice")
            if reads & set(writes):
                raise AssertionError(f"{what} level {lv}: reads {sorted(reads & set(writes))[:5]}"
                                     " written in the same level")

    check(ws.factor, "factor", ws.nslots, lambda a, b: list(a) + list(b))
    check(ws.forward, "forward solve", ws.n, lambda s, k: list(k))
    check(ws.backward, "backward solve", ws.n, lambda s, k: list(k))
