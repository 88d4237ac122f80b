"""Which wavenumbers of a P(k) grid the perturbation stage solves, and P(k) at the others.

Why: the solve's cost is its total number of steps, and the steps per mode grow with k (the
baryon-photon oscillations before recombination): half of configs/lcdm.yaml's steps are in its
21 modes above 1 h/Mpc, where P(k) is smooth in ln k on the scale of the grid's spacing (20 a
decade; the baryon wiggles are damped there). CLASS and CAMB solve P(k) on a sampling of their
own and interpolate; here the precision keys ``k_solve_stride`` and ``k_solve_dense_below`` do
it on the requested grid: above ``k_solve_dense_below`` [h/Mpc] only every
``k_solve_stride``-th mode of the grid (and always the last) is solved, and P_m, P_cb at the
others come from a cubic spline of ln P in ln k through the solved modes
(docs/perturbations.md, "Solving fewer modes at high k"; accuracy in docs/benchmarks.md).

The spline is the not-a-knot cubic spline (scipy's ``CubicSpline`` default), chosen over the
natural one because it reproduces a cubic in ln k exactly: ln P's primordial part,
ln(A_s) + (n_s − 1 + α_s/2 ln(k/k_pivot)) ln(k/k_pivot) − 3 ln k, is a quadratic, so the
spline of ln P is the spline of 2 ln|T| plus that quadratic, exactly. It is a fixed linear map
W of the solved values (built once, in float64, by splining the identity's columns), so:

* the same W maps d ln P/dθ (a derivative commutes with a fixed linear map), and under JAX
  the fill is a matmul and a gather, differentiable and jit-able;
* the solved modes are returned as solved, bit for bit (they are gathered, not multiplied);
* a NaN (a failed mode) at any solved mode makes every interpolated value of that spectrum NaN
  (the spline of a grid reads all its nodes), so a failure is never hidden by the spline.

Transfer functions stay on the solved modes (``Transfers.k``): the late-time radiation fields
(d_g, d_ur, s_ncdm) oscillate in k and do not interpolate (boltzmann/modes.py's docstring).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["KSampling", "choose", "every_mode", "solved_indices", "spline_weights",
           "cut_grid_h"]

#: relative slack of the cut: a mode within this of ``k_solve_dense_below`` counts as at it, so
#: a grid given in h/Mpc and the same grid in 1/Mpc divided by h select the same modes
CUT_SLACK = 1e-9


def solved_indices(k_h, stride: int, dense_below: float) -> np.ndarray:
    """Ascending indices of the modes of ``k_h`` (K,) [h/Mpc], distinct, any order, to solve:
    every mode below ``dense_below`` [h/Mpc]; from the first mode at or above it, every
    ``stride``-th in order of k; and the largest k (so that no mode is extrapolated)."""
    k_h = np.asarray(k_h, np.float64).reshape(-1)
    stride = int(stride)
    if stride < 1:
        raise ValueError(f"k_solve_stride = {stride}: must be >= 1 (1 solves every mode)")
    order = np.argsort(k_h, kind="stable")
    above = k_h[order] >= float(dense_below) * (1.0 - CUT_SLACK)
    first = int(np.argmax(above)) if above.any() else k_h.size
    ranks = np.concatenate([np.arange(first), np.arange(first, k_h.size, stride),
                            [k_h.size - 1] if k_h.size else []]).astype(np.int64)
    return np.sort(order[np.unique(ranks)])


def spline_weights(x_nodes, x_out) -> np.ndarray:
    """(len(x_out), len(x_nodes)) W with W @ y the not-a-knot cubic spline through (x_nodes, y)
    at x_out, for any y: the splines of the identity's columns. x_nodes distinct, any order
    (two nodes: the straight line; three: the parabola, as scipy's ``CubicSpline`` does)."""
    from scipy.interpolate import CubicSpline

    x_nodes = np.asarray(x_nodes, np.float64).reshape(-1)
    x_out = np.asarray(x_out, np.float64).reshape(-1)
    order = np.argsort(x_nodes)
    if x_nodes.size < 2 or np.any(np.diff(x_nodes[order]) <= 0):
        raise ValueError("spline_weights: needs at least two distinct nodes")
    weights = np.empty((x_out.size, x_nodes.size))
    weights[:, order] = CubicSpline(x_nodes[order], np.eye(x_nodes.size), axis=0,
                                    bc_type="not-a-knot")(x_out)
    return weights


@dataclass(frozen=True, eq=False)
class KSampling:
    """The solved modes of a k axis of ``n`` modes and the spline that fills in the others.

    solved: ascending indices of the solved modes; interpolated: the others, ascending;
    weights: (len(interpolated), len(solved)) rows of W for the interpolated modes (the rows
    of the solved modes are unit vectors, applied as a gather); k, k_h: the axis filled, (C, n)
    [1/Mpc] and (n,) [h/Mpc] or None (grid in 1/Mpc), when the caller gave them.
    """

    solved: np.ndarray
    interpolated: np.ndarray
    weights: np.ndarray
    n: int
    k: np.ndarray | None = None
    k_h: np.ndarray | None = None
    #: for each mode of the axis, its place in concatenate([solved values, interpolated ones])
    _place: np.ndarray = field(init=False, repr=False)
    #: for each interpolated mode, the position among the solved of the one before it on the
    #: axis (just below it in k on an ascending axis)
    _below: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        place = np.empty(self.n, np.int64)
        place[self.solved] = np.arange(self.solved.size)
        place[self.interpolated] = self.solved.size + np.arange(self.interpolated.size)
        object.__setattr__(self, "_place", place)
        below = np.clip(np.searchsorted(self.solved, self.interpolated) - 1, 0, None)
        object.__setattr__(self, "_below", below)

    @property
    def every_mode(self) -> bool:
        """True when every mode is solved (stride 1): the fills return their input as is."""
        return self.interpolated.size == 0

    @property
    def k_solved(self) -> np.ndarray | None:
        """(C, len(solved)) the solved wavenumbers [1/Mpc] (None without ``k``)."""
        return None if self.k is None else self.k[:, self.solved]

    @property
    def k_h_solved(self) -> np.ndarray | None:
        """(len(solved),) the solved wavenumbers [h/Mpc], or None for a grid in 1/Mpc."""
        return None if self.k_h is None else self.k_h[self.solved]

    def matrix(self) -> np.ndarray:
        """(n, len(solved)) the whole W, unit rows at the solved modes (for inspection)."""
        return np.concatenate([np.eye(self.solved.size), self.weights])[self._place]

    def _assemble(self, solved_values, interpolated_values):
        xp = np if isinstance(solved_values, np.ndarray) else jnp
        both = xp.concatenate([solved_values, interpolated_values], axis=-1)
        return xp.take(both, self._place, axis=-1)

    def _spline(self, values):
        """W's interpolated rows applied along the last axis (numpy or JAX, as given)."""
        if isinstance(values, np.ndarray):
            return np.einsum("...s,is->...i", values, self.weights)
        return jnp.einsum("...s,is->...i", values, self.weights,
                          precision=lax.Precision.HIGHEST)

    def fill(self, values):
        """``values`` (..., len(solved)) continued to (..., n) by the spline of the values
        themselves (ln P, or d ln P/dθ): solved entries copied, the others W @ values."""
        if self.every_mode:
            return values
        return self._assemble(values, self._spline(values))

    def fill_power(self, power):
        """A power spectrum (..., len(solved)) [> 0] on the whole axis: exp of the spline of
        ln P at the interpolated modes, the solved values as they are."""
        if self.every_mode:
            return power
        xp = np if isinstance(power, np.ndarray) else jnp
        return self._assemble(power, xp.exp(self._spline(xp.log(power))))

    def fill_transfer(self, transfer):
        """A transfer function (..., len(solved)) of one sign over the filled range on the
        whole axis: ln|T| splined (the spline ``fill_power`` gives P through, up to rounding,
        since ln P − 2 ln|T| is a quadratic in ln k), with the sign of the solved mode before it."""
        if self.every_mode:
            return transfer
        xp = np if isinstance(transfer, np.ndarray) else jnp
        sign = xp.sign(xp.take(transfer, self._below, axis=-1))
        return self._assemble(transfer, sign * xp.exp(self._spline(xp.log(xp.abs(transfer)))))


def every_mode(n: int, k=None, k_h=None) -> KSampling:
    """The sampling that solves all ``n`` modes (k_solve_stride 1)."""
    return KSampling(solved=np.arange(n), interpolated=np.arange(0), weights=np.zeros((0, n)),
                     n=int(n), k=k, k_h=k_h)


def cut_grid_h(k, k_h, h) -> np.ndarray:
    """(K,) the axis in h/Mpc the cut reads: ``k_h`` when the grid is shared in h/Mpc (the same
    modes for every cosmology), else the shared grid in 1/Mpc, ``k[0]``, divided by the largest
    h. Why the largest: the cut in 1/Mpc, k_solve_dense_below·h, is then at or above every
    cosmology's own, so each cosmology has every mode below its own cut solved (one selection
    for all: the cosmologies of a launch share one k axis)."""
    if k_h is not None:
        return np.asarray(k_h, np.float64)
    return np.asarray(k, np.float64)[0] / float(np.max(np.asarray(h, np.float64)))


def choose(k, k_h, h, precision) -> KSampling:
    """The sampling of the axis ``k`` (C, K) [1/Mpc] (``k_h`` (K,) [h/Mpc] or None, ``h`` (C,))
    by the precision's ``k_solve_stride`` and ``k_solve_dense_below`` (module docstring)."""
    k = np.asarray(k, np.float64)
    k_h = None if k_h is None else np.asarray(k_h, np.float64)
    n = k.shape[-1]
    stride = int(precision.k_solve_stride)
    if stride == 1:
        return every_mode(n, k, k_h)
    grid_h = cut_grid_h(k, k_h, h)
    solved = solved_indices(grid_h, stride, float(precision.k_solve_dense_below))
    interpolated = np.setdiff1d(np.arange(n), solved)
    if interpolated.size == 0:
        return every_mode(n, k, k_h)
    ln_k = np.log(grid_h)
    return KSampling(solved=solved, interpolated=interpolated,
                     weights=spline_weights(ln_k[solved], ln_k[interpolated]), n=n, k=k,
                     k_h=k_h)
