"""Physical constants and unit conversions, as plain floats in the units the code uses.

Every number here is derived from ``astropy.constants`` / ``astropy.units`` (CODATA 2018 and the
IAU 2015 resolutions in astropy >= 4), so there is one source of truth and no hand-typed digits.

Unit system of the package
--------------------------
- lengths and conformal time: Mpc;  wavenumbers and rates (H, aH, kappa'): 1/Mpc
  (c = 1, so a rate in 1/Mpc is a rate per light-Mpc of time);
- temperatures: K;  particle masses and energies: eV;
- densities: CLASS's convention ``rho_tilde_X = 8 pi G rho_X / (3 c^2)`` expressed in 1/Mpc^2,
  so that the Friedmann equation reads ``H^2 = sum_X rho_tilde_X`` with H in 1/Mpc
  (Lesgourgues 2011, arXiv:1104.2932, the CLASS background module; the same convention labels the
  ``(.)rho_X`` columns of tests/data/class_lcdm_background.csv).

Note: CLASS hard-codes G = 6.67428e-11 (CODATA 2006) while astropy has 6.67430e-11; the 3e-6
relative difference in rho_tilde shifts H by ~1.5e-6, far below our 1e-5 agreement target.
"""
from __future__ import annotations

import math

from astropy import constants as _c
from astropy import units as _u

# --------------------------------------------------------------------------- SI base values
#: speed of light [m/s]
C_SI: float = float(_c.c.to_value(_u.m / _u.s))
#: Newton's constant [m^3 kg^-1 s^-2]
G_SI: float = float(_c.G.to_value(_u.m**3 / _u.kg / _u.s**2))
#: Boltzmann constant [J/K]
K_B_SI: float = float(_c.k_B.to_value(_u.J / _u.K))
#: reduced Planck constant [J s]
HBAR_SI: float = float(_c.hbar.to_value(_u.J * _u.s))
#: Stefan–Boltzmann constant [W m^-2 K^-4]
SIGMA_SB_SI: float = float(_c.sigma_sb.to_value(_u.W / _u.m**2 / _u.K**4))
#: Thomson cross-section [m^2]
SIGMA_T_SI: float = float(_c.sigma_T.to_value(_u.m**2))
#: electron mass [kg]
M_E_SI: float = float(_c.m_e.to_value(_u.kg))
#: proton mass [kg]
M_P_SI: float = float(_c.m_p.to_value(_u.kg))
#: hydrogen-1 atom mass [kg]: 1.00782503207 u (CODATA atomic mass of 1H). Note RECFAST and CLASS
#: hard-code m_H = 1.673575e-27 kg, 2.5e-5 larger; the thermodynamics module may choose either.
M_H_SI: float = float((1.00782503207 * _u.u).to_value(_u.kg))
#: elementary charge [C] (for eV <-> J)
EV_SI: float = float((1.0 * _u.eV).to_value(_u.J))

# --------------------------------------------------------------------------- lengths and times
#: one megaparsec [m]
MPC_M: float = float((1.0 * _u.Mpc).to_value(_u.m))
#: one gigayear (Julian years, 365.25 d) [s]
GYR_S: float = float((1.0 * _u.Gyr).to_value(_u.s))
#: light-travel distance in one Gyr [Mpc]: converts a proper time in Mpc (c = 1) to Gyr by division
GYR_MPC: float = C_SI * GYR_S / MPC_M
#: H0 for h = 1, i.e. 100 km/s/Mpc divided by c, in 1/Mpc  (= 1 / 2997.92458 Mpc)
H100_INV_MPC: float = 100.0e3 / C_SI

# --------------------------------------------------------------------------- temperatures/energies
#: k_B in eV/K: converts a temperature in K to an energy in eV
K_B_EV_PER_K: float = K_B_SI / EV_SI

# --------------------------------------------------------------------------- density conversions
#: Multiply a *mass* density in kg/m^3 by this to get rho_tilde = 8 pi G rho / 3 in 1/Mpc^2
#: (H^2/c^2 in 1/m^2, times Mpc^2).
RHO_TILDE_PER_KG_M3: float = 8.0 * math.pi * G_SI / 3.0 * (MPC_M / C_SI) ** 2
#: Multiply an *energy* density in J/m^3 by this to get rho_tilde in 1/Mpc^2.
RHO_TILDE_PER_J_M3: float = RHO_TILDE_PER_KG_M3 / C_SI**2
#: rho_tilde of a critical universe with h = 1, i.e. H100^2 in 1/Mpc^2: omega_X = rho_tilde_X0 / this
RHO_TILDE_CRIT_H2: float = H100_INV_MPC**2

#: Photon energy density at T = 1 K as rho_tilde [1/Mpc^2]: a_rad T^4 with a_rad = 4 sigma_SB / c.
RHO_TILDE_GAMMA_PER_K4: float = 4.0 * SIGMA_SB_SI / C_SI * RHO_TILDE_PER_J_M3

#: Fermi–Dirac prefactor: a species with g_eff internal states (g_eff = 2 for one neutrino + its
#: antineutrino, i.e. CLASS's ``deg_ncdm = 1``) at temperature T has energy density
#: ``g_eff (k_B T)^4 / (2 pi^2 (hbar c)^3) * I`` with the dimensionless integral
#: ``I = int q^2 eps(q) f0(q) dq``.  This constant is ``2 (k_B T)^4 / (2 pi^2 (hbar c)^3)`` at
#: T = 1 K converted to rho_tilde [1/Mpc^2] (the leading 2 is the deg_ncdm = 1 convention).
RHO_TILDE_FD_PER_K4: float = (
    2.0 * K_B_SI**4 / (2.0 * math.pi**2 * (HBAR_SI * C_SI) ** 3) * RHO_TILDE_PER_J_M3
)

#: Massless-neutrino temperature ratio in instantaneous decoupling, T_nu / T_gamma = (4/11)^(1/3).
T_NU_OVER_T_GAMMA: float = (4.0 / 11.0) ** (1.0 / 3.0)
#: rho_ur per effective species / rho_gamma = 7/8 (4/11)^(4/3).
RHO_UR_PER_NEFF_OVER_RHO_G: float = 7.0 / 8.0 * (4.0 / 11.0) ** (4.0 / 3.0)

#: Thomson cross-section [Mpc^2], for the opacity kappa' = a n_e sigma_T in 1/Mpc.
SIGMA_T_MPC2: float = SIGMA_T_SI / MPC_M**2
#: electron mass energy [eV]
M_E_EV: float = float((_c.m_e * _c.c**2).to_value(_u.eV))

__all__ = [name for name in dir() if name.isupper()]
