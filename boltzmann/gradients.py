"""P(k, z), sigma8 and transfer functions as differentiable JAX functions of the cosmological
parameters, and their exact Jacobian by forward sensitivities.

The derivative is of the whole computation, not of the perturbation solve alone::

    θ → CosmoParams → background H(a), τ(a)  ┐
                    → thermodynamics κ', c_s² (recombination, z_reio from tau_reio) ┘→ table
                    → per-mode parameter rows (densities, ncdm normalisation, fluid w0, wa)
                    → adiabatic initial states
                    → solve_diff (joint [y, S] solve under differentiation) → transfers → P, σ8

The arrows are the stages themselves, in their traceable form (``tables.tables_one``,
``perturbations.differentiable_transfers``, ``spectra.power_spectra``) on an ensemble of one
cosmology. ``solver.solve_diff`` supplies the tangent of the solve with
respect to the initial states, the parameter rows and the table (its tangent enters the joint
RHS linearly).  ``jax.jacfwd`` over θ therefore asks the solver for exactly len(θ) sensitivity
directions in one joint solve per k-chunk.

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
leaving it out changed ∂ln P/∂w0 at k = 1 h/Mpc from −0.495 (CLASS) to −0.295.  PPF (Fang, Hu &
Lewis 2008) would remove the singularity altogether and is not implemented.  In a config that
already has a fluid (w ≠ −1 everywhere) the fluid model is differentiated as is.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from solver.backends.registry import resolve_backend

from . import modes
from .params import ConfigError, CosmoParams
from .perturbations import MAX_STEPS, differentiable_transfers, observables
from .runtime import require_float64
from .spectra import power_spectra
from .tables import tables_one

__all__ = ["PARAMETERS", "PowerSpectrumFunction", "available_parameters"]

#: the issue's parameter list, in this order (config names)
PARAMETERS = ("h", "omega_b", "omega_cdm", "ln10^{10}A_s", "n_s", "tau_reio", "m_ncdm", "N_ur",
              "w0_fld", "wa_fld")


def available_parameters(cosmo) -> tuple:
    """The PARAMETERS a cosmology can be differentiated in (m_ncdm only with massive species)."""
    return tuple(p for p in PARAMETERS if p != "m_ncdm" or cosmo.n_ncdm > 0)

_SCALARS = ("h", "omega_b", "omega_cdm", "A_s", "n_s", "tau_reio", "N_ur", "w0_fld", "wa_fld",
            "YHe", "T_cmb", "k_pivot")


def _parse_name(name: str):
    """('scalar', leaf) | ('ln10As', None) | ('m_all', None) | ('m_one', i)."""
    if name == "ln10^{10}A_s":
        return "ln10As", None
    if name == "m_ncdm":
        return "m_all", None
    if name.startswith("m_ncdm[") and name.endswith("]"):
        try:
            return "m_one", int(name[7:-1])
        except ValueError:
            pass
    if name in _SCALARS:
        return "scalar", name
    raise ConfigError(f"gradients: unknown parameter {name!r}; allowed: {', '.join(PARAMETERS)}, "
                      "A_s, m_ncdm[i], YHe, T_cmb")


class PowerSpectrumFunction:
    """θ ↦ {P_m, P_cb (n_z, n_k) [Mpc³], sigma8, sigma8_cb (n_z,), d_m (n_z, n_k)} for one config.

    ``f = PowerSpectrumFunction(config)``; ``f.theta0`` is the fiducial vector (order
    ``f.parameters``); ``f(theta)`` evaluates (jit-able, differentiable); ``f.jacobian(theta)``
    returns values and ∂(output)/∂θ by one forward-mode sweep (``jax.jacfwd``: one joint solve
    with len(θ) directions per k-chunk); ``f.dlnpk(theta)`` the ∂ln P_m/∂θ table the CLI writes.

    Options: ``parameters`` (subset/order of PARAMETERS and the extra names ``_parse_name`` takes),
    ``k`` [1/Mpc] and ``z`` override the config's output grid, ``rtol`` overrides the precision's,
    ``n_chunks`` splits the modes (sorted by k) into that many solves,
    ``sensitivity_error_control`` and ``backend`` ("jax", "cuda" or "auto") are passed to
    ``solve_diff`` (docs/gradients.md).
    """

    #: step limit of each mode's solve
    MAX_STEPS = MAX_STEPS

    def __init__(self, config, *, parameters: Sequence[str] = PARAMETERS, k=None, z=None,
                 rtol: float | None = None, atol: float | None = None, n_chunks: int = 4,
                 sensitivity_error_control: bool = True, with_sigma8: bool = True,
                 backend: str = "jax"):
        require_float64()
        self.config = config
        self.backend = backend
        self.sensitivity_error_control = bool(sensitivity_error_control)
        self.parameters = tuple(parameters)
        if len(set(self.parameters)) != len(self.parameters):
            raise ConfigError(f"gradients: repeated parameter names in {self.parameters}")
        parsed = [_parse_name(p) for p in self.parameters]
        cosmo = config.cosmology
        if any(p[0] in ("m_all", "m_one") for p in parsed) and cosmo.n_ncdm == 0:
            raise ConfigError("gradients: m_ncdm requested but the cosmology has no massive "
                              "neutrino species (set cosmology.m_ncdm, or drop m_ncdm from the "
                              "parameter list)")
        for kind, i in parsed:
            if kind == "m_one" and not 0 <= i < cosmo.n_ncdm:
                raise ConfigError(f"gradients: m_ncdm[{i}] out of range; the cosmology has "
                                  f"{cosmo.n_ncdm} massive species")
        prec = config.precision
        # w0/wa derivatives of a Λ config: fluid background at (-1, 0), fluid perturbations
        # linearised about Λ (module docstring)
        self.de_at_lambda = (any(p[1] in ("w0_fld", "wa_fld") for p in parsed)
                             and not cosmo.use_fld)
        if self.de_at_lambda:
            cosmo = dataclasses.replace(cosmo, w0_fld=-1.0, wa_fld=0.0, use_fld=True)
        self.model = modes.model_for(cosmo, prec, de_at_lambda=self.de_at_lambda)
        self.cosmo0 = cosmo
        self._parsed = parsed
        self.rtol = float(prec.rtol if rtol is None else rtol)
        self.atol = float(prec.atol if atol is None else atol)
        self.grid = modes.make_grid(prec)
        self.k = np.asarray(config.output.k_grid(float(cosmo.h)) if k is None else k, np.float64)
        if self.k.ndim != 1 or self.k.size == 0 or np.any(self.k <= 0):
            raise ValueError(f"k must be a 1-d array of positive wavenumbers [1/Mpc], got shape "
                             f"{self.k.shape}")
        self.z = [float(v) for v in (config.output.z if z is None else z)]
        self.x_save, _ = modes.save_times(self.z)
        self.weights = modes.error_weights(self.model)
        self.with_sigma8 = bool(with_sigma8) and self.k.size >= 5
        # fixed start times from the fiducial cosmology (see module docstring)
        rows0 = modes.mode_rows(self.model, _one(cosmo), self.k[None], self.grid)
        self.x0, _ = modes.initial_states(self.model, rows0, prec.k_tau_ini, prec.omega_tau_ini)
        modes.check_start_times(self.x0, self.grid, self.x_save, prec)
        order = np.argsort(self.k)
        n_chunks = max(1, min(int(n_chunks), self.k.size))
        size = int(math.ceil(self.k.size / n_chunks))
        self._chunks = [order[c:c + size] for c in range(0, self.k.size, size)]
        self.theta0 = jnp.asarray([self._fiducial_value(kind, leaf)
                                   for kind, leaf in parsed], jnp.float64)
        self._jit_value = jax.jit(self._evaluate)
        # one program for values and Jacobian: the primal comes from the same trace (has_aux)
        self._jit_jac = jax.jit(jax.jacfwd(lambda th: (self._evaluate(th),) * 2, has_aux=True))

    @property
    def backend_name(self) -> str:
        """The backend the solves run on ("jax" or "cuda")."""
        return resolve_backend(self.backend).name

    # -- θ <-> CosmoParams
    def _fiducial_value(self, kind, leaf):
        c = self.cosmo0
        if kind == "ln10As":
            return float(c.ln10_10_A_s)
        if kind == "m_all":
            return float(np.mean(np.asarray(c.m_ncdm)))
        if kind == "m_one":
            return float(np.asarray(c.m_ncdm)[leaf])
        return float(getattr(c, leaf))

    def cosmology(self, theta) -> CosmoParams:
        """The CosmoParams at θ (leaves may be tracers)."""
        c = self.cosmo0
        theta = jnp.asarray(theta)
        updates = {}
        m = jnp.asarray(c.m_ncdm, jnp.float64)
        for j, (kind, leaf) in enumerate(self._parsed):
            if kind == "ln10As":
                updates["A_s"] = 1e-10 * jnp.exp(theta[j])
            elif kind == "m_all":
                m = m + (theta[j] - float(np.mean(np.asarray(c.m_ncdm))))
            elif kind == "m_one":
                m = m.at[leaf].add(theta[j] - float(np.asarray(c.m_ncdm)[leaf]))
            else:
                updates[leaf] = theta[j]
        if any(kind in ("m_all", "m_one") for kind, _ in self._parsed):
            updates["m_ncdm"] = m
        return dataclasses.replace(c, **updates)

    # -- the computation: the stages on an ensemble of one
    def _solve_inputs(self, theta):
        """(cosmology at θ stacked as an ensemble of one, its table (1, …))."""
        cosmo = _one(self.cosmology(theta))
        table, _ = jax.vmap(lambda c: tables_one(c, self.grid, self.model))(cosmo)
        return cosmo, table

    def _evaluate(self, theta):
        cosmo, table = self._solve_inputs(theta)
        fields = differentiable_transfers(
            table, cosmo, self.k[None], self.z, self.x0, self.model, self.grid, rtol=self.rtol,
            atol=self.atol, chunks=self._chunks, backend=self.backend,
            sensitivity_error_control=self.sensitivity_error_control, max_steps=self.MAX_STEPS)
        spec = power_spectra(fields, self.k[None], cosmo, with_sigma8=self.with_sigma8)
        out = {"P_m": spec["P_m"][0], "P_cb": spec["P_cb"][0], "d_m": fields["d_m"][0]}
        if self.with_sigma8:
            out["sigma8"] = spec["sigma8"][0]
            out["sigma8_cb"] = spec["sigma8_cb"][0]
        return out

    def _observables(self, ys, rows, table):
        """The model's observables of states ys (n_k, n_save, n) at the save times."""
        return observables(self.model, ys, self.x_save, rows, table, compiled=False)

    def sensitivity_problem(self, theta=None) -> dict:
        """The perturbation solve that ``jacobian`` differentiates, as explicit arrays: the solve's
        inputs at θ and their tangents along each parameter (dy0 (m, n_k, n), dparams (m, n_k, P),
        dargs (m, 1, …) for the table), with the solve options — the keyword arguments of
        ``solver.sensitivity.joint_solve`` (plus ``rhs``), e.g. to count a direction's steps
        (scripts/sensitivity_steps.py).  ``observables(ys, rows, table)`` maps a solve's states
        (n_k, n_save, n) to the model's observables at the save times."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)

        def inputs(th):
            cosmo, table = self._solve_inputs(th)
            rows = modes.mode_rows(self.model, cosmo, self.k[None], self.grid)
            return modes.initial_states_at(self.model, rows, self.x0), rows, table

        (y0, rows, table), tangents = jax.jit(
            lambda th: (inputs(th), jax.jacfwd(inputs)(th)))(theta)
        dy0, drows, dtable = (jnp.moveaxis(t, -1, 0) for t in tangents)
        return dict(rhs=self.model.rhs, y0=y0, t_save=self.x_save, params=rows, args=table,
                    dy0=dy0, dparams=drows, dargs=dtable, t0=self.x0, rtol=self.rtol,
                    atol=self.atol, error_weights=self.weights, max_steps=self.MAX_STEPS,
                    observables=self._observables)

    def __call__(self, theta=None) -> dict:
        """Outputs at θ (default: the fiducial); NaN where a mode failed (see ``check``)."""
        return self._jit_value(self.theta0 if theta is None else jnp.asarray(theta, jnp.float64))

    def jacobian(self, theta=None) -> tuple[dict, dict]:
        """(values, jac): jac[name] has the output's shape + (len(θ),)."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        jac, val = self._jit_jac(theta)
        return val, jac

    def value(self, theta=None) -> dict:
        """The outputs at θ, as calling the object does."""
        return self(theta)

    def value_and_jacobian(self, theta=None) -> tuple[dict, dict]:
        """(values, jac) from one forward-mode program: the name for what ``jacobian`` returns."""
        return self.jacobian(theta)

    def dlnpk(self, theta=None) -> dict:
        """Values and ∂ln P_m/∂θ, ∂ln P_cb/∂θ (n_z, n_k, n_θ), ∂ln σ8/∂θ (n_z, n_θ), with wall
        times; raises RuntimeError naming the wavenumbers where the solve failed."""
        t0 = time.perf_counter()
        val, jac = self.jacobian(theta)
        val = {k: np.asarray(v) for k, v in val.items()}
        jac = {k: np.asarray(v) for k, v in jac.items()}
        wall = time.perf_counter() - t0
        bad = ~np.all(np.isfinite(jac["P_m"]), axis=(0, 2)) | ~np.all(np.isfinite(val["P_m"]),
                                                                      axis=0)
        if np.any(bad):
            raise RuntimeError("gradients: the sensitivity solve failed (non-finite) at k = "
                               + ", ".join(f"{k:.4g}" for k in self.k[bad]) + " 1/Mpc")
        out = {"k": self.k, "z": self.z, "parameters": self.parameters,
               "theta": np.asarray(self.theta0 if theta is None else theta), "P_m": val["P_m"],
               "P_cb": val["P_cb"],
               "dlnP_m": jac["P_m"] / val["P_m"][..., None],
               "dlnP_cb": jac["P_cb"] / val["P_cb"][..., None], "seconds": wall}
        if "sigma8" in val:
            out["sigma8"] = val["sigma8"]
            out["dlnsigma8"] = jac["sigma8"] / val["sigma8"][:, None]
            out["dlnsigma8_cb"] = jac["sigma8_cb"] / val["sigma8_cb"][:, None]
        return out


def _one(cosmo: CosmoParams) -> CosmoParams:
    """``cosmo`` as an ensemble of one (a leading axis of 1 on every leaf); traceable."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64)[None], cosmo)
