"""Baryons and cold dark matter.

CDM is at rest (theta_c = 0 defines the synchronous gauge), so only its density evolves.  Baryons
are a fluid with the tabulated sound speed c_s^2; their Thomson drag is added by the photons.
"""
from __future__ import annotations

from .base import Derivatives, Layout, Observables, Sources, Species


class BaryonsCdm(Species):
    states = ("delta_c", "delta_b", "theta_b")
    params = ("rho_b0", "rho_cdm0")

    def densities(self, e, L: Layout):
        e("A_b", f"{L.p('rho_b0')} * ia")
        e("A_c", f"{L.p('rho_cdm0')} * ia")

    def moments(self, e, L: Layout, src: Sources):
        db, dc = L.y("delta_b"), L.y("delta_c")
        src.drho += [f"A_b * {db}", f"A_c * {dc}"]
        src.rpt.append(f"A_b * {L.y('theta_b')}")
        src.matter += [("A_b", f"A_b * {db}", True), ("A_c", f"A_c * {dc}", True)]
        src.rho_plus_p += ["A_b", "A_c"]

    def equations(self, e, L: Layout, d: Derivatives):
        Y = L.y
        d.set("delta_c", "-0.5 * h_prime")
        d.set("delta_b", f"-{Y('theta_b')} - 0.5 * h_prime")
        d.set("theta_b", f"-cH * {Y('theta_b')} + cs2b * k2 * {Y('delta_b')}")

    def observables(self, L: Layout, obs: Observables):
        obs.add("density", "d_b", L.y("delta_b"))
        obs.add("density", "d_cdm", L.y("delta_c"))
        obs.add("velocity", "t_b", L.y("theta_b"))
