"""The output contract: pk.csv, tk.csv and summary.json in one output directory.

Other tools and tests read these files, so their layout is fixed here and nowhere else.

pk.csv
    Leading comment lines start with ``# ``; the last comment line is the header
    ``# k_1/Mpc,P_m_z<z>_Mpc3,...,P_cb_z<z>_Mpc3,...`` (all P_m columns first, in the requested
    z order, then all P_cb columns), z formatted with ``f"{z:g}"``. k in 1/Mpc, P in Mpc^3,
    10 significant digits. This is the layout of the CLASS/CAMB reference files in tests/data,
    so ``numpy.loadtxt(path, delimiter=",")`` reads the numbers of either and `read_pk_csv`
    reads the column names too.
tk.csv
    Same conventions; columns ``k_1/Mpc`` (the solved wavenumbers: pk.csv's, or fewer of them
    with ``precision.k_solve_stride`` > 1, whose other P(k) are splined) then, for each z in
    order, one block of transfer
    functions named ``<CLASS name>_z<z>`` (e.g. ``d_m_z0``, ``d_ncdm[0]_z0.5``, ``t_b_z1``), in
    CLASS 'class' normalisation (unit primordial curvature; d_* density contrasts, t_* velocity
    divergences theta in 1/Mpc, synchronous gauge).
dpk.csv (only with ``--gradients``)
    Same conventions; columns ``k_1/Mpc`` then, for each z in order and each parameter θ in the
    order of ``boltzmann.gradients.PARAMETERS``, ``dlnP_m_z<z>/d<θ>`` = ∂ln P_m(k, z)/∂θ at fixed k
    [1/Mpc] (θ in the config's units: h, omega_b, omega_cdm, ln10^{10}A_s, n_s, tau_reio,
    m_ncdm [eV], N_ur, w0_fld, wa_fld), then the same for P_cb (``dlnP_cb_z<z>/d<θ>``).
background.csv (only with ``output.z_background``)
    Same comment/header conventions; one row per requested redshift, columns
    ``BACKGROUND_COLUMNS``: ``z``, ``H_1/Mpc`` (H/c), ``D_A_Mpc`` (angular diameter),
    ``D_M_Mpc`` (transverse comoving), ``f`` (dln D/dln a, CLASS's scale-independent rate),
    ``sigma8`` (σ(8 Mpc/h) of P_m at z), then ``D_H_Mpc`` (1/H), ``D_V_Mpc``
    ((z D_M² D_H)^{1/3}), ``D_L_Mpc``, ``D`` (growth factor, D(0) = 1), ``fsigma8``,
    ``sigma8_cb``. Numbers with 17 significant digits (``BACKGROUND_FORMAT``): a value read back
    is the computed double exactly, so likelihood codes and the Python API agree to the last bit.
summary.json
    ``sigma8`` and ``sigma8_cb`` (dicts keyed by the same z strings; null where the k range did
    not allow it, with the reason in ``sigma8_problems``), ``z`` (the strings in
    order), ``parameters`` (resolved cosmology), ``derived`` (classy's names:
    ``boltzmann.derived.SUMMARY_NAMES``), ``backend``, ``solver_stats``,
    ``timings_s`` (wall seconds per stage), ``k_range_1/Mpc``, ``n_k``, ``files``, ``produced_by``.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

__all__ = [
    "z_label",
    "pk_column_names",
    "tk_column_names",
    "write_pk_csv",
    "write_tk_csv",
    "write_summary_json",
    "read_pk_csv",
    "read_summary_json",
    "write_dpk_csv",
    "dpk_column_names",
    "DPK_FILE",
    "write_background_csv",
    "BACKGROUND_FILE",
    "BACKGROUND_COLUMNS",
    "PK_FILE",
    "TK_FILE",
    "SUMMARY_FILE",
]

PK_FILE = "pk.csv"
TK_FILE = "tk.csv"
SUMMARY_FILE = "summary.json"
DPK_FILE = "dpk.csv"
BACKGROUND_FILE = "background.csv"
K_COLUMN = "k_1/Mpc"
NUMBER_FORMAT = "%.9e"  # 10 significant digits
BACKGROUND_FORMAT = "%.16e"  # 17 significant digits: round trip to the same double
#: background.csv's columns, in order (the first six are the fixed contract)
BACKGROUND_COLUMNS = ("z", "H_1/Mpc", "D_A_Mpc", "D_M_Mpc", "f", "sigma8", "D_H_Mpc", "D_V_Mpc",
                      "D_L_Mpc", "D", "fsigma8", "sigma8_cb")

# CLASS's order of transfer-function columns (synchronous gauge); unknown names follow, sorted.
_CLASS_TK_ORDER = ("d_g", "d_b", "d_cdm", "d_ur", "d_ncdm", "d_m", "d_cb", "d_tot", "phi", "psi", "h", "h_prime",
                   "eta", "eta_prime", "H_T_Nb_prime", "k2gamma_Nb", "t_g", "t_b", "t_ur", "t_ncdm", "t_tot")


def z_label(z: float) -> str:
    """The string that names redshift z in column names and summary keys: ``f"{z:g}"``."""
    return f"{float(z):g}"


def pk_column_names(zs: Sequence[float], with_cb: bool = True) -> list[str]:
    """Header of pk.csv: k, then P_m for each z, then (optionally) P_cb for each z."""
    names = [K_COLUMN] + [f"P_m_z{z_label(z)}_Mpc3" for z in zs]
    if with_cb:
        names += [f"P_cb_z{z_label(z)}_Mpc3" for z in zs]
    return names


def _class_order_key(name: str):
    base = name.split("[")[0]
    rank = _CLASS_TK_ORDER.index(base) if base in _CLASS_TK_ORDER else len(_CLASS_TK_ORDER)
    return (rank, base if rank == len(_CLASS_TK_ORDER) else "", name)


def ordered_transfer_names(names) -> list[str]:
    """Transfer-function names in CLASS's column order (unknown names last, alphabetically)."""
    return sorted(names, key=_class_order_key)


