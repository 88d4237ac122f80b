"""Photons: temperature and polarisation hierarchies (MB95 F_l, G_l) and Thomson scattering.

Thomson scattering couples the photons to the baryons: kappa' damps every photon moment but the
monopole, the quadrupole source Pi = F_2 + G_0 + G_2 feeds the polarisation, and the drag
R kappa' (theta_g - theta_b), R = 4 rho_g / (3 rho_b), is added to the baryons' velocity equation.
"""
from __future__ import annotations

from .base import Derivatives, Layout, Observables, Sources, Species
from .hierarchy import METRIC_QUADRUPOLE, radiation_density, radiation_moments, stream


class Photons(Species):
    free_streaming = "photons"
    params = ("rho_g0",)

    def __init__(self, l_max: int, l_max_pol: int):
        self.l_max, self.l_max_pol = l_max, l_max_pol
        self.states = (tuple(f"F_g_{l}" for l in range(l_max + 1))
                       + tuple(f"G_g_{l}" for l in range(l_max_pol + 1)))
        self.radiation = self.states

    def densities(self, e, L: Layout):
        radiation_density(e, L, "g")

    def moments(self, e, L: Layout, src: Sources):
        radiation_moments(e, L, src, "g")

    def equations(self, e, L: Layout, d: Derivatives):
        Y = L.y
        e("R_b", "1.3333333333333333 * A_g / A_b")
        d.couple("theta_b", f"R_b * kd * (theta_g - {Y('theta_b')})")
        e("Pi_g", f"{Y('F_g_2')} + {Y('G_g_0')} + {Y('G_g_2')}")
        lg, lp = self.l_max, self.l_max_pol
        d.set("F_g_0", f"-k * {Y('F_g_1')} - 0.6666666666666666 * h_prime")
        d.set("F_g_1", f"k * 0.3333333333333333 * ({Y('F_g_0')} - 2.0 * {Y('F_g_2')})"
                       f" + kd * (1.3333333333333333 * {Y('theta_b')} / k - {Y('F_g_1')})")
        d.set("F_g_2", f"{stream(L, 'F_g_', 2, lg)} + {METRIC_QUADRUPOLE}"
                       f" - kd * ({Y('F_g_2')} - 0.1 * Pi_g)")
        for l in range(3, lg + 1):
            d.set(f"F_g_{l}", f"{stream(L, 'F_g_', l, lg)} - kd * {Y(f'F_g_{l}')}")
        d.set("G_g_0", f"-k * {Y('G_g_1')} + kd * (0.5 * Pi_g - {Y('G_g_0')})")
        d.set("G_g_1", f"{stream(L, 'G_g_', 1, lp)} - kd * {Y('G_g_1')}")
        d.set("G_g_2", f"{stream(L, 'G_g_', 2, lp)} + kd * (0.1 * Pi_g - {Y('G_g_2')})")
        for l in range(3, lp + 1):
            d.set(f"G_g_{l}", f"{stream(L, 'G_g_', l, lp)} - kd * {Y(f'G_g_{l}')}")

    def observables(self, L: Layout, obs: Observables):
        obs.add("density", "d_g", L.y("F_g_0"))
        obs.add("velocity", "t_g", "theta_g")
        # the Thomson-scattering quadrupole source F_2 + G_0 + G_2 (CMB polarisation source)
        obs.add("optional", "Pi_g", "Pi_g")
