"""Hydrogen and helium recombination: RECFAST-class rate equations, in JAX.

What is modelled (all rates in SI inside, derivatives returned per ln a):

- Hydrogen: the effective three-level atom of Peebles (1968) in the RECFAST form of Seager,
  Sasselov & Scott (1999, ApJ 523 L1; 2000, ApJS 128 407): Case-B recombination coefficient
  from the Pequignot, Petitjean & Boisson (1991) fit times the fudge factor F_H, photoionisation
  from n = 2 by detailed balance, the Peebles escape factor C_H with the Lyman-alpha Sobolev
  factor K_H = lambda_Lya^3 / (8 pi H) and the 2s->1s two-photon rate.  By default RECFAST 1.5.2's
  double-Gaussian correction of K_H in ln(1+z) (Rubino-Martin, Chluba, Fendt & Wandelt 2010,
  MNRAS 403 439) with the fudge factor it was calibrated with, F_H = 1.14 - 0.015 = 1.125 (the
  pairing of RECFAST 1.5.2 as shipped in CAMB and CLASS: Hswitch on => F_H = 1.125); F_H = 1.14 is
  the RECFAST 1.4 value (Wong, Moss & Scott 2008, MNRAS 386 1023) for the uncorrected equations.
- Helium I: the singlet three-level atom (SSS 2000) with the Hummer & Storey (1998) recombination
  fit, plus the RECFAST 1.5 refinements: Sobolev escape probability of the 2^1P - 1^1S line
  (Switzer & Hirata 2008, PRD 77 083006/7/8), continuum opacity of neutral hydrogen in that line
  with Kholupenko, Ivanchik & Varshalovich (2007, MNRAS 378 L39) fitting parameters (b_He = 0.86
  fudge of Wong, Moss & Scott 2008), and the 2^3P - 1^1S intercombination (triplet) channel.
- Helium II -> III: Saha equilibrium (it ends at z ~ 5000, long before it matters for the CMB).
- Baryon temperature: Compton coupling to the CMB plus adiabatic cooling
  (dT_b/dt = -2 H T_b + (8 sigma_T a_R T_g^4 / 3 m_e c) x_e/(1+f_He+x_e) (T_g - T_b)).

State vector ``y = (x_H, x_He, theta)``:
    x_H   = n(H+) / n_H,
    x_He  = (n(He+) + n(He++)) / n_He   (the fraction of helium that lost at least one electron),
    theta = T_b / T_gamma               (order one; 1 while Compton coupling is tight).
Free-electron fraction per hydrogen nucleus: x_e = x_H + f_He x_He + f_He x_He3 with x_He3 the
Saha He++ fraction, f_He = n_He/n_H = Y / (not4 (1-Y)).

Atomic data (level wavenumbers, Einstein coefficients, cross-sections, the He/H mass ratio
``not4``) are those tabulated in RECFAST 1.5 (sources named beside each value).  Fundamental
constants come from astropy (CODATA 2018).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from astropy import constants as _c
from astropy import units as _u

from .small_linalg import lu_factor_small, lu_solve_small, solve_small

# --------------------------------------------------------------------------- fundamental (astropy)
C_SI = float(_c.c.to_value(_u.m / _u.s))
H_PLANCK_SI = float(_c.h.to_value(_u.J * _u.s))
K_B_SI = float(_c.k_B.to_value(_u.J / _u.K))
M_E_SI = float(_c.m_e.to_value(_u.kg))
SIGMA_T_SI = float(_c.sigma_T.to_value(_u.m**2))
G_SI = float(_c.G.to_value(_u.m**3 / _u.kg / _u.s**2))
#: radiation constant a_R = 4 sigma_SB / c  [J m^-3 K^-4]
A_RAD_SI = 4.0 * float(_c.sigma_sb.to_value(_u.W / _u.m**2 / _u.K**4)) / C_SI
MPC_M = float((1.0 * _u.Mpc).to_value(_u.m))
#: mass of the 1H atom: 1.00782503207 u (CODATA atomic mass of 1H)
M_H_SI = float((1.00782503207 * _u.u).to_value(_u.kg))
#: 100 km/s/Mpc in 1/s
H100_SI = 1.0e5 / MPC_M

# --------------------------------------------------------------------------- atomic data (RECFAST 1.5)
#: He/H atomic mass ratio used by RECFAST and CLASS to define f_He (Steigman's "not4")
NOT4 = 3.9715
#: H 2s -> 1s two-photon decay rate [1/s] (Goldman 1989, as in RECFAST)
LAMBDA_2S1S_H = 8.2245809
#: He I 2^1S -> 1^1S two-photon decay rate [1/s] (Dalgarno, as in RECFAST)
LAMBDA_2S1S_HE = 51.3
#: wavenumbers [1/m]: H ionisation and Lyman-alpha (2s/2p average)
L_H_ION = 1.096787737e7
L_H_ALPHA = 8.225916453e6
#: He I ionisation, 2^1S and 2^1P levels (Drake 1993)
L_HE1_ION = 1.98310772e7
L_HE_2S = 1.66277434e7
L_HE_2P = 1.71134891e7
#: He II ionisation (J. Phys. Chem. Ref. Data 1987)
L_HE2_ION = 4.389088863e7
#: He I 2^3P, 2^3S levels and 2^3S ionisation (Drake & Morton 2007)
L_HE_2PT = 1.690871466e7
L_HE_2ST = 1.5985597526e7
L_HE_2ST_ION = 3.8454693845e6
#: Einstein A of 2^1P-1^1S (Morton, Wu & Drake 2006) and 2^3P-1^1S (Lach & Pachucki 2001) [1/s]
A2P_SINGLET = 1.798287e9
A2P_TRIPLET = 177.58
#: H photoionisation cross-sections at the He 2^1P / 2^3P line energies [m^2] (Hummer & Storey 1998)
SIGMA_HE_2PS = 1.436289e-22
SIGMA_HE_2PT = 1.484872e-22
#: Pequignot, Petitjean & Boisson (1991) Case-B fit alpha = 1e-19 a t^b / (1 + c t^d) m^3/s, t = T/1e4 K
PPB_A, PPB_B, PPB_C, PPB_D = 4.309, -0.6166, 0.6703, 0.5300
#: Hummer & Storey (1998) He I fits alpha = q / [sqrt(T/T2) (1+sqrt(T/T2))^(1-p) (1+sqrt(T/T1))^(1+p)]
HS_SINGLET = dict(q=10.0**-16.744, p=0.711, t1=10.0**5.114, t2=3.0)
HS_TRIPLET = dict(q=10.0**-16.306, p=0.761, t1=10.0**5.114, t2=3.0)
#: RECFAST 1.5 double-Gaussian K_H correction: amplitudes, centres in ln(1+z), widths
GAUSS_AMP = (-0.14, 0.079)
GAUSS_CENTRE = (7.28, 6.73)
GAUSS_WIDTH = (0.18, 0.33)
#: Kholupenko et al. (2007) H-continuum-opacity fit parameters: singlet (p, q=b_He), triplet (p, q)
KIV_SINGLET = (0.36, 0.86)
KIV_TRIPLET = (0.66, 0.9)

# derived energies as temperatures [K]
_HC_OVER_K = H_PLANCK_SI * C_SI / K_B_SI
T_H_2S_ION = _HC_OVER_K * (L_H_ION - L_H_ALPHA)      # ionisation from n = 2
T_H_ALPHA = _HC_OVER_K * L_H_ALPHA                   # n = 2 excitation
T_HE_2S_ION = _HC_OVER_K * (L_HE1_ION - L_HE_2S)
T_HE_2S = _HC_OVER_K * L_HE_2S
T_HE_PS = _HC_OVER_K * (L_HE_2P - L_HE_2S)
T_HE_2ST_ION = _HC_OVER_K * L_HE_2ST_ION
T_HE_2ST = _HC_OVER_K * L_HE_2ST
T_HE_PST = _HC_OVER_K * (L_HE_2PT - L_HE_2ST)
T_HE2_ION = _HC_OVER_K * L_HE2_ION
#: (2 pi m_e k_B / h^2)  [1/(m^2 K)], so that (SAHA_CR T)^{3/2} is the electron quantum concentration
SAHA_CR = 2.0 * math.pi * M_E_SI * K_B_SI / H_PLANCK_SI**2
#: Compton coupling rate prefactor 8 sigma_T a_R / (3 m_e c)  [1/(s K^4)]
COMPTON_RATE = 8.0 * SIGMA_T_SI * A_RAD_SI / (3.0 * M_E_SI * C_SI)
#: converts H in 1/Mpc (c = 1) to 1/s
INV_MPC_TO_INV_S = C_SI / MPC_M


@dataclass(frozen=True)
class RecombinationSettings:
    """Static switches of the recombination physics (hashable: used as a jit static argument).

    fudge_H: F_H multiplying the Case-B rate; None (default) = RECFAST's pairing with
        ``gaussian_correction``: 1.125 with the double-Gaussian K_H correction (RECFAST 1.5.2,
        Rubino-Martin et al. 2010), 1.14 without it (RECFAST 1.4, Wong, Moss & Scott 2008).
        Mixing 1.14 with the Gaussians recombines ~1.3% too fast in the freeze-out tail
        (x_e 1.46% below HyRec at z = 200, against 0.2% with the pairing; docs/thermodynamics.md).
        The resolved value is :attr:`fudge_H_value`.
    gaussian_correction: apply the RECFAST 1.5.2 double-Gaussian factor to K_H.
    helium_sobolev / helium_continuum_opacity / helium_triplet: the RECFAST 1.5 He I refinements
        (Heflag = 6 in RECFAST 1.5 is all three on).
    photoionisation_at_radiation_temperature: evaluate the photoionisation rates beta at T_gamma
        (detailed balance with the radiation field, as HyRec does) instead of at T_b (RECFAST).
    """

    fudge_H: float | None = None
    gaussian_correction: bool = True
    helium_sobolev: bool = True
    helium_continuum_opacity: bool = True
    helium_triplet: bool = True
    photoionisation_at_radiation_temperature: bool = True

    #: RECFAST 1.4 fudge factor (no K_H correction) and RECFAST 1.5.2's change with the correction on
    FUDGE_H_RECFAST14 = 1.14
    DELTA_FUDGE_H_GAUSSIAN = -0.015

    @property
    def fudge_H_value(self) -> float:
        """F_H actually used: ``fudge_H`` if given, else RECFAST's pairing with ``gaussian_correction``."""
        if self.fudge_H is not None:
            return float(self.fudge_H)
        return self.FUDGE_H_RECFAST14 + (self.DELTA_FUDGE_H_GAUSSIAN if self.gaussian_correction else 0.0)

    def __post_init__(self):
        if self.fudge_H is not None and not (1.0 <= self.fudge_H <= 1.3):
            raise ValueError(f"fudge_H={self.fudge_H}: expected a RECFAST-like value in [1, 1.3]")
        if self.helium_continuum_opacity and not self.helium_sobolev:
            raise ValueError("helium_continuum_opacity=True needs helium_sobolev=True (RECFAST Heflag >= 2)")


