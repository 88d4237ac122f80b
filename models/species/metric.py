"""The metric: synchronous-gauge Einstein equations from the species' sums, and the potentials.

h' comes from the 00 constraint and eta' from the 0i equation (MB95 eq. 21a,b), so the only
metric state is eta.  The Newtonian potentials of the observables follow from
alpha = (h' + 6 eta') / (2 k^2) and the anisotropic stress (MB95 eq. 18); h itself is -2 delta_c,
exact in this gauge (delta_c' = -h'/2) with the initial conditions of models.initial_conditions.
"""
from __future__ import annotations

from ..codegen import Emitter
from .base import Derivatives, Layout, Observables, Sources, Species


class Metric(Species):
    states = ("eta",)

    def einstein(self, e: Emitter, L: Layout, src: Sources):
        """h' and eta' from the sums of every species' terms (``src``)."""
        rpt = list(src.rpt)
        if src.rpt_radiation:   # rho + p = 4 rho / 3
            rpt.insert(0, f"1.3333333333333333 * ({' + '.join(src.rpt_radiation)})")
        e.comment("Einstein equations (MB95 eq. 21a,b): k^2 eta - ℋh'/2 = -(3/2) a^2 drho~, "
                  "k^2 eta' = (3/2) a^2 (rho~+p~) theta")
        e("dA_tot", " + ".join(src.drho))
        e("rpt_tot", " + ".join(rpt))
        e("h_prime", f"2.0 * (k2 * {L.y('eta')} + 1.5 * dA_tot) * icH")
        e("eta_prime", "1.5 * rpt_tot / k2")

    def equations(self, e, L: Layout, d: Derivatives):
        d.set("eta", "eta_prime")

    def summed_observables(self, L: Layout, obs: Observables, src: Sources):
        """Totals over the clustering matter, and the metric (needs the sources' terms)."""
        Y, o = L.y, obs.lines
        shear = list(src.shear)
        if src.shear_radiation:   # (rho + p) sigma = (4/3) rho F_2 / 2
            shear.insert(0, f"0.6666666666666666 * ({' + '.join(src.shear_radiation)})")
        o("A_m", " + ".join(a for a, _, _ in src.matter))
        o("dA_m", " + ".join(da for _, da, _ in src.matter))
        o("shear_tot", " + ".join(shear))
        o("alpha", "(h_prime + 6.0 * eta_prime) / (2.0 * k2)")
        o("alpha_prime", f"-2.0 * cH * alpha + {Y('eta')} - 4.5 * shear_tot / k2")
        cb = [(a, da) for a, da, is_cb in src.matter if is_cb]
        obs.add("total", "d_m", "dA_m / A_m")
        obs.add("total", "d_cb", f"({' + '.join(da for _, da in cb)}) / "
                                 f"({' + '.join(a for a, _ in cb)})")
        obs.add("metric", "h_prime", "h_prime")
        obs.add("metric", "eta", Y("eta"))
        obs.add("metric", "eta_prime", "eta_prime")
        obs.add("metric", "h", f"-2.0 * {Y('delta_c')}")
        obs.add("metric", "phi", f"{Y('eta')} - cH * alpha")
        obs.add("metric", "psi", "cH * alpha + alpha_prime")
        # the synchronous-to-Newtonian time shift and its d/dtau (CMB line-of-sight sources)
        obs.add("metric", "alpha", "alpha")
        obs.add("metric", "alpha_prime", "alpha_prime")
