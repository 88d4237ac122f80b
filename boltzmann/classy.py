"""A classy-compatible facade: ``from boltzmann.classy import Class`` instead of ``from classy
import Class``, and a script written for CLASS's Python wrapper runs on this code.

::

    cosmo = Class()
    cosmo.set({"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9,
               "n_s": 0.9649, "tau_reio": 0.0544, "output": "mPk", "P_k_max_h/Mpc": 10,
               "z_pk": "0,1"})
    cosmo.compute()
    cosmo.pk_lin(0.1, 0.0), cosmo.sigma8(), cosmo.Hubble(0.5), cosmo.angular_distance(0.5)
    cosmo.get_current_derived_parameters(["100*theta_s", "rs_d", "age"])

CLASS's parameter names and units throughout (k in 1/Mpc, P in Mpc³, H in 1/Mpc, distances in
Mpc, age in Gyr). ``set`` translates the parameters (``boltzmann.class_input``: what maps to
what, what is accepted without effect, what is refused and why); ``compute`` runs
``boltzmann.compute`` on the resulting configuration — the same pipeline as the CLI — when the
output asks for mPk, and only the background and thermodynamics otherwise. P(k, z) between the
computed nodes is CLASS's interpolation: a natural cubic spline of ln P in ln k (below the
smallest k, P ∝ k P_R(k) as CLASS extrapolates), and in z a natural cubic spline in ln(1+z) on
the nodes 0, z_pk and a grid of step 0.05 in ln(1+z) up to z_max. Background quantities are
evaluated exactly at any z (``boltzmann.distances``). Errors are classy's classes:
``CosmoSevereError`` (input; ``UnsupportedOption`` for CLASS options this code does not have) and
``CosmoComputationError`` (a failed solve).

CMB spectra: ``output`` with tCl, pCl, lCl (and ``lensing = yes``, ``l_max_scalars``) runs the CMB
stage (``boltzmann.cmb``, the CLI's cl.csv numbers); ``raw_cl``/``lensed_cl`` return classy's
dicts (``boltzmann.classy_cl``: dimensionless C_ℓ indexed by ℓ from 0). Asking for spectra that
were not requested raises ``ClNotAvailable`` (a ``CosmoSevereError``) saying what to add.
"""
from __future__ import annotations

from typing import Iterable

import jax
import numpy as np
from scipy.interpolate import CubicSpline

from . import derived as derived_mod
from . import distances, modes
from . import spectra as spectra_mod
from .class_input import (OUTPUTS, CosmoComputationError, CosmoError, CosmoSevereError,
                          UnsupportedOption, check_name, to_config)
from .params import ConfigError, load_config
from .runtime import use_float64

__all__ = ["Class", "CosmoError", "CosmoSevereError", "CosmoComputationError",
           "UnsupportedOption", "ClNotAvailable", "CallableFloat"]


class ClNotAvailable(CosmoSevereError, NotImplementedError):
    """C_ℓ that were not computed: not requested in ``output``/``lensing``, or a kind this code
    does not compute (number counts, ``density_cl``); the message says what to change."""


class CallableFloat(float):
    """A float that can be called, so that ``cosmo.h`` and ``cosmo.h()`` both work (classy's)."""

    def __call__(self):
        return self


_H = jax.jit(distances.hubble)
_CHI = jax.jit(distances.comoving_distance)
_GROWTH = jax.jit(distances.growth)
_THERMO_DERIVED = jax.jit(derived_mod.derived_from_thermodynamics, static_argnums=1)
#: relative slack on the k range (k_max in 1/Mpc is k_max [h/Mpc] · h, rounded)
_K_SLACK = 1e-10
_DENSITY_CL = ("number-count and shear C_ℓ (density_cl) are not computed by boltzmann (CMB C_ℓ, "
               "P(k), σ8, background and derived quantities are): use CLASS itself (pip install "
               "classy) for them")


def _vectorised(z, fn):
    """fn on z as an array; a float back for a scalar z (classy's convention)."""
    out = np.asarray(fn(np.atleast_1d(np.asarray(z, np.float64))), np.float64)
    return float(out[0]) if np.ndim(z) == 0 else out.reshape(np.shape(z))


