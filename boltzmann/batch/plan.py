"""How a table is cut into launches: rows grouped by species structure, groups cut into chunks.

Cosmologies of one launch must share one generated perturbation model (same number of massive
species, Λ or fluid; ``ensemble.StructureMismatch`` otherwise), so rows are grouped by that
structure first, each group in table order. A group is cut into chunks of ``chunk_size`` rows
(a group smaller than that is one chunk of its own size); every chunk of a group is launched
with the same number of cosmologies (compute.py pads), so each group compiles once.

The plan depends only on the table, the config and the chunk size, never on what is already
done, so a restart rebuilds exactly the chunks of the first run and skips the finished ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..params import Config
from .table import ParamTable, structure_keys

__all__ = ["Chunk", "plan_chunks", "default_chunk_size", "DEFAULT_CHUNK"]

#: rows per launch when ``--chunk-size`` is not given, by JAX platform: on a GPU the ensemble
#: throughput still grows up to 1024 cosmologies per launch (docs/benchmarks.md, "ensemble
#: throughput"); on a CPU a launch of 16 default-precision cosmologies takes minutes, so a
#: killed run loses little
DEFAULT_CHUNK = {"gpu": 1024, "cuda": 1024, "rocm": 1024, "cpu": 16}


@dataclass(frozen=True)
class Chunk:
    """Rows launched together; ``pad_to``: the launch size of the chunk's group."""

    index: int
    rows: np.ndarray
    pad_to: int
    structure: tuple

    def describe(self) -> str:
        n, fld = self.structure
        return f"{n} ncdm species, {'w0-wa fluid' if fld else 'Lambda'}"


def default_chunk_size(platform: str) -> int:
    return DEFAULT_CHUNK.get(platform, DEFAULT_CHUNK["cpu"])


def plan_chunks(table: ParamTable, config: Config, chunk_size: int) -> list[Chunk]:
    """Every readable row in exactly one chunk; unreadable rows (``table.errors``) in none."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
    groups: dict[tuple, list[int]] = {}
    for row, key in enumerate(structure_keys(table, config)):
        if row not in table.errors:
            groups.setdefault(key, []).append(row)
    chunks = []
    for key, rows in groups.items():
        size = min(chunk_size, len(rows))
        for start in range(0, len(rows), size):
            chunks.append(Chunk(index=len(chunks), rows=np.asarray(rows[start:start + size]),
                                pad_to=size, structure=key))
    return chunks
