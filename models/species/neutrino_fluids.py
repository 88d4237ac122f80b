"""Neutrinos as fluids once a mode is well inside the horizon (k tau >> 1).

Inside the horizon the free-streaming hierarchies of massless and massive neutrinos carry their
higher multipoles away from the metric, and their density, velocity and shear are what the
Einstein equations read.  Three fluid variables per species then replace the hierarchy: CLASS's
ultra-relativistic fluid approximation (Blas, Lesgourgues & Tram 2011, "ufa_class") for the
massless neutrinos and its non-cold-relic fluid approximation (Lesgourgues & Tram 2011, CLASS IV
section 3.3) for each massive species.  A model built with ``neutrino_fluid=True``
(models/eb.py) uses these emitters; boltzmann.perturbations switches a mode from the full model
to it at a k tau threshold (``models.fluid_switch`` maps the state).

Massless neutrinos keep the MB95 names F_ur_0..2 (delta = F_0, theta = 3k F_1 / 4, sigma = F_2 / 2),
so their first three multipoles carry over unchanged; the shear closes as

    sigma' = -3 sigma / tau + (2/3) (theta + h'/2),    i.e.  F_2' = -3 F_2 / tau + k F_1 + (2/3) h'.

A massive species s evolves delta_ncdm_s, theta_ncdm_s, sigma_ncdm_s with w = p/rho, the
pseudo-pressure P = (1/3) int q^2 f0 q^4/eps^3 of the same momentum quadrature as the full model,
c_a^2 = w (5 - P/p) / (3 (1 + w)), c_eff^2 = c_a^2 and c_vis^2 = 3 w c_a^2:

    delta' = -(1 + w)(theta + h'/2) - 3 H (c_eff^2 - w) delta,
    theta' = -H (1 - 3 c_a^2) theta + c_eff^2 k^2 delta / (1 + w) - k^2 sigma,
    sigma' = -3 [H (2/3 - c_a^2 - P/(3p)) + 1/tau] sigma + (8/3) c_vis^2 (theta + h'/2) / (1 + w),

H the conformal Hubble rate.  The parameters are the full model's, so one parameter row serves
both models of a mode.
"""
from __future__ import annotations

from ..codegen import lit
from .base import Derivatives, Layout, Observables, Sources, Species
from .massless_neutrinos import MasslessNeutrinos
from .massive_neutrinos import NcdmQuadrature, background_sums, einstein_terms


class MasslessNeutrinoFluid(MasslessNeutrinos):
    """The massless neutrinos' F_0, F_1, F_2 with the fluid closure of the shear: the hierarchy
    emitter cut at l = 2 (its states, densities, Einstein terms and observables), but for F_2's
    equation."""

    def __init__(self):
        super().__init__(2)

    def moment_equation(self, L: Layout, l: int) -> str:
        if l < 2:
            return super().moment_equation(L, l)
        return (f"-3.0 * itau * {L.y('F_ur_2')} + k * {L.y('F_ur_1')}"
                " + 0.6666666666666666 * h_prime")


def fluid_state_names(s: int) -> tuple[str, str, str]:
    """The fluid states of massive species ``s``: density contrast, velocity divergence, shear."""
    return (f"delta_ncdm_{s}", f"theta_ncdm_{s}", f"sigma_ncdm_{s}")


class MassiveNeutrinoFluid(Species):
    """Massive species ``s`` as a fluid; background quantities from its quadrature ``quad``."""

    def __init__(self, s: int, quad: NcdmQuadrature):
        self.s, self.quad = s, quad
        self.params = (f"ncdm_norm_{s}", f"ncdm_m_over_T_{s}")
        self.states = fluid_state_names(s)

    def moments(self, e, L: Layout, src: Sources):
        s, sp = self.s, self.quad
        dl, th, sg = (L.y(n) for n in self.states)
        e.comment(f"ncdm species {s} as a fluid: background sums on {len(sp.q)} momentum nodes")
        background_sums(e, L, s, sp)
        pseudo = " + ".join(f"{lit(w * q ** 4 / 3.0)} * ieps{s}_{i} * ieps{s}_{i} * ieps{s}_{i}"
                            for i, (q, w) in enumerate(zip(sp.q, sp.weights)))
        e(f"w_ncdm{s}", f"Pa_ncdm{s} / A_ncdm{s}")
        e(f"pp_ncdm{s}", f"nrm{s} * ({pseudo}) / Pa_ncdm{s}")     # pseudo-pressure / p
        e(f"ca2_ncdm{s}", f"w_ncdm{s} * (5.0 - pp_ncdm{s}) / (3.0 * (1.0 + w_ncdm{s}))")
        e(f"rp_ncdm{s}", f"A_ncdm{s} + Pa_ncdm{s}")
        e(f"dA_ncdm{s}", f"A_ncdm{s} * {dl}")
        e(f"rpt_ncdm{s}", f"rp_ncdm{s} * {th}")
        e(f"shr_ncdm{s}", f"rp_ncdm{s} * {sg}")
        einstein_terms(src, s, f"rp_ncdm{s}")

    def equations(self, e, L: Layout, d: Derivatives):
        s = self.s
        dn, tn, sn = self.states
        dl, th, sg = (L.y(n) for n in self.states)
        w, ca2 = f"w_ncdm{s}", f"ca2_ncdm{s}"
        d.set(dn, f"-(1.0 + {w}) * ({th} + 0.5 * h_prime) - 3.0 * cH * ({ca2} - {w}) * {dl}")
        d.set(tn, f"-cH * (1.0 - 3.0 * {ca2}) * {th} + {ca2} * k2 * {dl} / (1.0 + {w})"
                  f" - k2 * {sg}")
        d.set(sn, f"-3.0 * (cH * (0.6666666666666666 - {ca2} - pp_ncdm{s} * 0.3333333333333333)"
                  f" + itau) * {sg} + 8.0 * {w} * {ca2} * ({th} + 0.5 * h_prime)"
                  f" / (1.0 + {w})")

    def observables(self, L: Layout, obs: Observables):
        s = self.s
        obs.add("optional", f"d_ncdm[{s}]", L.y(self.states[0]))
        obs.add("optional", f"t_ncdm[{s}]", L.y(self.states[1]))
        obs.add("optional", f"s_ncdm[{s}]", L.y(self.states[2]))
