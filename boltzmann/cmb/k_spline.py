"""The sources carried from the source k grid to the transfer k grid: a spline in ln k as a
banded operator.

The interpolating spline of degree p through values on the K source wavenumbers is linear in
them: its B-spline coefficients are c = C v (C = the inverse of the collocation matrix, K × K),
and at any k only p + 1 B-splines are nonzero, so the value there is Σ_j B_j(k) c[s(k) + j].
``sampling.spline_matrix`` writes the same operator as one dense (K_fine × K) matrix; applied to
the five sources of ~1000 conformal times that matrix costs 2·K_fine·K flops per time (27 GFLOP
at K_fine ≈ 10⁴, K ≈ 260: about a second on two CPU cores) and its host construction tens of
milliseconds per cosmology; the banded form costs K² + 2(p+1)·K_fine per time and builds in a
few milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from scipy.interpolate import BSpline, make_interp_spline

__all__ = ["BandedSpline"]


@dataclass(frozen=True)
class BandedSpline:
    """The spline of ``degree`` in ln k from K wavenumbers to K_fine others.

    coefficients: (K, K) B-spline coefficients per unit data vector (C); start: (K_fine,) the
    first nonzero B-spline at each target; basis: (K_fine, degree + 1) their values there.
    """

    coefficients: np.ndarray
    start: np.ndarray
    basis: np.ndarray

    @classmethod
    def build(cls, k_from, k_to, degree: int) -> "BandedSpline":
        """The operator for targets ``k_to`` inside [k_from[0], k_from[-1]] (a clear error
        otherwise: the spline is not meant to extrapolate)."""
        x_from = np.log(np.asarray(k_from, np.float64))
        x_to = np.log(np.asarray(k_to, np.float64))
        # rounding of the logarithms may put an end point a few ulp outside
        tol = 1e-12 * max(1.0, float(np.max(np.abs(x_from))))
        if x_to.min() < x_from[0] - tol or x_to.max() > x_from[-1] + tol:
            raise ValueError(f"BandedSpline: targets k in [{np.exp(x_to.min()):.6g}, "
                             f"{np.exp(x_to.max()):.6g}] reach outside the source grid "
                             f"[{k_from[0]:.6g}, {k_from[-1]:.6g}]")
        x_to = np.clip(x_to, x_from[0], x_from[-1])
        spl = make_interp_spline(x_from, np.eye(x_from.size), k=int(degree), axis=0)
        design = BSpline.design_matrix(x_to, spl.t, int(degree)).tocsr()
        design.sort_indices()
        width = int(degree) + 1
        if design.nnz != width * x_to.size:
            raise ValueError("BandedSpline: unexpected design matrix layout")
        start = design.indices[::width].astype(np.int32)
        cols = design.indices.reshape(-1, width)
        if not np.array_equal(cols, start[:, None] + np.arange(width)[None, :]):
            raise ValueError("BandedSpline: the nonzero B-splines are not consecutive")
        return cls(coefficients=np.asarray(spl.c, np.float64), start=start,
                   basis=design.data.reshape(-1, width).copy())

    def apply(self, values):
        """(K_fine, ...) the spline's values at the targets, of ``values`` (K, ...) at the
        sources (jnp; linear, so any tangent of ``values`` goes through it unchanged). One
        compiled program: called eagerly, its gathers and sums would each write a
        K_fine × S array."""
        return _apply(jnp.asarray(self.coefficients), jnp.asarray(self.start),
                      jnp.asarray(self.basis), values)


@jax.jit
def _apply(coefficients, start, basis, values):
    c = coefficients @ values
    extra = (None,) * (c.ndim - 1)
    out = basis[(slice(None), 0) + extra] * c[start]
    for j in range(1, basis.shape[1]):
        out = out + basis[(slice(None), j) + extra] * c[start + j]
    return out
