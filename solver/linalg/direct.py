"""A Jacobian the right-hand side supplies itself, instead of colour sweeps.

A linear right-hand side f = A(t) y knows its Jacobian: A.  When the rhs carries the attribute
``rhs.linear_jacobian`` (duck-typed; the EB models provide it, derived from their own source by
``models.linear_jacobian``), a solver evaluates the m structural entries directly and needs only one
forward sweep, in t, for f and ∂f/∂t -- instead of one sweep per colour of the pattern plus that
one.  Contract of the attribute:

* ``rows``, ``cols``: the m structural nonzeros of J (every entry the rhs can make nonzero);
* ``values(t, p[, args])``: their values as a tuple (JAX), independent of y;
* for the CUDA backend with tables, ``core_device(t, p, tv)`` and ``device_source``: the same
  given the interpolated table values of ``rhs.table_split``.

:class:`DirectJacobian` maps the entries onto a linear solver's slots with one gather (slots
outside the entries -- LU fill, a diagonal the rhs does not touch -- read 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["direct_jacobian_of", "declared_pattern", "DirectJacobian", "build_direct_jacobian"]

_REQUIRED = ("rows", "cols", "values")


def direct_jacobian_of(rhs):
    """``rhs.linear_jacobian`` if the rhs declares one (checked), else None."""
    lj = getattr(rhs, "linear_jacobian", None)
    if lj is None:
        return None
    missing = [a for a in _REQUIRED if not hasattr(lj, a)]
    if missing or len(lj.rows) != len(lj.cols):
        raise TypeError(f"rhs.linear_jacobian lacks {missing or 'rows/cols of equal length'} "
                        "(solver.linalg.direct)")
    return lj


def declared_pattern(lj, n: int) -> np.ndarray:
    """The (n, n) boolean pattern of the declared entries."""
    rows, cols = np.asarray(lj.rows, np.int64), np.asarray(lj.cols, np.int64)
    if rows.size and (rows.min() < 0 or cols.min() < 0 or max(rows.max(), cols.max()) >= n):
        raise ValueError(f"rhs.linear_jacobian has entries outside an {n} x {n} matrix")
    pattern = np.zeros((n, n), dtype=bool)
    pattern[rows, cols] = True
    return pattern


@dataclass(frozen=True)
class DirectJacobian:
    """``gather[s]``: the entry that lands in slot s, or m (a zero) for slots it does not fill;
    ``entry_slots[e]``: the slot of entry e (what generated device code writes to)."""

    m: int
    gather: np.ndarray
    entry_slots: np.ndarray

    def to_slots(self, values):
        """The entries (a length-m array) in slot layout (JAX)."""
        import jax.numpy as jnp

        v = jnp.asarray(values)
        return jnp.concatenate([v, jnp.zeros((1,), v.dtype)])[self.gather]


def build_direct_jacobian(lj, slot_rows, slot_cols) -> DirectJacobian:
    """Place the declared entries of ``lj`` in a slot layout; every entry must have a slot."""
    slot_rows, slot_cols = np.asarray(slot_rows, np.int64), np.asarray(slot_cols, np.int64)
    n = int(max(slot_rows.max(), slot_cols.max())) + 1 if slot_rows.size else 0
    where = {(int(r), int(c)): s for s, (r, c) in enumerate(zip(slot_rows, slot_cols))}
    m = len(lj.rows)
    entry_slots = np.empty(m, dtype=np.int64)
    for e, (r, c) in enumerate(zip(lj.rows, lj.cols)):
        slot = where.get((int(r), int(c)))
        if slot is None:
            raise ValueError(f"the solver's pattern (n = {n}) has no slot for the declared "
                             f"Jacobian entry ({r}, {c}); pass sparsity=None or a superset")
        entry_slots[e] = slot
    gather = np.full(slot_rows.size, m, dtype=np.int64)
    gather[entry_slots] = np.arange(m)
    return DirectJacobian(m=m, gather=gather, entry_slots=entry_slots)
