"""Generator of the linear Einstein-Boltzmann right-hand side (synchronous gauge).

Equations: Ma & Bertschinger 1995 (MB95, ApJ 455, 7), synchronous gauge, in the conventions of
CLASS (Blas, Lesgourgues & Tram 2011): densities in "rho-tilde" units rho~ = 8 pi G rho / 3
(1/Mpc^2, so that H^2 = sum rho~), velocity divergences theta in 1/Mpc, shear sigma with
F_2 = 2 sigma.  Independent variable x = ln a: every derivative returned is d/dx = (d/dtau)/ℋ
with ℋ = a H the conformal Hubble rate.

Species / state (see ``EBModel.state_names``):
  eta                      metric (h' from the 00 Einstein constraint, eta' from 0i)
  delta_c                  CDM density (theta_c = 0 defines the gauge)
  delta_b, theta_b         baryons, Thomson drag R kappa' (theta_g - theta_b), sound speed c_s^2
  F_g_0..F_g_L             photon temperature multipoles (F_0 = delta_g, theta_g = 3k F_1/4)
  G_g_0..G_g_L'            photon polarisation multipoles
  F_ur_0..F_ur_L           massless neutrinos
  Psi_s_q{i}_l{l}          massive species s, momentum node i, multipole l (MB95 eq. 57)
  delta_de, theta_de       w0-wa dark-energy fluid (optional; CLASS fluid equations,
                           rest-frame sound speed cs2_de)
Hierarchies are closed with MB95 eq. 51 (free streaming, (l+1)/tau term, tau conformal time).

The RHS is emitted as straight-line Python over scalars: ``y[<int>]`` and ``p[<int>]`` only, every
loop over l and q unrolled here, math through the alias ``M`` (jax.numpy now, ``math`` on the GPU)
and table reads through ``T.cell``/``T.row`` (models.tables).  The same emitted intermediates also
form ``observables`` (CLASS 'class'-format transfer quantities), so the two cannot disagree.

From the same lines the generator cuts a ``models.tables.TableSplit`` (``EBModel.table_split``,
also ``rhs.table_split``): ``rhs_core(y, x, p, tv)`` (the rhs with the four Hermite reads replaced
by the tuple tv = (ln ℋ, ln τ, ln κ', c_s²)), ``table_values(x, p, tab)`` (the reads) and
``table_values_dx`` (their closed-form x-derivative), each in a JAX and a math/builtins (numba
device) flavour -- what the CUDA backend needs, since Enzyme cannot differentiate array reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from . import tables as _tables
from .codegen import compile_source

# Table columns read by the RHS, in the table's column order (tab[row, c, ...]).
TABLE_COLUMNS = (
    "ln_conformal_hubble",   # ln ℋ, ℋ = aH [1/Mpc]
    "ln_conformal_time",     # ln tau [Mpc]   (free-streaming truncation only)
    "ln_kappa_dot",          # ln kappa', kappa' = a n_e sigma_T [1/Mpc]
    "cs2_b",                 # baryon sound speed^2 c_s^2 (CLASS c_b^2; can be < 0 briefly at
                             # reionisation, hence not tabulated as a log)
)


@dataclass(frozen=True)
class NcdmQuadrature:
    """Momentum quadrature of one non-cold relic, in units of its temperature today.

    ``weights`` integrate against q^2 f0(q):  int q^2 f0(q) g(q) dq ~= sum_i w_i g(q_i);
    any overall constant is absorbed by the parameter ``ncdm_norm_s``.  ``dlnf0_dlnq`` is
    d ln f0 / d ln q at the nodes (Fermi-Dirac: -q / (1 + exp(-q))).
    """

    q: tuple
    weights: tuple
    dlnf0_dlnq: tuple

    def __post_init__(self):
        n = len(self.q)
        if n == 0 or len(self.weights) != n or len(self.dlnf0_dlnq) != n:
            raise ValueError("NcdmQuadrature: q, weights, dlnf0_dlnq must be non-empty and of "
                             f"equal length, got {len(self.q)}, {len(self.weights)}, "
                             f"{len(self.dlnf0_dlnq)}")
        if any(float(q) <= 0.0 for q in self.q):
            raise ValueError("NcdmQuadrature: momentum nodes q must be > 0")


def _lit(value: float) -> str:
    """A float literal that round-trips exactly."""
    return repr(float(value))


class _Emitter:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, name: str, expr: str):
        self.lines.append(f"    {name} = {expr}")

    def comment(self, text: str):
        self.lines.append(f"    # {text}")


@dataclass(frozen=True)
class EBModel:
    """A generated Einstein-Boltzmann model; see ``build_eb_model``."""

    source: str
    rhs: Callable
    observables_fn: Callable = field(repr=False)
    n: int
    state_names: tuple
    param_names: tuple
    table_columns: tuple
    radiation_indices: tuple
    l_max_g: int
    l_max_pol_g: int
    l_max_ur: int
    l_max_ncdm: int
    ncdm: tuple
    de_fluid: bool
    #: rhs split into a table-free core and the table lookup (models.tables.TableSplit); also
    #: attached to the rhs function as ``rhs.table_split`` for solvers (the CUDA backend)
    table_split: object = field(default=None, repr=False, compare=False)
    #: dark energy linearised at Λ for derivatives (see build_eb_model, de_at_lambda)
    de_at_lambda: bool = False

    def index(self, name: str) -> int:
        """Position of a state variable by name (ValueError if absent)."""
        try:
            return self.state_names.index(name)
        except ValueError:
            raise ValueError(f"no state variable {name!r}") from None

    def param_index(self, name: str) -> int:
        """Position of a parameter by name (ValueError if absent)."""
        try:
            return self.param_names.index(name)
        except ValueError:
            raise ValueError(f"no parameter {name!r}; have {self.param_names}") from None

    def make_params(self, **values) -> np.ndarray:
        """Parameter vector from keyword values; every name in ``param_names`` is required."""
        unknown = set(values) - set(self.param_names)
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)}; allowed {self.param_names}")
        missing = [name for name in self.param_names if name not in values]
        if missing:
            raise ValueError(f"missing parameter(s) {missing}")
        return np.array([float(values[name]) for name in self.param_names])

    def make_rhs(self, math_module, table_ops=None) -> Callable:
        """Compile the same source with ``M`` bound to ``math_module`` (e.g. ``math``) and the
        table helpers ``T`` bound to ``table_ops`` (default: PY_TABLE_OPS unless math_module is
        jax.numpy)."""
        return _compile(self.source, math_module, table_ops)[0]

    def observables(self, y, x, p, tab) -> dict:
        """CLASS 'class'-format transfer quantities at one time (JAX).

        Keys: d_g, d_b, d_cdm, d_ur, d_ncdm[s], d_m (cdm+b+ncdm, density weighted), d_cb,
        t_g, t_b, t_ur, t_ncdm[s], t_m?, h_prime, eta, eta_prime, h (= -2 delta_cdm, exact for
        the adiabatic initial conditions of models.initial_conditions), phi, psi (Newtonian
        potentials from MB95 eq. 18), delta_de/theta_de with the fluid, plus a, conformal_hubble.
        """
        return self.observables_fn(y, x, p, tab)


def _compile(source, math_module, table_ops):
    if table_ops is None:
        table_ops = _tables.JAX_TABLE_OPS if math_module is jnp else _tables.PY_TABLE_OPS
    return compile_source(source, ("rhs", "observables"), {"M": math_module, "T": table_ops},
                          tag="eb_rhs")


def build_eb_model(l_max_g: int = 20, l_max_pol_g: int = 15, l_max_ur: int = 50,
                   ncdm: Sequence[NcdmQuadrature] = (), l_max_ncdm: int = 20,
                   de_fluid: bool = False, de_at_lambda: bool = False) -> EBModel:
    """Generate and compile the synchronous-gauge EB model.

    Defaults: photon/polarisation (20, 15) as the CLASS reference run; l_max_ur = 50 because the
    massless-neutrino truncation is the accuracy limit at k ~ 1/Mpc (delta_m vs CLASS at k = 1:
    4.4e-4 with 30, 1.3e-4 with 50, 6e-5 with 80; docs/perturbations.md).  l_max_ncdm not yet
    converged-tested.

    Parameter vector layout is ``EBModel.param_names``:
      k [1/Mpc]; cosmo_row (row of ``tab``, stored as float); table_x_min, table_dx (the uniform
      ln a grid of ``tab``; n_grid is ``tab.shape[-1]``); rho_g0, rho_b0, rho_cdm0, rho_ur0
      (8 pi G rho / 3 today, 1/Mpc^2); per ncdm species s: ncdm_norm_s (rho~_s(a) a^4 =
      norm * sum_i w_i eps_i) and ncdm_m_over_T_s (mass over the species' temperature today);
      with ``de_fluid`` or ``de_at_lambda``: rho_de0, w0, wa, cs2_de.

    ``de_at_lambda``: the w0-wa fluid linearised about Λ, for derivatives at w0 = -1, wa = 0.
    There the c_s² = 1 fluid is singular (θ' has c_s² k² δ/(1+w), c_a² has w'/(1+w)) and its
    contribution is not linear in the direction of (δw0, δwa): only directional derivatives exist.
    This mode evolves, per direction u in {A = (1, 0), B = (1, 1)} of the (w0, wa) plane, the
    regular variables δ̃_u = δ_de/(1+w) and θ_u of a fluid with 1 + w ∝ g_u(a) (g_A = 1,
    g_B = 2 - a, never zero for a <= 1):

        δ̃' = -(θ + h'/2) - 3(c_s² - w)ℋ δ̃ - 9ℋ²/k² [(c_s² - w) + c_u/(3ℋ)] θ - c_u δ̃,
        θ'  = -(1 - 3c_s²)ℋ θ + c_s² k² δ̃,          c_u = g_u'/g_u  (c_A = 0, c_B = -aℋ/(2 - a)),

    (the fluid equations of CLASS divided by 1 + w), and feeds the Einstein equations with
    ρ_de (1+w) δ = ρ_de [α δ̃_A + β (2-a) δ̃_B], α = 1 + w0 - wa, β = wa (so α + β(2 - a) = 1 + w).
    On the w0 axis (wa = 0) this is the constant-w fluid exactly, on the diagonal (-1+s, s) it is
    the CPL fluid exactly; at Λ both vanish, so values equal Λ's and the derivatives are
    ∂/∂w0 = D_(1,0) and ∂/∂wa = D_(1,1) - D_(1,0) — the definition of CLASS's finite-difference
    reference (tests/data/class_dlnpk_dtheta.yaml).  Only meant for derivatives at Λ.
    """
    if de_fluid and de_at_lambda:
        raise ValueError("de_fluid and de_at_lambda are exclusive")
    for name, value, low in (("l_max_g", l_max_g, 4), ("l_max_pol_g", l_max_pol_g, 4),
                             ("l_max_ur", l_max_ur, 4), ("l_max_ncdm", l_max_ncdm, 4)):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    ncdm = tuple(s if isinstance(s, NcdmQuadrature) else NcdmQuadrature(*map(tuple, s))
                 for s in ncdm)

    # ---- state layout -------------------------------------------------------------------
    names = ["eta", "delta_c", "delta_b", "theta_b"]
    names += [f"F_g_{l}" for l in range(l_max_g + 1)]
    names += [f"G_g_{l}" for l in range(l_max_pol_g + 1)]
    names += [f"F_ur_{l}" for l in range(l_max_ur + 1)]
    for s, sp in enumerate(ncdm):
        for i in range(len(sp.q)):
            names += [f"Psi_{s}_q{i}_l{l}" for l in range(l_max_ncdm + 1)]
    if de_fluid:
        names += ["delta_de", "theta_de"]
    if de_at_lambda:
        names += ["delta_de_A", "theta_de_A", "delta_de_B", "theta_de_B"]
    idx = {nm: i for i, nm in enumerate(names)}
    radiation = tuple(i for nm, i in idx.items() if nm.startswith(("F_g_", "G_g_", "F_ur_")))

    pnames = ["k", "cosmo_row", "table_x_min", "table_dx", "rho_g0", "rho_b0", "rho_cdm0",
              "rho_ur0"]
    for s in range(len(ncdm)):
        pnames += [f"ncdm_norm_{s}", f"ncdm_m_over_T_{s}"]
    if de_fluid or de_at_lambda:
        pnames += ["rho_de0", "w0", "wa", "cs2_de"]
    pidx = {nm: i for i, nm in enumerate(pnames)}

    def Y(nm):
        return f"y[{idx[nm]}]"

    def P(nm):
        return f"p[{pidx[nm]}]"

    e = _Emitter()
    # ---- background from the table ------------------------------------------------------
    e.comment("background and thermodynamics: cubic Hermite on the uniform ln a table")
    e("k", P("k"))
    e("k2", "k * k")
    tab_start = len(e.lines)  # e.lines[tab_start:tab_end]: the table reads (see _table_split)
    e("row", f"T.row({P('cosmo_row')})")
    e("dxg", P("table_dx"))
    e("jc, tc", f"T.cell(x, {P('table_x_min')}, dxg, tab.shape[3])")
    e("tc2", "tc * tc")
    e("tc3", "tc2 * tc")
    e("b00", "2.0 * tc3 - 3.0 * tc2 + 1.0")
    e("b10", "(tc3 - 2.0 * tc2 + tc) * dxg")
    e("b01", "-2.0 * tc3 + 3.0 * tc2")
    e("b11", "(tc3 - tc2) * dxg")
    for c, col in enumerate(TABLE_COLUMNS):
        e(f"tab_{col}", f"b00 * tab[row, {c}, 0, jc] + b10 * tab[row, {c}, 1, jc]"
                        f" + b01 * tab[row, {c}, 0, jc + 1] + b11 * tab[row, {c}, 1, jc + 1]")
    tab_end = len(e.lines)
    e("cH", "M.exp(tab_ln_conformal_hubble)")
    e("icH", "1.0 / cH")
    e("itau", "M.exp(-tab_ln_conformal_time)")
    e("kd", "M.exp(tab_ln_kappa_dot)")
    e("cs2b", "tab_cs2_b")
    e("a", "M.exp(x)")
    e("ia", "1.0 / a")
    e("ia2", "ia * ia")
    e.comment("A_X = a^2 rho~_X  [1/Mpc^2]")
    e("A_g", f"{P('rho_g0')} * ia2")
    e("A_b", f"{P('rho_b0')} * ia")
    e("A_c", f"{P('rho_cdm0')} * ia")
    e("A_ur", f"{P('rho_ur0')} * ia2")

    # ---- species sums for the Einstein equations --------------------------------------------
    e.comment("photons and massless neutrinos: theta = 3k F_1/4, sigma = F_2/2")
    e("theta_g", f"0.75 * k * {Y('F_g_1')}")
    e("theta_ur", f"0.75 * k * {Y('F_ur_1')}")
    drho_terms = [f"A_g * {Y('F_g_0')}", f"A_b * {Y('delta_b')}", f"A_c * {Y('delta_c')}",
                  f"A_ur * {Y('F_ur_0')}"]
    rpt_terms = ["1.3333333333333333 * (A_g * theta_g + A_ur * theta_ur)", f"A_b * {Y('theta_b')}"]
    shear_terms = [f"0.6666666666666666 * (A_g * {Y('F_g_2')} + A_ur * {Y('F_ur_2')})"]
    for s, sp in enumerate(ncdm):
        e.comment(f"ncdm species {s}: MB95 eq. 55 on {len(sp.q)} momentum nodes")
        e(f"mT{s}", f"a * {P(f'ncdm_m_over_T_{s}')}")
        e(f"mT2_{s}", f"mT{s} * mT{s}")
        e(f"nrm{s}", f"{P(f'ncdm_norm_{s}')} * ia2")
        rho, prs, drho, rpt, shr = [], [], [], [], []
        for i, (q, w) in enumerate(zip(sp.q, sp.weights)):
            e(f"eps{s}_{i}", f"M.sqrt({_lit(q * q)} + mT2_{s})")
            e(f"ieps{s}_{i}", f"1.0 / eps{s}_{i}")
            rho.append(f"{_lit(w)} * eps{s}_{i}")
            prs.append(f"{_lit(w * q * q / 3.0)} * ieps{s}_{i}")
            drho.append(f"{_lit(w)} * eps{s}_{i} * {Y(f'Psi_{s}_q{i}_l0')}")
            rpt.append(f"{_lit(w * q)} * {Y(f'Psi_{s}_q{i}_l1')}")
            shr.append(f"{_lit(w * q * q)} * ieps{s}_{i} * {Y(f'Psi_{s}_q{i}_l2')}")
        e(f"A_ncdm{s}", f"nrm{s} * ({' + '.join(rho)})")
        e(f"Pa_ncdm{s}", f"nrm{s} * ({' + '.join(prs)})")
        e(f"dA_ncdm{s}", f"nrm{s} * ({' + '.join(drho)})")
        e(f"rpt_ncdm{s}", f"nrm{s} * k * ({' + '.join(rpt)})")
        e(f"shr_ncdm{s}", f"nrm{s} * 0.6666666666666666 * ({' + '.join(shr)})")
        drho_terms.append(f"dA_ncdm{s}")
        rpt_terms.append(f"rpt_ncdm{s}")
        shear_terms.append(f"shr_ncdm{s}")
    if de_fluid:
        e.comment("w0-wa fluid: rho ~ a^(-3(1+w0+wa)) exp(3 wa (a-1)), c_a^2 = w - w'/(3(1+w)ℋ)")
        e("w_de", f"{P('w0')} + {P('wa')} * (1.0 - a)")
        e("opw_de", "1.0 + w_de")
        e("A_de", f"{P('rho_de0')} * M.exp(-(1.0 + 3.0 * ({P('w0')} + {P('wa')})) * x"
                  f" + 3.0 * {P('wa')} * (a - 1.0))")
        e("ca2_de", f"w_de + {P('wa')} * a / (3.0 * opw_de)")
        e("cs2_de", P("cs2_de"))
        drho_terms.append(f"A_de * {Y('delta_de')}")
        rpt_terms.append(f"opw_de * A_de * {Y('theta_de')}")
    if de_at_lambda:
        e.comment("w0-wa fluid linearised at Λ: directions A = (1,0), B = (1,1) (build_eb_model)")
        e("w_de", f"{P('w0')} + {P('wa')} * (1.0 - a)")
        e("A_de", f"{P('rho_de0')} * M.exp(-(1.0 + 3.0 * ({P('w0')} + {P('wa')})) * x"
                  f" + 3.0 * {P('wa')} * (a - 1.0))")
        e("cs2_de", P("cs2_de"))
        e("wA_de", f"1.0 + {P('w0')} - {P('wa')}")
        e("wB_de", f"{P('wa')} * (2.0 - a)")
        e("cB_de", "-a * cH / (2.0 - a)")
        drho_terms.append(f"A_de * (wA_de * {Y('delta_de_A')} + wB_de * {Y('delta_de_B')})")
        rpt_terms.append(f"A_de * (wA_de * {Y('theta_de_A')} + wB_de * {Y('theta_de_B')})")
    e.comment("Einstein equations (MB95 eq. 21a,b): k^2 eta - ℋh'/2 = -(3/2) a^2 drho~, "
              "k^2 eta' = (3/2) a^2 (rho~+p~) theta")
    e("dA_tot", " + ".join(drho_terms))
    e("rpt_tot", " + ".join(rpt_terms))
    e("h_prime", f"2.0 * (k2 * {Y('eta')} + 1.5 * dA_tot) * icH")
    e("eta_prime", "1.5 * rpt_tot / k2")

    # ---- equations (d/dtau), multiplied by 1/ℋ at the end ----------------------------------
    d: dict[str, str] = {}
    d["eta"] = "eta_prime"
    d["delta_c"] = "-0.5 * h_prime"
    d["delta_b"] = f"-{Y('theta_b')} - 0.5 * h_prime"
    e("R_b", "1.3333333333333333 * A_g / A_b")
    d["theta_b"] = (f"-cH * {Y('theta_b')} + cs2b * k2 * {Y('delta_b')}"
                    f" + R_b * kd * (theta_g - {Y('theta_b')})")

    def stream(prefix, l, lmax, rate="k"):
        """Free streaming k/(2l+1) [l F_{l-1} - (l+1) F_{l+1}] or the MB95 eq. 51 closure."""
        if l == lmax:
            return (f"{rate} * {Y(f'{prefix}{l - 1}')}"
                    f" - {_lit(l + 1)} * itau * {Y(f'{prefix}{l}')}")
        return (f"{rate} * ({_lit(l / (2 * l + 1))} * {Y(f'{prefix}{l - 1}')}"
                f" - {_lit((l + 1) / (2 * l + 1))} * {Y(f'{prefix}{l + 1}')})")

    # photons
    e("Pi_g", f"{Y('F_g_2')} + {Y('G_g_0')} + {Y('G_g_2')}")
    d["F_g_0"] = f"-k * {Y('F_g_1')} - 0.6666666666666666 * h_prime"
    d["F_g_1"] = (f"k * 0.3333333333333333 * ({Y('F_g_0')} - 2.0 * {Y('F_g_2')})"
                  f" + kd * (1.3333333333333333 * {Y('theta_b')} / k - {Y('F_g_1')})")
    metric2 = "0.26666666666666666 * h_prime + 1.6 * eta_prime"
    d["F_g_2"] = (f"{stream('F_g_', 2, l_max_g)} + {metric2}"
                  f" - kd * ({Y('F_g_2')} - 0.1 * Pi_g)")
    for l in range(3, l_max_g + 1):
        d[f"F_g_{l}"] = f"{stream('F_g_', l, l_max_g)} - kd * {Y(f'F_g_{l}')}"
    d["G_g_0"] = f"-k * {Y('G_g_1')} + kd * (0.5 * Pi_g - {Y('G_g_0')})"
    d["G_g_1"] = f"{stream('G_g_', 1, l_max_pol_g)} - kd * {Y('G_g_1')}"
    d["G_g_2"] = f"{stream('G_g_', 2, l_max_pol_g)} + kd * (0.1 * Pi_g - {Y('G_g_2')})"
    for l in range(3, l_max_pol_g + 1):
        d[f"G_g_{l}"] = f"{stream('G_g_', l, l_max_pol_g)} - kd * {Y(f'G_g_{l}')}"
    # massless neutrinos
    d["F_ur_0"] = f"-k * {Y('F_ur_1')} - 0.6666666666666666 * h_prime"
    for l in range(1, l_max_ur + 1):
        d[f"F_ur_{l}"] = stream("F_ur_", l, l_max_ur)
    d["F_ur_2"] += f" + {metric2}"
    # massive relics (MB95 eq. 57)
    for s, sp in enumerate(ncdm):
        for i, (q, dlnf) in enumerate(zip(sp.q, sp.dlnf0_dlnq)):
            pre = f"Psi_{s}_q{i}_l"
            e(f"qk{s}_{i}", f"{_lit(q)} * k * ieps{s}_{i}")
            rate = f"qk{s}_{i}"
            d[f"{pre}0"] = f"-{rate} * {Y(pre + '1')} + {_lit(dlnf / 6.0)} * h_prime"
            for l in range(1, l_max_ncdm + 1):
                d[f"{pre}{l}"] = stream(pre, l, l_max_ncdm, rate)
            d[f"{pre}2"] += (f" - {_lit(dlnf)} * (0.06666666666666667 * h_prime"
                             f" + 0.4 * eta_prime)")
    if de_fluid:
        dd, td = Y("delta_de"), Y("theta_de")
        d["delta_de"] = (f"-opw_de * ({td} + 0.5 * h_prime) - 3.0 * (cs2_de - w_de) * cH * {dd}"
                         f" - 9.0 * opw_de * (cs2_de - ca2_de) * cH * cH * {td} / k2")
        d["theta_de"] = f"-(1.0 - 3.0 * cs2_de) * cH * {td} + cs2_de * k2 / opw_de * {dd}"
    if de_at_lambda:
        for u, c in (("A", None), ("B", "cB_de")):
            dd, td = Y(f"delta_de_{u}"), Y(f"theta_de_{u}")
            extra_t = f" + {c} / (3.0 * cH)" if c else ""
            extra_d = f" - {c} * {dd}" if c else ""
            d[f"delta_de_{u}"] = (f"-({td} + 0.5 * h_prime) - 3.0 * (cs2_de - w_de) * cH * {dd}"
                                  f" - 9.0 * cH * cH / k2 * ((cs2_de - w_de){extra_t}) * {td}"
                                  f"{extra_d}")
            d[f"theta_de_{u}"] = f"-(1.0 - 3.0 * cs2_de) * cH * {td} + cs2_de * k2 * {dd}"

    assert set(d) == set(names), set(names) ^ set(d)
    head = ["def rhs(y, x, p, tab):",
            '    """d y / d ln a of the synchronous-gauge EB system (generated by models/eb.py)."""']
    body = list(e.lines)
    body.append("    # derivatives: (d/dtau) / ℋ")
    for nm in names:
        body.append(f"    d_{nm} = ({d[nm]}) * icH")
    ret = "    return (" + ", ".join(f"d_{nm}" for nm in names) + ",)"
    rhs_src = "\n".join(head + body + [ret])

    # ---- observables (same intermediates) ------------------------------------------------
    ob = ["def observables(y, x, p, tab):",
          '    """CLASS-format transfer quantities (generated by models/eb.py)."""']
    ob += list(e.lines)
    o = _Emitter()
    o("A_m", " + ".join(["A_b", "A_c"] + [f"A_ncdm{s}" for s in range(len(ncdm))]))
    o("dA_m", " + ".join([f"A_b * {Y('delta_b')}", f"A_c * {Y('delta_c')}"]
                         + [f"dA_ncdm{s}" for s in range(len(ncdm))]))
    o("shear_tot", " + ".join(shear_terms))
    o("alpha", "(h_prime + 6.0 * eta_prime) / (2.0 * k2)")
    o("alpha_prime", f"-2.0 * cH * alpha + {Y('eta')} - 4.5 * shear_tot / k2")
    out = {
        "a": "a", "conformal_hubble": "cH",
        "d_g": Y("F_g_0"), "d_b": Y("delta_b"), "d_cdm": Y("delta_c"), "d_ur": Y("F_ur_0"),
        "d_m": "dA_m / A_m",
        "d_cb": f"(A_b * {Y('delta_b')} + A_c * {Y('delta_c')}) / (A_b + A_c)",
        "t_g": "theta_g", "t_b": Y("theta_b"), "t_ur": "theta_ur",
        "h_prime": "h_prime", "eta": Y("eta"), "eta_prime": "eta_prime",
        "h": f"-2.0 * {Y('delta_c')}",
        "phi": f"{Y('eta')} - cH * alpha", "psi": "cH * alpha + alpha_prime",
    }
    for s in range(len(ncdm)):
        out[f"d_ncdm[{s}]"] = f"dA_ncdm{s} / A_ncdm{s}"
        out[f"t_ncdm[{s}]"] = f"rpt_ncdm{s} / (A_ncdm{s} + Pa_ncdm{s})"
    if de_fluid:
        out["d_de"], out["t_de"] = Y("delta_de"), Y("theta_de")
    ob += o.lines
    ob.append("    return {" + ", ".join(f"{key!r}: {val}" for key, val in out.items()) + "}")
    source = rhs_src + "\n\n\n" + "\n".join(ob) + "\n"

    rhs, obs = _compile(source, jnp, None)
    split = _table_split(body, ret, tab_start, tab_end, pidx)
    rhs.table_split = split  # the protocol a solver looks for (models.tables.TableSplit)
    return EBModel(source=source, rhs=rhs, observables_fn=obs, n=len(names),
                   state_names=tuple(names), param_names=tuple(pnames),
                   table_columns=TABLE_COLUMNS, radiation_indices=radiation,
                   l_max_g=l_max_g, l_max_pol_g=l_max_pol_g, l_max_ur=l_max_ur,
                   l_max_ncdm=l_max_ncdm, ncdm=ncdm, de_fluid=de_fluid, table_split=split,
                   de_at_lambda=de_at_lambda)


def _table_split(body, ret, tab_start, tab_end, pidx) -> _tables.TableSplit:
    """The table-free core and the table lookup, cut from the very lines of ``rhs`` (no second
    copy of the physics): ``body[tab_start:tab_end]`` are the Hermite reads that end in one
    ``tab_<column> = ...`` per column of TABLE_COLUMNS.

    * ``rhs_core(y, x, p, tv)``: ``rhs`` with those reads replaced by ``tab_<column> = tv[c]``;
    * ``table_values(x, p, tab)``: the reads themselves, returning the tuple ``tv``;
    * ``table_values_dx(x, p, tab)``: d tv/dx, the x-derivative of the same cubic Hermite
      (closed form: d/dx of the basis, 1/dx from dt/dx), on the same cell.  It agrees with
      jax's derivative of ``table_values`` to the conditioning of the table, not to 1e-16:
      both differentiate f0 - f1 of close node values; this form rounds less.

    JAX flavour: the reads verbatim (``T.cell``/``T.row``), so ``table_values`` is the rhs's own
    arithmetic.  Device flavour: ``T.row``/``T.cell`` written out with builtins (``int`` truncates
    toward zero; after clipping to [0, n_grid - 2] that equals the clipped floor of
    models.tables._cell_py), so a numba-cuda device compiler needs no helper namespace.
    """
    reads = body[tab_start:tab_end]
    if not (reads[0].startswith("    row = ") and reads[2].startswith("    jc, tc = ")):
        raise AssertionError("table-read lines moved; update _table_split")
    cols = TABLE_COLUMNS
    core = ["def rhs_core(y, x, p, tv):",
            '    """rhs given the interpolated table values tv (generated by models/eb.py)."""']
    core += body[:tab_start] + [f"    tab_{col} = tv[{c}]" for c, col in enumerate(cols)]
    core += body[tab_end:] + [ret]
    core_src = "\n".join(core) + "\n"

    def tab_ref(c, d, node):
        return f"tab[row, {c}, {d}, jc{' + 1' if node else ''}]"

    # d/dx of b00 f0 + b10 d0 + b01 f1 + b11 d1 with dt/dx = 1/dx; b01' = -b00', so the value
    # terms are g00 (f0 - f1): the node difference first (exact for close values, Sterbenz), which
    # avoids the cancellation of g00 f0 - g00 f1 (cond ~ |f| / (dx |f'|), ~1e4 for ln tau)
    deriv = ["    g00 = (6.0 * tc2 - 6.0 * tc) / dxg",
             "    g10 = 3.0 * tc2 - 4.0 * tc + 1.0",
             "    g11 = 3.0 * tc2 - 2.0 * tc"]
    deriv += [f"    dtab_{col} = g00 * ({tab_ref(c, 0, 0)} - {tab_ref(c, 0, 1)})"
              f" + g10 * {tab_ref(c, 1, 0)} + g11 * {tab_ref(c, 1, 1)}"
              for c, col in enumerate(cols)]
    tv_ret = "    return (" + ", ".join(f"tab_{col}" for col in cols) + ",)"
    dtv_ret = "    return (" + ", ".join(f"dtab_{col}" for col in cols) + ",)"
    basis = [ln for ln in reads if ln.split(" = ")[0].strip() in ("tc2", "tc3")]

    def lookup_src(cell_lines):
        values = cell_lines + [ln for ln in reads[3:]]  # tc2, tc3, b.., tab_<col>
        return "\n".join(
            ["def table_values(x, p, tab):",
             '    """Interpolated table values tv at x (cubic Hermite; generated)."""']
            + values + [tv_ret, "", "",
                        "def table_values_dx(x, p, tab):",
                        '    """d tv / dx at x (derivative of the same cubic; generated)."""']
            + cell_lines + basis + deriv + [dtv_ret]) + "\n"

    jax_cell = reads[:3]
    dev_cell = [f"    row = int(p[{pidx['cosmo_row']}])",
                f"    dxg = p[{pidx['table_dx']}]",
                f"    u = (x - p[{pidx['table_x_min']}]) / dxg",
                "    jc = min(max(int(u), 0), tab.shape[3] - 2)",
                "    tc = u - jc"]
    if reads[1] != dev_cell[1]:
        raise AssertionError("table-read lines changed; update _table_split")
    names = ("rhs_core", "table_values", "table_values_dx")
    jax_src = core_src + "\n\n" + lookup_src(jax_cell)
    dev_src = core_src + "\n\n" + lookup_src(dev_cell)
    core_j, look_j, dlook_j = compile_source(jax_src, names,
                                             {"M": jnp, "T": _tables.JAX_TABLE_OPS},
                                             tag="eb_split")
    core_d, look_d, dlook_d = compile_source(dev_src, names, {"M": math}, tag="eb_split_device")
    return _tables.TableSplit(n_tv=len(cols), names=tuple(cols), core=core_j, lookup=look_j,
                              lookup_dt=dlook_j, core_device=core_d, lookup_device=look_d,
                              lookup_dt_device=dlook_d, device_source=dev_src)


def rhs_source_only(model: EBModel) -> str:
    """The ``rhs`` function's source alone (without ``observables``), e.g. for the GPU target."""
    return model.source.split("\n\n\ndef observables")[0] + "\n"
