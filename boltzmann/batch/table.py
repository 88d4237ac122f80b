"""The parameter table of a batch: a CSV of CLASS-named cosmology keys, one cosmology a row.

A table is read once, up front, into plain numbers: an (N, P) float array whose empty cells are
NaN ("take this key from the config"), plus the rows that could not be read at all (wrong cell
count, a cell that is not a finite number). Problems with the *header* stop the batch before
anything runs, because they concern every row (an unknown column, a duplicated one, a column
that contradicts the config); problems with one *row* are recorded for that row and the others
are computed, because a weekend's batch must not die on line 81 234.

Each row becomes a cosmology by overlaying its cells on the config's cosmology block and running
the same validation as a YAML config (``boltzmann.params.load_config``), so a bad row gets the
message a bad config would get. That validation costs about a millisecond a row (the massive
neutrino density is an integral), so it runs per chunk, next to the solve, not here.
"""
from __future__ import annotations

import csv
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..params import Config, CosmoParams, load_config
from ..schema import COSMOLOGY_TABLE
from .errors import BatchError

__all__ = ["ParamTable", "TableError", "COLUMNS", "read_table", "check_columns", "base_block",
           "row_block", "row_cosmology", "structure_keys"]

#: the columns a table may have: the config schema's cosmology keys
COLUMNS = tuple(COSMOLOGY_TABLE)
_NCDM_LISTS = ("m_ncdm", "deg_ncdm", "T_ncdm")
_AMPLITUDE = ("A_s", "ln10^{10}A_s")
_FLUID = ("w0_fld", "wa_fld")


class TableError(BatchError, ValueError):
    """The table as a whole cannot be used (file, header, or a column against the config)."""


@dataclass
class ParamTable:
    """A parsed parameter table.

    names: the P column names (schema keys); values: (N, P) float64, NaN where a cell is empty
    (the config's value is used) or unreadable; errors: {row: message} of the rows that could not
    be read (they are recorded as failed and never computed); lines: (N,) line numbers in the
    file, for messages; source: the file.
    """

    names: tuple
    values: np.ndarray
    errors: dict = field(default_factory=dict)
    lines: np.ndarray | None = None
    source: Path | None = None

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])


def _check_header(header: list[str], source) -> tuple:
    names = tuple(h.strip() for h in header)
    for name in names:
        if name == "":
            raise TableError(f"{source}: the header has an empty column name; every column must "
                             f"be a cosmology key ({', '.join(COLUMNS)})")
        if name not in COSMOLOGY_TABLE:
            hint = difflib.get_close_matches(name, COLUMNS, n=1, cutoff=0.5)
            hint_text = f"; did you mean {hint[0]!r}?" if hint else ""
            raise TableError(f"{source}: unknown column {name!r}{hint_text} (columns must be "
                             f"cosmology keys of the config schema: {', '.join(COLUMNS)}; "
                             f"docs/parameters.md)")
    seen = set()
    for name in names:
        if name in seen:
            raise TableError(f"{source}: column {name!r} appears twice in the header")
        seen.add(name)
    return names


def _parse_row(cells: list[str], names: tuple, line: int) -> tuple[np.ndarray, str | None]:
    row = np.full(len(names), np.nan)
    if len(cells) != len(names):
        return row, (f"line {line}: {len(cells)} cells, but the header has {len(names)} "
                     f"columns")
    problems = []
    for j, (name, cell) in enumerate(zip(names, cells)):
        text = cell.strip()
        if text == "":
            continue
        try:
            value = float(text)
        except ValueError:
            problems.append(f"column {name} = {text!r} is not a number")
            continue
        if not math.isfinite(value):
            problems.append(f"column {name} = {text!r} is not a finite number (leave the cell "
                            f"empty to use the config's value)")
            continue
        row[j] = value
    if problems:
        return np.full(len(names), np.nan), f"line {line}: " + "; ".join(problems)
    return row, None


