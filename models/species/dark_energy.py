"""The w0-wa dark-energy fluid (CLASS's fluid equations), or its form linearised about Λ.

:class:`DarkEnergyFluid`: w = w0 + wa (1 - a), rho~ ∝ a^(-3(1+w0+wa)) exp(3 wa (a - 1)), rest-frame
sound speed cs2_de, adiabatic c_a^2 = w - w'/(3(1+w)ℋ); singular where 1 + w = 0.
:class:`DarkEnergyAtLambda`: the regular variables delta/(1+w), theta of two directions in the
(w0, wa) plane, for derivatives at w0 = -1, wa = 0 (equations and reasoning in
models.eb.build_eb_model's docstring, ``de_at_lambda``).
"""
from __future__ import annotations

from .base import Derivatives, Layout, Observables, Sources, Species

PARAMS = ("rho_de0", "w0", "wa", "cs2_de")


def _density(L: Layout) -> str:
    return (f"{L.p('rho_de0')} * M.exp(-(1.0 + 3.0 * ({L.p('w0')} + {L.p('wa')})) * x"
            f" + 3.0 * {L.p('wa')} * (a - 1.0))")


class DarkEnergyFluid(Species):
    states = ("delta_de", "theta_de")
    params = PARAMS

    def moments(self, e, L: Layout, src: Sources):
        P = L.p
        e.comment("w0-wa fluid: rho ~ a^(-3(1+w0+wa)) exp(3 wa (a-1)), c_a^2 = w - w'/(3(1+w)ℋ)")
        e("w_de", f"{P('w0')} + {P('wa')} * (1.0 - a)")
        e("opw_de", "1.0 + w_de")
        e("A_de", _density(L))
        e("ca2_de", f"w_de + {P('wa')} * a / (3.0 * opw_de)")
        e("cs2_de", P("cs2_de"))
        src.drho.append(f"A_de * {L.y('delta_de')}")
        src.rpt.append(f"opw_de * A_de * {L.y('theta_de')}")

    def equations(self, e, L: Layout, d: Derivatives):
        dd, td = L.y("delta_de"), L.y("theta_de")
        d.set("delta_de", f"-opw_de * ({td} + 0.5 * h_prime) - 3.0 * (cs2_de - w_de) * cH * {dd}"
                          f" - 9.0 * opw_de * (cs2_de - ca2_de) * cH * cH * {td} / k2")
        d.set("theta_de", f"-(1.0 - 3.0 * cs2_de) * cH * {td} + cs2_de * k2 / opw_de * {dd}")

    def observables(self, L: Layout, obs: Observables):
        obs.add("optional", "d_de", L.y("delta_de"))
        obs.add("optional", "t_de", L.y("theta_de"))


class DarkEnergyAtLambda(Species):
    """Directions A = (1, 0) and B = (1, 1) of (w0, wa): 1 + w ∝ g_u(a), g_A = 1, g_B = 2 - a.

    No observables of its own: its states are per-direction regular variables, not the
    fluid's delta and theta (those are (1 + w) times them, zero at Λ).
    """

    states = ("delta_de_A", "theta_de_A", "delta_de_B", "theta_de_B")
    params = PARAMS
    #: c_u = g_u'/g_u per direction (None: zero); cB_de is emitted in ``moments``
    DIRECTIONS = (("A", None), ("B", "cB_de"))

    def moments(self, e, L: Layout, src: Sources):
        P, Y = L.p, L.y
        e.comment("w0-wa fluid linearised at Λ: directions A = (1,0), B = (1,1) (build_eb_model)")
        e("w_de", f"{P('w0')} + {P('wa')} * (1.0 - a)")
        e("A_de", _density(L))
        e("cs2_de", P("cs2_de"))
        e("wA_de", f"1.0 + {P('w0')} - {P('wa')}")
        e("wB_de", f"{P('wa')} * (2.0 - a)")
        e("cB_de", "-a * cH / (2.0 - a)")
        src.drho.append(f"A_de * (wA_de * {Y('delta_de_A')} + wB_de * {Y('delta_de_B')})")
        src.rpt.append(f"A_de * (wA_de * {Y('theta_de_A')} + wB_de * {Y('theta_de_B')})")

    def equations(self, e, L: Layout, d: Derivatives):
        for u, c in self.DIRECTIONS:
            dd, td = L.y(f"delta_de_{u}"), L.y(f"theta_de_{u}")
            extra_t = f" + {c} / (3.0 * cH)" if c else ""
            extra_d = f" - {c} * {dd}" if c else ""
            d.set(f"delta_de_{u}", f"-({td} + 0.5 * h_prime) - 3.0 * (cs2_de - w_de) * cH * {dd}"
                                   f" - 9.0 * cH * cH / k2 * ((cs2_de - w_de){extra_t}) * {td}"
                                   f"{extra_d}")
            d.set(f"theta_de_{u}", f"-(1.0 - 3.0 * cs2_de) * cH * {td} + cs2_de * k2 * {dd}")
