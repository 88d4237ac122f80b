"""Adiabatic growing-mode initial conditions, synchronous gauge, deep in radiation domination.

Series in k tau (MB95 eq. 96, Ma & Bertschinger 1995) with the first-order corrections in
omega tau that CLASS adds (Blas, Lesgourgues & Tram 2011, perturbations.c 'ad' initial
conditions), where omega = a rho~_m / sqrt(rho~_r) = rho~_m0 / sqrt(rho~_r0) [1/Mpc] measures the
matter admixture (a(tau) = sqrt(rho~_r0) tau + rho~_m0 tau^2 / 4 in a radiation+matter universe).
Normalisation as CLASS's 'class' transfer output: unit primordial curvature, eta -> 1 on
super-horizon scales, so density contrasts start negative (delta_g = -(k tau)^2/3).
Massive relics are relativistic at the start and follow the massless neutrinos (MB95 eq. 98):
Psi_l(q) = -F_ur,l / 4 * dlnf0/dlnq, with the massive epsilon/q factor on l = 1.
The w0-wa fluid starts on the attractor of Ballesteros & Lesgourgues 2010 (arXiv:1004.5509).

Every function here is written in jax.numpy without value-dependent Python control flow, so the
initial state is differentiable with respect to the parameter vector.
"""
from __future__ import annotations

import jax.numpy as jnp

from .eb import EBModel

# Default start: k tau_ini <= KTAU_MAX and omega tau_ini <= OMTAU_MAX.  The neglected terms are
# O((k tau)^4) and O((omega tau)^2) relative, i.e. <= 1e-8 and 1e-6 at these values.
KTAU_MAX = 1.0e-2
OMTAU_MAX = 1.0e-3


def _rho_ncdm_a4(model: EBModel, p, a):
    """Sum over massive species of rho~ a^4 at scale factor a (their quadrature)."""
    total = 0.0
    for s, sp in enumerate(model.ncdm):
        norm = p[model.param_index(f"ncdm_norm_{s}")]
        mT = a * p[model.param_index(f"ncdm_m_over_T_{s}")]
        eps = jnp.sqrt(jnp.asarray(sp.q) ** 2 + mT * mT)
        total = total + norm * jnp.sum(jnp.asarray(sp.weights) * eps)
    return total


def radiation_matter(model: EBModel, p):
    """(rho~_r0, rho~_m0): today's radiation (photons + ur + relativistic ncdm) and
    matter (baryons + cdm) densities [1/Mpc^2] used by the radiation-era expansion."""
    pi = model.param_index
    rho_r0 = p[pi("rho_g0")] + p[pi("rho_ur0")] + _rho_ncdm_a4(model, p, 0.0)
    rho_m0 = p[pi("rho_b0")] + p[pi("rho_cdm0")]
    return rho_r0, rho_m0


def initial_time(model: EBModel, p, ktau_max: float = KTAU_MAX, omtau_max: float = OMTAU_MAX):
    """(tau_ini, a_ini) for the mode k = p['k']: tau_ini = min(ktau_max/k, omtau_max/omega).

    a_ini = sqrt(rho~_r0) tau + rho~_m0 tau^2 / 4 (exact for radiation + matter; the massive
    relics' mass and Lambda are negligible there).  For the Planck cosmology omega ~ 7.7e-3/Mpc,
    so tau_ini <= 0.13 Mpc and a_ini <= 2.7e-7; at k = 1/Mpc, a_ini ~ 2e-8.  The table handed to
    the RHS must start at or below ln a_ini.
    """
    if not ktau_max > 0 or not omtau_max > 0:
        raise ValueError(f"ktau_max and omtau_max must be > 0, got {ktau_max}, {omtau_max}")
    k = p[model.param_index("k")]
    rho_r0, rho_m0 = radiation_matter(model, p)
    omega = rho_m0 / jnp.sqrt(rho_r0)
    tau = jnp.minimum(ktau_max / k, omtau_max / omega)
    a = jnp.sqrt(rho_r0) * tau + 0.25 * rho_m0 * tau * tau
    return tau, a