def tk_column_names(zs: Sequence[float], names_per_z: Mapping[float, Sequence[str]]) -> list[str]:
    """Header of tk.csv: k, then ``<name>_z<z>`` for each z block."""
    cols = [K_COLUMN]
    for z in zs:
        cols += [f"{name}_z{z_label(z)}" for name in ordered_transfer_names(names_per_z[z])]
    return cols


def dpk_column_names(zs: Sequence[float], parameters: Sequence[str]) -> list[str]:
    """dpk.csv header: k, then dlnP_m per (z, θ), then dlnP_cb per (z, θ)."""
    return [K_COLUMN] + [f"dlnP_{s}_z{z_label(z)}/d{p}" for s in ("m", "cb") for z in zs
                         for p in parameters]


def write_dpk_csv(path, k, dlnpk_m, dlnpk_cb, zs: Sequence[float], parameters: Sequence[str],
                  comments: Sequence[str] = ()) -> Path:
    """Write dpk.csv; ``dlnpk_m``/``dlnpk_cb`` have shape (n_z, n_k, n_θ)."""
    _check_unique_labels(zs)
    k = np.asarray(k, dtype=float)
    dm, dcb = np.asarray(dlnpk_m, float), np.asarray(dlnpk_cb, float)
    shape = (len(zs), k.size, len(parameters))
    if dm.shape != shape or dcb.shape != shape:
        raise ValueError(f"dlnpk arrays must have shape {shape}, got {dm.shape}, {dcb.shape}")
    cols = [k] + [d[iz, :, ip] for d in (dm, dcb) for iz in range(len(zs))
                  for ip in range(len(parameters))]
    notes = [_produced_by(), "exact derivatives dlnP/dθ at fixed k (1/Mpc), forward sensitivities "
             "through background, thermodynamics, initial conditions and perturbations", *comments]
    _write_table(Path(path), dpk_column_names(zs, parameters), cols, notes)
    return Path(path)


def _check_unique_labels(zs: Sequence[float]) -> None:
    labels = [z_label(z) for z in zs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"output z values must be distinct after formatting with :g, got {labels}")


