"""A Cobaya theory on this code: ``from boltzmann.cobaya import BoltzmannTheory``.

Cobaya's likelihoods ask a theory for products (``Pk_interpolator``, ``Hubble``, ``rdrag``, ``Cl``,
...) by name; Cobaya's own ``classy`` and ``camb`` theories answer them with CLASS or CAMB. This
theory answers the ones this code computes, in the same units and conventions, so that a Cobaya
input written for ``classy`` runs with the theory block changed (docs/cobaya.md)::

    theory:
      boltzmann.cobaya.BoltzmannTheory:
        extra_args: {l_max_ur: 12, tol_perturbations_integration: 1.0e-5}

Parameters have CLASS's names (``boltzmann.class_input``: h or H0, omega_b, omega_cdm, A_s or
ln_A_s_1e10 — or ``logA`` dropped with ``A_s: "lambda logA: 1e-10*np.exp(logA)"`` as in Cobaya's
cosmology examples —, n_s, tau_reio, m_ncdm, N_ur, w0_fld, wa_fld, ...); ``renames`` maps the
CAMB/Planck names (omegabh2, ns, tau, rdrag, ...) onto them, as the ``classy`` theory does.

Products (what ``must_provide`` accepts) and where they come from:

- ``Pk_interpolator`` / ``Pk_grid`` (linear only; vars_pairs ``delta_tot`` → P_m,
  ``delta_nonu`` → P_cb; k in 1/Mpc, P in Mpc³), ``sigma8_z``: the stage pipeline
  (``boltzmann.compute``) with the requested redshifts added to the solve and CLASS's z grid of
  step 0.05 in ln(1+z) up to the largest (at least four nodes, for Cobaya's interpolator);
  σ8 integrates over the modes it needs whatever k_max was asked (``modes.sigma8_grid``);
- ``fsigma8`` = f(z) σ8(z), f CLASS's scale-independent growth rate — background.csv's
  ``fsigma8`` column;
- ``Hubble`` [1/Mpc, or km/s/Mpc by the getter's units], ``angular_diameter_distance``,
  ``comoving_radial_distance`` [Mpc]: ``boltzmann.derived.background_table`` (background.csv's
  numbers, exact at any z, flat universe);
- derived parameters (``rdrag`` = ``rs_drag`` = r_s(z_d) [Mpc], ``theta_s_100``, ``sigma8``,
  ``z_reio``, ``age``, ``Omega_m``, ... every name of ``boltzmann.derived.NAMES``):
  ``boltzmann.derived`` on the same run (summary.json's numbers);
- ``Cl`` (lensed TT, TE, EE, BB and the lensing potential pp) and ``unlensed_Cl``: the CMB stage
  (``boltzmann.cmb``), dimensionless as CLASS returns them (the getters apply Cobaya's units).

Only what a likelihood asked for is computed: a BAO-only run solves no perturbations (background
and thermodynamics alone). A cosmology the code cannot compute (a parameter outside its range,
a failed mode, a non-finite number) makes ``calculate`` return False — Cobaya then rejects the
point — with the reason logged at debug level and kept in ``last_failure``; with
``stop_at_error: True`` it raises instead. Inputs the code does not support (a CLASS option it
lacks, a non-linear P(k)) are refused at initialisation, naming what to change.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

import jax
import numpy as np

try:
    from cobaya.log import LoggedError
    from cobaya.theories.cosmo import BoltzmannBase
    from cobaya.tools import Pool1D
except ImportError as exc:  # the package works without Cobaya; this module needs it
    raise ImportError("boltzmann.cobaya needs Cobaya: pip install 'boltzmann-gpu[cobaya]' "
                      "(or pip install cobaya)") from exc

from . import derived as derived_mod
from . import modes
from .class_input import CosmoError, UnsupportedOption, check_name, to_config
from .cobaya_products import (ClRequest, cl_dict, derived_names_known, derived_value,
                              pk_redshifts)
from .params import ConfigError, load_config

__all__ = ["BoltzmannTheory"]

#: the z-dependent background products, and the background.csv column each is read from
_BACKGROUND = {"Hubble": "H_1/Mpc", "angular_diameter_distance": "D_A_Mpc",
               "comoving_radial_distance": "D_M_Mpc"}
#: products answered from the P(k) solve
_PK_PRODUCTS = ("sigma8_z", "fsigma8")
#: Pk_grid variables → the spectrum holding them
_VARS = {"delta_tot": "pk_m", "delta_nonu": "pk_cb"}
#: errors that mean "this cosmology cannot be computed" (the point is rejected, not the run)
_POINT_ERRORS = (ConfigError, CosmoError, ValueError, ArithmeticError, RuntimeError)

_DERIVED_ALL = jax.jit(derived_mod.derived_parameters)
_DERIVED_THERMO = jax.jit(derived_mod.derived_from_thermodynamics, static_argnums=1)


class BoltzmannTheory(BoltzmannBase):
    """Cobaya theory computing with boltzmann-gpu (module docstring: products, units, failures).

    Options: ``extra_args`` (fixed CLASS-named inputs and precision settings, e.g. YHe, N_ur,
    l_max_ur, tol_perturbations_integration, k_per_decade_for_pk, P_k_max_1/Mpc),
    ``backend`` ("auto", "jax" or "cuda": the perturbation solver), ``renames``,
    ``stop_at_error``.
    """

    extra_args: dict = {}
    backend: str = "auto"
    stop_at_error: bool = False
    speed: float = 1.0
    #: sampler (CAMB/Planck) names → CLASS names, as Cobaya's classy theory renames them
    renames: dict = {"As": "A_s", "ns": "n_s", "tau": "tau_reio", "omegabh2": "omega_b",
                     "omegach2": "omega_cdm", "omegab": "Omega_b", "omegac": "Omega_cdm",
                     "omegam": "Omega_m", "omegal": "Omega_Lambda", "w": "w0_fld",
                     "wa": "wa_fld", "yhe": "YHe", "yheused": "YHe", "rdrag": "rs_drag",
                     "zrei": "z_reio", "omegan": "Omega_nu"}

    # ------------------------------------------------------------------ set-up
    def initialize(self):
        super().initialize()
        for name in self.extra_args:
            self._check_input_name(name, "extra_args")
        if "P_k_max_h/Mpc" in self.extra_args:
            raise LoggedError(self.log, "extra_args: give P_k_max_1/Mpc (P_k_max_h/Mpc would "
                              "move the k grid in 1/Mpc with h)")
        try:        # settings refused whatever the sampled parameters: refuse them now
            to_config(dict(self.extra_args))
        except CosmoError as exc:
            raise LoggedError(self.log, "extra_args: %s", exc) from None
        self.derived_extra = []
        self.last_failure = None
        self.n_failures = 0
        self._pools = {}
        self._pk_pairs = set()
        self._pk_k_max = 0.0
        self._pk_z = set()
        self._cl = ClRequest()
        self._needs_pk = False

    def _check_input_name(self, name, where):
        try:
            check_name(self.translate_param(name))
        except UnsupportedOption as exc:
            raise LoggedError(self.log, "%s: %s", where, exc) from None

    def initialize_with_params(self):
        super().initialize_with_params()
        for p in self.input_params:
            self._check_input_name(p, "input parameter")
        unknown = [p for p in self.output_params
                   if not derived_names_known(self.translate_param(p))]
        if unknown:
            raise LoggedError(self.log, "derived parameter(s) %s are not computed by boltzmann; "
                              "it provides: %s", unknown, ", ".join(self.get_can_provide_params()))

    def get_can_provide_params(self):
        names = [n for n in derived_mod.NAMES if n.replace("_", "").isalnum()]
        names += ["rs_drag", "Omega_b", "Omega_cdm", "Omega_k"]
        return names + [s for s, c in self.renames.items() if c in names or c in derived_mod.NAMES]

    def get_can_support_params(self):
        return ["H0"]

    def get_version(self):
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("boltzmann-gpu")
        except PackageNotFoundError:
            return None

    def must_provide(self, **requirements):
        super().must_provide(**requirements)
        for key, value in self._must_provide.items():
            if isinstance(key, tuple) and key[0] == "Pk_grid":
                nonlinear, pair = key[1], key[2:]
                if nonlinear:
                    raise LoggedError(
                        self.log, "boltzmann computes the linear P(k) only: the likelihood asks "
                        "for a non-linear one; make it request 'nonlinear: False'")
                if any(v not in _VARS for v in pair):
                    raise LoggedError(self.log, "P(k) of %s is not computed; vars_pairs may be "
                                      "%s", pair, list(_VARS))
                if pair[0] != pair[1]:
                    raise LoggedError(self.log, "cross spectra %s are not computed; ask for "
                                      "equal pairs", pair)
                self._pk_pairs.add(pair)
                self._pk_k_max = max(self._pk_k_max, float(value["k_max"]))
                self._pk_z.update(float(z) for z in np.atleast_1d(value["z"]))
                self._needs_pk = True
            elif key in _BACKGROUND or key in _PK_PRODUCTS:
                self._pools[key] = Pool1D(value["z"])
                if key in _PK_PRODUCTS:
                    self._pk_z.update(float(z) for z in self._pools[key].values)
                    self._needs_pk = True
            elif key in ("Cl", "unlensed_Cl"):
                self._cl.add(value, lensed=key == "Cl", log=self.log)
                if "T_cmb" not in self.derived_extra:
                    self.derived_extra.append("T_cmb")
            elif value is None:     # a derived parameter asked for by name (e.g. rdrag)
                name = self.translate_param(key)
                if not derived_names_known(name):
                    raise LoggedError(self.log, "requested product %r is not computed by "
                                      "boltzmann", key)
                if name not in self.derived_extra:
                    self.derived_extra.append(name)
            else:
                raise LoggedError(
                    self.log, "requested product %r is not provided by boltzmann; it provides "
                    "Pk_interpolator, Pk_grid, sigma8_z, fsigma8, Hubble, "
                    "angular_diameter_distance, comoving_radial_distance, Cl, unlensed_Cl and "
                    "derived parameters", key)
        wanted = [self.translate_param(p) for p in self.output_params] + self.derived_extra
        if any(n.startswith(("sigma8", "S8")) for n in wanted):
            self._needs_pk = True
            self._pk_z.add(0.0)

    # ------------------------------------------------------------------ computing
    def calculate(self, state, want_derived=True, **params_values_dict):
        try:
            products = self._compute(params_values_dict)
        except _POINT_ERRORS as exc:
            return self._reject(state, f"{type(exc).__name__}: {exc}")
        bad = [name for name, v in _numbers(products) if not np.all(np.isfinite(v))]
        if bad:
            return self._reject(state, f"non-finite {', '.join(sorted(set(bad)))}")
        values = products.pop("_derived")
        state.update(products)
        if want_derived:
            state["derived"] = {p: values[p] for p in self.output_params}
        state["derived_extra"] = {p: values[p] for p in self.derived_extra}
        return True

    def _reject(self, state, why: str) -> bool:
        """Log why the point failed and report it to Cobaya (or raise, with stop_at_error)."""
        self.last_failure = why
        self.n_failures += 1
        if self.stop_at_error:
            raise LoggedError(self.log, "computation failed for %r: %s", state["params"], why)
        self.log.debug("computation failed for %r (the point is rejected): %s",
                       state["params"], why)
        return False

    def _class_parameters(self, params: Mapping[str, Any]) -> dict:
        """The CLASS input of this point: the parameters, extra_args and what the products
        need (mPk, P_k_max_1/Mpc, z_pk)."""
        pars = {self.translate_param(p): v for p, v in params.items()}
        pars.update(self.extra_args)
        if self._needs_pk:
            pars["output"] = "mPk"
            k_max = self._pk_k_max or 1.0      # CLASS's default, 1/Mpc
            pars["P_k_max_1/Mpc"] = max(k_max, float(pars.get("P_k_max_1/Mpc", 0.0)))
            z = set(self._pk_z)
            if "z_pk" in self.extra_args:       # CLASS's "0.5,1" or a list
                extra = self.extra_args["z_pk"]
                z.update(float(v) for v in (re.split(r"[,\s]+", extra.strip())
                                            if isinstance(extra, str) else np.atleast_1d(extra))
                         if str(v).strip())
            pars["z_pk"] = ",".join(repr(v) for v in pk_redshifts(z, bool(self._pk_pairs)))
        else:
            pars.pop("output", None)
        return pars

    def _compute(self, params) -> dict:
        config_dict, settings = to_config(self._class_parameters(params))
        if self._cl:
            config_dict["output"].update(self._cl.output_block())
        config = load_config(config_dict)
        cosmo = config.cosmology
        for name, value in settings.get("dark_energy_checks", {}).items():
            closure = float(getattr(cosmo, name))
            if abs(closure - value) > 1e-4:
                raise ConfigError(f"{name} = {value} but the flat closure gives {closure:.6f}")
        out = {}
        result = None
        if self._needs_pk or self._cl:
            from . import compute
            result = compute(config, backend=self.backend)
            failed = result.failure_message(shown=4)
            if failed:
                raise RuntimeError(failed)
            out.update(self._spectra_products(result))
        out["_derived"] = self._derived(config, result)
        z_bg = sorted({float(z) for key in _BACKGROUND if key in self._pools
                       for z in self._pools[key].values})
        if z_bg:
            table = derived_mod.background_table(cosmo, np.asarray(z_bg))
            for key, column in _BACKGROUND.items():
                if key in self._pools:
                    idx = [z_bg.index(float(z)) for z in self._pools[key].values]
                    out[key] = np.asarray(table[column])[idx]
        if "fsigma8" in self._pools:        # background.csv's f σ8 at the solved redshifts
            z_f = np.asarray(self._pools["fsigma8"].values, np.float64)
            out["fsigma8"] = derived_mod.background_table(
                cosmo, z_f, sigma8=_sigma8_at(result, z_f))["fsigma8"]
        return out

    def _spectra_products(self, result) -> dict:
        """Pk_grid (k, z ascending, P[z, k]), σ8(z) and the C_ℓ of a pipeline result."""
        out = {}
        spectra = result.spectra
        z = np.asarray(result.z, np.float64)
        order = np.argsort(z)
        for pair in self._pk_pairs:
            pk = getattr(spectra, _VARS[pair[0]])[0][order]
            out[("Pk_grid", False) + pair] = (np.asarray(result.k[0]).copy(), z[order].copy(),
                                              np.asarray(pk).copy())
        if "sigma8_z" in self._pools:
            out["sigma8_z"] = _sigma8_at(result, self._pools["sigma8_z"].values)
        if self._cl:
            for key, lensed in (("Cl", True), ("unlensed_Cl", False)):
                if self._cl.wants(lensed):
                    out[key] = cl_dict(result.cl, self._cl.names(lensed), lensed=lensed)
        return out

    def _derived(self, config, result) -> dict:
        """{name: float} for every derived parameter asked for (sampler and CLASS names)."""
        names = list(dict.fromkeys([*self.output_params, *self.derived_extra]))
        if not names:
            return {}
        cosmo = config.cosmology
        if result is not None:
            values = derived_mod.result_values(result)
        else:
            values = {k: float(v) for k, v in _DERIVED_ALL(cosmo, {}).items()}
            if any(derived_value(self.translate_param(n), values) is None for n in names):
                grid = modes.make_grid(config.precision)
                values = {k: float(v) for k, v in _DERIVED_THERMO(cosmo, grid).items()}
        out = {}
        for name in names:
            value = derived_value(self.translate_param(name), values)
            if value is None:
                raise RuntimeError(f"derived parameter {name!r} could not be formed for this "
                                   "point (σ8 needs z = 0 in the P(k) solve)")
            out[name] = value
        return out

    # ------------------------------------------------------------------ getters
    def _get_z_dependent(self, quantity, z, pool=None):
        """The values of a z-dependent product at z (a subset of the requested redshifts)."""
        pool = pool or self._pools.get(quantity)
        if pool is None or quantity not in self.current_state:
            raise LoggedError(self.log, "%s was not requested from this theory", quantity)
        try:
            index = pool.find_indices(z)
        except ValueError:
            raise LoggedError(self.log, "%s not computed at z = %s; computed at %s", quantity,
                              z, list(pool.values)) from None
        return np.array(self.current_state[quantity], copy=True)[index]

    def _get_Cl(self, ell_factor=False, units="FIRASmuK2", lensed=True):
        key = "Cl" if lensed else "unlensed_Cl"
        if key not in self.current_state:
            raise LoggedError(self.log, "no %s C_ℓ were requested from this theory",
                              "lensed" if lensed else "unlensed")
        cls = {name: np.array(v, copy=True) for name, v in self.current_state[key].items()}
        unit = self._cmb_unit_factor(units, self.current_state["derived_extra"]["T_cmb"])
        ell = cls["ell"].astype(np.float64)
        factor = ell * (ell + 1.0) / (2.0 * math.pi)
        for name in cls:
            if name == "ell":
                continue
            cls[name] *= unit ** sum(name.count(c) for c in "teb")
            if ell_factor:
                cls[name] *= factor * (ell * (ell + 1.0) if name == "pp" else 1.0)
        return cls

    def get_Cl(self, ell_factor=False, units="FIRASmuK2"):
        """Lensed TT, TE, EE, BB and the lensing potential pp (index ℓ, from 0); units and
        ell_factor as Cobaya's classy theory (pp: [ℓ(ℓ+1)]²/2π with ell_factor)."""
        return self._get_Cl(ell_factor, units, lensed=True)

    def get_lensed_scal_Cl(self, ell_factor=False, units="FIRASmuK2"):
        """The lensed scalar C_ℓ: ``get_Cl`` (there are only scalar modes here)."""
        return self._get_Cl(ell_factor, units, lensed=True)

    def get_unlensed_Cl(self, ell_factor=False, units="FIRASmuK2"):
        """Unlensed TT, TE, EE, BB (zero: scalar modes) and pp, as ``get_Cl``."""
        return self._get_Cl(ell_factor, units, lensed=False)


def _sigma8_at(result, zs) -> np.ndarray:
    """σ8 of P_m at each z of zs (all solved: the redshifts were added to the solve); an error
    naming the problem when σ8 could not be formed there."""
    out = []
    for z in zs:
        problem = result.spectra.problem(0, "d_m", float(z))
        if problem is not None:
            raise RuntimeError(f"σ8 at z = {z:g}: {problem}")
        iz = [float(v) for v in result.z].index(float(z))
        out.append(float(result.spectra.sigma8[0, iz]))
    return np.asarray(out)


def _numbers(products: dict):
    """(name, array) of every number in the products, for the finiteness check."""
    for key, value in products.items():
        if key == "_derived":
            yield from ((f"derived {n}", np.asarray(v)) for n, v in value.items())
        elif isinstance(value, dict):
            yield from ((str(key), np.asarray(v)) for v in value.values())
        elif isinstance(value, tuple):
            yield from ((str(key), np.asarray(v)) for v in value)
        else:
            yield str(key), np.asarray(value)

