"""P(k, z), sigma8 and transfer functions — and the background observables (H, D_A, D_M, growth)
and derived numbers (100θ_s, r_d, z_d, age, ...) the CLI writes beside them — as differentiable
JAX functions of the cosmological parameters, and their exact Jacobian by forward sensitivities.

The derivative is of the whole computation, not of the perturbation solve alone::

    θ → CosmoParams → background H(a), τ(a)  ┐
                    → thermodynamics κ', c_s² (recombination, z_reio from tau_reio) ┘→ table
                    → per-mode parameter rows (densities, ncdm normalisation, fluid w0, wa)
                    → adiabatic initial states
                    → solve_diff (joint [y, S] solve under differentiation) → transfers → P, σ8
    θ → CosmoParams → distances (H, D_A, D_M, f) and, with the table's z_rec, z_drag, ...,
                      derived numbers (boltzmann.derived)

The arrows are the stages themselves, in their traceable form (``tables.tables_one``,
``perturbations.mode_inputs``, ``solve_modes``, ``transfers_of_states``,
``spectra.power_spectra``) on an ensemble of one cosmology. ``solver.solve_diff`` supplies the
tangent of the solve with respect to the initial states, the parameter rows and the table (its
tangent enters the joint RHS linearly). Forward mode over θ therefore asks the solver for one
sensitivity direction per parameter the solve depends on, in one joint solve per k-chunk: the
primordial parameters (A_s, n_s) leave the solve's inputs unchanged, so they get none
(``ParameterMap.solve_directions``; their derivatives come from the outputs stage alone).
``jacobian`` runs it as three compiled programs (inputs and their tangents, the solve, the
outputs' jvp) chained by the chain rule, each far smaller for XLA to compile than
``jax.jacfwd`` of the whole function.

What is held fixed (not differentiated), and why:
* the k grid in 1/Mpc (P in Mpc³): ∂/∂h is at fixed k [1/Mpc], as in CLASS's FD with k in 1/Mpc;
* the start time x_ini = ln a_ini of each mode, fixed at its fiducial value: it is a numerical
  choice (the growing-mode series is accurate to ~1e-8 there), and the state's dependence on θ at
  that fixed time is carried by the initial conditions (``modes.initial_states_at``);
* YHe, T_cmb, k_pivot, T_ncdm, deg_ncdm (inputs, but not in the parameter list below).

Parameters (``PARAMETERS``; names as in the config): h, omega_b, omega_cdm, ln10^{10}A_s (or
A_s), n_s, tau_reio, m_ncdm (all massive species together: each m_i moves by the same amount;
``m_ncdm[i]`` for one species), N_ur, w0_fld, wa_fld.

Dark energy at the Λ point.  The c_s² = 1 fluid is singular at w = −1 (its equations divide by
1 + w) and its effect is not linear in the direction of (δw0, δwa), so only directional
derivatives exist there.  Asking for w0_fld/wa_fld in a Λ config therefore switches the
background to the w0–wa fluid at w0 = −1, wa = 0 (the same expansion as Λ) and the perturbations
to ``models.eb``'s ``de_at_lambda`` form: the fluid linearised about Λ along the two well-posed
directions (1, 0) (constant w) and (1, 1) (CPL with 1 + w = s(2 − a)), in the regular variables
δ/(1+w) and θ.  Values equal Λ's exactly; the derivatives are ∂/∂w0 = D_(1,0) and
∂/∂wa = D_(1,1) − D_(1,0), which is how CLASS's finite-difference reference is defined
(tests/data/class_dlnpk_dtheta.yaml).  Dropping the fluid perturbations instead ("smooth dark
energy") is wrong in synchronous gauge: the fluid's δ is sourced by −(1+w) h'/2 at every k, and
leaving it out changed ∂ln P/∂w0 at k = 1 h/Mpc from −0.495 (CLASS) to −0.295.  In a config that
already has a fluid the fluid model is differentiated as is: with ``use_ppf`` (the default) the
PPF closure (Fang, Hu & Lewis 2008, models/species/dark_energy_ppf.py), which has no singularity,
so ∂/∂w0 and ∂/∂wa exist at every (w0, wa), Λ's (−1, 0) included (tests/test_ppf.py); with
``use_ppf: false`` the rest-frame fluid (w ≠ −1 everywhere).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from solver import sec_weight
from solver.backends.registry import resolve_backend
from solver.persisted import PersistedProgram

from . import derived as derived_mod
from . import distances, fluid_phases, k_sampling, modes
from .gradients_ahead import AheadOfCall, parallel_solves, run_on_host, solve_sharding
from .params import ConfigError, CosmoParams
from .perturbations import (MAX_STEPS, chunk_groups, mode_inputs, observables,
                            solve_modes, solve_modes_with_tangents, transfers_of_states)
from .runtime import require_float64
from .spectra import power_spectra
from .tables import DERIVED, compute_tables, host_cpu, tables_one, thermodynamics_on
from .theta import PARAMETERS, ParameterMap, available_parameters, jvps_along, widen
from .theta import one as _one

log = logging.getLogger(__name__)

__all__ = ["PARAMETERS", "PowerSpectrumFunction", "available_parameters", "DERIVED_OUTPUTS",
           "BACKGROUND_OUTPUTS"]

#: derived numbers (classy's names, ``boltzmann.derived``) among the outputs by default
DERIVED_OUTPUTS = ("100*theta_s", "100*theta_star", "rs_d", "z_d", "z_star", "z_rec", "z_reio",
                   "age", "conformal_age", "Omega_m", "Neff")
#: background observables at ``z_background`` among the outputs: H [1/Mpc], D_A, D_M, D_H
#: [Mpc], growth rate f and factor D (``boltzmann.distances``, as background.csv has them)
BACKGROUND_OUTPUTS = ("H", "D_A", "D_M", "D_H", "f", "D")


#: k-chunks of a PowerSpectrumFunction on the JAX backend (the main job's are
#: ``perturbations.N_CHUNKS_JAX``): smaller lock-step chunks spend fewer steps on modes that
#: have finished, and two groups of them run at the same time on a multi-core CPU. The
#: ``--gradients`` second run on the 2-core CPU: 53.4 s with 4 chunks, 37.5 s with 8, 45.3 s
#: with 16 (solve 33.4, 20.3, 27.2 s; docs/benchmarks.md)
N_CHUNKS_JACOBIAN_JAX = 8


class PowerSpectrumFunction(AheadOfCall):
    """θ ↦ {P_m, P_cb (n_z, n_k) [Mpc³], sigma8, sigma8_cb (n_z,), d_m (n_z, n_k), background
    observables (n_zb,), derived numbers ()} for one config.

    ``f = PowerSpectrumFunction(config)``; ``f.theta0`` is the fiducial vector (order
    ``f.parameters``); ``f(theta)`` evaluates (jit-able, differentiable); ``f.jacobian(theta)``
    returns values and ∂(output)/∂θ by forward mode (one joint solve with a direction per
    non-primordial parameter per k-chunk; ``jax.jacfwd(f)`` gives the same); ``f.dlnpk(theta)``
    the ∂ln P_m/∂θ table the CLI writes.

    Outputs besides the spectra, each differentiable in θ like them:

    * σ8 integrates P(k) over 1e-3..5 h/Mpc whatever ``k`` asks for: the modes it needs beyond
      the request are solved along (``modes.sigma8_grid``, as the CLI does; ``f.k_axis`` are
      all those wavenumbers, ``f.keep`` where the requested ones sit) and P(k), d_m are
      reported on the request only;
    * with ``precision.k_solve_stride`` > 1 only ``f.k_solve`` (``f.sampling.solved`` of
      ``f.k_axis``) are solved, as ``run_ensemble`` does, and P, d_m at the others come from
      the spline of ln P (ln|d_m|) in ln k through them (``boltzmann.k_sampling``): the same
      linear map carries the tangents, so ∂ln P/∂θ is the spline of the solved ones;
    * ``BACKGROUND_OUTPUTS`` at the redshifts ``f.z_background``: "H" [1/Mpc], "D_A", "D_M",
      "D_H" [Mpc], "f" (dln D/dln a), "D" (growth factor, D(0) = 1) — ``boltzmann.distances``,
      the functions background.csv is written with;
    * the derived numbers ``derived`` (classy's names: "100*theta_s", "rs_d" [Mpc], "z_d",
      "age" [Gyr], ...), from ``boltzmann.derived.derived_parameters`` with the thermodynamic
      redshifts of the same tables the perturbations use — summary.json's numbers.

    Options: ``parameters`` (subset/order of PARAMETERS and the extra names ``theta.parse_name`` takes),
    ``k`` [1/Mpc] and ``z`` override the config's output grid, ``z_background`` the redshifts of
    the background outputs (default: the config's ``output.z_background``, else ``z``; ``()``
    for none), ``derived`` the derived names (default ``DERIVED_OUTPUTS``; any of
    ``boltzmann.derived.NAMES`` but σ8's, which are outputs of their own), ``rtol`` overrides
    the precision's, ``n_chunks`` splits the modes (sorted by k) into that many solves (default:
    1 on the CUDA backend, whose solves run in turn, each as long as its slowest mode;
    ``N_CHUNKS_JACOBIAN_JAX`` lock-step solves on the JAX backend),
    ``with_sigma8=False`` drops σ8 and its extra modes, ``sensitivity_error_control`` (True = 1,
    False = 0 or a weight in between; default: the precision's ``sensitivity_error_weight``)
    and ``backend`` ("jax", "cuda" or "auto") are passed to ``solve_diff`` (docs/gradients.md).
    """

    #: step limit of each mode's solve
    MAX_STEPS = MAX_STEPS

    def __init__(self, config, *, parameters: Sequence[str] = PARAMETERS, k=None, z=None,
                 rtol: float | None = None, atol: float | None = None,
                 n_chunks: int | None = None,
                 sensitivity_error_control: bool | float | None = None,
                 with_sigma8: bool = True,
                 backend: str = "jax", z_background=None,
                 derived: Sequence[str] = DERIVED_OUTPUTS):
        require_float64()
        self.config = config
        self.backend = backend
        self.last_stage_seconds = None   # the last jacobian()'s wall seconds per stage
        if sensitivity_error_control is None:
            sensitivity_error_control = config.precision.sensitivity_error_weight
        self.sensitivity_error_control = sec_weight(sensitivity_error_control)
        self._map = ParameterMap(config.cosmology, parameters)
        self.parameters = self._map.names
        prec = config.precision
        # w0/wa derivatives of a Λ config: fluid background at (-1, 0), fluid perturbations
        # linearised about Λ (module docstring)
        self.de_at_lambda = self._map.de_at_lambda
        cosmo = self._map.cosmo0
        self.model = modes.model_for(cosmo, prec, de_at_lambda=self.de_at_lambda)
        self.cosmo0 = cosmo
        self.rtol = float(prec.rtol if rtol is None else rtol)
        self.atol = float(prec.atol if atol is None else atol)
        self.grid = modes.make_grid(prec)
        self.k = np.asarray(config.output.k_grid(float(cosmo.h)) if k is None else k, np.float64)
        if self.k.ndim != 1 or self.k.size == 0 or np.any(self.k <= 0):
            raise ValueError(f"k must be a 1-d array of positive wavenumbers [1/Mpc], got shape "
                             f"{self.k.shape}")
        self.z = [float(v) for v in (config.output.z if z is None else z)]
        if z_background is None:
            z_background = config.output.z_background or self.z
        self.z_background = np.asarray(z_background, np.float64).reshape(-1)
        self.derived = _derived_names(derived)
        self.x_save, _ = modes.save_times(self.z)
        self.weights = modes.error_weights(self.model, prec.baryon_error_weight)
        self.k_axis, self.keep = _solve_grid(self.k, float(cosmo.h), bool(with_sigma8))
        self.with_sigma8 = bool(with_sigma8) and self.k_axis.size >= 5
        #: the modes solved (all, or fewer above ``k_solve_dense_below``: module k_sampling)
        self.sampling = k_sampling.choose(self.k_axis[None], None, [float(cosmo.h)], prec)
        self.k_solve = self.k_axis[self.sampling.solved]
        # fixed start times from the fiducial cosmology (see module docstring)
        rows0 = modes.mode_rows(self.model, _one(cosmo), self.k_solve[None], self.grid)
        self.x0, _ = modes.initial_states(self.model, rows0, prec.k_tau_ini, prec.omega_tau_ini)
        modes.check_start_times(self.x0, self.grid, self.x_save, prec)
        #: the neutrino-fluid switches (boltzmann.fluid_phases), held fixed at the fiducial
        #: cosmology's times like the start times; empty unless a precision key asks for them
        self._phases = self._fluid_plan(cosmo, rows0, prec)
        order = np.argsort(self.k_solve)
        if n_chunks is None:
            n_chunks = N_CHUNKS_JACOBIAN_JAX if resolve_backend(backend).name == "jax" else 1
        n_chunks = max(1, min(int(n_chunks), self.k_solve.size))
        size = int(math.ceil(self.k_solve.size / n_chunks))
        self._chunks = [order[c:c + size] for c in range(0, self.k_solve.size, size)]
        #: the Jacobian's solve program's index arguments (None: the chunks as they are, a
        #: non-JAX backend): one group per solve run at the same time (``_solve_groups``)
        self._chunk_groups = (chunk_groups(self._chunks, parallel_solves())
                              if resolve_backend(backend).name == "jax" and not self._phases
                              else None)
        self.theta0 = self._map.theta0
        self._jit_value = jax.jit(self._evaluate)
        # the same value as two programs, θ → inputs (placed on the host CPU) and inputs → outputs
        self._jit_stage_inputs = jax.jit(self._stage_inputs)
        self._jit_solve_outputs = jax.jit(self._solve_and_outputs)
        #: compute θ → (tables, rows, initial states) and their tangents on the host CPU when the
        #: default device is an accelerator: the tables' 4000-node sequential scan runs at
        #: kernel-launch latency on a GPU (boltzmann.tables.HOST_TABLES_MAX); None: the default
        self.inputs_on_host = host_cpu() is not None
        self._jit_background = jax.jit(self._background_at)
        # the Jacobian as three programs, chained by explicit tangents (``jacobian``); their
        # traced forms persisted (solver.persisted) when a program store is set: a later
        # process skips tracing them (~20 s on the CPU for configs/lcdm.yaml, docs/benchmarks.md)
        self._construction = (repr(config), tuple(self.parameters), self.k.tobytes(),
                              tuple(self.z), self.z_background.tobytes(), tuple(self.derived),
                              self.rtol, self.atol, self.sensitivity_error_control,
                              bool(with_sigma8), n_chunks)
        #: keyword arguments that rebuild this function on another backend object (the
        #: sensitivity kernel's helper process, ``boltzmann.kernel_helper``)
        self.construction_kwargs = dict(
            parameters=tuple(self.parameters), k=self.k, z=tuple(self.z), rtol=self.rtol,
            atol=self.atol, n_chunks=n_chunks,
            sensitivity_error_control=self.sensitivity_error_control,
            with_sigma8=bool(with_sigma8), z_background=self.z_background,
            derived=tuple(self.derived))
        self._jit_inputs_jvp = self._persisted(self._inputs_and_tangents, "inputs")
        self._jit_solve_jvp = self._persisted(self._solve_and_tangents, "solve")
        self._jit_outputs_jvp = self._persisted(self._outputs_and_tangents, "outputs")

    def _fluid_plan(self, cosmo, rows0, prec) -> list:
        """``fluid_phases.plan`` of the solve's modes at the fiducial cosmology's tables (computed
        here only when ``ur_fluid_k_tau`` or ``ncdm_fluid_k_tau`` is set)."""
        if float(prec.ur_fluid_k_tau) <= 0.0 and float(prec.ncdm_fluid_k_tau) <= 0.0:
            return []
        table = compute_tables(_one(cosmo), self.grid, self.model).model_table
        rows0 = np.asarray(rows0)
        return fluid_phases.plan(self.model, table, self.grid,
                                 rows0[:, self.model.param_index("k")],
                                 rows0[:, self.model.param_index("cosmo_row")], prec, self.x_save)

    def _persisted(self, method, stage: str) -> PersistedProgram:
        """``jax.jit(method)``, persisted under a key of everything the constructor was given
        (with the project's code, which ``PersistedProgram`` adds): two objects built alike trace
        the same program. The inputs and outputs programs run no solver, so they are keyed
        whatever the backend: the CLI gives a ``CudaBackend`` object, and a later process would
        otherwise trace the inputs program again (26 s of a 32-s Jacobian on an H100,
        docs/benchmarks.md). Not keyed (plain jit): the solve of a backend given as an object
        (its options are not in the key) and the CUDA backend's solve, whose host callback
        cannot be exported."""
        def parts():
            if stage == "solve" and not isinstance(self.backend, str):
                raise TypeError("backend object: its options are not part of the solve's key")
            if stage == "solve" and self.backend_name != "jax":
                raise TypeError("the sensitivity solve's host callback is not exportable")
            return ("boltzmann.gradients", type(self).__name__, stage, self.backend_name,
                    self.MAX_STEPS, *self._construction)
        return PersistedProgram(method, parts, name=f"gradients.{stage}")

    @property
    def solve_directions(self) -> np.ndarray:
        """Indices of ``parameters`` whose directions the Jacobian's joint solve integrates
        (``theta.ParameterMap.solve_directions``: all but the primordial ones)."""
        return self._map.solve_directions

    @property
    def fluid_phases(self) -> list:
        """The neutrino-fluid switches its solves run (``fluid_phases.plan``; empty: none)."""
        return self._phases

    @property
    def backend_name(self) -> str:
        """The backend the solves run on ("jax" or "cuda")."""
        return resolve_backend(self.backend).name

    def cosmology(self, theta) -> CosmoParams:
        """The CosmoParams at θ (leaves may be tracers)."""
        return self._map.cosmology(theta)

    # -- the computation: the stages on an ensemble of one
    def _tables(self, theta):
        """(cosmology at θ stacked as an ensemble of one, its table (1, …), its thermodynamic
        redshifts {tables.DERIVED name: (1,)})."""
        cosmo = _one(self.cosmology(theta))
        table, thermo = jax.vmap(lambda c: tables_one(c, self.grid, self.model))(cosmo)
        return cosmo, table, thermo

    def _solve_inputs(self, theta):
        """(cosmology at θ stacked as an ensemble of one, its table (1, …))."""
        cosmo, table, _ = self._tables(theta)
        return cosmo, table

    # the stages θ → inputs → solve → outputs; ``_evaluate`` composes them
    def _stage_inputs(self, theta):
        """θ → (table (1, …), rows, y0, background and derived outputs): what the solve and the
        outputs read. The background outputs depend on θ and the thermodynamics alone, so they
        are computed here, with the tables (on the host CPU on an accelerator: a few quadratures
        that would otherwise run as small GPU kernels after the solve)."""
        cosmo, table, thermo = self._tables(theta)
        rows, y0 = mode_inputs(table, cosmo, self.k_solve[None], self.x0, self.model, self.grid)
        return table, rows, y0, self._background(self.cosmology(theta), thermo)

    def _stage_solve(self, table, rows, y0):
        """The modes' states at the save times (``solve_diff``: differentiable)."""
        return solve_modes(table, rows, y0, self.x0, self.z, self.model, rtol=self.rtol,
                           atol=self.atol, chunks=self._chunks, backend=self.backend,
                           sensitivity_error_control=self.sensitivity_error_control,
                           max_steps=self.MAX_STEPS,
                           weights=self.weights, phases=self._phases)

    def _stage_outputs(self, theta, ys, rows, table, background):
        """The outputs from θ, the solved states and the background outputs."""
        cosmo = _one(self.cosmology(theta))
        fields = transfers_of_states(ys, rows, table, self.k_solve[None], self.z, self.model)
        spec = power_spectra(fields, self.k_axis[None], cosmo, with_sigma8=self.with_sigma8,
                             sampling=self.sampling)
        keep = self.keep
        out = {"P_m": spec["P_m"][0][:, keep], "P_cb": spec["P_cb"][0][:, keep],
               "d_m": self.sampling.fill_transfer(fields["d_m"][0])[:, keep]}
        if self.with_sigma8:
            out["sigma8"] = spec["sigma8"][0]
            out["sigma8_cb"] = spec["sigma8_cb"][0]
        out.update(background)
        return out

    def _evaluate(self, theta):
        table, rows, y0, background = self._stage_inputs(theta)
        return self._stage_outputs(theta, self._stage_solve(table, rows, y0), rows, table,
                                   background)

    def _solve_and_outputs(self, theta, table, rows, y0, background):
        return self._stage_outputs(theta, self._stage_solve(table, rows, y0), rows, table,
                                   background)

    def _host_inputs(self, program, theta):
        """``program(theta)`` on the host CPU, its result moved to the default device; or run
        where it is when the inputs are not placed on the host (``inputs_on_host``)."""
        cpu, theta = self._inputs_theta(theta)
        return run_on_host(program, theta, cpu)

    # the Jacobian by the chain rule over the stages, one compiled program each
    def _solve_inputs_and_thermo(self, theta):
        """((table, rows, y0), the thermodynamic redshifts): the inputs stage less the
        background outputs."""
        cosmo, table, thermo = self._tables(theta)
        rows, y0 = mode_inputs(table, cosmo, self.k_solve[None], self.x0, self.model, self.grid)
        return (table, rows, y0), thermo

    def _inputs_and_tangents(self, theta):
        """(inputs, their tangents with the direction axis first): the tables, rows and initial
        states along the solve's directions only (``ParameterMap.solve_directions``: their
        tangents along a primordial parameter are zero), the background outputs along every
        parameter (the derived numbers include A_s and n_s)."""
        S = self._map.solve_directions
        (solve_in, thermo), (dsolve_in, dthermo) = jvps_along(self._solve_inputs_and_thermo,
                                                              theta, S)
        background, dbackground = jax.vmap(
            lambda e, dt: jax.jvp(lambda th, tm: self._background(self.cosmology(th), tm),
                                  (theta, thermo), (e, dt)),
            out_axes=(None, 0))(jnp.eye(theta.size, dtype=theta.dtype),
                                widen(dthermo, S, theta.size))
        return (*solve_in, background), (*dsolve_in, dbackground)

    def _solve_and_tangents(self, table, rows, y0, dtable, drows, dy0, index=None):
        """(states, their tangents (m, …)) from ONE joint sensitivity solve with the m directions
        (``solver.solve_with_tangents``: the states are the joint solve's own, so no plain
        solve runs beside it); ``index``: the chunks to solve (one of
        ``_chunk_groups``; the others' modes come back zero), None: all."""
        return solve_modes_with_tangents(
            table, rows, y0, dtable, drows, dy0, self.x0, self.z, self.model, rtol=self.rtol,
            atol=self.atol, chunks=self._chunks if index is None else index, backend=self.backend,
            sensitivity_error_control=self.sensitivity_error_control, max_steps=self.MAX_STEPS,
            weights=self.weights, phases=self._phases)

    def _outputs_and_tangents(self, theta, ys, rows, table, background, dys, drows, dtable,
                              dbackground):
        """(outputs, ∂outputs/∂θ with θ's axis last, as ``jax.jacfwd`` lays it out); ``dys``,
        ``drows``, ``dtable`` along the solve's directions, ``dbackground`` along all."""
        eye = jnp.eye(theta.size, dtype=theta.dtype)
        dys, drows, dtable = widen((dys, drows, dtable), self._map.solve_directions, theta.size)
        return jax.vmap(
            lambda e, a, b, c, d: jax.jvp(self._stage_outputs,
                                          (theta, ys, rows, table, background), (e, a, b, c, d)),
            out_axes=(None, -1))(eye, dys, drows, dtable, dbackground)

    def _background(self, cosmo, thermo) -> dict:
        """The background observables at ``z_background`` and the derived numbers of one
        cosmology (the CLI's functions: background.csv's and summary.json's)."""
        out = {}
        if self.z_background.size:
            z = jnp.asarray(self.z_background)
            D, f = distances.growth(cosmo, z)
            out.update(H=distances.hubble(cosmo, z), D_A=distances.angular_distance(cosmo, z),
                       D_M=distances.transverse_comoving_distance(cosmo, z),
                       D_H=distances.hubble_distance(cosmo, z), f=f, D=D)
        if self.derived:
            values = derived_mod.derived_parameters(
                cosmo, {name: v[0] for name, v in thermo.items()})
            if self.de_at_lambda:   # the fluid at w = -1 stands for Λ (module docstring)
                values["Omega_Lambda"] = values["Omega0_lambda"] = values["Omega_fld"]
                values["Omega_fld"] = values["Omega0_fld"] = jnp.zeros(())
            out.update({name: values[name] for name in self.derived})
        return out

    def _background_at(self, theta):
        """``_background`` with the thermodynamics alone (no perturbation table to build)."""
        cosmo = self.cosmology(theta)
        if not self.derived:    # the distances need no thermodynamics
            return self._background(cosmo, {})
        th = thermodynamics_on(cosmo, self.grid)
        return self._background(cosmo, {name: jnp.reshape(getattr(th, name), (1,))
                                        for name in DERIVED})

    def background(self, theta=None) -> dict:
        """The background and derived outputs alone at θ (no perturbation solve): the same
        numbers as in ``f(theta)``, a cheap differentiable function of θ for BAO/SN-type
        likelihoods (``jax.jacfwd(f.background)`` works)."""
        return self._jit_background(self.theta0 if theta is None
                                    else jnp.asarray(theta, jnp.float64))

    def _observables(self, ys, rows, table):
        """The model's observables of states ys (n_k, n_save, n) at the save times."""
        return observables(self.model, ys, self.x_save, rows, table, compiled=False)

    def sensitivity_problem(self, theta=None) -> dict:
        """The perturbation solve that ``jacobian`` differentiates, as explicit arrays: the solve's
        inputs at θ and their tangents along each parameter (dy0 (m, n_k, n), dparams (m, n_k, P),
        dargs (m, 1, …) for the table), with the solve options — the keyword arguments of
        ``solver.sensitivity.joint_solve`` (plus ``rhs``), e.g. to count a direction's steps
        (scripts/sensitivity_steps.py).  Its modes are ``k_solve``: ``k_axis`` (the requested
        ``k`` sit at ``keep``; the others are σ8's) or, with ``k_solve_stride`` > 1, its
        ``sampling.solved``.  ``observables(ys, rows, table)`` maps a solve's states
        (n_k, n_save, n) to the model's observables at the save times."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)

        def inputs(th):
            cosmo, table = self._solve_inputs(th)
            rows = modes.mode_rows(self.model, cosmo, self.k_solve[None], self.grid)
            return modes.initial_states_at(self.model, rows, self.x0), rows, table

        (y0, rows, table), tangents = jax.jit(
            lambda th: (inputs(th), jax.jacfwd(inputs)(th)))(theta)
        dy0, drows, dtable = (jnp.moveaxis(t, -1, 0) for t in tangents)
        return dict(rhs=self.model.rhs, y0=y0, t_save=self.x_save, params=rows, args=table,
                    dy0=dy0, dparams=drows, dargs=dtable, t0=self.x0, rtol=self.rtol,
                    atol=self.atol, error_weights=self.weights, max_steps=self.MAX_STEPS,
                    observables=self._observables)

    def __call__(self, theta=None) -> dict:
        """Outputs at θ (default: the fiducial); NaN where a mode failed. Traceable (jit, jvp,
        jacfwd, vmap: one program); a concrete θ on an accelerator runs the inputs stage on the
        host CPU (``inputs_on_host``) and the solve and outputs on the device."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        if isinstance(theta, jax.core.Tracer) or not (self.inputs_on_host and host_cpu()):
            return self._jit_value(theta)
        table, rows, y0, background = self._host_inputs(self._jit_stage_inputs, theta)
        return self._jit_solve_outputs(theta, table, rows, y0, background)

    def jacobian(self, theta=None, *, release_inputs: bool = False) -> tuple[dict, dict]:
        """(values, jac): jac[name] has the output's shape + (len(θ),).

        ``release_inputs``: drop the inputs program from memory (``jax.clear_caches``) once it
        has run, before the solve program compiles or loads — for a process that computes one
        Jacobian (the CLI): on the 2-core CPU the first run's peak fell by 0.4–0.8 GiB
        (docs/benchmarks.md); a caller that will call again keeps it (the default).

        Forward mode through the stages as three compiled programs chained by explicit
        tangents — θ → (table, rows, y0) with their len(θ) tangents; the solve with one joint
        sensitivity solve; the outputs' jvp — the same arithmetic as ``jax.jacfwd(f)`` (one
        program), whose single XLA compile of everything at once took several times the memory
        and longer than the three pieces on the CPU (docs/gradients.md). The values come from
        the joint solve (the steps that also control the sensitivities; on the CUDA backend
        the sensitivity kernel's direction-0 threads), so they equal ``f(theta)``'s to the
        solver tolerance, and ∂P/∂θ is exactly consistent with them."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        t0 = time.perf_counter()
        (table, rows, y0, background), (dtable, drows, dy0, dbackground) = (
            jax.block_until_ready(self._host_inputs(self._jit_inputs_jvp, theta)))
        if release_inputs:
            self._wait_for_preload()      # jax.clear_caches must not meet a load in progress
            self._jit_inputs_jvp.release()
        t1 = time.perf_counter()
        # committed to one device, as ``preload`` lowers the program: otherwise a stored
        # executable would be looked up under another key than the one loaded ahead
        solve_args = jax.device_put((table, rows, y0, dtable, drows, dy0), solve_sharding())
        self._wait_for_kernel_helper()
        ys, dys = self._solve_groups(solve_args)
        t2 = time.perf_counter()
        out = jax.block_until_ready(self._jit_outputs_jvp(theta, ys, rows, table, background,
                                                          dys, drows, dtable, dbackground))
        # wall seconds per stage (the first call's include tracing and compiling): what bounds
        # a Jacobian, reported by the CLI's summary.json
        self.last_stage_seconds = {"inputs": t1 - t0, "solve": t2 - t1,
                                   "outputs": time.perf_counter() - t2}
        return out

    def value(self, theta=None) -> dict:
        """The outputs at θ, as calling the object does."""
        return self(theta)

    def value_and_jacobian(self, theta=None) -> tuple[dict, dict]:
        """(values, jac): the name for what ``jacobian`` returns."""
        return self.jacobian(theta)

    def dlnpk(self, theta=None, *, release_inputs: bool = False) -> dict:
        """Values and ∂ln P_m/∂θ, ∂ln P_cb/∂θ (n_z, n_k, n_θ), ∂ln σ8/∂θ (n_z, n_θ), the
        background and derived outputs (``background``: {name: value}) and their plain
        derivatives (``dbackground``: {name: output shape + (n_θ,)}), with wall times; raises
        RuntimeError naming the wavenumbers where the solve failed."""
        t0 = time.perf_counter()
        val, jac = self.jacobian(theta, release_inputs=release_inputs)
        val = {k: np.asarray(v) for k, v in val.items()}
        jac = {k: np.asarray(v) for k, v in jac.items()}
        wall = time.perf_counter() - t0
        bad = ~np.all(np.isfinite(jac["P_m"]), axis=(0, 2)) | ~np.all(np.isfinite(val["P_m"]),
                                                                      axis=0)
        if np.any(bad):
            raise RuntimeError("gradients: the sensitivity solve failed (non-finite) at k = "
                               + ", ".join(f"{k:.4g}" for k in self.k[bad]) + " 1/Mpc")
        if "sigma8" in val and not (np.all(np.isfinite(val["sigma8"]))
                                    and np.all(np.isfinite(jac["sigma8"]))):
            raise RuntimeError("gradients: σ8 is not finite: a mode added for its k range "
                               f"({self.k_solve[0]:.3g}..{self.k_solve[-1]:.3g} 1/Mpc) failed; "
                               "tighten rtol or pass with_sigma8=False")
        out = {"k": self.k, "z": self.z, "parameters": self.parameters,
               "theta": np.asarray(self.theta0 if theta is None else theta), "P_m": val["P_m"],
               "P_cb": val["P_cb"],
               "dlnP_m": jac["P_m"] / val["P_m"][..., None],
               "dlnP_cb": jac["P_cb"] / val["P_cb"][..., None], "seconds": wall}
        if "sigma8" in val:
            out["sigma8"] = val["sigma8"]
            out["dlnsigma8"] = jac["sigma8"] / val["sigma8"][:, None]
            out["dlnsigma8_cb"] = jac["sigma8_cb"] / val["sigma8_cb"][:, None]
        names = [n for n in (*BACKGROUND_OUTPUTS, *self.derived) if n in val]
        out["background"] = {n: val[n] for n in names}
        out["dbackground"] = {n: jac[n] for n in names}   # output shape + (n_θ,)
        return out


def _solve_grid(k: np.ndarray, h: float, with_sigma8: bool) -> tuple[np.ndarray, np.ndarray]:
    """(wavenumbers to solve, ascending; index of each requested k in them): the request plus,
    for σ8, the modes ``modes.sigma8_grid`` adds below and above it (one grid in 1/Mpc, held
    fixed while h moves: its range has the margin ``SIGMA8_K_RANGE_H`` describes)."""
    if not with_sigma8:
        return k, np.arange(k.size)
    order = np.argsort(k, kind="stable")
    k_all, _, keep_sorted = modes.sigma8_grid(k[order][None], None, [h])
    keep = np.empty(k.size, np.int64)
    keep[order] = keep_sorted
    return k_all[0], keep


def _derived_names(names) -> tuple:
    """The derived outputs asked for, checked against ``boltzmann.derived.NAMES``."""
    names = tuple(names)
    unknown = [n for n in names if n not in derived_mod.NAMES]
    if unknown:
        raise ConfigError(f"gradients: unknown derived number(s) {unknown}; known: "
                          + ", ".join(derived_mod.NAMES))
    own = [n for n in names if n.startswith(("sigma8", "S8"))]
    if own:
        raise ConfigError(f"gradients: {own} are not derived outputs: σ8 is the output "
                          "'sigma8' (at every z; S8 = sigma8[z=0] (Omega_m/0.3)^1/2 from it)")
    return names