def read_table(path: str | Path) -> ParamTable:
    """Parse a comma-separated table: a header of schema keys, then one cosmology per line.

    Blank lines and lines starting with ``#`` are skipped. Raises TableError for a missing or
    unreadable file, an empty table or a bad header; bad rows are returned in ``errors``.
    """
    path = Path(path)
    try:
        with open(path, newline="") as fh:
            lines = [(i, line) for i, line in enumerate(fh, start=1)
                     if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise TableError(f"cannot read the parameter table {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TableError(f"{path}: not a text (UTF-8) file: {exc}") from exc
    if not lines:
        raise TableError(f"{path}: no header line; the first line must name the columns, e.g. "
                         f"'h,omega_cdm,A_s'")
    reader = csv.reader(line for _, line in lines)
    names = _check_header(next(reader), path)
    values, errors, numbers = [], {}, []
    for (line_no, _), cells in zip(lines[1:], reader):
        row, problem = _parse_row(cells, names, line_no)
        if problem is not None:
            errors[len(values)] = problem
        values.append(row)
        numbers.append(line_no)
    if not values:
        raise TableError(f"{path}: the table has a header but no rows")
    return ParamTable(names=names, values=np.asarray(values, np.float64).reshape(-1, len(names)),
                      errors=errors, lines=np.asarray(numbers), source=path)


# --------------------------------------------------------------------------- rows -> cosmologies
def base_block(cosmo: CosmoParams) -> dict:
    """A config's cosmology as a ``cosmology:`` block (CLASS names), the base every row overlays."""
    block = {name: float(getattr(cosmo, name))
             for name in ("h", "omega_b", "omega_cdm", "A_s", "n_s", "k_pivot", "tau_reio",
                          "YHe", "T_cmb", "N_ur")}
    for name in _NCDM_LISTS:
        block[name] = [float(x) for x in np.asarray(getattr(cosmo, name))]
    if cosmo.use_fld:
        block["w0_fld"] = float(cosmo.w0_fld)
        block["wa_fld"] = float(cosmo.wa_fld)
        block["use_ppf"] = bool(cosmo.use_ppf)
        block["cs2_fld"] = float(cosmo.cs2_fld)
    return block


def check_columns(names, config: Config) -> None:
    """Refuse columns that cannot mean one thing for this config (before anything runs)."""
    n = config.cosmology.n_ncdm
    given = [name for name in _NCDM_LISTS if name in names]
    if given and n > 1:
        raise TableError(f"column {given[0]} sets a single massive species, but the config has "
                         f"{n}; a table row describes at most one massive species. Give the "
                         f"species in the config and vary other keys, or use a config with one "
                         f"species (deg_ncdm sets its degeneracy)")


def row_block(base: dict, names, row) -> dict:
    """The cosmology block of one row: its non-empty cells over the config's block.

    A row's amplitude (A_s or ln10^{10}A_s) replaces the config's, whichever key either uses;
    ``m_ncdm`` (and ``deg_ncdm``, ``T_ncdm``) describe one massive species, ``N_ncdm = 0`` none;
    ``w0_fld``/``wa_fld`` switch the row to the dark-energy fluid.
    """
    block = {k: (list(v) if isinstance(v, list) else v) for k, v in base.items()}
    given = {name: float(v) for name, v in zip(names, row) if not math.isnan(v)}
    if any(k in given for k in _AMPLITUDE):
        for k in _AMPLITUDE:
            block.pop(k, None)
    n_base = len(base["m_ncdm"])
    if "m_ncdm" in given and n_base != 1:
        block.pop("deg_ncdm", None)
        block["T_ncdm"] = COSMOLOGY_TABLE["T_ncdm"].default
    if given.get("N_ncdm") == 0.0 and "m_ncdm" not in given:
        for k in _NCDM_LISTS:
            block.pop(k, None)
    for name, value in given.items():
        block[name] = [value] if name in ("m_ncdm", "deg_ncdm") else value
    return block


def row_cosmology(base: dict, names, row) -> CosmoParams:
    """The validated CosmoParams of one row; raises ``boltzmann.params.ConfigError``."""
    return load_config({"cosmology": row_block(base, names, row)}).cosmology


def structure_keys(table: ParamTable, config: Config) -> list[tuple[int, bool]]:
    """(number of ncdm species, fluid?) of every row, from the cells alone (no validation).

    Rows of one key share one generated perturbation model, so they can share a launch. A row
    whose cells contradict each other gets some key and then fails its validation.
    """
    cosmo = config.cosmology
    col = {name: table.values[:, j] for j, name in enumerate(table.names)}
    N = table.n_rows
    n = np.full(N, cosmo.n_ncdm, dtype=np.int64)
    if "m_ncdm" in col:
        n[~np.isnan(col["m_ncdm"])] = 1
    if "N_ncdm" in col:
        given = ~np.isnan(col["N_ncdm"])
        n[given] = np.rint(col["N_ncdm"][given]).astype(np.int64)
    fld = np.full(N, bool(cosmo.use_fld))
    for name in _FLUID:
        if name in col:
            fld |= ~np.isnan(col[name])
    return list(zip(n.tolist(), fld.tolist()))
