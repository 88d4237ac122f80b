"""An elimination ordering for a short critical path, for LUs run by many lanes at once.

AMD (``sparse_lu.amd_order``) minimises fill, which is what a single thread wants.  A warp that
factors and solves cooperatively is bound instead by the *depth* of the elimination: the number
of dependency levels, each a synchronisation.  A Boltzmann hierarchy is a chain, and a chain
eliminated from one end is as deep as it is long (59 levels per triangular solve for the
default EB model under AMD).

:func:`depth_order` eliminates in rounds: each round takes an independent set of the vertices of
smallest degree (no two adjacent, so their pivots do not depend on each other) and eliminates
all of them, adding the fill edges among their neighbours.  On a chain every other vertex goes
in one round (odd-even reduction), so its depth becomes logarithmic, at the price of a little
fill.  ``slack`` admits vertices up to ``slack`` times the smallest degree (plus two) into a
round: larger rounds, fewer levels, more fill.  The graph work is networkx's.
"""
from __future__ import annotations

import networkx as nx
import numpy as np

__all__ = ["depth_order", "elimination_levels"]


def depth_order(pattern, slack: float = 2.0) -> np.ndarray:
    """``order[k]``: the original index eliminated k-th, by rounds of independent low-degree
    vertices of the symmetrised pattern (module docstring)."""
    pat = np.asarray(pattern, dtype=bool)
    n = pat.shape[0]
    sym = pat | pat.T
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    rows, cols = np.nonzero(sym)
    graph.add_edges_from((int(i), int(j)) for i, j in zip(rows, cols) if i < j)
    order: list[int] = []
    while graph.number_of_nodes():
        degree = dict(graph.degree())
        limit = min(degree.values()) * slack + 2.0
        taken, blocked = [], set()
        for v in sorted(graph.nodes(), key=lambda u: (degree[u], u)):
            if degree[v] > limit:
                break
            if v in blocked:
                continue
            taken.append(v)
            blocked.add(v)
            blocked.update(graph[v])
        for v in taken:
            neighbours = list(graph[v])
            graph.add_edges_from((a, b) for i, a in enumerate(neighbours)
                                 for b in neighbours[i + 1:])
            graph.remove_node(v)
        order += taken
    return np.asarray(order, dtype=np.int64)


def elimination_levels(sym) -> tuple[int, int]:
    """(forward, backward) dependency levels of the triangular solves of a ``SymbolicLU``."""
    n = sym.n
    fwd = np.zeros(n, dtype=np.int64)
    bwd = np.zeros(n, dtype=np.int64)
    for k in range(n):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j < k:
                fwd[k] = max(fwd[k], fwd[j] + 1)
    for k in reversed(range(n)):
        for s in sym.row_slots(k):
            j = int(sym.col_idx[s])
            if j > k:
                bwd[k] = max(bwd[k], bwd[j] + 1)
    return int(fwd.max()) + 1, int(bwd.max()) + 1
