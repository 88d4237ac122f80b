"""What a batch file was made from: the config (by content), the parameter table and the code.

A batch resumes into an existing file only when the new run would compute the same numbers,
so the file records a hash of everything that sets them — the precision block, the redshifts and
k grid, the config's cosmology (every key a row leaves empty comes from it) — and a hash of the
parameter table. The config's name, its output folder and its comments do not enter the hash:
renaming or re-commenting a YAML file must not orphan a half-finished weekend run.

The code version (package version and, in a git checkout, the commit) is recorded but not
enforced: resuming after an update is allowed, and every version that wrote rows is listed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from ..params import Config
from .table import ParamTable, base_block

__all__ = ["config_description", "config_hash", "config_yaml", "table_hash", "code_version",
           "describe_difference"]


def config_description(config: Config) -> dict:
    """The parts of a config that determine a batch's numbers, as plain JSON-able values."""
    out = config.output
    if out.k_values is not None:
        grid = {"k_values_1/Mpc": [float(k) for k in out.k_values]}
    else:
        grid = {"k_min_h/Mpc": out.k_min, "k_max_h/Mpc": out.k_max,
                "k_per_decade": out.k_per_decade}
    return {"cosmology": base_block(config.cosmology),
            "output": {"z": [float(z) for z in out.z], **grid},
            "precision": dataclasses.asdict(config.precision)}


def _canonical(data) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def config_hash(config: Config) -> str:
    """SHA-256 of the config's description (hex)."""
    return hashlib.sha256(_canonical(config_description(config)).encode()).hexdigest()


def config_yaml(config: Config) -> str:
    """The description as YAML, with the name and source, for people reading the file."""
    head = {"name": config.name,
            "source": None if config.source_path is None else str(config.source_path)}
    return yaml.safe_dump({**head, **config_description(config)}, sort_keys=False)


def table_hash(table: ParamTable) -> str:
    """SHA-256 of the table's column names, values (NaN = empty) and unreadable rows."""
    h = hashlib.sha256()
    h.update(_canonical(list(table.names)).encode())
    h.update(np.ascontiguousarray(table.values, dtype="<f8").tobytes())
    h.update(_canonical(sorted(table.errors)).encode())
    return h.hexdigest()


def describe_difference(stored_yaml: str, config: Config, limit: int = 5) -> str:
    """'precision.rtol: file 1e-05, now 0.0001; ...' between a stored description and a config."""
    try:
        stored = yaml.safe_load(stored_yaml) or {}
    except yaml.YAMLError:
        return "the file's config could not be read back"
    now = config_description(config)
    diffs = []
    for block, values in now.items():
        before = stored.get(block, {}) or {}
        for key in sorted(set(values) | set(before)):
            if values.get(key) != before.get(key):
                diffs.append(f"{block}.{key}: file {before.get(key)!r}, now {values.get(key)!r}")
    if not diffs:
        return "the descriptions differ in a way the comparison does not show"
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more


@lru_cache(maxsize=1)
def code_version() -> str:
    """'boltzmann-gpu 0.1.0' plus the git commit ('+dirty' with local changes) when available."""
    try:
        from importlib.metadata import version
        text = f"boltzmann-gpu {version('boltzmann-gpu')}"
    except Exception:  # noqa: BLE001 - not installed: the checkout still has a commit
        text = "boltzmann-gpu (not installed)"
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                    capture_output=True, text=True, timeout=10)
            if commit.returncode == 0 and commit.stdout.strip():
                text += f" (git {commit.stdout.strip()})"
        except (OSError, subprocess.SubprocessError):
            pass
    return text
