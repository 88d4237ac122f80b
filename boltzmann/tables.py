"""Stage 1: background and thermodynamics tables, for one cosmology or many at once.

``compute_tables(cosmos, grid, model)`` evaluates ``boltzmann.background`` and
``boltzmann.thermodynamics`` on the uniform ln a grid and packs what the perturbation equations
read (ln ℋ, ln τ, ln κ', c_s² and their x-derivatives, for cubic Hermite interpolation) into the
``models.tables`` layout. ``model_table`` and ``tables_one`` are the traceable pieces that
``boltzmann.gradients`` differentiates through; ``compute_tables`` is the concrete driver (one
compiled program per model and grid, cosmologies in pieces, host placement for few cosmologies).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from models.hermite import cumulative_hermite
from solver.caches import Cache
from solver.persisted import PersistedProgram

from . import background as bg
from .modes import Grid
from .thermodynamics import LoopShape, compute_thermodynamics

__all__ = ["Tables", "compute_tables", "model_table", "tables_one", "thermodynamics_on",
           "host_cpu", "DERIVED", "TABLE_CHUNK", "HOST_TABLES_MAX", "ACCELERATOR_LOOPS"]

#: thermodynamic numbers reported with the tables (CLASS's definitions, boltzmann.thermodynamics)
DERIVED = ("z_reio", "z_rec", "z_star", "z_drag")
#: most cosmologies per compiled (vmapped) tables program; larger batches run in pieces of this
#: size, all through one program (the sequential scan's time hardly depends on the batch: 256
#: cosmologies in one piece take 362 ms on an H200, 128 take 350 ms; XLA's GPU compile of the
#: rolled form vmapped over 1024 stalled)
TABLE_CHUNK = 256
#: up to this many cosmologies the tables are computed on the host CPU when the default device is
#: an accelerator: the 4000-node sequential scan runs at kernel-launch latency on a GPU, slower
#: than a CPU core for a handful of cosmologies (docs/benchmarks.md)
HOST_TABLES_MAX = 16

#: the loop shape of tables computed on an accelerator, where every loop iteration and every
#: LAPACK-like call is a kernel launch: the Newton iterations written out and the small systems
#: solved in straight-line code (2.8× faster than the rolled LAPACK form for 128 cosmologies on
#: an H200; four nodes per scan iteration gained 2 % more and compiled 2.6× longer:
#: scripts/bench_tables.py, docs/benchmarks.md)
ACCELERATOR_LOOPS = LoopShape(newton_unrolled=True, scan_unroll=1, inline_solves=True)

_PROGRAMS = Cache("boltzmann.tables", maxsize=16)


@dataclass(frozen=True)
class Tables:
    """Background and thermodynamics of C cosmologies, as the perturbation stage reads them.

    grid: the ln a grid of every table;
    model_table: (C, n_columns, 2, n_grid) array, values and d/dx of ``model.table_columns`` at
        the grid nodes (``models.tables`` layout; row c belongs to cosmology c);
    derived: {name: (C,)} thermodynamic numbers (``DERIVED``: z_reio, z_rec, z_star, z_drag);
    device: where the tables were computed ("cpu", "gpu", ...).
    """

    grid: Grid
    model_table: object
    derived: dict
    device: str

    @property
    def n_cosmologies(self) -> int:
        return int(self.model_table.shape[0])


def host_cpu():
    """JAX's CPU device when the default device is an accelerator, else None."""
    try:
        if jax.default_backend() == "cpu":
            return None
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def model_table(cosmo, thermo, grid: Grid, model) -> jnp.ndarray:
    """One cosmology's (n_columns, 2, n_grid) table on ``grid`` (values and d/dx); traceable."""
    x = jnp.asarray(grid.nodes)
    a = jnp.exp(x)
    H = bg.hubble(cosmo, a)
    conf_h = a * H
    dlnh = 1.0 + bg.dhubble_dlna(cosmo, a) / H
    # tau(x) = tau(x_0) + int dx / (aH), accumulated along the grid by the Hermite (corrected
    # trapezoid) rule, O(dx^4) ~ 1e-12 relative at the default grid; a direct quadrature at
    # every node costs 200 Hubble evaluations per node and compiles poorly when vmapped
    inv_ah = 1.0 / conf_h
    tau = bg.conformal_time(cosmo, a[0]) + cumulative_hermite(grid.dx, inv_ah, -inv_ah * dlnh)
    cols = {
        "ln_conformal_hubble": (jnp.log(conf_h), dlnh),
        "ln_conformal_time": (jnp.log(tau), 1.0 / (conf_h * tau)),
        "ln_kappa_dot": (thermo.ln_kappa_dot, thermo.dln_kappa_dot),
        "cs2_b": (thermo.cs2, thermo.dcs2),
    }
    return jnp.stack([jnp.stack([jnp.asarray(v), jnp.asarray(d)]) for v, d in
                      (cols[name] for name in model.table_columns)])


