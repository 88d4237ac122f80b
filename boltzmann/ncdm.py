"""Non-cold relics (massive neutrinos): Fermi–Dirac momentum integrals.

Conventions (as CLASS, Lesgourgues & Tram 2011, arXiv:1104.2935):
- each species has a mass ``m`` [eV], a present temperature ``T_ncdm0 = T_ncdm * T_cmb`` [K], and a
  degeneracy ``deg`` (``deg = 1`` is one neutrino plus its antineutrino, two internal states);
- the comoving momentum in units of ``k_B T_ncdm0`` is ``q``; the unperturbed distribution is the
  relativistic Fermi–Dirac ``f0(q) = 1 / (exp(q) + 1)`` (frozen after decoupling);
- at scale factor ``a`` the comoving energy in the same units is ``eps = sqrt(q^2 + M(a)^2)`` with
  ``M(a) = a m / (k_B T_ncdm0)``;
- ``rho_tilde(a) = deg * C_FD * T_ncdm0^4 / a^4 * int q^2 eps f0 dq`` and
  ``p_tilde(a) = deg * C_FD * T_ncdm0^4 / a^4 * int q^4 / (3 eps) f0 dq`` with ``C_FD`` =
  :data:`boltzmann.constants.RHO_TILDE_FD_PER_K4` (so that the massless limit is exactly
  ``7/8 (T_ncdm0/T_cmb)^4 rho_gamma`` per unit ``deg``).

Two quadratures live here, for two jobs:

1. **Background** (:func:`fd_integrals`): a fixed composite Gauss–Legendre rule, 10 nodes on each
   of 20 panels over q in [0, 60] (panels narrow near q = 0, where eps has its branch point at
   q = i M, and widen along the exponential tail; the neglected tail beyond q = 60 is < 1e-20 of
   the integral).  Measured against adaptive quadrature it is accurate to better than 1e-12
   relative for every M in [0, 1e4]; it is fixed, so it is jit/vmap friendly and differentiable
   in the mass.
2. **Perturbations** (:func:`perturbation_quadrature`): a Gaussian rule with the weight function
   ``q^2 f0(q)`` on [0, inf) itself, built once by the discretised Stieltjes procedure and the
   Golub–Welsch eigenvalue method (Gautschi 2004, *Orthogonal Polynomials: Computation and
   Approximation*, sections 2.2.3 and 3.1.1).  An n-node rule integrates ``q^2 f0 P(q)`` exactly
   for polynomials P of degree <= 2n - 1; ``eps`` is smooth in q, so a handful of nodes
   reproduce rho and p at every a (the idea of CLASS's optimised ncdm quadrature, Lesgourgues &
   Tram 2011, sec. 3, and of CAMB's few-node massive-neutrino integration; the nodes here are our
   own construction).  Because eps(q) = sqrt(q^2 + M^2) has branch points at q = +-iM, the
   Gaussian rule converges only algebraically (max relative error over all a of rho / p:
   n_q = 5: 2.9e-4 / 6.4e-4, n_q = 8: 4.8e-5 / 1.1e-4).  The default ("optimised") rules,
   for 3 <= n_q <= 12, start from the Gaussian rule and move the n_q nodes and n_q weights to
   minimise, in a reweighted least-squares (approximately minimax) sense, the relative errors of
   rho and p over M in {0} U [1e-2, 1e4]; they were computed once (scipy least_squares) and are
   stored below.  Measured max relative error of rho and p over all M in [0, 1e5]:
   n_q = 3: 4.6e-4, 4: 1.0e-4, 5: 1.6e-5, 6: 3.7e-6, 7: 6.7e-7, 8: 1.2e-7, 9..12: <= 1.5e-6.
   The error at large M is that of the number density sum_i w_i (exact for the Gaussian rule).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from models.hermite import hermite_interp

from solver.caches import Cache

from . import constants as const

#: the quadrature rules are constants of the code, computed once per size
_RULES = Cache("boltzmann.ncdm_quadratures", maxsize=16)


# ----------------------------------------------------------------------------- background rule
#: panel edges of the composite Gauss–Legendre background rule (q in units of k_B T_ncdm0)
_BG_PANEL_EDGES = np.array(
    [0.0, 0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.75, 3.5, 4.5, 5.75, 7.0, 9.0, 11.0, 14.0,
     18.0, 23.0, 30.0, 40.0, 60.0]
)
_BG_NODES_PER_PANEL = 10


def background_quadrature() -> tuple[np.ndarray, np.ndarray]:
    """Nodes q_j and weights W_j with ``sum_j W_j g(q_j) ~= int_0^inf q^2 f0(q) g(q) dq``.

    Composite Gauss–Legendre (see module docstring); the factor ``q^2 f0(q)`` is folded into the
    weights.  Returns numpy arrays (constants, not cosmology-dependent).
    """
    return _RULES.get_or_build("background", _background_quadrature)


def _background_quadrature() -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(_BG_NODES_PER_PANEL)
    lo, hi = _BG_PANEL_EDGES[:-1, None], _BG_PANEL_EDGES[1:, None]
    q = (0.5 * (hi - lo) * x[None, :] + 0.5 * (hi + lo)).ravel()
    wq = (0.5 * (hi - lo) * w[None, :]).ravel()
    return q, wq * q**2 * fermi_dirac(q)


def fermi_dirac(q):
    """Relativistic Fermi–Dirac occupation ``1 / (exp(q) + 1)`` (numpy or jnp input)."""
    xp = jnp if isinstance(q, jnp.ndarray) else np
    return 0.5 * (1.0 - xp.tanh(0.5 * q))  # overflow-free form of 1/(e^q + 1)


def dlnf0_dlnq(q):
    """Logarithmic slope of f0: ``d ln f0 / d ln q = -q / (1 + exp(-q))`` (Ma & Bertschinger 1995,
    eq. 56 uses it in the massive-neutrino Boltzmann hierarchy)."""
    xp = jnp if isinstance(q, jnp.ndarray) else np
    return -q * 0.5 * (1.0 + xp.tanh(0.5 * q))


def fd_integrals(mass_ratio, nodes=None):
    """Dimensionless energy and pressure integrals of a Fermi–Dirac relic.

    Parameters
    ----------
    mass_ratio : array_like
        ``M = a m / (k_B T_ncdm0)``, any shape, >= 0.
    nodes : (q, W) or None
        Quadrature with ``q^2 f0`` folded into the weights, summed directly; default: the
        background rule (:func:`background_quadrature`) through its table in ln M
        (:func:`background_integrals`).

    Returns
    -------
    (I_rho, I_p) : arrays of the shape of ``mass_ratio``
        ``I_rho = int q^2 eps f0 dq`` and ``I_p = int q^4 / (3 eps) f0 dq`` with
        ``eps = sqrt(q^2 + M^2)``.  Massless limit: ``I_rho = 3 I_p = 7 pi^4 / 120``.
    """
    if nodes is None:
        return background_integrals(mass_ratio)
    return quadrature_integrals(mass_ratio, nodes)


def quadrature_integrals(mass_ratio, nodes):
    """``(I_rho, I_p)`` of :func:`fd_integrals` summed over the quadrature ``nodes`` = (q, W)."""
    q, w = nodes
    q = jnp.asarray(q)
    w = jnp.asarray(w)
    m = jnp.asarray(mass_ratio)[..., None]
    eps = jnp.sqrt(q**2 + m**2)
    i_rho = jnp.sum(w * eps, axis=-1)
    i_p = jnp.sum(w * q**2 / (3.0 * eps), axis=-1)
    return i_rho, i_p


# ----------------------------------------------------------------------------- background table
#: the logarithms of the background rule's integrals tabulated in u = ln M on [U_MIN, U_MAX] with
#: step U_STEP (values and d/du at every node, interpolated by cubic Hermite cells; ln I is close
#: to linear at both ends, so the cells are accurate to ~1e-13 relative everywhere);
#: below U_MIN and above U_MAX their series in M^2 and 1/M are exact to < 1e-15
_U_MIN, _U_MAX, _U_STEP = -9.0, 14.0, 1.0 / 512.0


def _background_table():
    q, w = background_quadrature()
    u = _U_MIN + _U_STEP * np.arange(int(round((_U_MAX - _U_MIN) / _U_STEP)) + 1)
    m = np.exp(u)[:, None]
    eps = np.sqrt(q**2 + m**2)
    rho = np.sum(w * eps, axis=-1)
    p = np.sum(w * q**2 / (3.0 * eps), axis=-1)
    dln_rho = np.sum(w * m**2 / eps, axis=-1) / rho                   # d ln I_rho / d ln M
    dln_p = -np.sum(w * q**2 * m**2 / (3.0 * eps**3), axis=-1) / p    # d ln I_p / d ln M
    moments = {"w/q": np.sum(w / q), "w": np.sum(w), "wq": np.sum(w * q), "wq2": np.sum(w * q**2),
               "wq4": np.sum(w * q**4)}
    return u, np.log(np.stack([rho, p])), np.stack([dln_rho, dln_p]), moments


def array_module(*xs):
    """numpy when every input is a plain number or numpy array (configuration arithmetic on the
    host, no device dispatch), else jax.numpy (traced, or arrays already on a device)."""
    return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def background_integrals(mass_ratio):
    """``(I_rho, I_p)`` of the background rule at ``M`` from its table in ln M.

    Why a table: H(a) with massive neutrinos is evaluated at every node and stage time of the
    background and thermodynamics stages; summing the 200-node rule there made those integrals
    most of the tables stage's time. The table is built once from the same rule, so the result is
    the rule's to ~1e-13 relative, and it is smooth in M (its derivative is that of the cubic
    cells, for gradients in the neutrino mass). numpy in, numpy out (``array_module``).
    """
    u_nodes, vals, ders, mom = _RULES.get_or_build("background_table", _background_table)
    xp = array_module(mass_ratio)
    m = xp.asarray(mass_ratio, dtype=np.float64)
    m_lo, m_hi = math.exp(_U_MIN), math.exp(_U_MAX)
    small = m <= m_lo
    large = m >= m_hi
    u = xp.log(xp.clip(m, m_lo, m_hi))          # every branch sees a finite, safe argument
    table = [xp.exp(hermite_interp(xp.asarray(u_nodes), xp.asarray(vals[j]), xp.asarray(ders[j]),
                                   u, xp=xp)) for j in range(2)]
    m_s = xp.where(small, m, m_lo)
    m2 = m_s * m_s
    series_small = (mom["wq"] + 0.5 * m2 * mom["w/q"], mom["wq"] / 3.0 - m2 * mom["w/q"] / 6.0)
    m_l = xp.where(large, m, m_hi)
    series_large = (m_l * mom["w"] + 0.5 * mom["wq2"] / m_l,
                    mom["wq2"] / (3.0 * m_l) - mom["wq4"] / (6.0 * m_l**3))
    return tuple(xp.where(small, sm, xp.where(large, lg, tb))
                 for sm, lg, tb in zip(series_small, series_large, table))


def mass_ratio(a, m_ev, t_ncdm0_k):
    """``M = a m / (k_B T_ncdm0)``: the rest mass in units of the comoving momentum scale."""
    return a * m_ev / (const.K_B_EV_PER_K * t_ncdm0_k)


def rho_p_ncdm(a, m_ev, t_ncdm0_k, deg, nodes=None):
    """Density and pressure ``(rho_tilde, p_tilde)`` [1/Mpc^2] of one ncdm species at scale factor a.

    ``a`` may be an array; ``m_ev``, ``t_ncdm0_k``, ``deg`` are scalars (broadcasting works too).
    Differentiable in all arguments.  ``nodes`` as in :func:`fd_integrals`. Plain numbers or
    numpy arrays are computed with numpy; JAX arrays and tracers by one compiled program.
    """
    if array_module(a, m_ev, t_ncdm0_k, deg) is np:
        return _rho_p(np, a, m_ev, t_ncdm0_k, deg, nodes)
    return _rho_p_program(a, m_ev, t_ncdm0_k, deg, nodes)


def _rho_p(xp, a, m_ev, t_ncdm0_k, deg, nodes):
    a = xp.asarray(a, dtype=np.float64)
    m = mass_ratio(a, m_ev, t_ncdm0_k)
    i_rho, i_p = (background_integrals(m) if nodes is None else
                  quadrature_integrals(m, nodes) if xp is jnp else
                  _quadrature_integrals_np(m, nodes))
    pref = deg * const.RHO_TILDE_FD_PER_K4 * t_ncdm0_k**4 / a**4
    return pref * i_rho, pref * i_p


def _quadrature_integrals_np(mass_ratio, nodes):
    q, w = (np.asarray(x, np.float64) for x in nodes)
    eps = np.sqrt(q**2 + np.asarray(mass_ratio, np.float64)[..., None] ** 2)
    return np.sum(w * eps, axis=-1), np.sum(w * q**2 / (3.0 * eps), axis=-1)


#: one compiled program per argument signature: run op by op, the table lookup was a few dozen
#: dispatches per call (on a GPU each a kernel launch and an executable to load per process)
_rho_p_program = jax.jit(lambda a, m, t, deg, nodes: _rho_p(jnp, a, m, t, deg, nodes))


def omega_ncdm(m_ev, t_ncdm0_k, deg):
    """Physical density today ``omega_ncdm = Omega_ncdm h^2`` of one species (exact FD integral)."""
    rho, _ = rho_p_ncdm(1.0, m_ev, t_ncdm0_k, deg)
    return rho / const.RHO_TILDE_CRIT_H2


# ----------------------------------------------------------------------------- perturbation rule
def _stieltjes_recurrence(n: int, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Recurrence coefficients (alpha_k, beta_k), k < n, of the monic orthogonal polynomials of
    the discrete measure sum_j w_j delta(x - x_j) (discretised Stieltjes procedure, Gautschi 2004
    sec. 2.2.3.1)."""
    alpha = np.zeros(n)
    beta = np.zeros(n)
    p_prev = np.zeros_like(x)
    p = np.ones_like(x)
    norm_prev = 1.0
    for k in range(n):
        norm = np.sum(w * p * p)
        alpha[k] = np.sum(w * x * p * p) / norm
        beta[k] = norm if k == 0 else norm / norm_prev
        p_next = (x - alpha[k]) * p - (beta[k] if k > 0 else 0.0) * p_prev
        p_prev, p, norm_prev = p, p_next, norm
    return alpha, beta