def _write_table(path: Path, header: list[str], columns: list[np.ndarray], comments: Sequence[str],
                 fmt: str = NUMBER_FORMAT) -> None:
    n = columns[0].shape[0]
    for name, col in zip(header, columns):
        if col.shape != (n,):
            raise ValueError(f"column {name} has shape {col.shape}, expected ({n},)")
    lines = [f"# {c}" for c in comments] + ["# " + ",".join(header)]
    table = np.column_stack(columns)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, table, fmt=fmt, delimiter=",", header="\n".join(lines), comments="")


def _produced_by() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"boltzmann-gpu (scripts/transfer.py), {stamp}"


def write_pk_csv(path, k, pk_m: Mapping[float, np.ndarray], pk_cb: Mapping[float, np.ndarray] | None = None,
                 zs: Sequence[float] | None = None, comments: Sequence[str] = ()) -> Path:
    """Write pk.csv (see module docstring). `pk_m`/`pk_cb` map z -> P(k) [Mpc^3] on grid `k` [1/Mpc]."""
    zs = list(pk_m.keys()) if zs is None else list(zs)
    _check_unique_labels(zs)
    k = np.asarray(k, dtype=float)
    cols = [k] + [np.asarray(pk_m[z], dtype=float) for z in zs]
    if pk_cb is not None:
        cols += [np.asarray(pk_cb[z], dtype=float) for z in zs]
    header = pk_column_names(zs, with_cb=pk_cb is not None)
    notes = [_produced_by(), "linear P(k); k in 1/Mpc (no h), P in Mpc^3 (no h); "
             "P_m = total matter (cdm+b+massive nu), P_cb = cdm+b", *comments]
    _write_table(Path(path), header, cols, notes)
    return Path(path)


def write_tk_csv(path, k, transfers: Mapping[float, Mapping[str, np.ndarray]], zs: Sequence[float] | None = None,
                 comments: Sequence[str] = ()) -> Path:
    """Write tk.csv (see module docstring). `transfers` maps z -> {CLASS name -> array over k}."""
    zs = list(transfers.keys()) if zs is None else list(zs)
    _check_unique_labels(zs)
    k = np.asarray(k, dtype=float)
    names_per_z = {z: list(transfers[z].keys()) for z in zs}
    header = tk_column_names(zs, names_per_z)
    cols = [k]
    for z in zs:
        cols += [np.asarray(transfers[z][name], dtype=float) for name in ordered_transfer_names(names_per_z[z])]
    notes = [_produced_by(),
             "transfer functions, synchronous gauge, CLASS 'class' normalisation (unit primordial curvature R):",
             "P_X(k) = 2 pi^2/k^3 * A_s (k/k_pivot)^(n_s-1) * d_X(k)^2; d_* density contrasts, "
             "t_* velocity divergences theta [1/Mpc]; k in 1/Mpc",
             "column <name>_z<z> holds CLASS's column <name> at redshift z (z as Python's f'{z:g}')",
             *comments]
    _write_table(Path(path), header, cols, notes)
    return Path(path)


def write_background_csv(path, columns: Mapping[str, np.ndarray], comments: Sequence[str] = ()) -> Path:
    """Write background.csv (module docstring) from {name: (n_z,)} holding ``BACKGROUND_COLUMNS``
    (``boltzmann.derived.background_table``); NaN marks a σ8 that could not be formed."""
    missing = [name for name in BACKGROUND_COLUMNS if name not in columns]
    if missing:
        raise ValueError(f"background.csv: missing columns {missing}")
    notes = [_produced_by(), "background observables at z: H = H/c in 1/Mpc, distances in Mpc "
             "(flat: D_M = comoving distance, D_A = D_M/(1+z), D_L = (1+z) D_M, D_H = 1/H, "
             "D_V = (z D_M^2 D_H)^(1/3)); f = dlnD/dlna and D (D(0)=1) from CLASS's "
             "scale-independent growth equation (baryons + CDM); sigma8 = sigma(8 Mpc/h) of the "
             "linear P_m at z (NaN where it could not be formed)", *comments]
    _write_table(Path(path), list(BACKGROUND_COLUMNS),
                 [np.asarray(columns[name], dtype=float) for name in BACKGROUND_COLUMNS], notes,
                 fmt=BACKGROUND_FORMAT)
    return Path(path)


