"""Compiled sparse LU without pivoting for a fixed pattern.

Host-side, once per sparsity pattern:

1. **Ordering.**  Approximate minimum degree (Amestoy, Davis & Duff 1996, SIAM J. Matrix Anal.
   Appl. 17:886) on the symmetrised pattern ``P | P.T | I`` through SuiteSparse AMD as shipped in
   cvxopt (``cvxopt.amd.order``).  The permutation is applied symmetrically, so the diagonal --
   where ``I/(h*gamma)`` lands in ``W = I/(h*gamma) - J`` -- stays on the diagonal.
2. **Symbolic elimination.**  Gaussian elimination without pivoting, row by row (the "IKJ" /
   Doolittle variant), on the permuted pattern gives the exact fill of ``L + U``.  There is no
   pivoting: the pattern is compiled in.  Rosenbrock methods of the Rodas family keep their order
   for an approximate ``W`` (Steinebach 2023), so a poor pivot costs a rejected step, not accuracy.
3. **Slots.**  One CSR image of ``L + U`` in permuted (elimination) order; every original entry
   ``(i, j)`` and every fill entry gets a slot.  The Jacobian sweeps write straight into the slots.
4. **Code.**  :func:`generate_lu_source` writes the factorisation and both triangular solves as
   straight-line SSA code over scalars with every slot a literal index.  The same text runs under
   JAX (inputs jnp arrays) and is meant to compile as a numba-cuda device function.
   :func:`table_lu_functions` is the loop-over-index-tables version for large patterns.

Layout of the factor (the ``lu`` vector, length ``nnz``, slot order): strict-lower slots hold the
multipliers ``l_ik``; strict-upper slots hold ``u_kj``; a diagonal slot holds the RECIPROCAL pivot
``1/u_kk`` (so the eight stage solves of a Rodas step multiply instead of divide).
Fill slots of the INPUT are ignored (the generated code starts fill at zero), so callers need not
clear them, though clearing is harmless.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from .coloring import as_pattern

__all__ = [
    "SymbolicLU",
    "amd_order",
    "symbolic_lu",
    "generate_lu_source",
    "table_lu_functions",
    "factor_schedule",
]


def _check_pattern(pattern) -> np.ndarray:
    pat = np.asarray(pattern)
    if pat.ndim != 2 or pat.shape[0] != pat.shape[1]:
        raise ValueError(f"pattern must be a square 2-D array, got shape {pat.shape}")
    return as_pattern(pat)


def amd_order(pattern) -> np.ndarray:
    """AMD ordering of ``pattern | pattern.T | I``: ``order[k]`` = original index of pivot k."""
    import cvxopt
    import cvxopt.amd

    pat = _check_pattern(pattern)
    n = pat.shape[0]
    sym = pat | pat.T | np.eye(n, dtype=bool)
    rows, cols = np.nonzero(np.tril(sym))
    mat = cvxopt.spmatrix(1.0, rows.tolist(), cols.tolist(), (n, n))
    order = np.array(list(cvxopt.amd.order(mat, "L")), dtype=np.int64)
    if sorted(order.tolist()) != list(range(n)):
        raise RuntimeError("cvxopt.amd.order returned something that is not a permutation")
    return order


@dataclass(frozen=True)
class SymbolicLU:
    """Fill pattern and slot layout of ``L + U`` for one pattern and ordering.

    ``order[k]`` is the original index eliminated k-th; ``position[i]`` the inverse.  CSR arrays
    ``row_ptr``/``col_idx`` are in permuted indices; slot ``s`` is the CSR position.
    ``slot_rows``/``slot_cols`` give each slot's ORIGINAL (row, column); ``slot_of[(i, j)]`` the
    slot of an original entry; ``diag_slots[i]`` the slot of original ``(i, i)``; ``is_fill[s]``
    marks slots created by elimination (not in ``pattern | I``).
    """

    n: int
    order: np.ndarray
    position: np.ndarray
    row_ptr: np.ndarray
    col_idx: np.ndarray
    slot_rows: np.ndarray
    slot_cols: np.ndarray
    is_fill: np.ndarray
    diag_slots: np.ndarray
    slot_of: dict = field(repr=False)

    @property
    def nnz(self) -> int:
        return int(self.col_idx.size)

    @property
    def n_fill(self) -> int:
        return int(self.is_fill.sum())

    def row_slots(self, k: int) -> range:
        """Slots of permuted row ``k``."""
        return range(int(self.row_ptr[k]), int(self.row_ptr[k + 1]))

    def op_counts(self) -> tuple[int, int]:
        """(factor flops, one-solve flops), counting +,-,*,/ each as one."""
        n_factor = 0
        n_solve = 0
        slot_perm = self._perm_slot_index()
        for k in range(self.n):
            for s in self.row_slots(k):
                j = int(self.col_idx[s])
                if j < k:
                    n_factor += 1 + 2 * len(self._upper_cols(k=j, slot_perm=slot_perm))
                    n_solve += 2
                elif j > k:
                    n_solve += 2
            n_factor += 1  # reciprocal pivot
            n_solve += 1
        return n_factor, n_solve

    def _perm_slot_index(self) -> dict:
        return {(k, int(self.col_idx[s])): s for k in range(self.n) for s in self.row_slots(k)}

    def _upper_cols(self, k: int, slot_perm=None) -> list[int]:
        return [int(self.col_idx[s]) for s in self.row_slots(k) if int(self.col_idx[s]) > k]


def _eliminate(rows_perm: list[set]) -> list[list[int]]:
    """Exact symbolic row-wise elimination (no pivoting, no cancellation) on permuted rows."""
    n = len(rows_perm)
    upper: list[list[int]] = [[] for _ in range(n)]
    final: list[list[int]] = []
    for i in range(n):
        row = set(rows_perm[i])
        heap = [k for k in row if k < i]
        heapq.heapify(heap)
        done = set()
        while heap:
            k = heapq.heappop(heap)
            if k in done:
                continue
            done.add(k)
            for j in upper[k]:
                if j not in row:
                    row.add(j)
                    if j < i:
                        heapq.heappush(heap, j)
        cols = sorted(row)
        final.append(cols)
        upper[i] = [j for j in cols if j > i]
    return final


def symbolic_lu(pattern, order=None) -> SymbolicLU:
    """Symbolic LU of ``pattern | I`` in elimination order ``order`` (default: :func:`amd_order`)."""
    pat = _check_pattern(pattern)
    n = pat.shape[0]
    if order is None:
        order = amd_order(pat)
    order = np.asarray(order, dtype=np.int64)
    if order.shape != (n,) or sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"order must be a permutation of range({n})")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    full = pat | np.eye(n, dtype=bool)
    permuted = full[np.ix_(order, order)]
    rows_perm = [set(np.nonzero(permuted[k])[0].tolist()) for k in range(n)]
    final = _eliminate(rows_perm)
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    row_ptr[1:] = np.cumsum([len(c) for c in final])
    col_idx = np.array([j for cols in final for j in cols], dtype=np.int64)
    slot_rows_perm = np.repeat(np.arange(n), [len(c) for c in final])
    slot_rows = order[slot_rows_perm]
    slot_cols = order[col_idx]
    is_fill = ~full[slot_rows, slot_cols]
    slot_of = {(int(i), int(j)): s for s, (i, j) in enumerate(zip(slot_rows, slot_cols))}
    diag_slots = np.array([slot_of[(i, i)] for i in range(n)], dtype=np.int64)
    return SymbolicLU(n=n, order=order, position=position, row_ptr=row_ptr, col_idx=col_idx,
                      slot_rows=slot_rows, slot_cols=slot_cols, is_fill=is_fill,
                      diag_slots=diag_slots, slot_of=slot_of)


def factor_schedule(sym: SymbolicLU):
    """The elimination, in the order every generated form follows: ('scale', s_ik, s_kk),
    ('update', s_ij, s_ik, s_kj) and ('pivot', s_ii) operations on slots."""
    perm_slot = sym._perm_slot_index()
    upper = [[(j, perm_slot[(k, j)]) for j in sym._upper_cols(k)] for k in range(sym.n)]
    for i in range(sym.n):
        for s in sym.row_slots(i):
            k = int(sym.col_idx[s])
            if k >= i:
                break
            yield ("scale", s, perm_slot[(k, k)])
            for j, s_kj in upper[k]:
                yield ("update", perm_slot[(i, j)], s, s_kj)
        yield ("pivot", perm_slot[(i, i)])


def generate_lu_source(sym: SymbolicLU) -> tuple[str, str]:
    """Straight-line SSA source of ``lu_factor(a)`` and ``lu_solve(lu, b)``.

    ``lu_factor`` reads slot values ``a[s]`` (fill slots ignored) and returns the tuple of ``nnz``
    factor values in slot order (see module docstring for the layout).  ``lu_solve`` takes that
    factor and ``b`` in ORIGINAL ordering and returns ``x`` (tuple, original ordering); the
    permutation is folded into the literal indices.
    """
    n, nnz = sym.n, sym.nnz
    version = [0] * nnz
    current: list[str | None] = [None] * nnz
    lines = [
        "def lu_factor(a):",
        f'    """Unpivoted sparse LU, n={n}, nnz={nnz} ({sym.n_fill} fill); generated code."""',
    ]
    for s in range(nnz):
        if not sym.is_fill[s]:
            name = f"a{s}"
            lines.append(f"    {name} = a[{s}]  # ({sym.slot_rows[s]}, {sym.slot_cols[s]})")
            current[s] = name
    row_of_slot = np.repeat(np.arange(n), np.diff(sym.row_ptr))
    last_row = -1
    for op in factor_schedule(sym):
        kind = op[0]
        row = int(row_of_slot[op[1]])
        if row != last_row:
            lines.append(f"    # pivot row {row} (original {sym.order[row]})")
            last_row = row
        if kind == "scale":
            _, s, s_kk = op
            lines.append(f"    l{s} = {current[s]} * d{s_kk}")
            current[s] = f"l{s}"
        elif kind == "update":
            _, s, s_ik, s_kj = op
            version[s] += 1
            name = f"a{s}_{version[s]}"
            prev = current[s]
            rhs = f"-(l{s_ik} * {current[s_kj]})" if prev is None else f"{prev} - l{s_ik} * {current[s_kj]}"
            lines.append(f"    {name} = {rhs}")
            current[s] = name
        else:
            _, s = op
            lines.append(f"    d{s} = 1.0 / {current[s]}")
            current[s] = f"d{s}"
    lines.append("    return (")
    lines.extend(f"        {current[s]}," for s in range(nnz))
    lines.append("    )")
    factor_src = "\n".join(lines) + "\n"

    lines = [
        "def lu_solve(lu, b):",
        f'    """Solve (L U) x = b for the factor of lu_factor, n={n}; b, x in original order."""',
        "    # forward substitution L z = b[order] (unit lower L)",
    ]
    for k in range(n):
        terms = [f"b[{sym.order[k]}]"]
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                terms.append(f"lu[{s}] * z{j}")
        lines.append(f"    z{k} = " + " - ".join(terms))
    lines.append("    # back substitution U x = z; diagonal slots hold 1/u_kk")
    for k in reversed(range(n)):
        terms = [f"z{k}"]
        diag = None
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j > k:
                terms.append(f"lu[{s}] * x{sym.order[j]}")
            elif j == k:
                diag = s
        body = terms[0] if len(terms) == 1 else "(" + " - ".join(terms) + ")"
        lines.append(f"    x{sym.order[k]} = {body} * lu[{diag}]")
    lines.append("    return (" + ", ".join(f"x{i}" for i in range(n)) + ("," if n == 1 else "") + ")")
    solve_src = "\n".join(lines) + "\n"
    return factor_src, solve_src


def table_lu_functions(sym: SymbolicLU):
    """Table-driven ``(lu_factor, lu_solve)`` in JAX (``lax.fori_loop`` over index tables).

    Same interface and factor layout as the generated code, but returns jnp arrays; used above the
    unrolling threshold where straight-line code would be too long to trace/compile.
    """
    import jax
    import jax.numpy as jnp

    kinds, dst, src1, src2 = [], [], [], []
    code = {"scale": 0, "update": 1, "pivot": 2}
    for op in factor_schedule(sym):
        kinds.append(code[op[0]])
        dst.append(op[1])
        src1.append(op[2] if len(op) > 2 else op[1])
        src2.append(op[3] if len(op) > 3 else op[1])
    kinds_a = jnp.asarray(np.array(kinds, dtype=np.int32))
    dst_a = jnp.asarray(np.array(dst, dtype=np.int32))
    src1_a = jnp.asarray(np.array(src1, dtype=np.int32))
    src2_a = jnp.asarray(np.array(src2, dtype=np.int32))
    keep = jnp.asarray(~sym.is_fill)
    n_ops = len(kinds)

    def lu_factor(a):
        vals = jnp.where(keep, jnp.asarray(a), 0.0)

        def body(q, v):
            kind, d, s1, s2 = kinds_a[q], dst_a[q], src1_a[q], src2_a[q]
            cur, x1, x2 = v[d], v[s1], v[s2]
            new = jnp.where(kind == 0, cur * x1, jnp.where(kind == 1, cur - x1 * x2, 1.0 / cur))
            return v.at[d].set(new)

        return jax.lax.fori_loop(0, n_ops, body, vals)

    # forward: for permuted row k, z[k] = b[order[k]] - sum lu[s] z[j]; ops flattened with row ids
    f_row, f_slot, f_col = [], [], []
    b_row, b_slot, b_col = [], [], []
    diag_perm = np.empty(sym.n, dtype=np.int32)
    for k in range(sym.n):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                f_row.append(k), f_slot.append(s), f_col.append(j)
            elif j == k:
                diag_perm[k] = s
    for k in reversed(range(sym.n)):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j > k:
                b_row.append(k), b_slot.append(s), b_col.append(j)
    order_a = jnp.asarray(sym.order)
    position_a = jnp.asarray(sym.position)
    diag_a = jnp.asarray(diag_perm)
    f_tabs = [jnp.asarray(np.array(t, dtype=np.int32)) for t in (f_row, f_slot, f_col)]
    b_tabs = [jnp.asarray(np.array(t, dtype=np.int32)) for t in (b_row, b_slot, b_col)]
    # the back substitution must finish row k (scale by 1/u_kk) before rows above read x[k]:
    # rows are processed in descending order, so scale row k when its last update has been
    # applied; we keep it simple: apply the row's updates, then scale at a row boundary.
    b_row_np = np.array(b_row, dtype=np.int64)
    n = sym.n

    def lu_solve(lu, b):
        lu = jnp.asarray(lu)
        z = jnp.asarray(b)[order_a]

        def fwd(q, z):
            r, s, c = f_tabs[0][q], f_tabs[1][q], f_tabs[2][q]
            return z.at[r].add(-lu[s] * z[c])

        z = jax.lax.fori_loop(0, len(f_row), fwd, z)

        # back substitution by rows, descending; row k's updates read x[j] for j > k (final)
        starts = np.searchsorted(-b_row_np, -np.arange(n), side="left") if len(b_row) else np.zeros(n, int)
        ends = np.searchsorted(-b_row_np, -np.arange(n), side="right") if len(b_row) else np.zeros(n, int)
        starts_a, ends_a = jnp.asarray(starts), jnp.asarray(ends)

        def row_step(m, x):
            k = n - 1 - m

            def upd(q, acc):
                return acc - lu[b_tabs[1][q]] * x[b_tabs[2][q]]

            acc = jax.lax.fori_loop(starts_a[k], ends_a[k], upd, z[k])
            return x.at[k].set(acc * lu[diag_a[k]])

        x = jax.lax.fori_loop(0, n, row_step, jnp.zeros_like(z))
        return x[position_a]

    return lu_factor, lu_solve


def _levels(items):
    """Group ``(level, payload)`` pairs into a dict level -> list of payloads."""
    out: dict[int, list] = {}
    for level, payload in items:
        out.setdefault(level, []).append(payload)
    return out


def level_lu_functions(sym: SymbolicLU):
    """Level-scheduled vectorised ``(lu_factor, lu_solve)`` in JAX; same layout as the generated code.

    Why: XLA's CPU compiler takes tens of seconds on a few thousand scalar operations (measured:
    ~10-60 s for the 70-variable EB-like pattern), so the CPU backend runs the same elimination
    grouped into dependency levels (wavefronts): every level is one gather-multiply-scatter over all
    operations whose inputs are final, so the program has O(levels) array operations instead of
    O(flops) scalar ones.  Updates into one slot commute (``a_ij -= sum_k l_ik u_kj``), so they
    may share a level and are summed by a scatter-add.
    """
    import jax.numpy as jnp

    n, nnz = sym.n, sym.nnz
    pending = np.zeros(nnz, dtype=np.int64)  # level of the last update into a slot so far
    final = np.zeros(nnz, dtype=np.int64)    # level after which a lower/diag slot is final
    row_of_slot = np.repeat(np.arange(n), np.diff(sym.row_ptr))
    is_upper = sym.col_idx > row_of_slot

    def ready(s):
        return pending[s] if is_upper[s] else final[s]

    ops = []
    for op in factor_schedule(sym):
        if op[0] == "update":
            _, s, s_ik, s_kj = op
            level = max(ready(s_ik), ready(s_kj)) + 1
            pending[s] = max(pending[s], level)
            ops.append((level, ("update", s, s_ik, s_kj)))
        elif op[0] == "scale":
            _, s, s_kk = op
            level = max(pending[s], final[s_kk]) + 1
            final[s] = level
            ops.append((level, ("scale", s, s_kk)))
        else:
            _, s = op
            level = pending[s] + 1
            final[s] = level
            ops.append((level, ("pivot", s)))
    factor_levels = []
    for level, group in sorted(_levels(ops).items()):
        def arr(kind, k):
            return np.array([g[k] for g in group if g[0] == kind], dtype=np.int32)
        factor_levels.append(tuple(arr(kind, k) for kind, k in
                                   (("update", 1), ("update", 2), ("update", 3),
                                    ("scale", 1), ("scale", 2), ("pivot", 1))))
    keep = ~sym.is_fill

    def lu_factor(a):
        v = jnp.where(keep, jnp.asarray(a), 0.0)
        for u_dst, u_l, u_u, s_dst, s_d, p_dst in factor_levels:
            old = v
            if u_dst.size:
                v = v.at[u_dst].add(-old[u_l] * old[u_u])
            if s_dst.size:
                v = v.at[s_dst].set(old[s_dst] * old[s_d])
            if p_dst.size:
                v = v.at[p_dst].set(1.0 / old[p_dst])
        return v

    # triangular solves, levelled by rows
    fwd_level = np.zeros(n, dtype=np.int64)
    bwd_level = np.zeros(n, dtype=np.int64)
    diag = np.empty(n, dtype=np.int64)
    lower_entries, upper_entries = [], []
    for k in range(n):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                fwd_level[k] = max(fwd_level[k], fwd_level[j] + 1)
                lower_entries.append((k, s, j))
            elif j == k:
                diag[k] = s
    for k in reversed(range(n)):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j > k:
                bwd_level[k] = max(bwd_level[k], bwd_level[j] + 1)
                upper_entries.append((k, s, j))

    def tables(entries, level_of):
        grouped = _levels((level_of[k], (k, s, j)) for k, s, j in entries)
        return [tuple(np.array([g[c] for g in grouped[lv]], dtype=np.int32) for c in range(3))
                for lv in sorted(grouped)]

    fwd_tables = tables(lower_entries, fwd_level)
    bwd_rows = [np.nonzero(bwd_level == lv)[0].astype(np.int32) for lv in range(bwd_level.max() + 1)]
    bwd_grouped = _levels((bwd_level[k], (k, s, j)) for k, s, j in upper_entries)
    bwd_tables = []
    for lv, rows in enumerate(bwd_rows):
        group = bwd_grouped.get(lv, [])
        ent = tuple(np.array([g[c] for g in group], dtype=np.int32) for c in range(3))
        bwd_tables.append((rows, diag[rows].astype(np.int32)) + ent)
    order = sym.order.astype(np.int32)
    position = sym.position.astype(np.int32)

    def lu_solve(lu, b):
        lu = jnp.asarray(lu)
        z = jnp.asarray(b)[order]
        for rows, slots, cols in fwd_tables:
            z = z.at[rows].add(-lu[slots] * z[cols])
        x = z
        for rows, dslots, e_rows, e_slots, e_cols in bwd_tables:
            if e_rows.size:
                acc = jnp.zeros_like(x).at[e_rows].add(lu[e_slots] * x[e_cols])
                x = x.at[rows].set((x[rows] - acc[rows]) * lu[dslots])
            else:
                x = x.at[rows].set(x[rows] * lu[dslots])
        return x[position]

    lu_factor.n_levels = len(factor_levels)
    return lu_factor, lu_solve
