"""Generator of the linear Einstein-Boltzmann right-hand side (synchronous gauge).

Equations: Ma & Bertschinger 1995 (MB95, ApJ 455, 7), synchronous gauge, in the conventions of
CLASS (Blas, Lesgourgues & Tram 2011): densities in "rho-tilde" units rho~ = 8 pi G rho / 3
(1/Mpc^2, so that H^2 = sum rho~), velocity divergences theta in 1/Mpc, shear sigma with
F_2 = 2 sigma.  Independent variable x = ln a: every derivative returned is d/dx = (d/dtau)/ℋ
with ℋ = a H the conformal Hubble rate.

Species / state (see ``EBModel.state_names``), [emitter module in models/species/]:
  eta                  metric: h' from the 00 Einstein constraint, eta' from 0i      [metric]
  delta_c              CDM density (theta_c = 0 defines the gauge)              [baryons_cdm]
  delta_b, theta_b     baryons, sound speed c_s^2                               [baryons_cdm]
  F_g_0..F_g_L         photon temperature multipoles (F_0 = delta_g, theta_g = 3k F_1/4)
                       and the Thomson drag R kappa' (theta_g - theta_b)            [photons]
  G_g_0..G_g_L'        photon polarisation multipoles                               [photons]
  F_ur_0..F_ur_L       massless neutrinos                                [massless_neutrinos]
  Psi_s_q{i}_l{l}      massive species s, momentum node i, multipole l (MB95 eq. 57)
                                                                          [massive_neutrinos]
  delta_de, theta_de   w0-wa dark-energy fluid (optional; CLASS fluid equations, rest-frame
                       sound speed cs2_de), or its form linearised at Λ         [dark_energy]
  Gamma_de             w0-wa dark energy in the PPF closure (optional; smooth through w = -1)
                                                                            [dark_energy_ppf]
Hierarchies are closed with MB95 eq. 51 (free streaming, (l+1)/tau term, tau conformal time).

The RHS is emitted as straight-line Python over scalars: ``y[<int>]`` and ``p[<int>]`` only, every
loop over l and q unrolled by the emitters, math through the alias ``M`` (jax.numpy under JAX,
``math`` in the CUDA device functions) and table reads through ``T.cell``/``T.row``
(models.tables).  This text is the single source of the model: the JAX rhs, the device functions,
the table split, the solver's sparsity, the Jacobian (models/linear_jacobian.py: the rhs is
linear in y, so J is its coefficient matrix, written out as straight-line code) and the
observables are all compiled or derived from it.
``observables`` (CLASS 'class'-format transfer quantities) reuses the rhs's intermediates, so the
two cannot disagree.

Composition (:func:`build_eb_model`): the emitters declare their states and parameters, which
fixes the layout; then they write their lines phase by phase (models/species/base.py): background
and table reads, densities, moments with their Einstein terms, the metric's sums, the equations of
motion, the observables.  From the same lines models/table_reads.py cuts the
``models.tables.TableSplit`` (``EBModel.table_split``, also ``rhs.table_split``): ``rhs_core``
(the rhs given the four table values), ``table_values`` and ``table_values_dx``, in a JAX and a
math/builtins (numba device) flavour -- what the CUDA backend needs, since Enzyme cannot
differentiate array reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from . import tables as _tables
from .codegen import Emitter, compile_source
from .linear_jacobian import build_linear_jacobian
from .species.background import Background
from .species.baryons_cdm import BaryonsCdm
from .species.base import Derivatives, Layout, Observables, Sources
from .species.dark_energy import DarkEnergyAtLambda, DarkEnergyFluid
from .species.dark_energy_ppf import DarkEnergyPPF
from .species.hierarchy import free_streaming_comment
from .species.massive_neutrinos import MassiveNeutrinos, NcdmQuadrature
from .species.massless_neutrinos import MasslessNeutrinos
from .species.metric import Metric
from .species.neutrino_fluids import MassiveNeutrinoFluid, MasslessNeutrinoFluid
from .species.photons import Photons
from .table_reads import TABLE_COLUMNS, table_split

#: the neutrino-fluid forms of a model (``build_eb_model(neutrino_fluid=...)``); "" is the full one
FLUID_FORMS = ("", "ur", "ncdm", "ur+ncdm")

__all__ = ["EBModel", "FLUID_FORMS", "NcdmQuadrature", "TABLE_COLUMNS", "build_eb_model", "rhs_source_only"]


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
    #: J = ∂rhs/∂y derived from the linear source (models.linear_jacobian.LinearJacobian); also
    #: attached to the rhs as ``rhs.linear_jacobian``
    linear_jacobian: object = field(default=None, repr=False, compare=False)
    #: w0-wa dark energy in the PPF closure (models/species/dark_energy_ppf.py)
    de_ppf: bool = False
    #: neutrinos as fluids (models/species/neutrino_fluids.py): "ur" (F_ur_0..2 with the fluid
    #: shear closure), "ncdm" (delta/theta/sigma_ncdm_s per massive species), "ur+ncdm", or ""
    #: (every hierarchy in full)
    neutrino_fluid: str = ""

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
        t_g, t_b, t_ur, t_ncdm[s], h_prime, eta, eta_prime, h (= -2 delta_cdm, exact for the
        adiabatic initial conditions of models.initial_conditions), phi, psi (Newtonian
        potentials from MB95 eq. 18), d_de/t_de with the fluid, d_de/Gamma_de with PPF, plus a,
        conformal_hubble.
        """
        return self.observables_fn(y, x, p, tab)