class RecombinationParams(NamedTuple):
    """Cosmology-dependent numbers the rate equations need (a pytree of JAX scalars)."""

    n_H0: jnp.ndarray      # hydrogen number density today [1/m^3]
    f_He: jnp.ndarray      # n_He / n_H
    T_cmb: jnp.ndarray     # CMB temperature today [K]
    Y_He: jnp.ndarray      # helium mass fraction


def helium_fraction(Y_He):
    """n_He/n_H = Y / (not4 (1 - Y)) with RECFAST's He/H mass ratio not4 = 3.9715."""
    return Y_He / (NOT4 * (1.0 - Y_He))


def hydrogen_density_today(omega_b, Y_He):
    """n_H today [1/m^3]: (1 - Y) rho_b / m_H, rho_b = omega_b * 3 (100 km/s/Mpc)^2 / (8 pi G)."""
    rho_b = omega_b * 3.0 * H100_SI**2 / (8.0 * math.pi * G_SI)
    return (1.0 - Y_He) * rho_b / M_H_SI


def make_params(omega_b, Y_He, T_cmb) -> RecombinationParams:
    """Build :class:`RecombinationParams` from omega_b = Omega_b h^2, the He mass fraction, T_cmb [K]."""
    omega_b = jnp.asarray(omega_b, dtype=jnp.float64)
    Y_He = jnp.asarray(Y_He, dtype=jnp.float64)
    T_cmb = jnp.asarray(T_cmb, dtype=jnp.float64)
    return RecombinationParams(hydrogen_density_today(omega_b, Y_He), helium_fraction(Y_He), T_cmb, Y_He)


