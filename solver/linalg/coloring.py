"""Column colouring for compressed forward-mode Jacobians (Curtis, Powell & Reid 1974).

Columns j and k may share a colour ("be seeded together in one forward sweep") only if no row has a
structural nonzero in both: then ``J @ (e_j + e_k)`` holds ``J[i, j]`` and ``J[i, k]`` in different
rows and both can be read back.  Finding few groups is vertex colouring of the column-intersection
graph (Coleman & Moré 1983, SIAM J. Numer. Anal. 20:187).  We run networkx's greedy colouring with
several vertex orderings and keep the fewest colours; every result is checked for structural
orthogonality before it is returned.
"""
from __future__ import annotations

import numpy as np

__all__ = ["color_columns", "seed_matrix", "check_coloring", "column_intersection_graph"]

_STRATEGIES = (
    "largest_first",
    "smallest_last",
    "independent_set",
    "saturation_largest_first",
    "connected_sequential_bfs",
    "connected_sequential_dfs",
)
_RANDOM_SEEDS = (0, 1, 2, 3)


def as_pattern(pattern) -> np.ndarray:
    """A 2-D structural pattern as a bool array (0/1 numbers allowed); ValueError otherwise."""
    pat = np.asarray(pattern)
    if pat.ndim != 2:
        raise ValueError(f"pattern must be a 2-D array, got shape {pat.shape}")
    if pat.dtype != bool:
        if not np.issubdtype(pat.dtype, np.number):
            raise ValueError(f"pattern must be boolean (or 0/1 numeric), got dtype {pat.dtype}")
        pat = pat != 0
    return pat


def column_intersection_graph(pattern):
    """networkx Graph on columns; edge (j, k) when some row has nonzeros in both columns."""
    import networkx as nx

    pat = as_pattern(pattern)
    overlap = pat.T.astype(np.int64) @ pat.astype(np.int64)
    np.fill_diagonal(overlap, 0)
    graph = nx.Graph()
    graph.add_nodes_from(range(pat.shape[1]))
    rows, cols = np.nonzero(np.triu(overlap))
    graph.add_edges_from(zip(rows.tolist(), cols.tolist()))
    return graph


def check_coloring(pattern, colors) -> None:
    """Raise ValueError unless no row has two nonzeros in columns of the same colour."""
    pat = as_pattern(pattern)
    colors = np.asarray(colors)
    if colors.shape != (pat.shape[1],):
        raise ValueError(f"colors must have shape ({pat.shape[1]},), got {colors.shape}")
    for i in range(pat.shape[0]):
        cs = colors[pat[i]]
        if np.unique(cs).size != cs.size:
            raise ValueError(f"colouring is not structurally orthogonal: row {i} has two "
                             f"nonzeros of one colour")


def _canonical(colors: np.ndarray) -> np.ndarray:
    """Relabel colours in order of first appearance along the columns (deterministic)."""
    mapping: dict[int, int] = {}
    out = np.empty_like(colors)
    for j, c in enumerate(colors.tolist()):
        out[j] = mapping.setdefault(c, len(mapping))
    return out


def color_columns(pattern) -> tuple[np.ndarray, int]:
    """Fewest-colour greedy colouring over several strategies: ``(colors, n_colors)``.

    ``colors[j]`` in ``range(n_colors)``; deterministic for a given pattern.
    """
    import networkx as nx

    pat = as_pattern(pattern)
    n = pat.shape[1]
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    graph = column_intersection_graph(pat)
    candidates = []
    for strategy in _STRATEGIES:
        candidates.append(nx.greedy_color(graph, strategy=strategy))
    for seed in _RANDOM_SEEDS:
        order = np.random.default_rng(seed).permutation(n).tolist()
        candidates.append(nx.greedy_color(graph, strategy=lambda g, c, order=order: iter(order)))
    best = None
    for coloring in candidates:
        colors = np.array([coloring[j] for j in range(n)], dtype=np.int64)
        n_colors = int(colors.max()) + 1
        if best is None or n_colors < best[1]:
            best = (colors, n_colors)
    colors = _canonical(best[0])
    check_coloring(pat, colors)
    return colors, best[1]


def seed_matrix(colors, n_colors: int) -> np.ndarray:
    """``S[j, c] = 1.0`` when column j has colour c: ``J @ S`` is the compressed Jacobian."""
    colors = np.asarray(colors, dtype=np.int64)
    if colors.ndim != 1 or (colors.size and (colors.min() < 0 or colors.max() >= n_colors)):
        raise ValueError(f"colors must be a 1-D array with values in range({n_colors})")
    seeds = np.zeros((colors.size, n_colors))
    seeds[np.arange(colors.size), colors] = 1.0
    return seeds
