"""Spherical Bessel functions j_ℓ(x) for the line-of-sight integrals: a host table, a JAX lookup.

``BesselTable.build(ells, x_max, dx)`` tabulates j_ℓ and j_ℓ' (j_ℓ = √(π/2x) J_{ℓ+½}(x) with
scipy.special.jv, whose uniform asymptotic expansions cost O(1) per value at large ℓ) on
the uniform grid x_i = i·dx for each sampled ℓ; ``values(table, il, x)`` returns j_ℓ, j_ℓ', j_ℓ''
and j_ℓ/x² (``j_only``: j_ℓ alone) at any x ≥ 0 by cubic Hermite interpolation (j from j and
j'; j' from j' and j'', where j'' comes from Bessel's equation at the nodes), and j'' from
Bessel's equation at x:

    j'' = -(2/x) j' - (1 - ℓ(ℓ+1)/x²) j.

With dx = 0.2 the interpolation error is ≈ dx⁴/384 ≈ 4e-6 of the function's amplitude.
Below x_ℓ = first x where |j_ℓ| exceeds 1e-12·max (x well below ℓ) the table holds exact zeros,
so scipy is only called where j_ℓ matters. The table is a pair of (L, n_x) arrays; a GPU path
can replace the lookup by an on-device recurrence without changing its callers.

Building a table costs tens of seconds of scipy; ``BesselTable.cached`` keeps the last few in
the process, with x_max rounded up to a multiple of ``X_BUCKET`` so that the small changes of
τ0 from one cosmology to the next (a sampler, a Jacobian) reuse the same table, and, when
``boltzmann.runtime.configure`` set up a persistent cache, stores each table there for later
processes (one .npz per table, keyed by the multipoles, x range, step and scipy's version;
written atomically; an entry that does not load or has the wrong shape is rebuilt).
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy
from scipy.special import jv

from models.hermite import hermite
from solver.caches import Cache

__all__ = ["BesselTable", "values", "j_only", "values_and_slopes", "j_and_slope",
           "turning_point", "X_BUCKET"]

#: ``BesselTable.cached`` rounds x_max up to a multiple of this (the table is then at most
#: this much longer than needed)
X_BUCKET = 500.0
_TABLES = Cache("boltzmann.cmb.bessel", maxsize=2)


def turning_point(ell, cut: float = 1e-12) -> np.ndarray:
    """x below which |j_ℓ(x)| < ~cut (WKB: j_ℓ decays like exp(-(ν·arccosh(ν/x) - sqrt(ν²-x²)))
    below ν = ℓ + 1/2); a conservative closed form, checked in the tests."""
    nu = np.asarray(ell, np.float64) + 0.5
    # solve nu*arccosh(nu/x) - sqrt(nu^2 - x^2) = ln(1/cut) for x by bisection on u = x/nu
    target = np.log(1.0 / cut)
    lo, hi = np.zeros_like(nu) + 1e-9, np.ones_like(nu)
    for _ in range(60):
        u = 0.5 * (lo + hi)
        f = nu * (np.arccosh(1.0 / u) - np.sqrt(1.0 - u * u)) - target
        lo, hi = np.where(f > 0, u, lo), np.where(f > 0, hi, u)
    return np.maximum(0.0, lo * nu - 2.0)


@dataclass(frozen=True)
class BesselTable:
    """j_ℓ (``j``) and dj_ℓ/dx (``dj``) at x_i = i·dx, i < n_x, for the multipoles ``ells``;
    ``pairs`` (L, 2 n_x), when set (``interleaved``), the same numbers as (j_0, j'_0, j_1, ...)
    per multipole, the form the lookups gather from."""

    ells: np.ndarray
    dx: float
    j: jnp.ndarray
    dj: jnp.ndarray
    pairs: jnp.ndarray | None = None

    def interleaved(self) -> "BesselTable":
        """The table with ``pairs`` set: a caller that looks up many multipoles (the line of
        sight's loops) interleaves the whole table once instead of one row per lookup."""
        pairs = jnp.stack([self.j, self.dj], axis=-1).reshape(self.j.shape[0], -1)
        return BesselTable(ells=self.ells, dx=self.dx, j=self.j, dj=self.dj, pairs=pairs)

    @classmethod
    def build(cls, ells, x_max: float, dx: float = 0.2) -> "BesselTable":
        ells = np.asarray(ells, np.int64)
        n = _n_nodes(x_max, dx)
        x = dx * np.arange(n)
        j = np.zeros((ells.size, n))
        dj = np.zeros((ells.size, n))
        starts = np.floor(turning_point(ells) / dx).astype(int)

        def fill(i):
            ell, i0 = int(ells[i]), max(int(starts[i]), 1)
            xs = x[i0:]
            norm = np.sqrt(np.pi / (2.0 * xs))
            j[i, i0:] = norm * jv(ell + 0.5, xs)
            # j_l' = j_{l-1} - (l + 1) j_l / x
            dj[i, i0:] = norm * jv(ell - 0.5, xs) - (ell + 1.0) * j[i, i0:] / xs

        # scipy's ufuncs release the GIL: the rows fill in parallel on every core
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(fill, range(ells.size)))
        # x = 0: j_l(0) = 0 and j_l'(0) = 0 for l >= 2 (the only multipoles sampled)
        return cls(ells=ells, dx=float(dx), j=jnp.asarray(j), dj=jnp.asarray(dj))

    @classmethod
    def cached(cls, ells, x_max: float, dx: float = 0.2) -> "BesselTable":
        """``build`` with x_max rounded up to a multiple of ``X_BUCKET``, kept in the process
        (the last two tables) for the next call with the same multipoles."""
        ells = np.asarray(ells, np.int64)
        x_top = X_BUCKET * np.ceil(float(x_max) / X_BUCKET)
        key = (ells.tobytes(), float(x_top), float(dx))
        return _TABLES.get_or_build(key, lambda: _stored_or_built(ells, x_top, dx))

    @property
    def x_max(self) -> float:
        return self.dx * (self.j.shape[1] - 2)


def _n_nodes(x_max: float, dx: float) -> int:
    """Nodes of a table reaching x_max (one beyond it for the last panel, one spare)."""
    return int(np.ceil(x_max / dx)) + 2


def _store_path(ells: np.ndarray, x_max: float, dx: float) -> Path | None:
    from ..runtime import TABLES_DIR, persistent_dir

    folder = persistent_dir(TABLES_DIR)
    if folder is None:
        return None
    h = hashlib.sha256(ells.astype(np.int64).tobytes())
    h.update(f"{x_max!r} {dx!r} scipy {scipy.__version__} format 1".encode())
    return folder / f"bessel-{h.hexdigest()[:32]}.npz"


def _stored_or_built(ells: np.ndarray, x_max: float, dx: float) -> BesselTable:
    """The table from the persistent store when it holds a readable one of the right shape,
    else built (and stored when there is a store)."""
    path = _store_path(ells, x_max, dx)
    n = _n_nodes(x_max, dx)
    if path is not None and path.exists():
        try:
            with np.load(path) as f:
                j, dj = f["j"], f["dj"]
            if j.shape == dj.shape == (ells.size, n) and np.all(np.isfinite(j)):
                return BesselTable(ells=ells, dx=float(dx), j=jnp.asarray(j), dj=jnp.asarray(dj))
        except Exception:  # noqa: BLE001 - an unreadable entry is rebuilt below
            pass
    table = BesselTable.build(ells, x_max, dx)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, j=np.asarray(table.j), dj=np.asarray(table.dj))
            os.replace(tmp, path)        # atomic: a concurrent reader sees all or nothing
        except OSError:
            Path(tmp).unlink(missing_ok=True)
    return table


