"""Compressed forward-mode Jacobians in the linear solver's slot layout.

With a structurally orthogonal column colouring (:mod:`solver.linalg.coloring`), one forward sweep
``J @ s_c`` per colour ``c`` (seed ``s_c`` = sum of the unit vectors of that colour) yields every
entry: ``J[i, j] = (J @ s_{colour(j)})[i]`` for ``(i, j)`` in the pattern (Curtis, Powell & Reid
1974).  One more sweep in ``t`` gives ``df/dt``.  The compressed results are decompressed by a
single gather straight into the slot vector of :class:`solver.linalg.linear.LinearSolver`, so
``W = I/(h*gamma) - J`` is assembled without any dense matrix:
``w = -jvals; w[diag] += 1/(h*gamma)``.
Slots outside the pattern (LU fill, or a diagonal the rhs does not touch) receive 0.

The pattern must be a superset of the true nonzeros; a missing entry would silently pollute another
entry of the same row and colour.  Use :func:`solver.linalg.sparsity.detect_sparsity` to derive it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .coloring import check_coloring, color_columns, seed_matrix

__all__ = ["JacobianPlan", "build_jacobian_plan", "assemble_w", "evaluate_rhs"]

_MODES = ("vmap", "loop")


def evaluate_rhs(rhs, y, t, p, args=None):
    """``rhs`` as a 1-D array: calls ``rhs(y, t, p)`` or ``rhs(y, t, p, args)`` and stacks."""
    import jax.numpy as jnp

    out = rhs(y, t, p) if args is None else rhs(y, t, p, args)
    return jnp.stack([jnp.asarray(v, dtype=y.dtype) for v in out])


@dataclass(frozen=True)
class JacobianPlan:
    """Host-side plan: colouring, seeds and the decompression gather into slots.

    ``seeds`` has shape ``(n_colors, n)``; ``gather_index[s]`` is the position of slot ``s`` in the
    flattened ``(n_colors, n)`` compressed Jacobian, or ``n_colors * n`` (a zero) for slots that are
    not in the pattern.  ``mode``: "vmap" (one ``jax.jvp`` over a batch of ``n_colors + 1``
    tangents, the primal computed once) or "loop" (one ``jax.jvp`` per colour).
    """

    n: int
    n_colors: int
    colors: np.ndarray
    seeds: np.ndarray
    gather_index: np.ndarray
    nslots: int
    mode: str = "vmap"

    def _sweeps(self, rhs, y, t, p, args):
        """Primal ``f`` and the ``(n_colors + 1, n)`` tangents (last row: d/dt)."""
        import jax
        import jax.numpy as jnp

        y = jnp.asarray(y)
        t = jnp.asarray(t, dtype=y.dtype)

        def f(y_, t_):
            return evaluate_rhs(rhs, y_, t_, p, args)

        tan_y = jnp.concatenate([jnp.asarray(self.seeds, dtype=y.dtype),
                                 jnp.zeros((1, self.n), dtype=y.dtype)])
        tan_t = jnp.zeros(self.n_colors + 1, dtype=y.dtype).at[-1].set(1.0)
        if self.mode == "vmap":
            f_val, lin = jax.linearize(f, y, t)
            tangents = jax.vmap(lin)(tan_y, tan_t)
        else:
            outs = [jax.jvp(f, (y, t), (tan_y[c], tan_t[c])) for c in range(self.n_colors + 1)]
            f_val = outs[0][0]
            tangents = jnp.stack([o[1] for o in outs])
        return f_val, tangents

    def _decompress(self, tangents):
        import jax.numpy as jnp

        compressed = jnp.concatenate([tangents[: self.n_colors].reshape(-1),
                                      jnp.zeros(1, dtype=tangents.dtype)])
        return compressed[self.gather_index]

    def jac_and_dfdt(self, rhs, y, t, p, args=None):
        """``(jvals, dfdt)``: ``J`` in slot layout (length ``nslots``) and ``df/dt`` (length n)."""
        _, jvals, dfdt = self.f_jac_and_dfdt(rhs, y, t, p, args)
        return jvals, dfdt

    def f_jac_and_dfdt(self, rhs, y, t, p, args=None):
        """``(f, jvals, dfdt)``: also the rhs value, which the sweeps compute anyway."""
        f_val, tangents = self._sweeps(rhs, y, t, p, args)
        return f_val, self._decompress(tangents), tangents[self.n_colors]

    def to_dense(self, jvals, slot_rows, slot_cols) -> np.ndarray:
        """Scatter slot values to a dense matrix (tests)."""
        dense = np.zeros((self.n, self.n))
        dense[np.asarray(slot_rows), np.asarray(slot_cols)] = np.asarray(jvals)
        return dense


def build_jacobian_plan(pattern, linear_solver=None, *, slot_rows=None, slot_cols=None,
                        colors=None, mode: str = "vmap", seed_columns=None) -> JacobianPlan:
    """Plan the compressed Jacobian of an rhs with structure ``pattern`` (``[i, j]``: f_i needs y_j).

    The slot layout comes from ``linear_solver`` (its ``slot_rows``/``slot_cols``) or from explicit
    ``slot_rows``/``slot_cols``; neither given → dense row-major ``n*n`` slots.  ``colors``
    (optional) overrides :func:`solver.linalg.coloring.color_columns`; it is checked for
    orthogonality.

    ``seed_columns`` (optional, indices): differentiate only these columns.  The others are never
    seeded, so their entries of J are neither computed nor able to pollute the ones read back;
    ``pattern`` must then have no entries in them, and their slots receive 0.  The forward-
    sensitivity solve uses it to take ``[J; H_1; ..; H_m]`` by sweeps over y alone (the s blocks'
    copies of J are not needed by :func:`solver.linalg.linear.build_block_triangular_solver`).
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    pat = np.asarray(pattern)
    if pat.ndim != 2 or pat.shape[0] != pat.shape[1]:
        raise ValueError(f"pattern must be a square 2-D array, got shape {pat.shape}")
    pat = pat.astype(bool)
    n = pat.shape[0]
    if linear_solver is not None:
        if slot_rows is not None or slot_cols is not None:
            raise ValueError("give either linear_solver or slot_rows/slot_cols, not both")
        slot_rows, slot_cols = linear_solver.slot_rows, linear_solver.slot_cols
        if linear_solver.n != n:
            raise ValueError(f"linear_solver.n={linear_solver.n} but pattern has n={n}")
    elif slot_rows is None and slot_cols is None:
        slot_rows, slot_cols = np.divmod(np.arange(n * n), n)
    elif slot_rows is None or slot_cols is None:
        raise ValueError("slot_rows and slot_cols must be given together")
    slot_rows = np.asarray(slot_rows, dtype=np.int64)
    slot_cols = np.asarray(slot_cols, dtype=np.int64)
    covered = np.zeros((n, n), dtype=bool)
    covered[slot_rows, slot_cols] = True
    if np.any(pat & ~covered):
        missing = np.argwhere(pat & ~covered)[:5].tolist()
        raise ValueError(f"slot layout lacks pattern entries, e.g. {missing}")
    if colors is None:
        colors, n_colors = color_columns(pat)
    else:
        colors = np.asarray(colors, dtype=np.int64)
        check_coloring(pat, colors)
        n_colors = int(colors.max()) + 1 if colors.size else 0
    seeds = seed_matrix(colors, n_colors).T.copy()
    if seed_columns is not None:
        seeded = np.zeros(n, dtype=bool)
        seeded[np.asarray(seed_columns, dtype=np.int64)] = True
        if np.any(pat[:, ~seeded]):
            raise ValueError("pattern has entries in columns outside seed_columns")
        seeds[:, ~seeded] = 0.0
    in_pattern = pat[slot_rows, slot_cols]
    gather_index = np.where(in_pattern, colors[slot_cols] * n + slot_rows, n_colors * n)
    return JacobianPlan(n=n, n_colors=n_colors, colors=colors, seeds=seeds,
                        gather_index=gather_index.astype(np.int64), nslots=int(slot_rows.size),
                        mode=mode)


def assemble_w(jvals, diag_slots, inv_h_gamma):
    """``W = I/(h*gamma) - J`` in slot layout from ``jvals`` (slot layout of ``J``)."""
    import jax.numpy as jnp

    return (-jnp.asarray(jvals)).at[np.asarray(diag_slots)].add(inv_h_gamma)