def thermodynamics_on(cosmo, grid: Grid, loops: LoopShape | None = None):
    """One cosmology's ThermoTable on ``grid``'s nodes, its recombination steps as the grid says
    (``Grid.thermo_stride``): every caller that needs the tables' thermodynamics gets the same
    ones. Traceable; ``loops`` as ``tables_one``'s."""
    return compute_thermodynamics(cosmo, lna_grid=grid.nodes, loops=loops,
                                  ode_stride=grid.thermo_stride)


def tables_one(cosmo, grid: Grid, model, loops: LoopShape | None = None):
    """(model table (n_columns, 2, n_grid), {DERIVED name: scalar}) of one cosmology; traceable.
    ``loops``: the thermodynamics' loop shape (``boltzmann.thermodynamics.LoopShape``)."""
    thermo = thermodynamics_on(cosmo, grid, loops)
    return model_table(cosmo, thermo, grid, model), {n: getattr(thermo, n) for n in DERIVED}


def _program(grid: Grid, model, batched: bool, loops: LoopShape | None = None):
    """jit(vmap(tables_one)) (``batched``) or jit(tables_one) for one grid and model, compiled
    once (its traced form persisted when a program store is set). One cosmology runs unbatched:
    XLA fuses the vmapped scan differently, which moves the tables by ~1e-10, and a lone
    cosmology should not pay for batching."""
    def build():
        one = lambda c: tables_one(c, grid, model, loops)  # noqa: E731
        # persisted (solver.persisted): later processes skip its ~1 s trace. The model's
        # generated source is all of it the program depends on besides the grid and columns
        parts = ("boltzmann.tables", repr(grid), tuple(model.table_columns),
                 hashlib.sha256(model.source.encode()).hexdigest(), bool(batched), repr(loops))
        return model, PersistedProgram(jax.vmap(one) if batched else one, parts,
                                       name="boltzmann.tables")
    return _PROGRAMS.get_or_build((grid, id(model), batched, loops), build)[1]


def _in_pieces(grid: Grid, model, cosmos, C: int, chunk: int, loops: LoopShape | None):
    """The tables of C cosmologies: unbatched for one, else in pieces of at most ``chunk``; the
    last piece is padded by repeating the last cosmology, so every piece reuses one compiled
    program."""
    if C == 1:
        tab, derived = _program(grid, model, False, loops)(
            jax.tree_util.tree_map(lambda x: x[0], cosmos))
        return tab[None], {name: v[None] for name, v in derived.items()}
    program = _program(grid, model, True, loops)
    if C <= chunk:
        return program(cosmos)
    tabs, ders = [], []
    for start in range(0, C, chunk):
        idx = np.minimum(np.arange(start, start + chunk), C - 1)
        piece = jax.tree_util.tree_map(lambda x: x[idx] if getattr(x, "ndim", 0) >= 1 else x,
                                       cosmos)
        tab, derived = program(piece)
        n = min(chunk, C - start)
        tabs.append(tab[:n])
        ders.append({name: v[:n] for name, v in derived.items()})
    return (jnp.concatenate(tabs),
            {name: jnp.concatenate([d[name] for d in ders]) for name in ders[0]})


def compute_tables(cosmos, grid: Grid, model, *, on_host: bool | None = None,
                   chunk: int = TABLE_CHUNK, loops: LoopShape | None = None) -> Tables:
    """Tables of C cosmologies (a CosmoParams with a leading axis of C on every leaf).

    on_host: compute on the host CPU and copy the result to the default device (default: when an
    accelerator is the default device and C <= HOST_TABLES_MAX).
    loops: the thermodynamics' loop shape (default: ``ACCELERATOR_LOOPS`` where the tables run on
    an accelerator, the rolled loops on a CPU).
    """
    C = int(np.shape(cosmos.h)[0])
    cpu = host_cpu()
    if on_host is None:
        on_host = C <= HOST_TABLES_MAX
    if on_host and cpu is not None:
        with jax.default_device(cpu):
            tab, derived = jax.device_get(_in_pieces(grid, model, cosmos, C, chunk, loops))
        device = "cpu"
    else:
        device = jax.default_backend()
        if loops is None and device != "cpu":
            loops = ACCELERATOR_LOOPS
        tab, derived = _in_pieces(grid, model, cosmos, C, chunk, loops)
        tab = tab.block_until_ready()
    return Tables(grid=grid, model_table=jnp.asarray(tab),
                  derived={n: np.asarray(derived[n]) for n in DERIVED}, device=device)
