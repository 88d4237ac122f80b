"""w0-wa dark energy in the parametrised post-Friedmann (PPF) closure, smooth through w = -1.

Why: the rest-frame fluid of :mod:`.dark_energy` divides by 1 + w (θ' has c_s² k² δ/(1+w), the
adiabatic c_a² has w'/(1+w)), so a w(a) that crosses or reaches -1 -- every DESI DR2 w0-wa best
fit -- has no perturbations there.  Fang, Hu & Lewis 2008 (arXiv:0808.3125) replace the dark
energy's δρ and θ by one variable Γ that is exact far above and far below a transition scale and
interpolates in between; CLASS (``use_ppf = yes``, its default) and CAMB (``ppf``) use it.  Here
it is written in the synchronous gauge and the units of models/eb.py (ρ~ = 8πGρ/3, so 4πGρ =
3ρ~/2, and every density carries a²).

Notation: T = every species but the dark energy; D_T = a²δρ~_T, Q_T = a²(ρ~+p~)_T θ_T,
B_T = a²(ρ~+p~)_T (background), θ_T = Q_T/B_T; A = a²ρ~_de, B = (1+w) A (negative when
phantom).  The 00 and 0i Einstein constraints give the synchronous-to-Newtonian shift
α = (h' + 6η')/(2k²); with the dark energy's comoving density written through Γ,
D_de + 3ℋQ_de/k² = -(2/3) k² Γ (Γ is the dark energy's share of the comoving Poisson equation):

    ℋα = η + 3/(2k²) (D_T + 3ℋ Q_T/k²) - Γ,
    S  = 3B/(2k²ℋ) (θ_T + k²α)                 (θ_T + k²α: the rest's Newtonian-gauge θ),
    X  = c_Γ² k²/ℋ²,   c_Γ = 0.4 c_s           (FHL's calibration; c_s² = ``cs2_de``),
    Γ' = ℋ [S/(1+X) - (1+X) Γ]                 (d/dτ; Γ → S on super-horizon scales,
                                                Γ → 0 well inside the transition scale),
    Q_de = B θ_T - (2/3) k²ℋ/(1+Y) (S - Γ'/ℋ - Γ),   Y = 9 B_T/(2k²),
    D_de = -(2/3) k² Γ - 3ℋ Q_de/k²,

and D_de, Q_de enter the Einstein sums like any species' terms.  Nothing divides by 1 + w, every
coefficient is smooth in (w0, wa), and every line is linear in the state (Γ, η and the other
species), as models/linear_jacobian.py requires.  At (w0, wa) = (-1, 0), B = 0: S = 0, Γ stays
zero and the model is ΛCDM exactly, with derivatives in w0 and wa that exist (unlike the fluid's).

Two choices, both as in CLASS: Γ starts at 0 (the dark energy is negligible in the radiation era,
and Γ relaxes to its attractor at rate ℋ(1+X)); there is no pressure perturbation to evolve
because the synchronous-gauge system here takes h' and η' from the constraints.  CLASS sets
Γ = Γ' = 0 once X > 1000 (a convenience for explicit integrators); the implicit solver here keeps
the equation, whose solution there is Γ ≈ S/X², a difference of order 1/X² in Γ.  No θ_de
observable: θ_de = Q_de/B is 0/0 where w crosses -1.

The emitter must come after every other species (models/eb.py puts the dark energy last): its
``moments`` reads the sums of the terms they have registered.
"""
from __future__ import annotations

from ..codegen import lit
from .base import Derivatives, Layout, Observables, Sources, Species
from .dark_energy import PARAMS, _density

#: c_Γ / c_s, Fang, Hu & Lewis 2008 (CLASS's c_gamma_over_c_fld, CAMB's c_Gamma_ppf)
C_GAMMA_OVER_C_S = 0.4


class DarkEnergyPPF(Species):
    """The PPF variable Γ of the w0-wa dark energy (module docstring for the equations)."""

    states = ("Gamma_de",)
    params = PARAMS

    def moments(self, e, L: Layout, src: Sources):
        P, G = L.p, L.y("Gamma_de")
        e.comment("w0-wa dark energy, PPF (Fang, Hu & Lewis 2008), models/species/dark_energy_ppf.py;"
                  " T = every other species")
        if not src.rho_plus_p:
            raise AssertionError("DarkEnergyPPF needs the other species' a^2 (rho~ + p~) "
                                 "(Sources.rho_plus_p): it must be emitted last")
        rpt = list(src.rpt)
        if src.rpt_radiation:   # rho + p = 4 rho / 3, as the metric sums them
            rpt.insert(0, f"1.3333333333333333 * ({' + '.join(src.rpt_radiation)})")
        e("w_de", f"{P('w0')} + {P('wa')} * (1.0 - a)")
        e("A_de", _density(L))
        e("B_de", "(1.0 + w_de) * A_de")
        e("dA_T", " + ".join(src.drho))
        e("rpt_T", " + ".join(rpt))
        e("B_T", " + ".join(src.rho_plus_p))
        e("theta_T", "rpt_T / B_T")
        e("X_de", f"{lit(C_GAMMA_OVER_C_S ** 2)} * {P('cs2_de')} * k2 * icH * icH")
        e("alpha_T", f"({L.y('eta')} + 1.5 * (dA_T + 3.0 * cH * rpt_T / k2) / k2 - {G}) * icH")
        e("S_de", "1.5 * B_de / k2 * icH * (theta_T + k2 * alpha_T)")
        e("Gp_de", f"cH * (S_de / (1.0 + X_de) - (1.0 + X_de) * {G})")
        e("rpt_de", f"B_de * theta_T - 0.6666666666666666 * k2 * cH / (1.0 + 4.5 * B_T / k2)"
                    f" * (S_de - (Gp_de + cH * {G}) * icH)")
        e("dA_de", f"-0.6666666666666666 * k2 * {G} - 3.0 * cH * rpt_de / k2")
        src.drho.append("dA_de")
        src.rpt.append("rpt_de")

    def equations(self, e, L: Layout, d: Derivatives):
        d.set("Gamma_de", "Gp_de")

    def observables(self, L: Layout, obs: Observables):
        obs.add("optional", "d_de", "dA_de / A_de")
        obs.add("optional", "Gamma_de", L.y("Gamma_de"))
