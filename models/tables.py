"""Background/thermodynamics tables sampled on a uniform ln a grid, read by cubic Hermite.

Layout (fixed, shared with the GPU backend): ``tab[cosmo_row, column, 0, j]`` is the value of a
column at node ``x_j = x_min + j*dx`` (x = ln a) and ``tab[cosmo_row, column, 1, j]`` its
derivative d/dx there.  Cubic Hermite with exact nodal derivatives is C1, local (two nodes), and
has error O(dx^4 f'''') -- with dx = 0.005 the smooth background columns are reproduced far below
1e-8, and the evaluation is a handful of flops plus four loads, cheap inside an RHS.

The generated RHS (models/eb.py) calls only two helpers from a "table ops" namespace, so the same
source can run under JAX (``JAX_TABLE_OPS``), plain Python/numba (``PY_TABLE_OPS``):

* ``cell(x, x_min, dx, n_grid) -> (j, t)``: node index (an integer usable as an array index,
  clipped to [0, n_grid-2] so x outside the grid extrapolates with the end cubic) and the
  fractional position t = (x - x_j)/dx.
* ``row(value) -> int``: the cosmology row index, stored as a float in the parameter vector.

The Hermite basis itself is emitted inline by the generator (pure arithmetic, no call), from
models.hermite, which also holds the numeric cubic :func:`interpolate` uses.

:class:`TableSplit` is the protocol by which an RHS that reads tables tells a solver how to keep the
table reads out of what it differentiates (the CUDA backend needs it: Enzyme's CUDA ``jvp`` takes
scalars and tuples only, not arrays).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import jax.numpy as jnp
import numpy as np

from .hermite import hermite


def _cell_jax(x, x_min, dx, n_grid):
    u = (x - x_min) / dx
    j = jnp.clip(jnp.floor(u), 0, n_grid - 2).astype(jnp.int32)
    return j, u - j


def _row_jax(value):
    return jnp.asarray(value).astype(jnp.int32)


def _cell_py(x, x_min, dx, n_grid):
    u = (x - x_min) / dx
    j = int(math.floor(u))
    j = min(max(j, 0), n_grid - 2)
    return j, u - j


def _row_py(value):
    return int(value)


JAX_TABLE_OPS = SimpleNamespace(cell=_cell_jax, row=_row_jax)
PY_TABLE_OPS = SimpleNamespace(cell=_cell_py, row=_row_py)


def interpolate(tab, row, column, x, x_min, dx):
    """Hermite-interpolate ``tab[row, column]`` at x (JAX; scalars or arrays of x)."""
    j, t = _cell_jax(jnp.asarray(x), x_min, dx, tab.shape[-1])
    return hermite(t, dx, tab[row, column, 0, j], tab[row, column, 1, j],
                   tab[row, column, 0, j + 1], tab[row, column, 1, j + 1])


def uniform_grid(x_min: float, x_max: float, n_grid: int) -> tuple[np.ndarray, float]:
    """Nodes x_j = x_min + j*dx, j = 0..n_grid-1, ending at x_max; returns (nodes, dx)."""
    if n_grid < 2:
        raise ValueError(f"n_grid must be >= 2, got {n_grid}")
    if not x_max > x_min:
        raise ValueError(f"x_max ({x_max}) must exceed x_min ({x_min})")
    dx = (x_max - x_min) / (n_grid - 1)
    return x_min + dx * np.arange(n_grid), dx


def pack_table(columns: dict, column_order, dtype=np.float64) -> np.ndarray:
    """Stack {name: (values, d/dx values)} into one cosmology's (n_cols, 2, n_grid) block.

    ``column_order`` is the model's ``table_columns``; a missing column is a ValueError naming it.
    Stack several blocks along a new axis 0 for an ensemble of cosmologies.
    """
    blocks = []
    for name in column_order:
        if name not in columns:
            raise ValueError(f"table column {name!r} missing; need {tuple(column_order)}")
        value, deriv = columns[name]
        blocks.append(np.stack([np.asarray(value, dtype), np.asarray(deriv, dtype)]))
    return np.stack(blocks)


@dataclass(frozen=True)
class TableSplit:
    """An RHS ``rhs(y, t, p, tab)`` that reads tables, split into a table-free core and a lookup.

    Contract (what a solver may rely on; it knows nothing else about the model):

    * ``rhs(y, t, p, tab) == core(y, t, p, lookup(t, p, tab))`` for every input (same arithmetic,
      so equal to rounding);
    * ``lookup(t, p, tab)`` returns a tuple of ``n_tv`` scalars (the interpolated table quantities,
      ``names``) that depend on ``t`` and ``p`` only, never on ``y``;
    * ``lookup_dt(t, p, tab)`` is its exact derivative d/dt (closed form), so that
      df/dt = ∂core/∂t + ∂core/∂tv · lookup_dt (the chain rule through the table);
    * ``core(y, t, p, tv)`` returns a tuple of n scalars and indexes ``y``, ``p`` and ``tv`` with
      integer literals only (straight-line code that device compilers and Enzyme accept).

    Two compilations of the same generated lines (they differ only in how the cell index is
    computed) are provided: ``core``/``lookup``/``lookup_dt`` trace under JAX (``M`` = jax.numpy);
    ``core_device``/``lookup_device``/``lookup_dt_device`` use only ``math`` and builtins on
    Python/numba scalars (``tab`` indexed with a Python int, the cell index clipped to the grid as
    :func:`_cell_py` does), so a numba(-cuda) device compiler accepts them unchanged and a CPU
    emulator runs them as plain Python.  ``device_source`` is their text.  The model attaches the
    split to its rhs function as ``rhs.table_split`` (a wrapper of the rhs, e.g. ``jax.jit(rhs)``,
    does not carry it).
    """

    n_tv: int
    names: tuple
    core: Callable = field(repr=False)
    lookup: Callable = field(repr=False)
    lookup_dt: Callable = field(repr=False)
    core_device: Callable = field(repr=False)
    lookup_device: Callable = field(repr=False)
    lookup_dt_device: Callable = field(repr=False)
    device_source: str = field(repr=False, default="")

    def __post_init__(self):
        if int(self.n_tv) != self.n_tv or self.n_tv < 1 or len(self.names) != self.n_tv:
            raise ValueError(f"TableSplit: n_tv must be a positive int equal to len(names), got "
                             f"{self.n_tv!r} and {len(self.names)} names")