def _perturbation_quadrature_cached(n_q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _RULES.get_or_build(("perturbation", int(n_q)), lambda: _perturbation_quadrature(n_q))


def _perturbation_quadrature(n_q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # discretise the weight q^2 f0(q) finely: composite Gauss–Legendre, 40 panels x 20 nodes
    edges = np.concatenate([np.linspace(0.0, 4.0, 17), np.linspace(4.0, 80.0, 25)[1:]])
    x, wl = np.polynomial.legendre.leggauss(20)
    lo, hi = edges[:-1, None], edges[1:, None]
    q = (0.5 * (hi - lo) * x + 0.5 * (hi + lo)).ravel()
    w = (0.5 * (hi - lo) * wl).ravel() * q**2 * fermi_dirac(q)
    alpha, beta = _stieltjes_recurrence(n_q, q, w)
    jacobi = np.diag(alpha) + np.diag(np.sqrt(beta[1:]), 1) + np.diag(np.sqrt(beta[1:]), -1)
    nodes, vecs = np.linalg.eigh(jacobi)
    weights = beta[0] * vecs[0, :] ** 2
    return nodes, weights, dlnf0_dlnq(nodes)


def perturbation_quadrature(n_q: int, method: str = "auto") -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """Momentum nodes for the massive-neutrino perturbation hierarchy.

    Returns ``(q, w, dlnf0_dlnq)``, numpy arrays of length ``n_q``: the nodes q_i (in units of
    k_B T_ncdm0, increasing), weights with ``sum_i w_i g(q_i) ~= int_0^inf q^2 f0(q) g(q) dq``,
    and ``d ln f0 / d ln q`` at the nodes.  So ``rho ∝ sum_i w_i eps_i`` and
    ``p ∝ sum_i w_i q_i^2 / (3 eps_i)``; pass ``nodes=(q, w)`` to :func:`rho_p_ncdm` to get the
    background the hierarchy sees.

    ``method``: ``"gauss"`` (Gaussian rule for the weight q^2 f0, exact for polynomial g of degree
    <= 2 n_q - 1), ``"optimised"`` (stored rules tuned for rho and p, 3 <= n_q <= 12; see module
    docstring), or ``"auto"`` (optimised where stored, else Gaussian).
    """
    if not isinstance(n_q, (int, np.integer)) or isinstance(n_q, bool) or not 1 <= n_q <= 40:
        raise ValueError(f"perturbation_quadrature: n_q must be an integer in [1, 40], got {n_q!r}")
    n_q = int(n_q)
    if method not in ("auto", "gauss", "optimised"):
        raise ValueError(f"perturbation_quadrature: method must be 'auto', 'gauss' or "
                         f"'optimised', got {method!r}")
    if method == "optimised" and n_q not in _OPTIMISED_RULES:
        raise ValueError(f"perturbation_quadrature: optimised rules exist for n_q in "
                         f"{min(_OPTIMISED_RULES)}..{max(_OPTIMISED_RULES)}, got {n_q}")
    if method != "gauss" and n_q in _OPTIMISED_RULES:
        q = np.array(_OPTIMISED_RULES[n_q][0])
        w = np.array(_OPTIMISED_RULES[n_q][1])
        order = np.argsort(q)  # the optimiser may have let nodes pass each other
        q, w = q[order], w[order]
        return q, w, dlnf0_dlnq(q)
    q, w, s = _perturbation_quadrature_cached(n_q)
    return q.copy(), w.copy(), s.copy()


# Optimised rules (nodes, weights) from the procedure in the module docstring; not from any
# other code.  Generated with float64 numpy/scipy and stored to full precision.
_OPTIMISED_RULES: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    3: (
        (1.222324189271489, 3.3344132424493997, 7.206119565668811,),
        (0.5311252948541527, 1.0654777543527867, 0.20568181674009875,),
    ),
    4: (
        (0.8534949357998121, 2.305189568245953, 4.750842061954678, 8.980298515631254,),
        (0.23783522024400455, 0.8997608010230539, 0.6074761307979177, 0.05784390044008897,),
    ),
    5: (
        (0.558195726396505, 1.5353341224279535, 3.160561806619932, 5.788119608054162,
            10.18592441279877,),
        (0.08245299755622114, 0.5260907384910856, 0.832054046533597, 0.3395370480735082,
            0.02292154434909559,),
    ),
    6: (
        (0.28932932956066215, 0.8622162473985662, 1.8681142496622576, 6.124390811619419,
            10.495864951381646, 3.504345871766109,),
        (0.014463881063986054, 0.16866174233927755, 0.5969778769086755, 0.27038451289763504,
            0.01774568656209981, 0.7348509078748551,),
    ),
    7: (
        (0.20745290629526633, 0.6110341839249798, 1.3230978394444788, 7.03099443290849,
            11.546336304322987, 4.259519982736968, 2.4726137576229292,),
        (0.005493023679307946, 0.07086445893056513, 0.33332903859489094, 0.1505705676022562,
            0.007695445060870255, 0.5569459449047643, 0.6781865442063465,),
    ),
    8: (
        (0.4688735574657836, 0.9992548790353858, 1.8499407527446643, 5.100595875951507,
            8.038319553897798, 12.715743276897914, 3.150156609555229, 0.1642122793316994,),
        (0.03413478578980904, 0.18078316057004346, 0.4879930946959635, 0.3734776241302004,
            0.07533114403228375, 0.0029776109791723564, 0.6456770634119814,
            0.0027106856108657378,),
    ),
    9: (
        (0.42843003380571226, 0.912607888243616, 1.6710330882987232, 4.113123381583919,
            8.598242144797629, 5.85740295423935, 13.184889876599646, 2.7502095037326133,
            0.1494384719874743,),
        (0.026773946782513717, 0.14562339225582183, 0.40465795822796274, 0.40552115422232354,
            0.047386885736981584, 0.20747048227046683, 0.001984399168851979, 0.5616005101446622,
            0.002066500542138232,),
    ),
    10: (
        (0.15720255096596905, 0.959248240145762, 1.7861866387087029, 3.0579272640490553,
            5.035000899599094, 7.888149169822481, 12.533110731315437, 4.893292849358747,
            0.448223473870223, 1.2188175280899324e-10,),
        (0.0023876783825253025, 0.16602233649758277, 0.46868457959921733, 0.6514109006236788,
            0.23590786355508833, 0.08351259405157202, 0.003453882609463599, 0.16145263626499767,
            0.03025530205337207, 1.5341250704198907e-23,),
    ),
    11: (
        (0.887866509614227, 1.641175367634097, 2.7757610370973156, 4.4218415162792954,
            6.743120191571904, 9.797497958344206, 14.20802108802451, 5.778549908187543,
            4.195309244860418, 0.41630847511984614, 0.14552991390378803,),
        (0.1373820925041035, 0.4044741349733339, 0.616839911001181, 0.43934892414350085,
            0.13965071258093847, 0.018883192218383985, 0.0007803210435104132, 0.008194517743875347,
            0.01091274646596452, 0.024709582474843256, 0.0019091055253483299,),
    ),
    12: (
        (0.45265338535585736, 0.9625957687424509, 1.751405137959787, 3.1824360623242347,
            4.955959948582071, 6.488609829391527, 8.357660841387872, 12.873075722883284,
            4.848429818590861, 2.441837351561892, 28474993.25947704, 0.1584735860636671,),
        (0.031017692653877934, 0.1646055157715236, 0.41597766375194967, 0.5542126667132549,
            0.2632698683317815, 0.06271931775485869, 0.053005760142978926, 0.0025792296674428017,
            0.08755237564900467, 0.16570104175471068, 4.741501470630616e-26,
            0.0024440601372013194,),
    ),
}


__all__ = [
    "background_quadrature",
    "fermi_dirac",
    "dlnf0_dlnq",
    "fd_integrals",
    "mass_ratio",
    "rho_p_ncdm",
    "omega_ncdm",
    "perturbation_quadrature",
]