def adiabatic_initial_conditions(model: EBModel, p, tau, a):
    """State vector (length model.n) of the adiabatic growing mode at conformal time tau and
    scale factor a, for the parameters p (reads k, densities, ncdm and fluid entries by name).
    """
    pi = model.param_index
    k = p[pi("k")]
    rho_g = p[pi("rho_g0")] / a**4
    rho_nu = (p[pi("rho_ur0")] + _rho_ncdm_a4(model, p, a)) / a**4
    rho_r = rho_g + rho_nu
    rho_b = p[pi("rho_b0")] / a**3
    rho_m = rho_b + p[pi("rho_cdm0")] / a**3
    fnu = rho_nu / rho_r
    fb = rho_b / rho_m
    om = a * rho_m / jnp.sqrt(rho_r)
    ot = om * tau
    kt = k * tau
    kt2 = kt * kt
    kt3 = kt2 * kt

    delta_g = -kt2 / 3.0 * (1.0 - ot / 5.0)
    theta_g = -k * kt3 / 36.0 * (1.0 - 3.0 * (1.0 + 5.0 * fb - fnu) / (20.0 * (1.0 - fnu)) * ot)
    theta_ur = (-k * kt3 / (36.0 * (4.0 * fnu + 15.0))
                * (4.0 * fnu + 23.0
                   - 3.0 * (8.0 * fnu**2 + 50.0 * fnu + 275.0) / (20.0 * (2.0 * fnu + 15.0)) * ot))
    shear_ur = (2.0 * kt2 / (45.0 + 12.0 * fnu)
                * (1.0 + (4.0 * fnu - 5.0) / (4.0 * (2.0 * fnu + 15.0)) * ot))
    # F_3 from F_3' = (3k/7) F_2 at leading order, F_2 = 2 sigma
    f3_ur = 4.0 * kt3 / (7.0 * (45.0 + 12.0 * fnu))
    eta = 1.0 - kt2 / (12.0 * (15.0 + 4.0 * fnu)) * (
        5.0 + 4.0 * fnu - (16.0 * fnu**2 + 280.0 * fnu + 325.0) / (10.0 * (2.0 * fnu + 15.0)) * ot)

    values = {
        "eta": eta,
        "delta_c": 0.75 * delta_g,
        "delta_b": 0.75 * delta_g,
        "theta_b": theta_g,
        "F_g_0": delta_g,
        "F_g_1": theta_g / (0.75 * k),
        "F_ur_0": delta_g,
        "F_ur_1": theta_ur / (0.75 * k),
        "F_ur_2": 2.0 * shear_ur,
        "F_ur_3": f3_ur,
    }
    for s, sp in enumerate(model.ncdm):
        mT = a * p[pi(f"ncdm_m_over_T_{s}")]
        for i, (q, dlnf) in enumerate(zip(sp.q, sp.dlnf0_dlnq)):
            eps = jnp.sqrt(q * q + mT * mT)
            values[f"Psi_{s}_q{i}_l0"] = -0.25 * dlnf * delta_g
            values[f"Psi_{s}_q{i}_l1"] = -eps / (3.0 * q * k) * dlnf * theta_ur
            values[f"Psi_{s}_q{i}_l2"] = -0.5 * dlnf * shear_ur
            values[f"Psi_{s}_q{i}_l3"] = -0.25 * dlnf * f3_ur
    if model.de_fluid:
        w = p[pi("w0")] + p[pi("wa")] * (1.0 - a)
        cs2 = p[pi("cs2_de")]
        values["delta_de"] = -kt2 / 4.0 * (1.0 + w) * (4.0 - 3.0 * cs2) / (4.0 - 6.0 * w + 3.0 * cs2)
        values["theta_de"] = -k * kt3 / 4.0 * cs2 / (4.0 - 6.0 * w + 3.0 * cs2)

    if model.de_at_lambda:   # δ̃ = δ_de/(1+w) and θ of the same attractor (build_eb_model)
        w = p[pi("w0")] + p[pi("wa")] * (1.0 - a)
        cs2 = p[pi("cs2_de")]
        for u in ("A", "B"):
            values[f"delta_de_{u}"] = -kt2 / 4.0 * (4.0 - 3.0 * cs2) / (4.0 - 6.0 * w + 3.0 * cs2)
            values[f"theta_de_{u}"] = -k * kt3 / 4.0 * cs2 / (4.0 - 6.0 * w + 3.0 * cs2)

    zero = jnp.zeros((), dtype=jnp.result_type(float))
    return jnp.stack([jnp.asarray(values.get(name, zero), dtype=zero.dtype) + zero
                      for name in model.state_names])
