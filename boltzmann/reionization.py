"""Reionisation: CAMB-style tanh history (CLASS's default ``reio_camb``), and z_reio from tau_reio.

Hydrogen and the first helium electron are reionised together by a tanh in y = (1+z)^{3/2}
(Lewis 2008, PRD 78 023002, eq. B3):

    x_e = x_before + (1 + f_He - x_before) (1 + tanh((y_re - y) / dy)) / 2,
    dy  = (3/2) sqrt(1 + z_re) dz_re,

the form CLASS uses by default (Lesgourgues 2011; CLASS ``reio_camb``, width dz_re = 0.5), with the
second helium electron added by a tanh in z centred on z_He = 3.5 with width 0.5:

    x_e += f_He (1 + tanh((z_He - z) / dz_He)) / 2.

CLASS switches the tanh on only below z_start = z_re + 8 dz_re (there it is ~1e-7 of its full
value); here it is evaluated everywhere (smooth), and tau_reio is defined as in CLASS: the Thomson
optical depth from today to z_start, integrated over the full x_e.

z_reio is solved from tau_reio by Newton iterations in the variable (1+z)^{3/2} (tau is nearly
linear in it in matter domination), a fixed iteration count; the derivative is then made exact by
the implicit-function theorem: one last Newton step whose tangent is -d tau/d theta / (d tau/d z).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

#: CLASS defaults (input parameters reionization_width, helium_fullreio_redshift/width,
#: reionization_start_factor)
REIO_WIDTH = 0.5
HELIUM_REIO_Z = 3.5
HELIUM_REIO_WIDTH = 0.5
REIO_START_FACTOR = 8.0


def reionised_fraction(z, x_before, z_reio, f_He, width=REIO_WIDTH,
                       helium_z=HELIUM_REIO_Z, helium_width=HELIUM_REIO_WIDTH):
    """x_e(z) after blending the recombination value ``x_before`` with the tanh reionisation."""
    y = (1.0 + z) ** 1.5
    y_re = (1.0 + z_reio) ** 1.5
    dy = 1.5 * jnp.sqrt(1.0 + z_reio) * width
    frac_H = 0.5 * (1.0 + jnp.tanh((y_re - y) / dy))
    frac_He = 0.5 * (1.0 + jnp.tanh((helium_z - z) / helium_width))
    return x_before + (1.0 + f_He - x_before) * frac_H + f_He * frac_He


# Gauss-Legendre nodes on [-1, 1] for the tau integral (smooth integrand; panels keep it exact)
_GL_X, _GL_W = np.polynomial.legendre.leggauss(8)


def optical_depth_to(z_max, z_reio, x_before_of_lna: Callable, kappa_dot_per_xe_of_lna: Callable,
                     aH_of_lna: Callable, f_He, n_panels: int = 48):
    """Thomson optical depth from today to redshift z_max with the reionised x_e.

    kappa_dot_per_xe_of_lna(lna) = a n_H sigma_T [1/Mpc] (so kappa' = x_e times it);
    aH_of_lna(lna) = conformal Hubble rate [1/Mpc]; d kappa / d ln a = kappa' / (a H).
    Integrated with 8-point Gauss-Legendre on ``n_panels`` equal panels in ln a, which resolves
    both tanh steps (width ~0.05 in ln a) to far below 1e-6 of tau.
    """
    lna_lo = -jnp.log1p(z_max)
    edges = jnp.linspace(lna_lo, 0.0, n_panels + 1)
    half = 0.5 * (edges[1:] - edges[:-1])
    mid = 0.5 * (edges[1:] + edges[:-1])
    nodes = (mid[:, None] + half[:, None] * _GL_X[None, :]).reshape(-1)
    weights = (half[:, None] * _GL_W[None, :]).reshape(-1)
    z = jnp.expm1(-nodes)
    x_e = reionised_fraction(z, x_before_of_lna(nodes), z_reio, f_He)
    integrand = x_e * kappa_dot_per_xe_of_lna(nodes) / aH_of_lna(nodes)
    return jnp.sum(weights * integrand)


def tau_reio_of_z_reio(z_reio, x_before_of_lna, kappa_dot_per_xe_of_lna, aH_of_lna, f_He):
    """CLASS's tau_reio: the optical depth from 0 to z_start = z_reio + 8 * width."""
    z_start = z_reio + REIO_START_FACTOR * REIO_WIDTH
    return optical_depth_to(z_start, z_reio, x_before_of_lna, kappa_dot_per_xe_of_lna, aH_of_lna, f_He)


def solve_z_reio(tau_reio, x_before_of_lna, kappa_dot_per_xe_of_lna, aH_of_lna, f_He,
                 newton_iterations: int = 12, z_bounds=(0.5, 60.0)):
    """z_reio such that tau_reio_of_z_reio(z_reio) = tau_reio (differentiable in everything).

    Newton in u = (1+z)^{3/2}, started at z = 10 and clipped to ``z_bounds``; ``tau_reio`` outside
    the range those bounds imply gives a clipped, wrong answer, so the caller should check
    ``tau_reio_of_z_reio(result)`` if it accepts exotic values (compute_thermodynamics does).
    """
    def tau_of_u(u):
        return tau_reio_of_z_reio(u ** (2.0 / 3.0) - 1.0, x_before_of_lna, kappa_dot_per_xe_of_lna,
                                  aH_of_lna, f_He)

    u_lo, u_hi = (1.0 + z_bounds[0]) ** 1.5, (1.0 + z_bounds[1]) ** 1.5
    tau_target = jax.lax.stop_gradient(tau_reio)
    def body(_, u):
        val, slope = jax.value_and_grad(tau_of_u)(u)
        return jnp.clip(u - (val - tau_target) / slope, u_lo, u_hi)

    u = jax.lax.fori_loop(0, newton_iterations, body, jnp.asarray(11.0**1.5))
    u = jax.lax.stop_gradient(u)
    # implicit-function step: zero in value at convergence, exact first derivative
    slope = jax.lax.stop_gradient(jax.grad(tau_of_u)(u))
    u = u - (tau_of_u(u) - tau_reio) / slope
    return u ** (2.0 / 3.0) - 1.0