def _compile(source, math_module, table_ops):
    if table_ops is None:
        table_ops = _tables.JAX_TABLE_OPS if math_module is jnp else _tables.PY_TABLE_OPS
    return compile_source(source, ("rhs", "observables"), {"M": math_module, "T": table_ops},
                          tag="eb_rhs")


def build_eb_model(l_max_g: int = 20, l_max_pol_g: int = 15, l_max_ur: int = 50,
                   ncdm: Sequence[NcdmQuadrature] = (), l_max_ncdm: int = 20,
                   de_fluid: bool = False, de_at_lambda: bool = False,
                   de_ppf: bool = False, neutrino_fluid: str = "") -> EBModel:
    """Generate and compile the synchronous-gauge EB model.

    Defaults: photon/polarisation (20, 15) as the CLASS reference run; l_max_ur = 50 because the
    massless-neutrino truncation is the accuracy limit at k ~ 1/Mpc (delta_m vs CLASS at k = 1:
    4.4e-4 with 30, 1.3e-4 with 50, 6e-5 with 80; docs/perturbations.md).  l_max_ncdm = 20 has
    no convergence test.

    Parameter vector layout is ``EBModel.param_names``:
      k [1/Mpc]; cosmo_row (row of ``tab``, stored as float); table_x_min, table_dx (the uniform
      ln a grid of ``tab``; n_grid is ``tab.shape[-1]``); rho_g0, rho_b0, rho_cdm0, rho_ur0
      (8 pi G rho / 3 today, 1/Mpc^2); per ncdm species s: ncdm_norm_s (rho~_s(a) a^4 =
      norm * sum_i w_i eps_i) and ncdm_m_over_T_s (mass over the species' temperature today);
      with ``de_fluid``, ``de_at_lambda`` or ``de_ppf``: rho_de0, w0, wa, cs2_de.

    ``de_ppf``: the w0-wa dark energy in the parametrised post-Friedmann closure (one state Γ,
    no division by 1 + w, so w(a) may cross -1; equations in models/species/dark_energy_ppf.py).

    ``neutrino_fluid``: "ur", "ncdm" or "ur+ncdm": the massless and/or massive neutrinos as
    fluids, for modes well inside the horizon (models/species/neutrino_fluids.py); the l_max of a
    replaced hierarchy is then unused but kept as given, so that the model records the full
    model it continues.

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
    if neutrino_fluid not in FLUID_FORMS:
        raise ValueError(f"neutrino_fluid must be one of {FLUID_FORMS}, got {neutrino_fluid!r}")
    if int(bool(de_fluid)) + int(bool(de_at_lambda)) + int(bool(de_ppf)) > 1:
        raise ValueError("de_fluid, de_at_lambda and de_ppf are exclusive")
    for name, value, low in (("l_max_g", l_max_g, 4), ("l_max_pol_g", l_max_pol_g, 4),
                             ("l_max_ur", l_max_ur, 4), ("l_max_ncdm", l_max_ncdm, 4)):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    ncdm = tuple(s if isinstance(s, NcdmQuadrature) else NcdmQuadrature(*map(tuple, s))
                 for s in ncdm)

    em = emitters(l_max_g, l_max_pol_g, l_max_ur, ncdm, l_max_ncdm, de_fluid, de_at_lambda,
                  de_ppf, neutrino_fluid)
    return _compose(em, model_args=dict(
        l_max_g=l_max_g, l_max_pol_g=l_max_pol_g, l_max_ur=l_max_ur, l_max_ncdm=l_max_ncdm,
        ncdm=ncdm, de_fluid=de_fluid, de_at_lambda=de_at_lambda, de_ppf=de_ppf,
        neutrino_fluid=neutrino_fluid))


class Emitters(NamedTuple):
    """The emitters of one model configuration.

    ``species``: emission order, which parameters, lines, the Einstein sums and the observables
    follow.  ``owners``: the state layout (public: solvers and initial conditions index it),
    metric and cold species first, then the hierarchies.
    """

    background: Background
    metric: Metric
    species: tuple
    owners: tuple


def emitters(l_max_g, l_max_pol_g, l_max_ur, ncdm, l_max_ncdm, de_fluid, de_at_lambda,
             de_ppf=False, neutrino_fluid="") -> Emitters:
    """One emitter per species for these (validated) arguments of :func:`build_eb_model`.

    The dark energy comes last: the PPF closure reads the other species' Einstein terms."""
    photons, cold = Photons(l_max_g, l_max_pol_g), BaryonsCdm()
    ur = MasslessNeutrinoFluid() if "ur" in neutrino_fluid else MasslessNeutrinos(l_max_ur)
    massive = [MassiveNeutrinoFluid(s, sp) if "ncdm" in neutrino_fluid
               else MassiveNeutrinos(s, sp, l_max_ncdm) for s, sp in enumerate(ncdm)]
    dark = ([DarkEnergyFluid()] if de_fluid else [DarkEnergyAtLambda()] if de_at_lambda
            else [DarkEnergyPPF()] if de_ppf else [])
    metric = Metric()
    return Emitters(Background(), metric, (photons, cold, ur, *massive, *dark),
                    (metric, cold, photons, ur, *massive, *dark))


