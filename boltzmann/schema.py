"""The configuration schema: every key of the ``cosmology``, ``output`` and ``precision`` blocks
with its type, default, allowed range, unit and meaning (docs/parameters.md is this, as a page).

One table per block, so that a new key is one line; ``boltzmann.params`` validates against them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Interval", "Key", "REQUIRED", "COSMOLOGY_TABLE", "OUTPUT_TABLE", "PRECISION_TABLE",
           "CL_SPECTRA"]


# ----------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class Interval:
    """Allowed interval for a number; ``open_lo``/``open_hi`` exclude the end points."""

    lo: float = -math.inf
    hi: float = math.inf
    open_lo: bool = False
    open_hi: bool = False

    def __contains__(self, x: float) -> bool:
        above = x > self.lo if self.open_lo else x >= self.lo
        below = x < self.hi if self.open_hi else x <= self.hi
        return bool(above and below)

    def __str__(self) -> str:
        left = "(" if self.open_lo or self.lo == -math.inf else "["
        right = ")" if self.open_hi or self.hi == math.inf else "]"
        return f"{left}{self.lo:g}, {self.hi:g}{right}"


REQUIRED = object()  # sentinel: key has no default


@dataclass(frozen=True)
class Key:
    """One entry of a parameter table: type, default, allowed range, unit and meaning."""

    kind: str  # "float", "int", "float_list", "float_or_list", "str", "str_list", "bool"
    default: Any
    allowed: Interval | None
    unit: str
    doc: str


# ----------------------------------------------------------------------------- tables
COSMOLOGY_TABLE: dict[str, Key] = {
    "h": Key("float", REQUIRED, Interval(0.2, 1.5, True, True), "-",
             "reduced Hubble constant, H0 = 100 h km/s/Mpc"),
    "omega_b": Key("float", REQUIRED, Interval(0.0, 1.0, True, False), "-",
                   "physical baryon density Omega_b h^2"),
    "omega_cdm": Key("float", REQUIRED, Interval(0.0, 2.0), "-",
                     "physical cold dark matter density Omega_cdm h^2"),
    "A_s": Key("float", None, Interval(0.0, 1e-7, True, False), "-",
               "primordial scalar amplitude at k_pivot (give exactly one of A_s, ln10^{10}A_s)"),
    "ln10^{10}A_s": Key("float", None, Interval(-5.0, 7.0), "-",
                        "ln(10^10 A_s) (alternative to A_s)"),
    "n_s": Key("float", REQUIRED, Interval(0.5, 1.5, True, True), "-", "scalar spectral index"),
    "k_pivot": Key("float", 0.05, Interval(0.0, 10.0, True, False), "1/Mpc",
                   "pivot wavenumber of the primordial spectrum"),
    "tau_reio": Key("float", REQUIRED, Interval(0.0, 0.5), "-",
                    "Thomson optical depth to reionisation (z_reio is solved for)"),
    "YHe": Key("float", 0.2454, Interval(0.0, 0.5, True, True), "-",
               "primordial helium mass fraction (a number; no BBN option)"),
    "T_cmb": Key("float", 2.7255, Interval(0.0, 100.0, True, False), "K",
                 "CMB temperature today"),
    "N_ur": Key("float", 3.044, Interval(0.0, 20.0), "-",
                "number of massless neutrino species, in units of 7/8 (4/11)^(4/3) rho_gamma"),
    "N_ncdm": Key("int", None, Interval(0, 10), "-",
                  "optional: number of massive species; must equal len(m_ncdm) if given"),
    "m_ncdm": Key("float_list", [], Interval(0.0, 100.0), "eV",
                  "masses of the non-cold relics (massive neutrinos), one per species"),
    "deg_ncdm": Key("float_list", None, Interval(0.0, 10.0, True, False), "-",
                    "degeneracy per species (1 = one neutrino + antineutrino); default 1 each"),
    "T_ncdm": Key("float_or_list", 0.71611, Interval(0.0, 2.0, True, False), "T_cmb",
                  "ncdm temperature today in units of T_cmb, one number or one per species"),
    "w0_fld": Key("float", None, Interval(-3.0, 0.0), "-",
                  "CPL dark-energy fluid w0; setting w0_fld or wa_fld replaces Lambda by the fluid"),
    "wa_fld": Key("float", None, Interval(-5.0, 5.0), "-",
                  "CPL dark-energy fluid wa, w(a) = w0 + wa (1 - a); needs w0 + wa <= 0, and "
                  "with use_ppf = false w(a) not crossing or reaching -1 for 0 < a <= 1"),
    "use_ppf": Key("bool", True, None, "-",
                   "fluid perturbations in the PPF closure (Fang, Hu & Lewis 2008; CLASS's "
                   "default), smooth through w = -1; false: the rest-frame fluid equations, "
                   "which need 1 + w of one sign. Only with w0_fld/wa_fld"),
    "cs2_fld": Key("float", 1.0, Interval(0.0, 1.0), "-",
                   "rest-frame sound speed^2 of the fluid (PPF: transition scale c_Gamma = "
                   "0.4 c_s). Only with w0_fld/wa_fld"),
}

OUTPUT_TABLE: dict[str, Key] = {
    "z": Key("float_or_list", [0.0], Interval(0.0, 1.0e4), "-",
             "redshift(s) at which P(k) and transfer functions are written"),
    "k_min": Key("float", 1.0e-4, Interval(0.0, math.inf, True, True), "h/Mpc",
                 "smallest wavenumber of the log-spaced k grid"),
    "k_max": Key("float", 10.0, Interval(0.0, 1.0e3, True, False), "h/Mpc",
                 "largest wavenumber of the log-spaced k grid"),
    "k_per_decade": Key("float", 20.0, Interval(1.0, 1.0e4), "1/decade",
                        "points per decade of the log-spaced k grid"),
    "k_file": Key("str", None, None, "path",
                  "file with one column of k in 1/Mpc (no h!); excludes k_min/k_max/k_per_decade; "
                  "relative paths are taken from the config file's folder"),
    "z_background": Key("float_list", [], Interval(0.0, 1.0e4), "-",
                        "redshift(s) of background.csv: H, D_A, D_M, growth rate f and sigma8 "
                        "(their P(k) is solved along, not written)"),
    "dir": Key("str", None, None, "path", "output directory; default out/<config name>"),
}

#: CMB angular power spectra (boltzmann.cmb, docs/cmb.md)
CL_SPECTRA = ("TT", "EE", "TE", "BB", "PP")
OUTPUT_TABLE.update({
    "cl": Key("str_list", [], None, "-",
              "CMB spectra to compute, any of TT, EE, TE, BB, PP (written to cl.csv; none if empty)"),
    "l_max": Key("int", 2500, Interval(30, 5000), "-", "largest multipole of the CMB spectra"),
    "lensing": Key("bool", False, None, "-",
                   "also compute the lensed TT, EE, TE, BB, written to cl_lensed.csv (needs PP in cl)"),
})

#: Precision settings. Adding a key = adding a line here (and a row in docs/parameters.md).
#: Defaults are measured choices: see docs/benchmarks.md and docs/perturbations.md.
PRECISION_TABLE: dict[str, Key] = {
    "rtol": Key("float", 1e-5, Interval(1e-12, 1e-1), "-",
                "relative tolerance of the perturbation ODE solver"),
    "atol": Key("float", 1e-10, Interval(0.0, 1e-2, True, False), "-",
                "absolute tolerance of the perturbation ODE solver"),
    "baryon_error_weight": Key("float", 0.03, Interval(0.0, 1.0), "-",
                               "weight of delta_b and theta_b in the solver's error norm of the "
                               "P(k) modes (0.03: 42% fewer steps at 10 h/Mpc than weight 1, "
                               "delta_m within 2e-5 of a converged solve; 0 moves P by 4e-4)"),
    "sensitivity_error_weight": Key("float", 0.01, Interval(0.0, 1.0), "-",
                                    "weight of the P(k) derivatives' sensitivities in the solver's "
                                    "error norm (controlled at rtol / weight; 0.01: 0.62x the "
                                    "steps of weight 0.1 at 10 h/Mpc, dlnP within 1.7e-4 of each "
                                    "parameter's scale as at 0.1; 0 leaves tau_reio's 5e-2 off)"),
    "k_solve_stride": Key("int", 1, Interval(1, 16), "-",
                          "above k_solve_dense_below solve only every k_solve_stride-th mode of "
                          "the P(k) grid (and the last); P_m, P_cb at the others from a "
                          "not-a-knot cubic spline of ln P in ln k through the solved modes, "
                          "transfer functions on the solved modes only; 1 solves every mode "
                          "(4 above 1 h/Mpc: P within 3.3e-5 of every mode solved and 36% "
                          "fewer steps for configs/lcdm.yaml, P within 6.2e-5 and sigma8 within "
                          "3e-8 over a prior box's corners; 2: 1.4e-5, 4.3e-5, 24% fewer)"),
    "k_solve_dense_below": Key("float", 1.0, Interval(0.01, 100.0), "h/Mpc",
                               "every mode of the P(k) grid below this wavenumber is solved "
                               "(k_solve_stride thins the modes above it)"),
    "l_max_g": Key("int", 20, Interval(4, 200), "-",
                   "photon temperature hierarchy truncation"),
    "l_max_pol_g": Key("int", 15, Interval(4, 200), "-",
                       "photon polarisation hierarchy truncation"),
    "l_max_ur": Key("int", 50, Interval(4, 200), "-",
                    "massless neutrino hierarchy truncation (sets the accuracy at k ~ 1/Mpc)"),
    "l_max_ncdm": Key("int", 24, Interval(4, 200), "-",
                      "massive neutrino hierarchy truncation per momentum node (12 leaves "
                      "P_cb 2.5e-3 high at 1 h/Mpc, 24 gives 5e-4)"),
    "n_q_ncdm": Key("int", 4, Interval(1, 40), "-",
                    "momentum nodes of the massive-neutrino hierarchy (5 changes P by < 1.5e-5 "
                    "and dlnP/dm_ncdm by 6e-4 of its scale, 3 moves P by 4e-4)"),
    "ur_fluid_k_tau": Key("float", 0.0, Interval(0.0, 1.0e4), "-",
                          "k tau at which a P(k) mode's massless-neutrino hierarchy gives way to "
                          "fluid equations (docs/perturbations.md); 0 keeps it to the end; 30 "
                          "moves P by <= 1.3e-4; keep l_max_ur >= this value"),
    "ncdm_fluid_k_tau": Key("float", 0.0, Interval(0.0, 1.0e4), "-",
                            "k tau at which a P(k) mode's massive-neutrino hierarchies give way "
                            "to one fluid per species (docs/perturbations.md); 0 keeps them to "
                            "the end; about 2e-3 in P_m for 0.2 eV of neutrinos"),
    "omega_tau_ini": Key("float", 1e-3, Interval(1e-6, 0.1), "-",
                         "start every mode no later than omega tau = omega_tau_ini, omega = "
                         "rho_m0/sqrt(rho_r0) (deep in radiation domination)"),
    "k_tau_ini": Key("float", 1e-2, Interval(1e-6, 1.0), "-",
                     "start each mode no later than k tau = k_tau_ini (super-horizon)"),
    "bg_a_min": Key("float", 1e-10, Interval(1e-16, 1e-4), "-",
                    "lower end of the background/thermodynamics ln(a) tables"),
    "bg_n_lna": Key("int", 4000, Interval(50, 10**6), "-",
                    "number of nodes of the background ln(a) table"),
    "thermo_ode_step": Key("float", 0.0116, Interval(1e-4, 0.05), "-",
                           "largest ln a step of the recombination equations below z = 3000, "
                           "as whole table cells (at least one), the nodes between "
                           "Hermite-interpolated (0.0116: two cells of the default grid, the "
                           "tables in 0.6 of the time, C_l within 5e-5 and P within 2e-5 of "
                           "one cell; three cells move C_l by 1.8e-4)"),
}