# --------------------------------------------------------------------------- rate coefficients
def alpha_H_caseB(T):
    """Case-B H recombination coefficient [m^3/s], Pequignot et al. (1991) fit (no fudge)."""
    t = T / 1.0e4
    return 1.0e-19 * PPB_A * t**PPB_B / (1.0 + PPB_C * t**PPB_D)


def _hummer_storey(T, q, p, t1, t2):
    s2 = jnp.sqrt(T / t2)
    s1 = jnp.sqrt(T / t1)
    return q / (s2 * (1.0 + s2) ** (1.0 - p) * (1.0 + s1) ** (1.0 + p))


def alpha_HeI_singlet(T):
    """He I singlet recombination coefficient [m^3/s] (Hummer & Storey 1998 fit, as RECFAST)."""
    return _hummer_storey(T, **HS_SINGLET)


def alpha_HeI_triplet(T):
    """He I triplet recombination coefficient [m^3/s] (Hummer & Storey 1998 fit, as RECFAST 1.5)."""
    return _hummer_storey(T, **HS_TRIPLET)


def _sobolev_escape(tau):
    """p = (1 - e^-tau) / tau, safe at small tau."""
    tau = jnp.maximum(tau, 1e-30)
    return -jnp.expm1(-tau) / tau


def helium_III_fraction(x_rest, F, s):
    """Saha He++ abundance per H nucleus.

    x_rest: electrons per H from H+ and the first He ionisation; F = f_He x_He (He that lost one
    electron or more, per H); s = S_2(T)/n_H the Saha ratio n_e n_He++ / n_He+ per n_H.  Solves
    X3 (x_rest + X3) = s (F - X3) in the cancellation-free form.
    """
    b = x_rest + s
    return 2.0 * s * F / (b + jnp.sqrt(b * b + 4.0 * s * F))


