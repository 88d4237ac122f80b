"""Massless neutrinos (and any other massless relic): the collisionless F_l hierarchy."""
from __future__ import annotations

from .base import Derivatives, Layout, Observables, Sources, Species
from .hierarchy import METRIC_QUADRUPOLE, radiation_density, radiation_moments, stream


class MasslessNeutrinos(Species):
    free_streaming = "massless neutrinos"
    params = ("rho_ur0",)

    def __init__(self, l_max: int):
        self.l_max = l_max
        self.states = tuple(f"F_ur_{l}" for l in range(l_max + 1))
        self.radiation = self.states

    def densities(self, e, L: Layout):
        radiation_density(e, L, "ur")

    def moments(self, e, L: Layout, src: Sources):
        radiation_moments(e, L, src, "ur")

    def equations(self, e, L: Layout, d: Derivatives):
        for l in range(self.l_max + 1):
            d.set(f"F_ur_{l}", self.moment_equation(L, l))

    def moment_equation(self, L: Layout, l: int) -> str:
        """d/dtau of F_l: free streaming (MB95 eq. 51 closure at l_max) and the metric terms."""
        if l == 0:
            return f"-k * {L.y('F_ur_1')} - 0.6666666666666666 * h_prime"
        metric = f" + {METRIC_QUADRUPOLE}" if l == 2 else ""
        return stream(L, "F_ur_", l, self.l_max) + metric

    def observables(self, L: Layout, obs: Observables):
        obs.add("density", "d_ur", L.y("F_ur_0"))
        obs.add("velocity", "t_ur", "theta_ur")
