"""Background observables at redshift z: H(z), distances, sound horizon, growth — in JAX.

What BAO, supernova and RSD likelihoods read, as plain functions of a ``CosmoParams`` and z, so
that ``jax.grad``/``jax.jacfwd`` differentiate them in every cosmological parameter (and in z).
Flat universe (the only one ``boltzmann.params`` builds), CLASS's units: H and rates in 1/Mpc
(H/c), distances in Mpc.

- ``hubble(cosmo, z)`` = H(z) from the Friedmann equation (``boltzmann.background``);
- ``comoving_distance`` χ(z) = ∫_0^z dz'/H(z') = ∫_{ln a}^0 dln a' / (a' H), by composite
  Gauss–Legendre in ln a over [ln a, 0] (``_PANELS`` × ``_NODES`` nodes: the integrand 1/(aH) is
  smooth, and the rule is exact to ~1e-14 relative; tests compare it with the difference of
  conformal times τ0 − τ(a)). Integrating from z directly, rather than subtracting two conformal
  ages of ~14 Gpc, keeps χ accurate at small z;
- transverse comoving ``D_M = χ`` (flat), ``angular_distance`` D_A = χ/(1+z),
  ``luminosity_distance`` D_L = (1+z) χ, Hubble distance D_H = 1/H, the BAO volume distance
  D_V = (z D_M² D_H)^{1/3};
- ``sound_horizon`` r_s(z) = ∫_0^a c_s da/(a² H), c_s = 1/√(3(1+R)), R = 3ρ_b/(4ρ_γ) — CLASS's
  ``comov.snd.hrz.`` (its thermodynamics reads rs_rec, rs_star, rs_d off it);
- ``growth(cosmo, z)`` = (D, f): CLASS's scale-independent growth factor and rate f = dln D/dln a
  (``scale_independent_growth_factor[_f]``), from ``boltzmann.background.growth_factor`` — the
  same ODE, sourced by baryons + CDM only (exact without massive neutrinos; their small-scale
  limit with them).

Every function accepts z of any shape (numbers or arrays) and returns that shape.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import background as bg
from . import constants as const

__all__ = ["hubble", "comoving_distance", "transverse_comoving_distance", "angular_distance",
           "luminosity_distance", "hubble_distance", "volume_distance", "sound_horizon",
           "baryon_photon_ratio", "growth", "age_gyr", "conformal_age"]

#: Gauss–Legendre panels and nodes per panel of the ln a integrals
_PANELS = 24
_NODES = 8
#: e-folds below the lower limit where the sound-horizon integral switches to its radiation-era
#: closed form (as boltzmann.background does for the conformal time)
_RS_EFOLDS = 25.0


def _scale_factor(z):
    return 1.0 / (1.0 + jnp.asarray(z, jnp.float64))


def _gauss_legendre(lo, hi, integrand):
    """∫_lo^hi integrand(x) dx by composite Gauss–Legendre on ``_PANELS`` equal panels,
    vectorised over the shape of lo/hi (both broadcastable)."""
    x, w = np.polynomial.legendre.leggauss(_NODES)
    edges = np.linspace(0.0, 1.0, _PANELS + 1)
    t = ((edges[:-1, None] + edges[1:, None]) / 2 + (edges[1:, None] - edges[:-1, None]) / 2 * x)
    wt = ((edges[1:, None] - edges[:-1, None]) / 2 * w)
    t, wt = t.ravel(), wt.ravel()                        # nodes and weights on [0, 1]
    lo, hi = jnp.asarray(lo)[..., None], jnp.asarray(hi)[..., None]
    return jnp.sum(wt * integrand(lo + (hi - lo) * t), axis=-1) * (hi - lo)[..., 0]


def hubble(cosmo, z):
    """H(z) [1/Mpc] (H/c; multiply by c in km/s for km/s/Mpc)."""
    return bg.hubble(cosmo, _scale_factor(z))


def comoving_distance(cosmo, z):
    """Comoving radial distance χ(z) = ∫_0^z dz'/H [Mpc] (flat)."""
    lna = jnp.log(_scale_factor(z))
    return _gauss_legendre(lna, jnp.zeros_like(lna),
                           lambda x: 1.0 / bg.conformal_hubble(cosmo, jnp.exp(x)))


def transverse_comoving_distance(cosmo, z):
    """D_M(z) [Mpc]: equal to χ(z) in a flat universe."""
    return comoving_distance(cosmo, z)


def angular_distance(cosmo, z):
    """Angular-diameter distance D_A = D_M/(1+z) [Mpc] (CLASS's ``angular_distance``)."""
    return comoving_distance(cosmo, z) * _scale_factor(z)


def luminosity_distance(cosmo, z):
    """Luminosity distance D_L = (1+z) D_M [Mpc]."""
    return comoving_distance(cosmo, z) / _scale_factor(z)


def hubble_distance(cosmo, z):
    """D_H = 1/H(z) [Mpc] (c/H), the radial BAO distance."""
    return 1.0 / hubble(cosmo, z)


def volume_distance(cosmo, z):
    """D_V = (z D_M² D_H)^{1/3} [Mpc], the isotropic BAO distance."""
    z = jnp.asarray(z, jnp.float64)
    return jnp.cbrt(z * comoving_distance(cosmo, z) ** 2 * hubble_distance(cosmo, z))


def baryon_photon_ratio(cosmo, a):
    """R = 3 ρ_b / (4 ρ_γ) at scale factor a (∝ a)."""
    return 0.75 * cosmo.omega_b / cosmo.omega_g * jnp.asarray(a, jnp.float64)


def sound_horizon(cosmo, z):
    """Comoving sound horizon r_s(z) = ∫_0^a c_s dτ [Mpc], c_s = 1/√(3(1+R)).

    From ln a − 25 to ln a by Gauss–Legendre; below, radiation domination and R ≈ 0 give
    r_s = c_s τ = c_s/(aH) (relative size e^-25 of the whole, its error negligible).
    """
    lna = jnp.log(_scale_factor(z))

    def integrand(x):
        a = jnp.exp(x)
        return 1.0 / (jnp.sqrt(3.0 * (1.0 + baryon_photon_ratio(cosmo, a)))
                      * bg.conformal_hubble(cosmo, a))

    return integrand(lna - _RS_EFOLDS) + _gauss_legendre(lna - _RS_EFOLDS, lna, integrand)


def growth(cosmo, z):
    """(D(z), f(z)): scale-independent growth factor (D(0) = 1) and rate f = dln D/dln a.

    CLASS's background growth equation (``boltzmann.background.growth_factor``): baryons + CDM
    source it, massive neutrinos enter only through H(z) — exact without massive neutrinos, the
    small-scale limit with them (as CLASS's ``scale_independent_growth_factor_f``). Equal to
    CLASS's to 3e-6 below z = 100; before recombination CLASS's f still carries its starting
    value f = 2 (D' = 2aH at its first time) while this solution starts on the radiation-era
    (Meszaros) growing mode: 6e-4 apart at z = 1000, 4.5 % at z = 1e4.
    """
    return bg.growth_factor(cosmo, _scale_factor(z))


def age_gyr(cosmo):
    """Age of the universe t(a = 1) [Gyr]."""
    return bg.age_gyr(cosmo)


def conformal_age(cosmo):
    """Conformal age τ0 [Mpc] (the comoving distance to the big bang)."""
    return bg.conformal_age(cosmo)


#: c in km/s, for H in km/s/Mpc = H [1/Mpc] × this
C_KM_S = const.C_SI / 1e3