def free_electron_fraction(lna, y, p: RecombinationParams):
    """x_e = n_e/n_H from the state (including Saha He++), and the He++ part separately."""
    x_H, x_He = y[0], y[1]
    a = jnp.exp(lna)
    T_g = p.T_cmb / a
    n_H = p.n_H0 / a**3
    s = (SAHA_CR * T_g) ** 1.5 * jnp.exp(-T_HE2_ION / T_g) / n_H
    x_rest = x_H + p.f_He * x_He
    x3 = helium_III_fraction(x_rest, p.f_He * x_He, s)
    return x_rest + x3, x3


def compton_rate_per_lna(lna, x_e, p: RecombinationParams, H_si):
    """Compton coupling rate of the baryon temperature per ln a (dimensionless),
    (8 sigma_T a_R T_g^4 / 3 m_e c) x_e / (1 + f_He + x_e) / H, with H_si in 1/s."""
    T_g = p.T_cmb / jnp.exp(lna)
    return COMPTON_RATE * T_g**4 * x_e / (1.0 + p.f_He + x_e) / H_si


def temperature_ratio_rhs(theta, compton_per_lna):
    """d theta / d ln a for theta = T_b/T_gamma: -theta (adiabatic a^-2 against T_gamma's a^-1)
    plus the Compton relaxation towards 1."""
    return -theta + compton_per_lna * (1.0 - theta)


def iterate(step: Callable, x, count: int, unrolled: bool):
    """``step`` applied ``count`` times to ``x``: written out (``unrolled``) or as one
    ``lax.fori_loop`` -- the same arithmetic. Written out, an iteration adds no loop of its own (on
    a GPU every iteration of an XLA while loop is a round trip to the host for its predicate);
    rolled, its body is traced once, which is what a program's size and compile time follow:
    under the Jacobian's ten tangents the fixed-count iterations of the thermodynamics (the Saha
    start, the z_rec / z_star / z_drag Newton solves) written out were about a sixth of the
    inputs program's operations (docs/benchmarks.md)."""
    if unrolled:
        for _ in range(count):
            x = step(x)
        return x
    return jax.lax.fori_loop(0, count, lambda _, v: step(v), x)