def _second_derivative(ell, x, j, dj):
    """j'' from Bessel's equation; at x -> 0 the limit of ℓ = 2's j''(0) = 2/15 (others 0)."""
    safe = jnp.where(x > 1e-6, x, 1.0)
    d2 = -2.0 / safe * dj - (1.0 - ell * (ell + 1.0) / (safe * safe)) * j
    return jnp.where(x > 1e-6, d2, jnp.where(ell == 2, 2.0 / 15.0, 0.0))


def _cells(table: BesselTable, il, x):
    """(t, h, j0, j1, d0, d1, x0): the table cell each x falls in and its node values.

    The multipole's row is interleaved as (j_0, j'_0, j_1, j'_1, ...), so a cell's four node
    values are one gather of four adjacent numbers instead of four gathers: on an H100, with the
    whole table interleaved, the line of sight's ℓ > 400 loop took 0.023 s against 0.029 s
    (scripts/profile_los_forms.py, docs/benchmarks.md). A table without ``pairs`` interleaves
    the row on each call (a copy of it)."""
    return _row_cells(_row(table, il), table.dx, x)


def _row_cells(pairs, dx: float, x):
    """``_cells`` from one multipole's interleaved row ``pairs`` (2 n_x,)."""
    u = x / dx
    i = jnp.clip(jnp.floor(u).astype(jnp.int32), 0, pairs.shape[0] // 2 - 2)
    dims = jax.lax.GatherDimensionNumbers(offset_dims=(jnp.ndim(x),), collapsed_slice_dims=(),
                                          start_index_map=(0,))
    q = jax.lax.gather(pairs, (2 * i)[..., None], dims, slice_sizes=(4,),
                       mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    return u - i, dx, q[..., 0], q[..., 2], q[..., 1], q[..., 3], i * dx


def j_only(table: BesselTable, il, x):
    """j_ℓ(x) alone (the lensing potential's integral needs no derivatives); 0 past x_max.
    Differentiable in x (``_j_lookup``)."""
    return _j_lookup(_row(table, il), _ell(table, il), x, table.dx, table.x_max)


def values(table: BesselTable, il, x):
    """(j_ℓ, j_ℓ', j_ℓ'', j_ℓ/x²) at x (any shape, x ≥ 0) for the table's il-th multipole.

    Past the table's end (x > x_max) every value is 0 (callers keep x inside). Differentiable
    in x (``_lookup``); the table itself is data, not differentiated."""
    return _lookup(_row(table, il), _ell(table, il), x, table.dx, table.x_max)


def _ell(table: BesselTable, il):
    return jnp.asarray(table.ells)[il].astype(jnp.float64)


def _row(table: BesselTable, il):
    """The il-th multipole's row interleaved as (j_0, j'_0, j_1, j'_1, ...) (``_cells``)."""
    return (table.pairs[il] if table.pairs is not None
            else jnp.stack([table.j[il], table.dj[il]], axis=-1).reshape(-1))


def values_and_slopes(table: BesselTable, il, x):
    """(``values``, their derivatives in x): ((j, j', j'', j/x²), (j', j'', j‴, (j/x²)′)),
    each made of the looked-up values (j‴ from Bessel's equation), for a caller that writes
    its own derivative in x (the line of sight's jvp)."""
    ell = _ell(table, il)
    out = _lookup.fun(_row(table, il), ell, x, table.dx, table.x_max)
    return out, _slopes(ell, x, *out[:3])


def j_and_slope(table: BesselTable, il, x):
    """(j_ℓ, j_ℓ') at x, 0 past x_max: ``j_only`` and its derivative in x."""
    return _j_and_slope(_row(table, il), _ell(table, il), x, table.dx, table.x_max)


# The lookups' derivatives in x are written out rather than traced through the interpolation.
# Each output's d/dx is another output (j' = j', (j')' = j'' ...) or follows from Bessel's
# equation, so a tangent costs one product per value and direction; traced, a tangent repeats
# the cell arithmetic (Hermite weights, the divisions of j'') once per direction. The only
# difference from the traced derivative is that j'' is Bessel's equation's rather than the
# cubic's own derivative of j' (both approximate the exact j_ℓ'' to the table's interpolation
# error; the written-out one is the closer, tests/test_cmb.py).
@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _lookup(row, ell, x, dx: float, x_max: float):
    """``values`` from the multipole's interleaved row ``row`` and its ``ell``."""
    return _values_at(ell, x, _row_cells(row, dx, x), x_max)


def _slopes(ell, x, j, dj, d2j):
    """d/dx of (j, j', j'', j/x²) from (j, j', j''); 0 wherever they are (past the table)."""
    safe = jnp.where(x > 1e-6, x, 1.0)
    d3j = jnp.where(x > 1e-6, 2.0 / (safe * safe) * dj - 2.0 / safe * d2j
                    - 2.0 * ell * (ell + 1.0) / (safe * safe * safe) * j
                    - (1.0 - ell * (ell + 1.0) / (safe * safe)) * dj, 0.0)
    safe = jnp.where(x > 1e-3, x, 1.0)
    d_jx2 = jnp.where(x > 1e-3, (dj - 2.0 * j / safe) / (safe * safe), 0.0)
    return dj, d2j, d3j, d_jx2


@_lookup.defjvp
def _lookup_jvp(dx, x_max, primals, tangents):
    row, ell, x = primals
    out = _lookup(row, ell, x, dx, x_max)
    return out, tuple(s * tangents[2] for s in _slopes(ell, x, *out[:3]))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _j_lookup(row, ell, x, dx: float, x_max: float):
    """``j_only`` from the multipole's interleaved row and its ``ell``."""
    return _j_and_slope(row, ell, x, dx, x_max)[0]     # the unused slope is dead code


def _j_and_slope(row, ell, x, dx: float, x_max: float):
    t, h, j0, j1, d0, d1, x0 = _row_cells(row, dx, x)
    inside = x <= x_max
    dd0 = _second_derivative(ell, x0, j0, d0)
    dd1 = _second_derivative(ell, x0 + h, j1, d1)
    return (jnp.where(inside, hermite(t, h, j0, d0, j1, d1), 0.0),
            jnp.where(inside, hermite(t, h, d0, dd0, d1, dd1), 0.0))


@_j_lookup.defjvp
def _j_lookup_jvp(dx, x_max, primals, tangents):
    j, dj = _j_and_slope(*primals, dx, x_max)
    return j, dj * tangents[2]


def _values_at(ell, x, cells, x_max: float):
    """``values`` from the cells' node values (``_cells``) of multipole ``ell``."""
    t, h, j0, j1, d0, d1, x0 = cells
    dd0 = _second_derivative(ell, x0, j0, d0)
    dd1 = _second_derivative(ell, x0 + h, j1, d1)
    j = hermite(t, h, j0, d0, j1, d1)
    dj = hermite(t, h, d0, dd0, d1, dd1)
    d2j = _second_derivative(ell, x, j, dj)
    safe = jnp.where(x > 1e-3, x, 1.0)
    j_x2 = jnp.where(x > 1e-3, j / (safe * safe), jnp.where(ell == 2, 1.0 / 15.0, 0.0))
    inside = x <= x_max
    return tuple(jnp.where(inside, v, 0.0) for v in (j, dj, d2j, j_x2))
