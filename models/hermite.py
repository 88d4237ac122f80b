"""Cubic Hermite interpolation and integration on uniform grids that store values and d/dx.

Every table in the pipeline (background, thermodynamics, the perturbation model's ln a table)
stores each quantity together with its exact derivative at the nodes.  A cubic Hermite cell is
then C1, local (two nodes) and accurate to O(dx^4 f''''), and the integral of a cell follows in
closed form (the corrected trapezoid rule, O(dx^5) per cell).  This module is the one place the
cubic is written down:

* :func:`hermite` -- the cubic on one cell, given the fractional position t in [0, 1];
* :func:`hermite_interp` -- interpolation on a uniform node array (index the cell, then
  :func:`hermite`);
* :func:`hermite_panels`, :func:`cumulative_hermite` -- cell integrals and their running sum;
* ``emitted_*`` -- the same cubic (and its d/dx) as text for generated code: the straight-line
  RHS of models/eb.py inlines it instead of calling a function.

The functions are written with plain arithmetic operators, so they run unchanged on Python floats,
numpy and jax arrays (traced or not); the array helpers that need an array library use jax.numpy
(``hermite_interp`` takes the module as an argument).
"""
from __future__ import annotations

import jax.numpy as jnp


def hermite(t, dx, f0, d0, f1, d1):
    """Cubic Hermite on one cell: values f0, f1 and d/dx d0, d1 at its ends, t in [0, 1]."""
    t2 = t * t
    t3 = t2 * t
    return ((2.0 * t3 - 3.0 * t2 + 1.0) * f0 + (t3 - 2.0 * t2 + t) * dx * d0
            + (-2.0 * t3 + 3.0 * t2) * f1 + (t3 - t2) * dx * d1)


def hermite_interp(x_nodes, values, derivs, x, xp=jnp):
    """Cubic Hermite interpolation on a uniform grid (values and first derivatives at nodes).

    Outside the grid the end cells extrapolate (the cell index is clipped).  The fractional
    position is measured from the cell's own node, (x - x_i)/h.  ``xp``: the array module of
    the inputs (numpy for host arithmetic on plain numbers; the arrays must be of that module).
    """
    x = xp.asarray(x)
    h = x_nodes[1] - x_nodes[0]
    i = xp.clip(xp.floor((x - x_nodes[0]) / h).astype(xp.int32), 0, x_nodes.shape[0] - 2)
    s = (x - x_nodes[i]) / h
    return hermite(s, h, values[i], derivs[i], values[i + 1], derivs[i + 1])


def hermite_panels(h, q, dq):
    """Integrals of q over each grid panel by the Hermite (corrected trapezoid) rule, O(h^5)."""
    return 0.5 * h * (q[:-1] + q[1:]) + h * h / 12.0 * (dq[:-1] - dq[1:])


def cumulative_hermite(h, q, dq):
    """Running integral of q from node 0 to each node (q, dq: values and d/dx, grid step h)."""
    return jnp.concatenate([jnp.zeros(1, q.dtype), jnp.cumsum(hermite_panels(h, q, dq))])


def emitted_powers(t: str) -> tuple[tuple[str, str], ...]:
    """``{t}2`` and ``{t}3`` as ``(name, expression)`` assignments for generated code."""
    return ((f"{t}2", f"{t} * {t}"), (f"{t}3", f"{t}2 * {t}"))


def emitted_basis(t: str, dx: str) -> tuple[tuple[str, str], ...]:
    """:func:`hermite`'s basis as ``(name, expression)`` assignments for generated code.

    Needs the powers of :func:`emitted_powers`.  Names ``b00, b10, b01, b11``: the weights of
    f0, d0, f1, d1, so that :func:`emitted_value` performs :func:`hermite`'s operations in its
    order (equal to the last bit).
    """
    t2, t3 = f"{t}2", f"{t}3"
    return (("b00", f"2.0 * {t3} - 3.0 * {t2} + 1.0"),
            ("b10", f"({t3} - 2.0 * {t2} + {t}) * {dx}"),
            ("b01", f"-2.0 * {t3} + 3.0 * {t2}"),
            ("b11", f"({t3} - {t2}) * {dx}"))


def emitted_value(f0: str, d0: str, f1: str, d1: str) -> str:
    """The cubic at the cell position of :func:`emitted_basis`."""
    return f"b00 * {f0} + b10 * {d0} + b01 * {f1} + b11 * {d1}"


def emitted_basis_dx(t: str, dx: str) -> tuple[tuple[str, str], ...]:
    """d/dx of the basis, for generated code (needs ``{t}2`` of :func:`emitted_powers`).

    b01' = -b00', so the value weights collapse to one, g00, applied to f0 - f1 (see
    :func:`emitted_value_dx`).
    """
    t2 = f"{t}2"
    return (("g00", f"(6.0 * {t2} - 6.0 * {t}) / {dx}"),
            ("g10", f"3.0 * {t2} - 4.0 * {t} + 1.0"),
            ("g11", f"3.0 * {t2} - 2.0 * {t}"))


def emitted_value_dx(f0: str, d0: str, f1: str, d1: str) -> str:
    """d/dx of the cubic at the cell position of :func:`emitted_basis_dx`.

    The node difference f0 - f1 is formed first: it is exact for close values (Sterbenz) and
    avoids the cancellation of g00 f0 - g00 f1 (condition ~ |f| / (dx |f'|), ~1e4 for ln tau).
    """
    return f"g00 * ({f0} - {f1}) + g10 * {d0} + g11 * {d1}"