def saha_state(lna, p: RecombinationParams, iterations: int = 4, unrolled: bool = True):
    """Saha-equilibrium state (x_H, x_He, theta = 1) at T_b = T_gamma: the initial condition.

    Uses n_e n_H+ / n_H0 = (2 pi m_e k T / h^2)^{3/2} e^{-chi_H/kT} and the He I analogue with the
    statistical-weight factor 4, iterated a few times on the shared electron density
    (``iterate``: ``unrolled`` or in a loop).
    """
    a = jnp.exp(lna)
    T = p.T_cmb / a
    n_H = p.n_H0 / a**3
    q = (SAHA_CR * T) ** 1.5 / n_H
    s_H = q * jnp.exp(-_HC_OVER_K * L_H_ION / T)
    s_He = 4.0 * q * jnp.exp(-_HC_OVER_K * L_HE1_ION / T)

    def fractions(x_e):
        return s_H / (x_e + s_H), s_He / (x_e + s_He)

    def step(x_e):
        x_H, x_He = fractions(x_e)
        return free_electron_fraction(lna, jnp.stack([x_H, x_He, jnp.ones_like(x_H)]), p)[0]

    x_e0 = jnp.broadcast_to(1.0 + 2.0 * p.f_He, jnp.shape(s_H)).astype(s_H.dtype)
    x_H, x_He = fractions(iterate(step, x_e0, iterations - 1, unrolled))
    return jnp.stack([x_H, x_He, jnp.ones_like(x_H)])



def _helium_escape(a2p, wavelength, sigma, kiv, n1s_He, H, T_b, p, x_He, one_minus_xH, settings):
    """(Sobolev escape rate A_2p P_esc, continuum-opacity addition or None) of one He I 2p line
    (singlet or triplet): the line's optical depth sets P_esc, and with
    ``settings.helium_continuum_opacity`` hydrogen photo-ionisation by the line's photons adds a
    fitted escape channel (Kholupenko, Ivanchik & Varshalovich 2007)."""
    tau = a2p * 3.0 * n1s_He / (wavelength**3 * 8.0 * math.pi * H)
    esc = a2p * _sobolev_escape(tau)
    if not settings.helium_continuum_opacity:
        return esc, None
    nu = C_SI * wavelength
    doppler = nu * jnp.sqrt(2.0 * K_B_SI * T_b / (M_H_SI * NOT4 * C_SI**2))
    gamma = (3.0 * a2p * p.f_He * (1.0 - x_He) * C_SI**2
             / (math.sqrt(math.pi) * sigma * 8.0 * math.pi * doppler * one_minus_xH * nu**2))
    pb, qb = kiv
    return esc, a2p / (1.0 + pb * jnp.maximum(gamma, 1e-300) ** qb)