def _jsonable(obj):
    """Convert numpy/JAX scalars and arrays, dataclasses, paths and non-finite floats for json."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return {str(key): _jsonable(val) for key, val in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, str) or obj is None:
        return obj
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):  # numpy or JAX array
        arr = np.asarray(obj)
        return _jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(obj, (float, np.floating)):
        val = float(obj)
        return val if math.isfinite(val) else str(val)
    return str(obj)


def _optional_float(value):
    return None if value is None else float(value)


def write_summary_json(path, *, zs: Sequence[float], sigma8: Mapping[float, float], sigma8_cb: Mapping[float, float],
                       parameters: Mapping, backend: str, solver_stats: Mapping, timings: Mapping[str, float],
                       k=None, extra: Mapping | None = None) -> Path:
    """Write summary.json (see module docstring); z keys become ``z_label(z)`` strings."""
    _check_unique_labels(zs)
    summary = {
        "produced_by": _produced_by(),
        "z": [z_label(z) for z in zs],
        "sigma8": {z_label(z): _optional_float(sigma8[z]) for z in zs},
        "sigma8_cb": {z_label(z): _optional_float(sigma8_cb[z]) for z in zs},
        "parameters": _jsonable(dict(parameters)),
        "backend": str(backend),
        "solver_stats": _jsonable(dict(solver_stats)),
        "timings_s": {str(stage): float(sec) for stage, sec in timings.items()},
        "files": {"pk": PK_FILE, "tk": TK_FILE},
    }
    if k is not None:
        k = np.asarray(k, dtype=float)
        summary["n_k"] = int(k.size)
        summary["k_range_1/Mpc"] = [float(k[0]), float(k[-1])]
    if extra:
        summary.update(_jsonable(dict(extra)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return path


def read_summary_json(path) -> dict:
    return json.loads(Path(path).read_text())


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_pk_csv(path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Read pk.csv / tk.csv or a tests/data reference file: (k, {column name -> array}).

    The header is the last ``#`` comment line before the data (or, failing that, a first
    non-numeric line). The first column is returned as k and also left out of the dict.
    """
    path = Path(path)
    header = None
    n_skip = 0
    with path.open() as fh:
        for line in fh:
            stripped = line.strip()
            if stripped.startswith("#"):
                header = stripped.lstrip("#").strip()
                n_skip += 1
                continue
            if not stripped:
                n_skip += 1
                continue
            first = stripped.split(",")[0].strip()
            if not _is_number(first):  # an uncommented header line
                header = stripped
                n_skip += 1
            break
    if not header:
        raise ValueError(f"{path}: no header line (expected a '# k_1/Mpc,...' comment line before the data)")
    names = [name.strip() for name in header.split(",")]
    data = np.loadtxt(path, delimiter=",", skiprows=n_skip, comments="#", ndmin=2)
    if data.shape[1] != len(names):
        raise ValueError(f"{path}: header names {len(names)} columns but rows have {data.shape[1]}")
    return data[:, 0].copy(), {name: data[:, i].copy() for i, name in enumerate(names) if i > 0}


# ----------------------------------------------------------------------------- CMB spectra
CL_FILE = "cl.csv"
#: cl.csv's columns: ℓ, then D_ℓ of TT, EE, TE, BB [μK²] and [ℓ(ℓ+1)]² C_ℓ^φφ/2π (PP)
CL_COLUMNS = ("ell", "TT", "EE", "TE", "BB", "PP")


