"""Column colouring: structural orthogonality and pinned colour counts (solver.linalg.coloring)."""
import numpy as np
import pytest

from solver.linalg.coloring import check_coloring, color_columns, seed_matrix


def vdp_lattice_pattern(n_osc=32):
    """Van der Pol lattice: x_k' = v_k; v_k' = mu (1 - x_k^2) v_k - x_k + D (x_{k-1} - 2 x_k + x_{k+1})."""
    n = 2 * n_osc
    pat = np.zeros((n, n), dtype=bool)
    for k in range(n_osc):
        x, v = 2 * k, 2 * k + 1
        pat[x, v] = True
        pat[v, [x, v]] = True
        if k > 0:
            pat[v, x - 2] = True
        if k < n_osc - 1:
            pat[v, x + 2] = True
    return pat


def eb_like_pattern(core=12, tails=(8, 10, 12, 13, 15)):
    """Dense core + tridiagonal tails, each joined to one core variable by one entry each way."""
    n = core + sum(tails)
    pat = np.zeros((n, n), dtype=bool)
    pat[:core, :core] = True
    start = core
    for k, length in enumerate(tails):
        idx = np.arange(start, start + length)
        pat[idx, idx] = True
        pat[idx[:-1], idx[1:]] = True
        pat[idx[1:], idx[:-1]] = True
        anchor = core - 1 - k
        pat[anchor, idx[0]] = pat[idx[0], anchor] = True
        start += length
    return pat


def test_vdp_lattice_colours_pinned():
    pat = vdp_lattice_pattern()
    colors, n_colors = color_columns(pat)
    check_coloring(pat, colors)
    assert colors.shape == (64,)
    assert n_colors == 4  # pinned: x-columns touch rows v_{k-1}, v_k, v_{k+1}
    assert n_colors < 64


def test_eb_like_colours_pinned():
    pat = eb_like_pattern()
    colors, n_colors = color_columns(pat)
    check_coloring(pat, colors)
    assert pat.shape == (70, 70)
    # pinned: 13 is optimal -- an anchor row has 12 core entries plus its tail's first entry
    assert n_colors == 13
    assert n_colors == pat.sum(axis=1).max()


def test_seed_matrix_compresses():
    pat = eb_like_pattern()
    colors, n_colors = color_columns(pat)
    seeds = seed_matrix(colors, n_colors)
    assert seeds.shape == (70, n_colors)
    assert np.all(seeds.sum(axis=1) == 1)
    # every nonzero of a random matrix with this pattern is recoverable from J @ S
    rng = np.random.default_rng(3)
    jac = np.where(pat, rng.normal(size=pat.shape), 0.0)
    compressed = jac @ seeds
    rows, cols = np.nonzero(pat)
    np.testing.assert_array_equal(compressed[rows, colors[cols]], jac[rows, cols])


def test_deterministic_and_random_patterns():
    rng = np.random.default_rng(0)
    for _ in range(5):
        pat = rng.random((40, 40)) < 0.1
        c1, n1 = color_columns(pat)
        c2, n2 = color_columns(pat.copy())
        np.testing.assert_array_equal(c1, c2)
        assert n1 == n2
        check_coloring(pat, c1)


def test_check_coloring_rejects_conflict():
    pat = np.array([[1, 1], [0, 1]], dtype=bool)
    with pytest.raises(ValueError, match="orthogonal"):
        check_coloring(pat, np.array([0, 0]))


def test_bad_input():
    with pytest.raises(ValueError, match="pattern"):
        color_columns(np.zeros(3))
    with pytest.raises(ValueError, match="colors"):
        seed_matrix(np.array([0, 3]), 2)