def recombination_rhs(
    lna,
    y,
    p: RecombinationParams,
    hubble_of_a: Callable,
    settings: RecombinationSettings = RecombinationSettings(),
    electron_fraction_for_compton: Callable | None = None,
):
    """d y / d ln a for y = (x_H, x_He, theta = T_b/T_gamma).

    hubble_of_a(a) must return H in 1/Mpc.  ``electron_fraction_for_compton(lna, x_e_rec)``, if
    given, replaces the recombination x_e in the Compton-coupling term (used to feed the
    reionised x_e into the baryon temperature).
    """
    x_H, x_He, theta = y[0], y[1], y[2]
    a = jnp.exp(lna)
    z = 1.0 / a - 1.0
    H = hubble_of_a(a) * INV_MPC_TO_INV_S  # 1/s
    T_g = p.T_cmb / a
    T_b = theta * T_g
    T_ph = T_g if settings.photoionisation_at_radiation_temperature else T_b
    n_H = p.n_H0 / a**3
    n_He = p.f_He * n_H
    x_e, x3 = free_electron_fraction(lna, y, p)
    x_HeII = x_He - x3 / p.f_He  # singly ionised fraction of helium

    # ---- hydrogen (Peebles / RECFAST)
    alpha_H = settings.fudge_H_value * alpha_H_caseB(T_b)
    alpha_H_ph = settings.fudge_H_value * alpha_H_caseB(T_ph)
    beta_H = alpha_H_ph * (SAHA_CR * T_ph) ** 1.5 * jnp.exp(-T_H_2S_ION / T_ph)
    K_H = 1.0 / (L_H_ALPHA**3 * 8.0 * math.pi * H)
    if settings.gaussian_correction:
        lnz1 = jnp.log1p(z)
        corr = 1.0
        for amp, cen, wid in zip(GAUSS_AMP, GAUSS_CENTRE, GAUSS_WIDTH):
            corr = corr + amp * jnp.exp(-(((lnz1 - cen) / wid) ** 2))
        K_H = K_H * corr
    n1s_H = n_H * (1.0 - x_H)
    C_H = (1.0 + K_H * LAMBDA_2S1S_H * n1s_H) / (1.0 + K_H * (LAMBDA_2S1S_H + beta_H) * n1s_H)
    dxH_dt = -(x_e * x_H * n_H * alpha_H - beta_H * (1.0 - x_H) * jnp.exp(-T_H_ALPHA / T_ph)) * C_H

    # ---- helium I singlets
    alpha_He = alpha_HeI_singlet(T_b)
    beta_He = 4.0 * alpha_HeI_singlet(T_ph) * (SAHA_CR * T_ph) ** 1.5 * jnp.exp(-T_HE_2S_ION / T_ph)
    n1s_He = n_He * (1.0 - x_He)
    one_minus_xH = jnp.maximum(1.0 - x_H, 1e-30)
    if settings.helium_sobolev:
        esc, continuum = _helium_escape(A2P_SINGLET, L_HE_2P, SIGMA_HE_2PS, KIV_SINGLET, n1s_He,
                                        H, T_b, p, x_He, one_minus_xH, settings)
        if continuum is not None:
            esc = esc + continuum
        # 1 / (K_He n_1s) = 3 x (escape rate per 2^1P atom); the Peebles factor below is written with
        # its inverse so that it stays finite when the Boltzmann factor e^{+h nu_ps / kT} overflows
        inv_K_n1s = 3.0 * esc
    else:
        inv_K_n1s = L_HE_2P**3 * 8.0 * math.pi * H / jnp.maximum(n1s_He, 1e-300)
    inv_X = inv_K_n1s * jnp.exp(-T_HE_PS / T_ph)  # 2^1P lies above 2^1S: escape suppressed
    C_He = (inv_X + LAMBDA_2S1S_HE) / (inv_X + LAMBDA_2S1S_HE + beta_He)
    dxHe_dt = -(x_e * x_HeII * n_H * alpha_He - beta_He * (1.0 - x_He) * jnp.exp(-T_HE_2S / T_ph)) * C_He

    # ---- helium I triplets (2^3P - 1^1S intercombination line)
    if settings.helium_triplet:
        alpha_t = alpha_HeI_triplet(T_b)
        beta_t = (4.0 / 3.0) * alpha_HeI_triplet(T_ph) * (SAHA_CR * T_ph) ** 1.5 * jnp.exp(-T_HE_2ST_ION / T_ph)
        esc_t, continuum = _helium_escape(A2P_TRIPLET, L_HE_2PT, SIGMA_HE_2PT, KIV_TRIPLET,
                                          n1s_He, H, T_b, p, x_He, one_minus_xH, settings)
        if continuum is not None:
            esc_t = esc_t + continuum / 3.0
        # C_t = w / (beta_t + w) with w = esc_t e^{-h nu_pst/kT}; written with the exponents combined
        # so that it stays finite at low T where both w and beta_t underflow
        beta_t_eff = (4.0 / 3.0) * alpha_HeI_triplet(T_ph) * (SAHA_CR * T_ph) ** 1.5 * jnp.exp(
            -(T_HE_2ST_ION - T_HE_PST) / T_ph)
        C_t = esc_t / (esc_t + beta_t_eff)
        dxHe_dt = dxHe_dt - (x_e * x_HeII * n_H * alpha_t
                             - 3.0 * beta_t * (1.0 - x_He) * jnp.exp(-T_HE_2ST / T_ph)) * C_t

    # ---- baryon temperature, as theta = T_b / T_gamma
    x_c = x_e if electron_fraction_for_compton is None else electron_fraction_for_compton(lna, x_e)
    dtheta = temperature_ratio_rhs(theta, compton_rate_per_lna(lna, x_c, p, H))

    return jnp.stack([dxH_dt / H, dxHe_dt / H / 1.0, dtheta])


