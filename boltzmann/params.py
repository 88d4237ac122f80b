"""Run configuration: YAML (or dict) -> validated, typed :class:`Config`.

A configuration has three blocks (every key is documented in docs/parameters.md):

- ``cosmology:`` CLASS's parameter names (Lesgourgues 2011, arXiv:1104.2932; CLASS's
  explanatory.ini), validated and turned into :class:`CosmoParams`, a JAX pytree whose leaves are
  the float parameters so that ``jax.grad`` can differentiate through everything downstream;
- ``output:`` redshifts and the k grid (:class:`OutputSpec`);
- ``precision:`` solver and truncation settings (:class:`PrecisionSpec`), one table
  (:data:`PRECISION_TABLE`) so that a new key is one line.

Bad input raises :class:`ConfigError` (a ``ValueError``) naming ``block.key``, the value, and
what is allowed.  Only flat universes for now: Omega_Lambda (or Omega_fld) follows from closure.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
import yaml

from . import constants as const
from . import ncdm as _ncdm

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """Invalid configuration; the message names the ``block.key``, the value and what is allowed."""


from .schema import COSMOLOGY_TABLE, OUTPUT_TABLE, PRECISION_TABLE, REQUIRED, Key

#: numpy for plain numbers (a configuration's arithmetic, on the host), jax.numpy for JAX values
_xp = _ncdm.array_module


_TOP_LEVEL = ("name", "cosmology", "output", "precision")
_TABLES = {"cosmology": COSMOLOGY_TABLE, "output": OUTPUT_TABLE, "precision": PRECISION_TABLE}


# ----------------------------------------------------------------------------- CosmoParams
_SCALAR_LEAVES = ("h", "omega_b", "omega_cdm", "A_s", "n_s", "k_pivot", "tau_reio", "YHe",
                  "T_cmb", "N_ur")
_ARRAY_LEAVES = ("m_ncdm", "deg_ncdm", "T_ncdm")
_FLD_LEAVES = ("w0_fld", "wa_fld")


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class CosmoParams:
    """Cosmological parameters, a JAX pytree.

    Leaves (differentiable): the scalars ``h, omega_b, omega_cdm, A_s, n_s, k_pivot, tau_reio,
    YHe, T_cmb, N_ur``, the per-species arrays ``m_ncdm`` [eV], ``deg_ncdm``, ``T_ncdm`` [T_cmb]
    (shape ``(n_ncdm,)``), and ``w0_fld, wa_fld`` (only read when ``use_fld``).  Static structure
    (pytree aux data): ``use_fld``; with it ``use_ppf`` (the PPF closure of the fluid's
    perturbations, CLASS's default, or the rest-frame fluid) and ``cs2_fld`` (its rest-frame sound
    speed², a model setting rather than a fitted parameter).  The number of ncdm species is the
    arrays' length.

    The amplitude is stored as ``A_s`` whichever way it was given; ``ln10_10_A_s`` is derived.
    Construct through :func:`load_config` (validated) or :meth:`make` (no checks).
    """

    h: Any
    omega_b: Any
    omega_cdm: Any
    A_s: Any
    n_s: Any
    k_pivot: Any
    tau_reio: Any
    YHe: Any
    T_cmb: Any
    N_ur: Any
    m_ncdm: Any
    deg_ncdm: Any
    T_ncdm: Any
    w0_fld: Any = -1.0
    wa_fld: Any = 0.0
    use_fld: bool = False
    use_ppf: bool = True
    cs2_fld: float = 1.0

    # -- pytree protocol
    def tree_flatten(self):
        leaves = tuple(getattr(self, n) for n in _SCALAR_LEAVES + _ARRAY_LEAVES + _FLD_LEAVES)
        return leaves, (self.use_fld, self.use_ppf, self.cs2_fld)

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        names = _SCALAR_LEAVES + _ARRAY_LEAVES + _FLD_LEAVES
        return cls(**dict(zip(names, leaves)), use_fld=aux[0], use_ppf=aux[1], cs2_fld=aux[2])

    @classmethod
    def make(cls, *, h, omega_b, omega_cdm, n_s, tau_reio, A_s=None, ln10_10_A_s=None,
             k_pivot=0.05, YHe=0.2454, T_cmb=2.7255, N_ur=3.044, m_ncdm=(), deg_ncdm=None,
             T_ncdm=0.71611, w0_fld=None, wa_fld=None, use_ppf=True,
             cs2_fld=1.0) -> "CosmoParams":
        """Build from keyword values without range checks (tests, programmatic use); the fluid
        (and with it ``use_ppf``, ``cs2_fld``) is on when w0_fld or wa_fld is given."""
        if (A_s is None) == (ln10_10_A_s is None):
            raise ConfigError("cosmology: give exactly one of A_s, ln10^{10}A_s")
        amp = A_s if A_s is not None else 1e-10 * math.exp(ln10_10_A_s)
        m = np.atleast_1d(np.asarray(m_ncdm, dtype=np.float64))
        n = m.shape[0]
        deg = np.ones(n) if deg_ncdm is None else np.atleast_1d(np.asarray(deg_ncdm, np.float64))
        t = np.broadcast_to(np.asarray(T_ncdm, dtype=np.float64), (n,)).copy()
        use_fld = w0_fld is not None or wa_fld is not None
        return cls(h=float(h), omega_b=float(omega_b), omega_cdm=float(omega_cdm), A_s=float(amp),
                   n_s=float(n_s), k_pivot=float(k_pivot), tau_reio=float(tau_reio),
                   YHe=float(YHe), T_cmb=float(T_cmb), N_ur=float(N_ur), m_ncdm=m,
                   deg_ncdm=deg, T_ncdm=t,
                   w0_fld=float(-1.0 if w0_fld is None else w0_fld),
                   wa_fld=float(0.0 if wa_fld is None else wa_fld), use_fld=use_fld,
                   use_ppf=bool(use_ppf), cs2_fld=float(cs2_fld))

    # -- derived quantities (jnp, differentiable)
    @property
    def n_ncdm(self) -> int:
        return int(np.shape(self.m_ncdm)[0])

    @property
    def H0(self):
        """Hubble constant in 1/Mpc (H0/c)."""
        return self.h * const.H100_INV_MPC

    @property
    def ln10_10_A_s(self):
        return _xp(self.A_s).log(1e10 * self.A_s)

    @property
    def omega_g(self):
        """Photon density Omega_g h^2 from T_cmb (black body, a_rad T^4)."""
        return const.RHO_TILDE_GAMMA_PER_K4 * self.T_cmb**4 / const.RHO_TILDE_CRIT_H2

    @property
    def omega_ur(self):
        """Massless neutrinos: N_ur * 7/8 (4/11)^(4/3) omega_g."""
        return self.N_ur * const.RHO_UR_PER_NEFF_OVER_RHO_G * self.omega_g

    @property
    def T_ncdm0_K(self):
        """ncdm temperatures today in K, shape (n_ncdm,)."""
        return _xp(self.T_ncdm, self.T_cmb).asarray(self.T_ncdm) * self.T_cmb

    @property
    def omega_ncdm(self):
        """Omega_ncdm h^2 per species today (exact Fermi–Dirac integral), shape (n_ncdm,)."""
        if self.n_ncdm == 0:
            return _xp(self.m_ncdm).zeros((0,))
        return _ncdm.omega_ncdm(self.m_ncdm, self.T_ncdm0_K, self.deg_ncdm)

    @property
    def omega_ncdm_tot(self):
        return _xp(self.m_ncdm, self.T_cmb).sum(self.omega_ncdm)

    @property
    def omega_m(self):
        """Omega_m h^2 = baryons + CDM + ncdm (ncdm counted with its full density today)."""
        return self.omega_b + self.omega_cdm + self.omega_ncdm_tot

    @property
    def omega_r(self):
        """Radiation today: photons + massless neutrinos (ncdm excluded)."""
        return self.omega_g + self.omega_ur

    @property
    def N_eff(self):
        """Effective number of neutrinos in the early universe: N_ur + sum deg (T_ncdm/T_nu)^4."""
        xp = _xp(self.T_ncdm, self.deg_ncdm)
        t_ratio = xp.asarray(self.T_ncdm) / const.T_NU_OVER_T_GAMMA
        return self.N_ur + xp.sum(xp.asarray(self.deg_ncdm) * t_ratio**4)

    @property
    def Omega_de(self):
        """Dark energy (Lambda or fluid) today from flatness: 1 - sum of the other Omegas."""
        return 1.0 - (self.omega_m + self.omega_r) / self.h**2

    @property
    def Omega_Lambda(self):
        return 0.0 * self.Omega_de if self.use_fld else self.Omega_de

    @property
    def Omega_fld(self):
        return self.Omega_de if self.use_fld else 0.0 * self.Omega_de

    @property
    def Omega_m(self):
        return self.omega_m / self.h**2

    def resolved(self) -> dict[str, Any]:
        """Plain floats (and lists) of inputs and derived numbers, for summary.json."""
        out: dict[str, Any] = {n: float(getattr(self, n)) for n in _SCALAR_LEAVES}
        out["ln10^{10}A_s"] = float(self.ln10_10_A_s)
        out["N_ncdm"] = self.n_ncdm
        for n in _ARRAY_LEAVES:
            out[n] = [float(x) for x in np.asarray(getattr(self, n))]
        out["use_fld"] = bool(self.use_fld)
        if self.use_fld:
            out["w0_fld"] = float(self.w0_fld)
            out["wa_fld"] = float(self.wa_fld)
            out["use_ppf"] = bool(self.use_ppf)
            out["cs2_fld"] = float(self.cs2_fld)
        out["H0_1/Mpc"] = float(self.H0)
        out["H0_km/s/Mpc"] = 100.0 * float(self.h)
        out["omega_g"] = float(self.omega_g)
        out["omega_ur"] = float(self.omega_ur)
        out["omega_ncdm"] = [float(x) for x in np.asarray(self.omega_ncdm)]
        out["omega_m"] = float(self.omega_m)
        out["Omega_m"] = float(self.Omega_m)
        out["Omega_Lambda"] = float(self.Omega_Lambda)
        out["Omega_fld"] = float(self.Omega_fld)
        out["N_eff"] = float(self.N_eff)
        return out


# ----------------------------------------------------------------------------- Output / Precision
@dataclass(frozen=True)
class OutputSpec:
    """What to write: redshifts and wavenumbers.

    ``k_min``/``k_max`` are in h/Mpc (as CLASS's P_k_max_h/Mpc); ``k_values`` (from ``k_file``)
    is in 1/Mpc.  Use :meth:`k_grid` to get the k array in 1/Mpc.
    """

    z: tuple[float, ...] = (0.0,)
    k_min: float = 1.0e-4
    k_max: float = 10.0
    k_per_decade: float = 20.0
    k_file: Path | None = None
    k_values: tuple[float, ...] | None = None
    dir: Path = Path("out/config")
    #: CMB spectra (boltzmann.cmb): which of TT, EE, TE, BB, PP, up to l_max, lensed or not
    cl: tuple[str, ...] = ()
    l_max: int = 2500
    lensing: bool = False
    z_background: tuple[float, ...] = ()

    @property
    def z_solve(self) -> tuple[float, ...]:
        """The redshifts the perturbations are saved at: ``z``, then the ``z_background`` ones not
        among them (σ8(z) of background.csv needs P(k) there)."""
        return tuple(self.z) + tuple(dict.fromkeys(v for v in self.z_background
                                                   if v not in self.z))

    def k_grid(self, h: float) -> np.ndarray:
        """Wavenumbers in 1/Mpc: the k_file column, or the log grid k_min..k_max (h/Mpc) times h."""
        if self.k_values is not None:
            return np.asarray(self.k_values, dtype=np.float64)
        decades = math.log10(self.k_max / self.k_min)
        n = max(2, int(math.ceil(decades * self.k_per_decade)) + 1)
        return np.logspace(math.log10(self.k_min), math.log10(self.k_max), n) * float(h)


PrecisionSpec = dataclasses.make_dataclass(
    "PrecisionSpec",
    [(name, int if key.kind == "int" else float, field(default=key.default))
     for name, key in PRECISION_TABLE.items()],
    frozen=True,
    namespace={"__doc__": "Precision settings; fields and defaults come from PRECISION_TABLE.",
               "__module__": __name__},
)


@dataclass(frozen=True)
class Config:
    """A validated run configuration."""

    name: str
    cosmology: CosmoParams
    output: OutputSpec
    precision: Any  # PrecisionSpec
    source_path: Path | None = None


# ----------------------------------------------------------------------------- YAML
class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` (no dot, YAML 1.1) as a float, not a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _read_yaml(path: Path) -> Mapping:
    try:
        with open(path) as fh:
            data = yaml.load(fh, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping with blocks {_TOP_LEVEL}")
    return data


def _resolve_path(source: str | Path) -> Path:
    p = Path(source)
    candidates = [p]
    if not p.is_absolute() and len(p.parts) == 1:
        candidates += [CONFIGS_DIR / p.name, CONFIGS_DIR / f"{p.name}.yaml"]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"config {str(source)!r} not found (tried: {', '.join(map(str, candidates))})")


# ----------------------------------------------------------------------------- validation helpers
def _check_keys(block: str, given: Mapping, table: Mapping) -> None:
    for key in given:
        if key not in table:
            hint = difflib.get_close_matches(str(key), list(table), n=1, cutoff=0.5)
            hint_msg = f"; did you mean {block}.{hint[0]}?" if hint else ""
            raise ConfigError(f"unknown key {block}.{key}{hint_msg} "
                              f"(valid keys: {', '.join(table)})")


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _coerce(block: str, key: str, spec: Key, value):
    where = f"{block}.{key}"
    if spec.kind == "float":
        if not _is_number(value):
            raise ConfigError(f"{where} = {value!r}: must be a number")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value!r}: must be finite")
        values = [value]
    elif spec.kind == "int":
        if isinstance(value, bool) or not (isinstance(value, (int, np.integer))
                                           or (_is_number(value) and float(value).is_integer())):
            raise ConfigError(f"{where} = {value!r}: must be an integer")
        value = int(value)
        values = [value]
    elif spec.kind in ("float_list", "float_or_list"):
        scalar = _is_number(value)
        seq = [value] if scalar else value
        if not isinstance(seq, (list, tuple)) or not all(_is_number(v) for v in seq):
            raise ConfigError(f"{where} = {value!r}: must be a number or a list of numbers")
        values = [float(v) for v in seq]
        if not all(math.isfinite(v) for v in values):
            raise ConfigError(f"{where} = {value!r}: must be finite")
        value = values[0] if (scalar and spec.kind == "float_or_list" and key != "z") else values
    elif spec.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r}: must be true or false")
        return value
    elif spec.kind == "str_list":
        seq = [value] if isinstance(value, str) else value
        if not isinstance(seq, (list, tuple)) or not all(isinstance(v, str) for v in seq):
            raise ConfigError(f"{where} = {value!r}: must be a list of names")
        return [str(v) for v in seq]
    elif spec.kind == "str":
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where} = {value!r}: must be a string (path)")
        return str(value)
    else:  # pragma: no cover - table error
        raise AssertionError(spec.kind)
    if spec.allowed is not None:
        for v in values:
            if v not in spec.allowed:
                raise ConfigError(f"{where} = {v!r} is out of range: allowed {spec.allowed} "
                                  f"[{spec.unit}]")
    return value


def _block(data: Mapping, block: str) -> dict:
    raw = data.get(block, {})
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{block}: must be a mapping of key: value, got {type(raw).__name__}")
    table = _TABLES[block]
    _check_keys(block, raw, table)
    out = {}
    for key, spec in table.items():
        if key in raw and raw[key] is not None:
            out[key] = _coerce(block, key, spec, raw[key])
        elif spec.default is REQUIRED:
            raise ConfigError(f"missing required key {block}.{key} ({spec.doc})")
    return out


# ----------------------------------------------------------------------------- builders
def _check_fluid(w0_: float, wa_: float, use_ppf: bool) -> None:
    """Refuse a w0-wa fluid the chosen perturbation equations cannot evolve.

    Always: w0 + wa <= 0 (w(a -> 0) = w0 + wa; CLASS requires the fluid to be negligible early).
    Without PPF, also w(a) = -1 anywhere on 0 < a <= 1: the rest-frame fluid equations divide by
    1 + w.  The PPF closure (boltzmann/modes.py, models/species/dark_energy_ppf.py) has no such
    division, so with ``use_ppf`` crossing -1, reaching it today and Λ itself (-1, 0) are allowed.
    """
    if w0_ + wa_ > 0.0:
        raise ConfigError(f"cosmology.w0_fld + cosmology.wa_fld = {w0_ + wa_:g} > 0: the fluid "
                          f"would not be dark energy at early times (w(a->0) = w0 + wa); "
                          f"allowed w0 + wa <= 0")
    if use_ppf:
        return
    # w(a) is linear in a, so it crosses -1 on 0 < a <= 1 iff w(0) + 1 and w(1) + 1 have
    # strictly opposite signs; the c_s^2 = 1 rest-frame fluid equations divide by 1 + w there
    if (w0_ + 1.0) * (w0_ + wa_ + 1.0) < 0.0:
        raise ConfigError(f"cosmology.w0_fld = {w0_:g}, cosmology.wa_fld = {wa_:g}: w(a) = w0 + "
                          f"wa (1 - a) crosses -1 (phantom divide) at a = "
                          f"{1.0 + (w0_ + 1.0) / wa_:.4g}; with cosmology.use_ppf = false the "
                          f"rest-frame fluid perturbation equations divide by 1 + w and diverge "
                          f"there. Set cosmology.use_ppf: true (the PPF closure, CLASS's "
                          f"default) or keep w0 + 1 and w0 + wa + 1 of the same sign")
    # w(a = 1) = -1: the fluid equations divide by 1 + w = 0 today
    if w0_ == -1.0:
        hint = ("that is a cosmological constant: leave w0_fld and wa_fld out (derivatives "
                "with respect to them at Λ are still available, docs/gradients.md) or use "
                "cosmology.use_ppf: true"
                if wa_ == 0.0 else
                "w(a) reaches -1 today (a = 1), where the rest-frame fluid equations (with "
                "cosmology.use_ppf = false) divide by 1 + w = 0; move w0_fld off -1 or set "
                "cosmology.use_ppf: true")
        raise ConfigError(f"cosmology.w0_fld = -1 with cosmology.wa_fld = {wa_:g}: {hint}")


def _build_cosmology(c: dict) -> CosmoParams:
    if ("A_s" in c) == ("ln10^{10}A_s" in c):
        given = "both" if "A_s" in c else "neither"
        raise ConfigError(f"cosmology: give exactly one of cosmology.A_s, "
                          f"cosmology.ln10^{{10}}A_s (got {given})")
    m = c.get("m_ncdm", [])
    n = len(m)
    if "N_ncdm" in c and c["N_ncdm"] != n:
        raise ConfigError(f"cosmology.N_ncdm = {c['N_ncdm']} but cosmology.m_ncdm has {n} "
                          f"entries {m}; they must agree")
    deg = c.get("deg_ncdm", [1.0] * n)
    if len(deg) != n:
        raise ConfigError(f"cosmology.deg_ncdm = {deg} has {len(deg)} entries but "
                          f"cosmology.m_ncdm = {m} has {n}; give one degeneracy per species")
    t = c.get("T_ncdm", COSMOLOGY_TABLE["T_ncdm"].default)
    if isinstance(t, list):
        if len(t) != n:
            raise ConfigError(f"cosmology.T_ncdm = {t} has {len(t)} entries but "
                              f"cosmology.m_ncdm = {m} has {n}; give one number or one per species")
    w0, wa = c.get("w0_fld"), c.get("wa_fld")
    use_ppf = c.get("use_ppf", COSMOLOGY_TABLE["use_ppf"].default)
    if w0 is None and wa is None:
        given = [name for name in ("use_ppf", "cs2_fld") if name in c]
        if given:
            raise ConfigError(f"cosmology.{given[0]} = {c[given[0]]!r} applies to the w0-wa dark-"
                              f"energy fluid, but there is none (a cosmological constant): give "
                              f"cosmology.w0_fld and/or cosmology.wa_fld, or leave "
                              f"cosmology.{given[0]} out")
    else:
        _check_fluid(-1.0 if w0 is None else w0, 0.0 if wa is None else wa, use_ppf)
    cosmo = CosmoParams.make(
        h=c["h"], omega_b=c["omega_b"], omega_cdm=c["omega_cdm"], n_s=c["n_s"],
        tau_reio=c["tau_reio"], A_s=c.get("A_s"), ln10_10_A_s=c.get("ln10^{10}A_s"),
        k_pivot=c.get("k_pivot", 0.05), YHe=c.get("YHe", 0.2454),
        T_cmb=c.get("T_cmb", 2.7255), N_ur=c.get("N_ur", 3.044), m_ncdm=m, deg_ncdm=deg,
        T_ncdm=t, w0_fld=w0, wa_fld=wa, use_ppf=use_ppf,
        cs2_fld=c.get("cs2_fld", COSMOLOGY_TABLE["cs2_fld"].default))
    if "ln10^{10}A_s" in c and cosmo.A_s not in COSMOLOGY_TABLE["A_s"].allowed:
        raise ConfigError(f"cosmology.ln10^{{10}}A_s = {c['ln10^{10}A_s']} gives A_s = "
                          f"{cosmo.A_s:g}, outside {COSMOLOGY_TABLE['A_s'].allowed}")
    omega_de = float(cosmo.Omega_de)
    if omega_de < 0.0:
        name = "Omega_fld" if cosmo.use_fld else "Omega_Lambda"
        raise ConfigError(f"cosmology: closure gives {name} = {omega_de:.6g} < 0 (flat universe: "
                          f"Omega_m + Omega_r = {1 - omega_de:.6g} exceeds 1); lower omega_b, "
                          f"omega_cdm, m_ncdm or N_ur, or raise h")
    return cosmo


def _build_output(o: dict, name: str, base_dir: Path | None) -> OutputSpec:
    range_keys = [k for k in ("k_min", "k_max", "k_per_decade") if k in o]
    kwargs: dict[str, Any] = {}
    z = o.get("z", [0.0])
    kwargs["z"] = tuple(z)
    kwargs["z_background"] = tuple(o.get("z_background", ()))
    if "k_file" in o:
        if range_keys:
            raise ConfigError(f"output.k_file excludes output.{range_keys[0]}: give either a k "
                              f"file or a k range, not both")
        kpath = Path(o["k_file"])
        if not kpath.is_absolute() and base_dir is not None:
            kpath = base_dir / kpath
        try:
            kv = np.loadtxt(kpath, ndmin=1, comments="#")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"output.k_file = {o['k_file']!r}: cannot read one column of "
                              f"numbers ({exc})") from exc
        if kv.ndim != 1 or kv.size < 1 or not np.all(np.isfinite(kv)) or np.any(kv <= 0):
            raise ConfigError(f"output.k_file = {o['k_file']!r}: must hold one column of positive "
                              f"finite k values in 1/Mpc")
        if np.any(np.diff(kv) <= 0):
            raise ConfigError(f"output.k_file = {o['k_file']!r}: k values must increase strictly")
        kwargs["k_file"] = kpath
        kwargs["k_values"] = tuple(float(x) for x in kv)
    else:
        for k in range_keys:
            kwargs[k] = o[k]
        kmin = kwargs.get("k_min", OUTPUT_TABLE["k_min"].default)
        kmax = kwargs.get("k_max", OUTPUT_TABLE["k_max"].default)
        if kmin >= kmax:
            raise ConfigError(f"output.k_min = {kmin:g} >= output.k_max = {kmax:g}: "
                              f"need k_min < k_max (h/Mpc)")
    kwargs["dir"] = Path(o["dir"]) if "dir" in o else Path("out") / name
    kwargs.update(_cl_output(o))
    return OutputSpec(**kwargs)


def _cl_output(o: dict) -> dict:
    """The CMB keys of the output block (cl, l_max, lensing), checked against each other."""
    from .schema import CL_SPECTRA

    cl = tuple(dict.fromkeys(o.get("cl", [])))
    bad = [v for v in cl if v not in CL_SPECTRA]
    if bad:
        raise ConfigError(f"output.cl = {list(o['cl'])}: unknown spectrum {bad[0]!r}; choose "
                          f"from {', '.join(CL_SPECTRA)}")
    lensing = bool(o.get("lensing", False))
    if lensing and "PP" not in cl:
        raise ConfigError("output.lensing = true needs the lensing potential: add PP to "
                          "output.cl")
    if "BB" in cl and not lensing:
        raise ConfigError("output.cl has BB, which scalar modes produce only through lensing: "
                          "set output.lensing: true (with PP in output.cl) or drop BB")
    return {"cl": cl, "l_max": int(o.get("l_max", 2500)), "lensing": lensing}


def load_config(source: str | Path | Mapping) -> Config:
    """Read and validate a configuration.

    ``source``: a path to a YAML file; a bare name (``"lcdm"`` or ``"lcdm.yaml"``) also resolves
    against the repository's ``configs/`` folder; or a dict with the same structure (optional
    top-level ``name``).  Raises :class:`ConfigError` on any problem.
    """
    source_path: Path | None = None
    if isinstance(source, Mapping):
        data = source
        name = str(data.get("name", "config"))
    elif isinstance(source, (str, Path)):
        source_path = _resolve_path(source).resolve()
        data = _read_yaml(source_path)
        name = str(data.get("name", source_path.stem))
    else:
        raise ConfigError(f"load_config: source must be a path or a dict, got "
                          f"{type(source).__name__}")
    for key in data:
        if key not in _TOP_LEVEL:
            hint = difflib.get_close_matches(str(key), _TOP_LEVEL, n=1, cutoff=0.5)
            hint_msg = f"; did you mean {hint[0]}?" if hint else ""
            raise ConfigError(f"unknown top-level block {key!r}{hint_msg} "
                              f"(valid: {', '.join(_TOP_LEVEL)})")
    if "cosmology" not in data:
        raise ConfigError("missing required block 'cosmology'")
    cosmo = _build_cosmology(_block(data, "cosmology"))
    base_dir = source_path.parent if source_path is not None else None
    output = _build_output(_block(data, "output"), name, base_dir)
    precision = PrecisionSpec(**_block(data, "precision"))
    return Config(name=name, cosmology=cosmo, output=output, precision=precision,
                  source_path=source_path)


def with_precision(config: Config, **settings) -> Config:
    """``config`` with precision keys changed, each checked as a config file's would be (name,
    type, range); raises ConfigError."""
    _check_keys("precision", settings, PRECISION_TABLE)
    values = {k: _coerce("precision", k, PRECISION_TABLE[k], v) for k, v in settings.items()}
    return dataclasses.replace(config, precision=dataclasses.replace(config.precision, **values))


__all__ = [
    "ConfigError", "Config", "CosmoParams", "OutputSpec", "PrecisionSpec", "load_config",
    "with_precision", "CONFIGS_DIR",
]