def write_cl_csv(path, cl, comments: Sequence[str] = ()) -> Path:
    """Write cl.csv from a ``boltzmann.cmb.ClSpectra`` (unlensed spectra).

    Same comment/header conventions as pk.csv; one row per ℓ = 2..l_max, columns ``CL_COLUMNS``:
    TT, EE, TE, BB as D_ℓ = ℓ(ℓ+1)C_ℓ/2π in μK² (T_cmb in the header), PP as
    [ℓ(ℓ+1)]² C_ℓ^φφ/2π (dimensionless; CLASS's convention); a spectrum that was not asked for
    is written as NaN (BB is zero without lensing: scalar modes make no B).
    """
    d = cl.d_ell()
    ell = np.asarray(cl.ell, dtype=float)
    cols = [ell] + [np.asarray(d.get(name, np.full(ell.size, np.nan)), float)
                    for name in CL_COLUMNS[1:]]
    notes = [_produced_by(), f"unlensed scalar CMB spectra: D_l = l(l+1)C_l/2pi in muK^2 "
             f"(T_cmb = {cl.T_cmb} K) for TT, EE, TE, BB; PP = [l(l+1)]^2 C_l^phiphi/2pi "
             "(dimensionless); NaN = not computed", *comments]
    _write_table(Path(path), list(CL_COLUMNS), cols, notes)
    return Path(path)


CL_LENSED_FILE = "cl_lensed.csv"
#: cl_lensed.csv's columns: ℓ, then lensed D_ℓ of TT, EE, TE, BB [μK²]
CL_LENSED_COLUMNS = ("ell", "TT", "EE", "TE", "BB")


def write_cl_lensed_csv(path, cl, comments: Sequence[str] = ()) -> Path:
    """Write cl_lensed.csv from a ``boltzmann.cmb.ClSpectra`` with lensed spectra: as cl.csv,
    columns ``CL_LENSED_COLUMNS``, D_ℓ = ℓ(ℓ+1)C̃_ℓ/2π in μK²."""
    d = cl.d_ell(lensed=True)
    ell = np.asarray(cl.ell, dtype=float)
    cols = [ell] + [np.asarray(d[name], float) for name in CL_LENSED_COLUMNS[1:]]
    notes = [_produced_by(), f"lensed scalar CMB spectra (all-sky correlation functions, Challinor "
             f"& Lewis 2005): D_l = l(l+1)C_l/2pi in muK^2 (T_cmb = {cl.T_cmb} K)", *comments]
    _write_table(Path(path), list(CL_LENSED_COLUMNS), cols, notes)
    return Path(path)


__all__ += ["CL_FILE", "CL_COLUMNS", "write_cl_csv", "CL_LENSED_FILE", "CL_LENSED_COLUMNS",
            "write_cl_lensed_csv"]


DCL_FILE = "dcl.csv"


def dcl_column_names(outputs: Sequence[str], parameters: Sequence[str],
                     log_outputs: Sequence[str]) -> list[str]:
    """dcl.csv header: ell, then per output and parameter ``dln<X>/d<θ>`` (``log_outputs``) or
    ``d<X>/d<θ>`` (TE, lensed_TE)."""
    return ["ell"] + [f"{'dln' if name in log_outputs else 'd'}{name}/d{p}" for name in outputs
                      for p in parameters]


def write_dcl_csv(path, table: dict, log_outputs: Sequence[str],
                  comments: Sequence[str] = ()) -> Path:
    """Write dcl.csv from ``boltzmann.cmb.ClFunction.dcl()``'s table: one row per ℓ, the
    derivatives of D_ℓ (cl.csv's and cl_lensed.csv's convention) in every parameter."""
    ell = np.asarray(table["ell"], float)
    outputs = list(table["derivative"])
    parameters = list(table["parameters"])
    cols = [ell]
    for name in outputs:
        d = np.asarray(table["derivative"][name], float)
        if d.shape != (ell.size, len(parameters)):
            raise ValueError(f"dcl: {name} has shape {d.shape}, expected "
                             f"{(ell.size, len(parameters))}")
        cols += [d[:, i] for i in range(len(parameters))]
    notes = [_produced_by(), "exact derivatives of the CMB spectra: dln D_l/dtheta for TT, EE, "
             "PP, lensed_TT, lensed_EE, lensed_BB; dD_l/dtheta [muK^2] for TE and lensed_TE "
             "(they cross zero); D_l as in cl.csv; forward sensitivities through background, "
             "thermodynamics, perturbations, line of sight and lensing, at fixed sampling grids",
             *comments]
    _write_table(Path(path), dcl_column_names(outputs, parameters, log_outputs), cols, notes)
    return Path(path)


__all__ += ["DCL_FILE", "dcl_column_names", "write_dcl_csv"]
