"""Linear solver for the Rosenbrock matrix ``W = I/(h*gamma) - J`` in a fixed slot layout.

``build_linear_solver(pattern, method)`` returns a :class:`LinearSolver` whose ``factor(w)`` takes
``W`` as a flat vector in slot layout (``w[s]`` is entry ``(slot_rows[s], slot_cols[s])``) and whose
``solve(lu, b)`` solves ``W x = b``.  Both are pure JAX functions of one trajectory (jit-wrapped for
the sparse methods, so eager calls do not dispatch op by op); vmap them for an ensemble.
Two methods:

* ``"sparse"``: AMD ordering + exact symbolic fill + unpivoted LU compiled for the pattern
  (:mod:`solver.linalg.sparse_lu`).  The straight-line generated source is always built and
  exposed as ``source`` (for the CUDA backend); the JAX functions default to the level-scheduled form because
  XLA's CPU compiler is very slow on thousands of scalar ops (see ``jax_impl``); above
  ``UNROLL_MAX_OPS`` operations, the table-driven version.
* ``"dense"``: ``slots = n*n`` row-major, LU with partial pivoting (``jax.scipy.linalg``).

``"auto"`` picks dense for ``n <= DENSE_MAX_N`` (see docs/solver_linear_algebra.md for the timing
that chose the threshold), sparse otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .codegen import compile_functions
from .ordering import depth_order
from .sparse_lu import (SymbolicLU, _check_pattern, generate_lu_source, level_lu_functions,
                        symbolic_lu, table_lu_functions)

__all__ = ["LinearSolver", "build_linear_solver", "build_block_triangular_solver", "DENSE_MAX_N",
           "UNROLL_MAX_OPS"]

#: ``method="auto"`` uses the dense pivoted LU up to this size (measured, see docs).
DENSE_MAX_N = 6
#: Straight-line code up to this many factor + solve operations; index tables above.
UNROLL_MAX_OPS = 20000

_METHODS = ("auto", "dense", "sparse")
_JAX_IMPLS = ("levels", "unrolled", "table")
_ORDERINGS = ("amd", "depth")


@dataclass(frozen=True)
class LinearSolver:
    """Factor/solve pair for one pattern.  ``lu`` returned by ``factor`` is an opaque pytree.

    Attributes: ``n``; ``nslots`` (length of ``w``); ``diag_slots[i]`` slot of ``(i, i)``;
    ``slot_rows``/``slot_cols`` original indices of each slot; ``is_fill`` slots not in the pattern
    (zero in ``W``); ``method`` ("dense" | "sparse" (levels) | "sparse-unrolled" | "sparse-table"); ``source`` the generated
    Python source (None for dense and table-driven); ``symbolic`` the :class:`SymbolicLU` (sparse).
    """

    n: int
    nslots: int
    diag_slots: np.ndarray
    slot_rows: np.ndarray
    slot_cols: np.ndarray
    is_fill: np.ndarray
    method: str
    factor: Callable[[Any], Any]
    solve: Callable[[Any, Any], Any]
    source: str | None = None
    symbolic: SymbolicLU | None = None

    def slot_index(self, i: int, j: int) -> int:
        """Slot of original entry ``(i, j)``; KeyError if structurally absent."""
        if self.symbolic is not None:
            return self.symbolic.slot_of[(int(i), int(j))]
        return int(i) * self.n + int(j)

    def to_dense(self, w) -> np.ndarray:
        """Scatter a slot vector into a dense ``(n, n)`` numpy matrix (tests, debugging)."""
        dense = np.zeros((self.n, self.n), dtype=np.asarray(w).dtype)
        dense[self.slot_rows, self.slot_cols] = np.asarray(w)
        return dense

    def from_dense(self, matrix) -> np.ndarray:
        """Gather a dense matrix into slot layout (fill slots get the matrix value, usually 0)."""
        return np.asarray(matrix)[self.slot_rows, self.slot_cols]


def _dense_solver(n: int) -> LinearSolver:
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    rows, cols = np.divmod(np.arange(n * n), n)

    def factor(w):
        return jsl.lu_factor(jnp.reshape(jnp.asarray(w), (n, n)))

    def solve(lu, b):
        return jsl.lu_solve(lu, jnp.asarray(b))

    return LinearSolver(n=n, nslots=n * n, diag_slots=np.arange(n) * (n + 1), slot_rows=rows,
                        slot_cols=cols, is_fill=np.zeros(n * n, dtype=bool), method="dense",
                        factor=factor, solve=solve)


def _sparse_solver(pattern: np.ndarray, unroll_max_ops: int, jax_impl: str,
                   ordering: str = "amd") -> LinearSolver:
    import jax
    import jax.numpy as jnp

    sym = symbolic_lu(pattern, depth_order(pattern) if ordering == "depth" else None)
    n_factor, n_solve = sym.op_counts()
    common = dict(n=sym.n, nslots=sym.nnz, diag_slots=sym.diag_slots, slot_rows=sym.slot_rows,
                  slot_cols=sym.slot_cols, is_fill=sym.is_fill, symbolic=sym)
    if jax_impl == "table" or n_factor + n_solve > unroll_max_ops:
        table_factor, table_solve = table_lu_functions(sym)
        return LinearSolver(method="sparse-table", factor=jax.jit(table_factor),
                            solve=jax.jit(table_solve), **common)
    factor_src, solve_src = generate_lu_source(sym)
    if jax_impl == "levels":
        level_factor, level_solve = level_lu_functions(sym)
        source = factor_src + "\n\n" + solve_src
        return LinearSolver(method="sparse", factor=jax.jit(level_factor),
                            solve=jax.jit(level_solve), source=source, **common)
    source = factor_src + "\n\n" + solve_src
    fns = compile_functions(source, ["lu_factor", "lu_solve"],
                            label=f"sparse_lu n={sym.n} nnz={sym.nnz}")
    gen_factor, gen_solve = fns["lu_factor"], fns["lu_solve"]

    def factor(w):
        return jnp.stack(gen_factor(jnp.asarray(w)))

    def solve(lu, b):
        return jnp.stack(gen_solve(lu, jnp.asarray(b)))

    return LinearSolver(method="sparse-unrolled", factor=factor, solve=solve, source=source,
                        **common)


def build_linear_solver(pattern, method: str = "auto", *, unroll_max_ops: int = UNROLL_MAX_OPS,
                        dense_max_n: int = DENSE_MAX_N, jax_impl: str = "levels",
                        ordering: str = "amd") -> LinearSolver:
    """Build the factor/solve pair for ``W`` with structure ``pattern | I``.

    ``pattern``: square boolean array (``[i, j]`` True where ``J`` may be nonzero); the diagonal is
    always added.  ``method``: "auto", "dense" or "sparse".

    ``jax_impl`` (sparse only) chooses how the JAX functions run the compiled elimination:
    "levels" (default; dependency-level vectorised gathers/scatters, compiles in seconds),
    "unrolled" (the generated straight-line source itself: exactly what the CUDA backend compiles,
    but XLA CPU compile time grows to tens of seconds at ~1000 operations), "table" (fori_loop over
    index tables: fastest to compile, slowest to run).  All share the slot and factor layout, and
    ``source`` always holds the generated straight-line code.

    ``ordering`` (sparse only): "amd" (least fill: one thread factors) or "depth" (fewest
    dependency levels: a warp factors and solves together; :mod:`solver.linalg.ordering`).
    """
    if ordering not in _ORDERINGS:
        raise ValueError(f"ordering must be one of {_ORDERINGS}, got {ordering!r}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if jax_impl not in _JAX_IMPLS:
        raise ValueError(f"jax_impl must be one of {_JAX_IMPLS}, got {jax_impl!r}")
    pat = _check_pattern(pattern)
    n = pat.shape[0]
    if n == 0:
        raise ValueError("pattern must have at least one row")
    if method == "auto":
        method = "dense" if n <= dense_max_n else "sparse"
    if method == "dense":
        return _dense_solver(n)
    return _sparse_solver(pat, unroll_max_ops, jax_impl, ordering)


def build_block_triangular_solver(base, coupling, m: int, method: str = "auto",
                                  **kwargs) -> LinearSolver:
    """Linear solver for the Rosenbrock matrix of a forward-sensitivity solve.

    The joint state ``z = [y, s_1 .. s_m]`` (n each) has the block lower-triangular Jacobian
    ``[[J, 0, ..], [H_1, J, 0, ..], .., [H_m, 0, .., J]]`` (``H_d = ∂s_d'/∂y``), so
    ``W = I/(hγ) - J_joint`` is solved exactly by factoring ``W0 = I/(hγ) - J`` once and
    substituting forward: ``W0 u = b_y``, then ``W0 v_d = b_d + H_d u`` for every direction.
    That is the CUDA sensitivity kernel's staggered solve; factoring the whole (m+1)n system
    instead costs ~30× the operations of W0 alone for the reduced EB model with m = 10
    (docs/gradients.md).

    Slot layout: W0's slots (``base``, fill included) first, then per direction the diagonal
    entries of its s block (only so that ``w[diag_slots] += 1/(hγ)`` has somewhere to go: the
    s-block copies of J are neither computed nor read, see ``build_jacobian_plan(seed_columns=)``)
    and the entries of ``coupling`` (the pattern of H_d, shared by all directions).

    ``base``: W0's :class:`LinearSolver` (the plain solve's, reused as it is), or W0's pattern,
    for which one is built with ``method`` and ``kwargs`` (:func:`build_linear_solver`).
    """
    import jax
    import jax.numpy as jnp

    if not isinstance(base, LinearSolver):
        base = build_linear_solver(base, method=method, **kwargs)
    n, nb = base.n, base.nslots
    cpl = np.asarray(coupling, dtype=bool)
    if cpl.shape != (n, n):
        raise ValueError(f"coupling must have shape {(n, n)}, got {cpl.shape}")
    if m < 1:
        raise ValueError(f"a block-triangular solve needs m >= 1 directions, got {m}")
    cr, cc = np.nonzero(cpl)
    nc = cr.size
    per = n + nc                                   # slots per direction: diagonal + coupling
    rows, cols = [base.slot_rows], [base.slot_cols]
    diag = [base.diag_slots]
    for d in range(m):
        off = n * (1 + d)
        rows += [np.arange(n) + off, cr + off]
        cols += [np.arange(n) + off, cc]
        diag.append(nb + d * per + np.arange(n))
    slot_rows = np.concatenate(rows).astype(np.int64)
    slot_cols = np.concatenate(cols).astype(np.int64)
    is_fill = np.concatenate([base.is_fill, np.zeros(m * per, dtype=bool)])

    def factor(w):
        w = jnp.asarray(w)
        wc = w[nb:].reshape(m, per)[:, n:]              # (m, nc): W's (s_d, y) entries = -H_d
        return base.factor(w[:nb]), wc

    def solve(lu, b):
        lu0, wc = lu
        b = jnp.asarray(b)
        u = base.solve(lu0, b[:n])
        wu = jnp.zeros((m, n), dtype=b.dtype).at[:, cr].add(wc * u[cc])   # W_(d,y) u
        v = jax.vmap(lambda r: base.solve(lu0, r))(b[n:].reshape(m, n) - wu)
        return jnp.concatenate([u, v.reshape(-1)])

    return LinearSolver(n=n * (1 + m), nslots=int(slot_rows.size),
                        diag_slots=np.concatenate(diag).astype(np.int64), slot_rows=slot_rows,
                        slot_cols=slot_cols, is_fill=is_fill, method=f"block-{base.method}",
                        factor=factor, solve=solve)