# --------------------------------------------------------------------------- implicit integrator
#: 2-stage Radau IIA (order 3, L-stable, stiffly accurate): Hairer & Wanner, Solving ODEs II, IV.5
RADAU_C = (1.0 / 3.0, 1.0)
RADAU_A = ((5.0 / 12.0, -1.0 / 12.0), (3.0 / 4.0, 1.0 / 4.0))


def radau_step(rhs: Callable, t, y, h, newton_iterations: int = 6, unrolled: bool = False,
               inline_solves: bool = False, stage_args: tuple = ((), ()),
               return_stages: bool = False):
    """One 2-stage Radau IIA step of y' = rhs(t, y, *stage_args[i]), solved by simplified Newton
    iterations.

    Why this method: the rate equations are stiff (the Compton and photoionisation rates exceed
    H by up to ~1e8 before recombination), so an explicit method would need tiny steps; Radau IIA
    is L-stable (stiff transients are damped, the solution relaxes onto the Saha / T_b = T_gamma
    quasi-equilibrium instead of oscillating), third order, and stiffly accurate (the new state is
    the last stage, whose derivative is the collocation derivative, so the tabulated d/dlna is
    consistent).  The iteration matrix I - h (A x J) uses the Jacobian at the step's end point
    predicted by a backward-Euler step, factorised once per step; a fixed iteration count keeps
    the step a plain differentiable JAX function (forward and reverse mode).

    ``stage_args[i]``: extra arguments of ``rhs`` at stage i's time t + c_i h (the end point is
    stage 1, c_1 = 1) — what depends on time alone (the expansion rate), computed for every step
    at once by the caller instead of inside the sequential loop, where XLA cannot hoist it.
    ``unrolled`` writes the Newton iterations out instead of a ``fori_loop``: the same arithmetic,
    but no loop of its own inside the caller's scan — on a GPU every iteration of an XLA while
    loop is a round trip to the host for its predicate; on the CPU the loop is cheaper to compile.
    ``inline_solves`` factorises and solves the 3×3 and 6×6 systems with straight-line array code
    (``boltzmann.small_linalg``) instead of a LAPACK / cuSOLVER call per system: on a GPU each
    such call is its own kernel launch, and the straight-line form fuses with the rhs around it.
    ``return_stages``: also return the stage increments Z (2, n) (y_{n+1} = y + Z[1]), where the
    linearised tangent of ``boltzmann.radau_path`` evaluates the step's Jacobians.
    """
    n = y.shape[0]
    A = jnp.asarray(RADAU_A)
    c = jnp.asarray(RADAU_C)
    eye = jnp.eye(n)

    def rhs_end(u):
        return rhs(t + h, u, *stage_args[1])

    # backward-Euler predictor (one Newton iteration from y) gives the Jacobian point and start
    J0 = jax.jacfwd(rhs_end)(y)
    solve = solve_small if inline_solves else jnp.linalg.solve
    factor = lu_factor_small if inline_solves else jax.scipy.linalg.lu_factor
    back = lu_solve_small if inline_solves else jax.scipy.linalg.lu_solve
    y_be = y + solve(eye - h * J0, h * rhs_end(y))
    J = jax.jacfwd(rhs_end)(y_be)
    M = jnp.eye(2 * n) - h * jnp.kron(A, J)
    lu = factor(M)

    def residual(zflat):
        Z = zflat.reshape(2, n)
        F = jnp.stack([rhs(t + c[i] * h, y + Z[i], *stage_args[i]) for i in range(2)])
        return zflat - h * (A @ F).reshape(-1)

    z0 = jnp.concatenate([c[0] * (y_be - y), c[1] * (y_be - y)])

    def body(_, z):
        return z - back(lu, residual(z))

    if unrolled:
        z = z0
        for i in range(newton_iterations):
            z = body(i, z)
    else:
        z = jax.lax.fori_loop(0, newton_iterations, body, z0)
    z = z.reshape(2, n)
    return (y + z[1], z) if return_stages else y + z[1]