class Class:
    """classy's ``Class`` on this code's pipeline (module docstring).

    ``Class(backend="auto")``: the perturbation solver backend ("jax", "cuda", "auto") is the one
    argument classy does not have. After ``compute``, ``result`` is the ``boltzmann.Result``
    (None without mPk), ``cl`` the ``boltzmann.cmb.ClSpectra`` (None without tCl/pCl/lCl) and
    ``config`` the ``boltzmann.Config`` that ran.
    """

    def __init__(self, default: bool = False, *, backend="auto"):
        self._pars: dict = {}
        self._backend = backend
        self.computed = False
        self.result = None
        self.cl = None
        self.config = None
        self._settings: dict = {}
        self._values: dict = {}
        self._splines: dict = {}

    # ------------------------------------------------------------------ input and running
    def set(self, *pars, **kars):
        """Add parameters (a dict and/or keywords, CLASS names); True when something changed.
        Unsupported names raise ``UnsupportedOption`` at once."""
        if len(pars) > 1:
            raise CosmoSevereError("bad call: set(dict) or set(name=value, ...)")
        new = dict(pars[0]) if pars else {}
        new.update(kars)
        for name in new:
            check_name(name)
        if all(name in self._pars and self._pars[name] == v for name, v in new.items()):
            return False
        self._pars.update(new)
        self.struct_cleanup()
        return True

    @property
    def pars(self) -> dict:
        """The parameters set so far."""
        return self._pars

    @property
    def state(self) -> bool:
        return True

    def empty(self):
        """Forget the parameters and the results."""
        self._pars = {}
        self.struct_cleanup()

    def struct_cleanup(self):
        """Forget the results (the parameters stay)."""
        self.computed = False
        self.result = None
        self.cl = None
        self.config = None
        self._values = {}
        self._splines = {}

    def compute(self, level: Iterable[str] | None = None):
        """Compute what ``output`` asks for (``level`` is accepted for classy's signature; every
        quantity below it is computed anyway). Raises CosmoSevereError for bad input and
        CosmoComputationError when the solve fails."""
        if self.computed:
            return
        use_float64()
        config_dict, self._settings = to_config(self._pars)
        try:
            config = load_config(config_dict)
        except ConfigError as exc:
            raise CosmoSevereError(str(exc)) from exc
        cosmo = config.cosmology
        for name, value in self._settings["dark_energy_checks"].items():
            closure = float(getattr(cosmo, name))
            if abs(closure - value) > 1e-4:
                raise UnsupportedOption(
                    f"{name} = {value}: the universe is flat and {name} follows from closure "
                    f"(= {closure:.6f} for these parameters); leave {name} out")
        if any(OUTPUTS[t] == "pk" for t in self._settings["outputs"]):
            from . import compute as run_pipeline  # the package's entry point (imports us not)

            result = run_pipeline(config, backend=self._backend)
            failed = result.failure_message()
            if failed:
                raise CosmoComputationError(failed)
            self.result = result
            self.cl = result.cl
            self._values = derived_mod.result_values(result)
        else:
            grid = modes.make_grid(config.precision)
            self._values = {k: float(v) for k, v in _THERMO_DERIVED(cosmo, grid).items()}
            if config.output.cl:      # the CMB stage alone (no P(k) modes): the same C_ℓ
                from .cmb import cl_for_config

                self.cl = cl_for_config(config, backend=self._backend)
        if self.cl is not None and self.cl.info.get("solver_failures", 0):
            raise CosmoComputationError(f"the perturbation solve of the CMB modes failed for "
                                        f"{self.cl.info['solver_failures']} k modes")
        self.config = config
        self.computed = True

    # ------------------------------------------------------------------ helpers
    def _need(self, pk: bool = False):
        if not self.computed:
            self.compute()
        if pk and self.result is None:
            raise CosmoSevereError("No power spectrum computed. You must add mPk to the list of "
                                   "outputs.")

    @property
    def _cosmo(self):
        self._need()
        return self.config.cosmology

    def _value(self, name: str) -> CallableFloat:
        return CallableFloat(self.get_current_derived_parameters([name])[name])

    def _nodes(self):
        """(z nodes ascending, ln k (K,), {"m" | "cb": ln P (Z, K)})."""
        r = self.result
        order = np.argsort(np.asarray(r.z, np.float64))
        z = np.asarray(r.z, np.float64)[order]
        lnp = {"m": np.log(r.spectra.pk_m[0][order]), "cb": np.log(r.spectra.pk_cb[0][order])}
        return z, np.log(r.k[0]), lnp, order

    def _ln_pk_at_z(self, kind: str, z: float):
        """(ln P on the k grid at z, k spline), cached per (kind, z)."""
        key = (kind, float(z))
        if key not in self._splines:
            z_nodes, lnk, lnp, _ = self._nodes()
            if z < 0 or z > z_nodes[-1] * (1 + 1e-12):
                raise CosmoSevereError(
                    f"You asked for the power spectrum at z = {z:g} but it was computed only "
                    f"for 0 <= z <= {z_nodes[-1]:g}; pass z_pk or z_max_pk")
            hit = np.nonzero(np.abs(z_nodes - z) <= 1e-12 * max(1.0, z))[0]
            if hit.size:
                row = lnp[kind][hit[0]]
            else:
                row = CubicSpline(np.log1p(z_nodes), lnp[kind], axis=0,
                                  bc_type="natural")(np.log1p(z))
            if len(self._splines) > 256:
                self._splines.clear()
            self._splines[key] = (row, CubicSpline(lnk, row, bc_type="natural"))
        return self._splines[key]

    def _pk(self, kind: str, k, z):
        self._need(pk=True)
        row, spline = self._ln_pk_at_z(kind, float(z))
        kk = np.asarray(k, np.float64)
        grid = np.asarray(self.result.k[0])
        if np.any(kk < 0) or np.any(kk > grid[-1] * (1 + _K_SLACK)):
            raise CosmoSevereError(f"k = {k} 1/Mpc out of bounds [0:{grid[-1]:.6g}]; raise "
                                   f"P_k_max_1/Mpc (or P_k_max_h/Mpc)")
        c = self.config.cosmology
        prim = lambda q: q * spectra_mod.primordial_curvature_power(  # noqa: E731
            q, float(c.A_s), float(c.n_s), float(c.k_pivot))
        inside = np.clip(kk, grid[0], grid[-1])
        out = np.exp(spline(np.log(inside)))
        idx = np.clip(np.searchsorted(grid, kk), 0, grid.size - 1)
        exact = grid[idx] == kk
        out = np.where(exact, np.exp(row[idx]), out)           # on a node: the computed value
        below = (kk < grid[0]) & (kk > 0)
        out = np.where(below, np.exp(row[0]) * np.asarray(prim(np.where(below, kk, grid[0])))
                       / np.asarray(prim(grid[0])), out)
        out = np.where(kk == 0, 0.0, out)
        return float(out) if np.ndim(k) == 0 else out

    # ------------------------------------------------------------------ P(k) and σ
    def pk_lin(self, k, z):
        """Linear total-matter P_m(k, z) [Mpc³], k [1/Mpc] (a number or an array)."""
        return self._pk("m", k, z)

    def pk_cb_lin(self, k, z):
        """Linear CDM + baryon P_cb(k, z) [Mpc³], k [1/Mpc]."""
        return self._pk("cb", k, z)

    def pk(self, k, z):
        """P_m(k, z) [Mpc³]: the linear one (non-linear options are refused at ``set``)."""
        return self._pk("m", k, z)

    def pk_cb(self, k, z):
        """P_cb(k, z) [Mpc³]: the linear one."""
        return self._pk("cb", k, z)

    def get_pk_and_k_and_z(self, nonlinear: bool = True, only_clustering_species: bool = False,
                           h_units: bool = False):
        """(P[k_index, z_index] [Mpc³], k [1/Mpc], z descending) on the computed nodes; with
        h_units, P in (Mpc/h)³ and k in h/Mpc. ``nonlinear=True`` (classy's default) raises:
        only the linear P(k) exists here."""
        self._need(pk=True)
        if nonlinear:
            raise CosmoSevereError("non-linear P(k, z) is not computed; call "
                                   "get_pk_and_k_and_z(nonlinear=False)")
        z, lnk, lnp, _ = self._nodes()
        pk = np.exp(lnp["cb" if only_clustering_species else "m"]).T[:, ::-1]
        h = float(self.config.cosmology.h)
        k = np.exp(lnk)
        return (pk * h**3, k / h, z[::-1].copy()) if h_units else (pk, k, z[::-1].copy())

    def _sigma8_z(self, name: str, z):
        self._need(pk=True)
        r, values = self.result, getattr(self.result.spectra, name)[0]
        z_nodes, _, _, order = self._nodes()
        problem = [m for c, n, zz, m in r.spectra.problems if n in ("d_m", "d_cb")]
        if problem:
            raise CosmoSevereError(problem[0])

        def at(zs):
            if np.any(zs < 0) or np.any(zs > z_nodes[-1] * (1 + 1e-12)):
                raise CosmoSevereError(f"σ8 was computed for 0 <= z <= {z_nodes[-1]:g}; pass "
                                       f"z_pk or z_max_pk")
            if z_nodes.size == 1:
                return np.full(zs.shape, values[order][0])
            return CubicSpline(np.log1p(z_nodes), values[order], bc_type="natural")(np.log1p(zs))
        return _vectorised(z, at)

    def sigma(self, R, z, h_units: bool = False):
        """σ(R, z) of P_m: R in Mpc (Mpc/h with h_units). R = 8 Mpc/h is σ8(z) as computed;
        other radii integrate the P(k) of the k grid (an error names a too narrow range)."""
        return self._sigma("sigma8", R, z, h_units)

    def sigma_cb(self, R, z, h_units: bool = False):
        """σ(R, z) of P_cb (as ``sigma``)."""
        return self._sigma("sigma8_cb", R, z, h_units)

    def _sigma(self, name, R, z, h_units):
        self._need(pk=True)
        h = float(self.config.cosmology.h)
        r_mpc = float(R) / h if h_units else float(R)
        if abs(r_mpc * h / 8.0 - 1.0) < 1e-12:
            return self._sigma8_z(name, z)
        kind = "m" if name == "sigma8" else "cb"
        row, _ = self._ln_pk_at_z(kind, float(z))
        try:
            return float(spectra_mod.sigma_R(self.result.k[0], np.exp(row), r_mpc))
        except spectra_mod.KRangeError as exc:
            raise CosmoSevereError(f"sigma(R = {R}): {exc}; widen P_k_max_1/Mpc") from exc

    @property
    def sigma8(self) -> CallableFloat:
        """σ8 of P_m at z = 0."""
        return self._value("sigma8")

    @property
    def sigma8_cb(self) -> CallableFloat:
        """σ8 of P_cb at z = 0."""
        return self._value("sigma8_cb")

    @property
    def S8(self) -> CallableFloat:
        """σ8 (Ω_m/0.3)^{1/2}."""
        return self._value("S8")

    # ------------------------------------------------------------------ background
    def Hubble(self, z):
        """H(z) [1/Mpc] (H/c)."""
        return _vectorised(z, lambda zz: _H(self._cosmo, zz))

    def comoving_distance(self, z):
        """Comoving distance χ(z) [Mpc]."""
        return _vectorised(z, lambda zz: _CHI(self._cosmo, zz))

    def angular_distance(self, z):
        """Angular-diameter distance D_A(z) = χ/(1+z) [Mpc]."""
        return _vectorised(z, lambda zz: _CHI(self._cosmo, zz) / (1.0 + zz))

    def luminosity_distance(self, z):
        """Luminosity distance D_L(z) = (1+z) χ [Mpc]."""
        return _vectorised(z, lambda zz: _CHI(self._cosmo, zz) * (1.0 + zz))

    def scale_independent_growth_factor(self, z):
        """CLASS's scale-independent growth factor D(z), D(0) = 1."""
        return _vectorised(z, lambda zz: _GROWTH(self._cosmo, zz)[0])

    def scale_independent_growth_factor_f(self, z):
        """CLASS's scale-independent growth rate f(z) = dln D/dln a."""
        return _vectorised(z, lambda zz: _GROWTH(self._cosmo, zz)[1])

    def scale_independent_f_sigma8(self, z):
        """f(z) σ8(z)."""
        return self.scale_independent_growth_factor_f(z) * self._sigma8_z("sigma8", z)

    # ------------------------------------------------------------------ derived numbers
    def get_current_derived_parameters(self, names) -> dict:
        """{name: value} for classy's names (``boltzmann.derived.NAMES``: 100*theta_s, rs_d
        [Mpc], z_d, z_star, z_rec, z_reio, age [Gyr], conformal_age [Mpc], Neff, Omega_m,
        Omega_Lambda, Omega0_fld, sigma8, ...)."""
        if not isinstance(names, list):
            raise TypeError("get_current_derived_parameters takes a list of names")
        self._need()
        try:
            return derived_mod.pick(self._values, names, self.config.cosmology.use_fld)
        except derived_mod.UnknownDerivedParameter as exc:
            raise CosmoSevereError(str(exc)) from None
        except KeyError as exc:
            if self.result is None:
                raise CosmoSevereError(f"{exc.args[0]}; σ8 needs the power spectrum: add mPk to "
                                       f"the list of outputs") from None
            raise CosmoSevereError(exc.args[0]) from None

    h = property(lambda self: self._value("h"), doc="h = H0 / (100 km/s/Mpc).")
    H0 = property(lambda self: self._value("H0"), doc="H0 [km/s/Mpc].")
    Omega_m = property(lambda self: self._value("Omega_m"), doc="Ω_m today (b + cdm + ncdm).")
    Omega_Lambda = property(lambda self: self._value("Omega_Lambda"), doc="Ω_Λ today.")
    Omega_fld = property(lambda self: self._value("Omega_fld"), doc="Ω_fld today.")
    Omega_r = property(lambda self: self._value("Omega_r"), doc="Ω of photons + massless ν.")
    Omega_nu = property(lambda self: self._value("Omega_nu"), doc="Ω_ncdm today.")
    Neff = property(lambda self: self._value("Neff"), doc="N_eff of the early universe.")
    n_s = property(lambda self: self._value("n_s"), doc="Scalar spectral index.")
    tau_reio = property(lambda self: self._value("tau_reio"), doc="Optical depth to reionisation.")
    z_reio = property(lambda self: self._value("z_reio"), doc="Reionisation redshift (solved).")
    age = property(lambda self: self._value("age"), doc="Age of the universe [Gyr].")
    theta_s_100 = property(lambda self: self._value("100*theta_s"),
                           doc="100 θ_s = 100 r_s(z_rec)/D_M(z_rec).")
    theta_star_100 = property(lambda self: self._value("100*theta_star"),
                              doc="100 θ_* = 100 r_s(z_star)/D_M(z_star).")
    rs_drag = property(lambda self: self._value("rs_d"),
                       doc="Comoving sound horizon at baryon drag r_s(z_d) [Mpc].")

    @property
    def Omega_b(self) -> CallableFloat:
        """Ω_b today."""
        return CallableFloat(self._value("omega_b") / self._value("h") ** 2)

    @property
    def omega_b(self) -> CallableFloat:
        """ω_b = Ω_b h²."""
        return self._value("omega_b")

    @property
    def Omega_cdm(self) -> CallableFloat:
        """Ω_cdm today."""
        return CallableFloat(self._value("omega_cdm") / self._value("h") ** 2)

    @property
    def T_cmb(self) -> CallableFloat:
        """CMB temperature today [K]."""
        return self._value("T_cmb")

    # ------------------------------------------------------------------ C_ℓ
    def raw_cl(self, lmax: int = -1, nofail: bool = False) -> dict:
        """Unlensed CMB C_ℓ, classy's dict: "ell" (0..lmax) and, as requested in ``output``,
        "tt", "ee", "te", "bb", "pp" — dimensionless ((ΔT/T)² and C_ℓ^φφ), indexed by ℓ, zero at
        ℓ < 2; "bb" is 0 (scalar modes). CLASS's "tp"/"ep" (cross-spectra with the potential)
        are not computed and not in the dict. ``lmax = -1``: up to ``l_max_scalars``; a larger
        lmax raises unless ``nofail``, which recomputes with ``l_max_scalars = lmax``."""
        return self._cl_dict(lmax, nofail, lensed=False)

    def lensed_cl(self, lmax: int = -1, nofail: bool = False) -> dict:
        """Lensed CMB C_ℓ (``lensing = yes``), classy's dict as ``raw_cl``'s: "tt", "ee", "te",
        "bb" lensed (all-sky correlation functions, docs/cmb.md), "pp" the unlensed C_ℓ^φφ (as in
        CLASS); no "tp"/"ep". ``lmax``, ``nofail`` as for ``raw_cl``."""
        return self._cl_dict(lmax, nofail, lensed=True)

    def _cl_dict(self, lmax: int, nofail: bool, lensed: bool) -> dict:
        from .classy_cl import cl_dict

        # the request alone decides what exists: asked before compute, nothing is solved
        request = (self._settings if self.computed else to_config(self._pars)[1])["cl"]
        if not request["tokens"]:
            raise ClNotAvailable("No Cl computed: add tCl (temperature), pCl (polarisation) "
                                 "and/or lCl (lensing potential) to output, e.g. output = "
                                 "'tCl,pCl,lCl'")
        if lensed and not request["lensing"]:
            raise ClNotAvailable("No lensed Cl computed: set lensing = yes (with lCl and tCl "
                                 "and/or pCl in output)")
        self._need()
        available = min(request["l_max"], int(self.cl.ell[-1]))
        lmax = available if lmax is None or int(lmax) == -1 else int(lmax)
        if lmax > available:
            if not nofail:
                raise CosmoSevereError(f"Can only compute up to lmax={available}: raise "
                                       f"l_max_scalars (or call with nofail=True)")
            self.set({"l_max_scalars": lmax})
            self.compute()
            return self._cl_dict(lmax, False, lensed)
        if lmax < 0:
            raise CosmoSevereError(f"lmax = {lmax}: give a multipole >= 0 (or -1 for all)")
        return cl_dict(self.cl, request, lmax, lensed=lensed)

    def density_cl(self, lmax: int = -1, nofail: bool = False):
        """Not available: raises ``ClNotAvailable``."""
        raise ClNotAvailable(_DENSITY_CL)