def _compose(em: Emitters, model_args) -> EBModel:
    """Lay out the states and parameters, let every emitter write its lines, compile."""
    background, metric, species, owners = em
    names = [nm for c in owners for nm in c.states]
    pnames = list(background.params) + [p for c in species for p in c.params]
    if len(set(names)) != len(names) or len(set(pnames)) != len(pnames):
        raise AssertionError("two emitters claim the same state or parameter")
    L = Layout({nm: i for i, nm in enumerate(names)}, {nm: i for i, nm in enumerate(pnames)})
    radiation_names = {nm for c in owners for nm in c.radiation}
    radiation = tuple(i for i, nm in enumerate(names) if nm in radiation_names)

    e = Emitter()
    reads, tab_start, tab_end = background.emit(e, L)
    e.comment("A_X = a^2 rho~_X  [1/Mpc^2]")
    for c in species:
        c.densities(e, L)
    labels = [c.free_streaming for c in species if c.free_streaming]
    if labels:
        e.comment(free_streaming_comment(labels))
    src = Sources()
    for c in species:
        c.moments(e, L, src)
    metric.einstein(e, L, src)
    d = Derivatives()
    metric.equations(e, L, d)
    for c in species:
        c.equations(e, L, d)
    d = d.resolve(names)

    # ---- rhs: the lines, then every state's d/dtau times 1/ℋ, in state order ----------------
    head = ["def rhs(y, x, p, tab):",
            '    """d y / d ln a of the synchronous-gauge EB system (generated by models/eb.py)."""']
    body = list(e.lines)
    body.append("    # derivatives: (d/dtau) / ℋ")
    for nm in names:
        body.append(f"    d_{nm} = ({d[nm]}) * icH")
    ret = "    return (" + ", ".join(f"d_{nm}" for nm in names) + ",)"
    rhs_src = "\n".join(head + body + [ret])

    # ---- observables (same intermediates) -----------------------------------------------------
    obs = Observables()
    background.observables(L, obs)
    metric.summed_observables(L, obs, src)
    for c in species:
        c.observables(L, obs)
    ob = ["def observables(y, x, p, tab):",
          '    """CLASS-format transfer quantities (generated by models/eb.py)."""']
    ob += list(e.lines) + obs.lines.lines
    ob.append("    return {" + ", ".join(f"{key!r}: {val}" for key, val in obs.items()) + "}")
    source = rhs_src + "\n\n\n" + "\n".join(ob) + "\n"

    rhs, observables = _compile(source, jnp, None)
    split = table_split(body[:tab_start], reads, body[tab_end:], ret)
    rhs.table_split = split  # the protocol a solver looks for (models.tables.TableSplit)
    jacobian = build_linear_jacobian(rhs_src, split.device_source,
                                     {"M": jnp, "T": _tables.JAX_TABLE_OPS}, {"M": math})
    rhs.linear_jacobian = jacobian  # J without sweeps (models.linear_jacobian.LinearJacobian)
    return EBModel(source=source, rhs=rhs, observables_fn=observables, n=len(names),
                   state_names=tuple(names), param_names=tuple(pnames),
                   table_columns=TABLE_COLUMNS, radiation_indices=radiation,
                   table_split=split, linear_jacobian=jacobian, **model_args)


def rhs_source_only(model: EBModel) -> str:
    """The ``rhs`` function's source alone (without ``observables``), e.g. for the GPU target."""
    return model.source.split("\n\n\ndef observables")[0] + "\n"
