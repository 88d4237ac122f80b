"""Exact derivatives of the CMB spectra in the cosmological parameters, by forward sensitivities.

``f = ClFunction(config)``; ``f(theta)`` gives the unlensed C_ℓ (TT, EE, TE, PP) and, with
lensing, the lensed ones (``lensed_TT`` ...) at every ℓ = 2..l_max; ``f.jacobian(theta)`` gives
them with ∂/∂θ; ``f.dcl()`` the table the CLI writes as dcl.csv. θ are the parameters of
``boltzmann.theta`` (the same names and meaning as for P(k)).

The derivative is of the whole chain, each arrow traced::

    θ → cosmology → tables (background, thermodynamics, reionisation from τ_reio)
      → mode rows and initial states at fixed start times;
        τ, e^{-κ}, g at the source samples; τ0; τ_rec           (``_inputs``)
      → per group of modes: ``solver.solve_with_tangents`` (the states and their tangents
        at the samples in one joint solve, one direction per parameter but the primordial
        A_s, n_s, which leave the solve's inputs unchanged: ``ParameterMap.solve_directions``;
        the tangents of only the states the sources read, ``source_states``)
        → the sources and their tangents (the jvp of the source program) (``_sources_jvp``)
      → line of sight, k integral, Limber, ℓ spline, lensing: their jvp, a block of
        directions at a time                                     (``_spectra_jvp``)

the stages of ``boltzmann.cmb.stage`` with the grids fixed, and the Jacobian of P(k)'s
structure (``boltzmann.gradients``): inputs with their tangents, the joint solve, the outputs'
jvp, each a program of its own.

Held fixed (numerical choices made at the fiducial cosmology, as CLASS holds its own grids fixed
when one differences it): the source wavenumbers and the transfer k grid [1/Mpc]; the source
samples in ln a (so τ_i, τ0, the trapezoid weights and the Bessel arguments k(τ0 − τ_i) move with
θ); the maximum of the visibility in ln a (the lensing kernel's τ_rec moves with θ); the sampled
ℓ and their spline; the start times of the modes; the solver groups and the free-streaming
switch; the late-source cut (in ln a); the interpolation cells of Limber's integral.

Costs: one C_ℓ evaluation here solves the same modes as ``compute_cl``; the Jacobian runs one
joint solve per chunk of modes with a direction per non-primordial parameter, and a tangent pass
of the line of sight per such parameter, whose ℓ × k × τ sums dominate on a CPU (docs/cmb.md,
Gradients); the primordial parameters' derivatives start after the transfer functions.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from solver import sec_weight, solve, solve_with_tangents

from .. import modes
from ..gradients_ahead import run_on_host
from ..perturbations import mode_inputs
from ..runtime import require_float64
from ..tables import host_cpu, tables_one
from ..theta import ParameterMap, available_parameters, jvps_along, one, widen
from .bessel import BesselTable
from .lensing import (WignerTables, default_n_beta, input_l_max, lensed_spectra,
                      resolve_method)
from .line_of_sight import transfer_functions
from .source_states import states_read
from .sampling import ClSampling, transfer_wavenumbers, transfer_window
from .sources import (SourceGrid, error_weights, evaluate_sources, source_background,
                      source_plan, source_program)
from .stage import (L_LATE, L_LIMBER, check_request, every_ell, sampled_multipoles,
                    sampled_spectra)

__all__ = ["ClFunction", "LOG_SPECTRA"]

#: spectra whose derivative is written as ∂ln D_ℓ/∂θ (the others, which cross zero: ∂D_ℓ/∂θ)
LOG_SPECTRA = ("TT", "EE", "PP", "lensed_TT", "lensed_EE", "lensed_BB")
#: the Bessel table reaches this much beyond the fiducial k_max τ0, so that τ0 may move
X_MARGIN = 1.02
#: tangent directions per pass of the line of sight on a CPU: each holds ≈ 1.6 GB at ℓ = 2500
#: (docs/cmb.md, Gradients), so two keep a lensed Jacobian within a workstation's memory; an
#: accelerator's memory holds every solved direction in one pass
CPU_DIRECTION_BLOCK = 2


class ClFunction:
    """θ ↦ {TT, EE, TE, PP: (l_max − 1,) unlensed C_ℓ (μK², PP dimensionless); with lensing also
    lensed_TT, lensed_EE, lensed_TE, lensed_BB} at ℓ = 2..l_max, for one config.

    Options: ``parameters`` (default: every one of ``theta.PARAMETERS`` the cosmology has),
    ``l_max``, ``spectra``, ``lensing`` (default: the config's output block, as
    ``cl_for_config``), ``sampling`` (ClSampling), ``backend`` ("jax", "cuda", "auto"),
    ``direction_block``: tangent directions per pass of the line of sight (memory against
    passes: every pass re-runs the primal line of sight, and each direction in a pass holds
    ≈ 1.6 GB at ℓ = 2500; None: every solved direction in one pass where JAX runs on an
    accelerator, two on a CPU), ``sensitivity_error_control`` (as for P(k): default the precision's
    ``sensitivity_error_weight``, docs/gradients.md), ``los_batch``:
    multipoles per iteration of the line of sight (None: ``line_of_sight.multipole_batch``),
    ``lensing_method``: lensing.LENSING_METHODS ("auto": the Wigner table on a GPU, passed to
    the programs as an argument; the ℓ recurrence elsewhere).
    """

    def __init__(self, config, *, parameters: Sequence[str] | None = None, l_max=None,
                 spectra=None, lensing=None, sampling: ClSampling = ClSampling(),
                 backend="jax", direction_block: int | None = None, max_steps: int = 200_000,
                 sensitivity_error_control: bool | float | None = None,
                 los_batch: int | None = None, lensing_method: str = "auto"):
        require_float64()
        out = config.output
        self.l_out = int(getattr(out, "l_max", 2500) if l_max is None else l_max)
        self.spectra = tuple(getattr(out, "cl", ()) or ("TT", "EE", "TE", "PP")) \
            if spectra is None else tuple(spectra)
        self.lensing = bool(getattr(out, "lensing", False)) if lensing is None else bool(lensing)
        check_request(self.l_out, self.spectra, self.lensing)
        if direction_block is not None and int(direction_block) < 1:
            raise ValueError(f"direction_block = {direction_block}: give the number of tangent "
                             "directions per pass of the line of sight, 1 or more (or None)")
        lensing_method = resolve_method(lensing_method)
        if parameters is None:
            parameters = available_parameters(config.cosmology)
        self._map = ParameterMap(config.cosmology, parameters)
        self.parameters = self._map.names
        self.theta0 = self._map.theta0
        self.de_at_lambda = self._map.de_at_lambda
        cosmo, prec = self._map.cosmo0, config.precision
        self.model = modes.model_for(cosmo, prec, de_at_lambda=self.de_at_lambda)
        self.grid = modes.make_grid(prec)
        self.backend = backend
        self.rtol, self.atol = min(sampling.rtol, prec.rtol), prec.atol
        self.max_steps = int(max_steps)
        if sensitivity_error_control is None:
            sensitivity_error_control = prec.sensitivity_error_weight
        self.sensitivity_error_control = sec_weight(sensitivity_error_control)
        if direction_block is None:
            direction_block = self._map.solve_directions.size if \
                jax.default_backend() != "cpu" else CPU_DIRECTION_BLOCK
        self.direction_block = int(direction_block)
        self.l_max = input_l_max(self.l_out) if self.lensing else self.l_out
        self.with_pp = "PP" in self.spectra
        self.names = tuple(n for n in ("TT", "EE", "TE", "PP") if n in self.spectra
                           or self.lensing)

        # the grids, from the fiducial cosmology (module docstring: held fixed)
        table = jax.jit(lambda th: self._tables(th)[1])(self.theta0)
        plan = source_plan(table[0], one(cosmo), prec, self.model, self.grid, self.l_max,
                           sampling=sampling, lensing_modes=self.with_pp)
        self.plan = plan
        self.ells = sampled_multipoles(self.l_max, sampling)
        self.sampling = sampling
        #: multipoles per line-of-sight iteration (None: sized for the jvp's direction block)
        self.los_batch = los_batch
        self.k_transfer = transfer_wavenumbers(plan.k[:plan.n_cmb], plan.tau0_fid, sampling)
        self.window = transfer_window(self.ells, self.k_transfer, plan.tau_fid, plan.tau0_fid,
                                      plan.tau_rec_fid, sampling)
        self.bessel = BesselTable.cached(
            self.ells, X_MARGIN * float(self.k_transfer[-1] * plan.tau0_fid) + 1.0)
        #: the lensing step's Wigner table where ``lensing_method`` resolves to "tables"
        #: (lensing.resolve_method), else None (the ℓ recurrence inside the program)
        wigner = None
        if self.lensing and lensing_method == "tables":
            wigner = WignerTables.cached(self.l_max, default_n_beta(self.l_max)).d
        self._table_args = (jnp.asarray(self.bessel.j), jnp.asarray(self.bessel.dj), wigner)
        self.l_limber = min(L_LIMBER, self.l_max)
        #: the Jacobian's solver calls: (mode indices, padded to the chunk size, photons
        #: controlled or None: each mode its group's row of weights)
        self._chunks = plan.chunks(backend)
        #: the value's solver calls: every mode, each with its group's error weights
        self._launches = plan.launches(backend)
        self._weight_rows = plan.error_weight_rows(self.model)
        self._program = source_program(self.model)
        #: the states the sources read: the Jacobian's solves keep only theirs
        self._read = states_read(self.model, table.shape)
        self._jit_inputs = jax.jit(self._inputs)
        #: run θ → inputs (and their tangents) on the host CPU when the default device is an
        #: accelerator, as ``PowerSpectrumFunction`` does: the tables' sequential scan runs at
        #: kernel-launch latency on a GPU (``tables.HOST_TABLES_MAX``)
        self.inputs_on_host = host_cpu() is not None
        self._jit_inputs_jvp = jax.jit(self._inputs_and_tangents)
        self._jit_sources = jax.jit(self._sources)
        self._jit_sources_jvp = jax.jit(self._sources_jvp, static_argnames="chunk")
        self._jit_spectra = jax.jit(self._spectra)
        self._jit_spectra_jvp = jax.jit(self._spectra_jvp)

    # -- the stages
    def _tables(self, theta):
        cosmo = one(self._map.cosmology(theta))
        table, _ = jax.vmap(lambda c: tables_one(c, self.grid, self.model))(cosmo)
        return cosmo, table

    def _solve_inputs(self, theta):
        """θ → (table (1, …), rows (K, P), y0 (K, n), background at the samples)."""
        cosmo, table = self._tables(theta)
        rows, y0 = mode_inputs(table, cosmo, self.plan.k[None], self.plan.x0, self.model,
                               self.grid)
        bg = source_background(self.model, table[0], self.grid, self.plan)
        return table, rows, y0, bg

    def _primordial(self, theta):
        """θ → {A_s, n_s, k_pivot, T_cmb}: what the spectra read of the cosmology directly."""
        cosmo = self._map.cosmology(theta)
        return {name: jnp.asarray(getattr(cosmo, name), jnp.float64)
                for name in ("A_s", "n_s", "k_pivot", "T_cmb")}

    def _inputs(self, theta):
        """θ → (table (1, …), rows (K, P), y0 (K, n), background at the samples, {A_s, n_s,
        k_pivot, T_cmb})."""
        return (*self._solve_inputs(theta), self._primordial(theta))

    def _inputs_and_tangents(self, theta):
        """(inputs, their tangents with the direction axis first): the solve's inputs along
        the solve's directions only (``ParameterMap.solve_directions``: a primordial
        parameter leaves them unchanged), {A_s, n_s, k_pivot, T_cmb} along every parameter."""
        solve_in, dsolve_in = jvps_along(self._solve_inputs, theta, self._map.solve_directions)
        prim, dprim = jvps_along(self._primordial, theta, np.arange(theta.size))
        return (*solve_in, prim), (*dsolve_in, dprim)

    def _sources(self, ys, rows, table, bg, streaming):
        return evaluate_sources(self._program, ys, self.plan.x, rows, table, bg, streaming)

    def _chunk_weights(self, chunk: int) -> np.ndarray:
        """The error weights of chunk ``chunk``'s solve: its group's row, or a row per mode."""
        _, pad, controlled = self._chunks[chunk]
        if controlled is None:
            return self._weight_rows[pad]
        return error_weights(self.model, controlled)

    def _sources_jvp(self, table, rows, y0, x0, bg, streaming, dtable, drows, dy0, dbg, *,
                     chunk: int):
        """Chunk ``chunk`` of the modes: the joint solve and the sources' jvp, (sources,
        tangents (m, …))."""
        read = self._read
        ys, dys = solve_with_tangents(
            self.model.rhs, y0, self.plan.x, rows, dy0=dy0, dparams=drows, dargs=dtable,
            args=table, t0=x0, rtol=self.rtol, atol=self.atol,
            error_weights=self._chunk_weights(chunk), max_steps=self.max_steps,
            backend=self.backend, sensitivity_error_control=self.sensitivity_error_control,
            saved_states=read)
        # the sources do not read the other states: zeros stand in for them

        def every_state(a):
            return jnp.zeros(a.shape[:-1] + (self.model.n,), a.dtype).at[..., read].set(a)

        ys, dys = every_state(ys), every_state(dys)

        def tangent(dy, dr, dt, db):
            return jax.jvp(lambda a, b, c, d: self._sources(a, b, c, d, streaming),
                           (ys, rows, table, bg), (dy, dr, dt, db))

        values, tangents = jax.vmap(tangent, out_axes=(None, 0))(dys, drows, dtable, dbg)
        return values, tangents

    def _source_grid(self, srcs, bg):
        plan = self.plan
        return SourceGrid(k=plan.k, tau=bg["tau"], x=plan.x, tau0=bg["tau0"],
                          tau_rec=bg["tau_rec"], t0=srcs[0], t1=srcs[1], t2=srcs[2], e=srcs[3],
                          phi=srcs[4], status=None, n_accepted=None, n_cmb=plan.n_cmb)

    def _transfers(self, srcs, bg, table_args):
        """Sources (five (K, S) arrays) → the line of sight's transfer functions."""
        table = dataclasses.replace(self.bessel, j=table_args[0], dj=table_args[1])
        return transfer_functions(self._source_grid(srcs, bg), self.ells, self.k_transfer,
                                  table, l_late=L_LATE, l_limber=self.l_limber,
                                  window=self.window, spline_degree=self.sampling.k_spline_degree,
                                  batch=self.los_batch)

    def _from_transfers(self, tr, srcs, bg, prim, table_args):
        """Transfer functions → the outputs (class docstring): the k integral with the
        primordial spectrum, Limber, the ℓ spline, lensing."""
        plan = self.plan
        sampled = sampled_spectra(tr, self._source_grid(srcs, bg), prim["A_s"], prim["n_s"],
                                  prim["k_pivot"], T_cmb=prim["T_cmb"], l_limber=self.l_limber,
                                  with_pp=self.with_pp, tau_fid=plan.tau_fid,
                                  tau0_fid=plan.tau0_fid)
        cl = every_ell(sampled, self.ells, self.l_max, self.names, self.sampling.l_spline_degree)
        n = self.l_out - 1
        out = {name: cl[name][:n] for name in self.names if name in self.spectra}
        if self.lensing:
            lensed = lensed_spectra(np.arange(2, self.l_max + 1), cl, self.l_out,
                                    method="recurrence", wigner=table_args[2])
            out.update({f"lensed_{name}": v for name, v in lensed.items()})
        return out

    def _spectra(self, srcs, bg, prim, table_args):
        """Sources (five (K, S) arrays) → the outputs (class docstring), traceable;
        ``table_args``: the Bessel table's (j, dj) and the lensing step's Wigner table (or
        None), arguments of the program rather than constants compiled into it (hundreds of MB
        and GB)."""
        return self._from_transfers(self._transfers(srcs, bg, table_args), srcs, bg, prim,
                                    table_args)

    def _spectra_jvp(self, srcs, bg, prim, dsrcs, dbg, dprim, table_args):
        """(outputs, ∂outputs with the direction axis last). ``dsrcs``, ``dbg`` are along the
        solve's directions, ``dprim`` along every parameter. The solve's directions pass
        through the line of sight, ``direction_block`` at a time (``lax.map`` over blocks
        bounds the memory of its tangents); a primordial parameter's moves only what follows
        the transfer functions, which are computed once for it."""
        S = self._map.solve_directions
        m = jax.tree_util.tree_leaves(dprim)[0].shape[0]
        spectra = functools.partial(self._spectra, table_args=table_args)
        tangents = (dsrcs, dbg, jax.tree_util.tree_map(lambda t: t[S], dprim))
        b = min(self.direction_block, S.size)
        n_blocks = -(-S.size // b)
        pad = n_blocks * b - S.size
        if n_blocks == 1:
            # one pass: the values and the transfer functions are its primal (a separate value
            # call would run the line of sight a second time)
            traced = {}

            def with_transfers(s, g, p):
                tr = traced["tr"] = self._transfers(s, g, table_args)
                return self._from_transfers(tr, s, g, p, table_args), (tr.T, tr.E, tr.P)

            (values, (T, E, P)), (jac, _) = jax.vmap(
                lambda s, g, p: jax.jvp(with_transfers, (srcs, bg, prim), (s, g, p)),
                out_axes=((None, None), 0))(*tangents)
            tr = dataclasses.replace(traced["tr"], T=T, E=E, P=P)   # its grids with the values
            return self._with_primordial(jac, S, m, tr, srcs, bg, prim, dprim, table_args,
                                         values)
        tr = self._transfers(srcs, bg, table_args)
        values = self._from_transfers(tr, srcs, bg, prim, table_args)

        def blocked(t):
            t = jnp.concatenate([t, jnp.zeros((pad,) + t.shape[1:], t.dtype)]) if pad else t
            return t.reshape((n_blocks, b) + t.shape[1:])

        def block(tb):
            return jax.vmap(lambda s, g, p: jax.jvp(spectra, (srcs, bg, prim),
                                                    (s, g, p))[1])(*tb)

        out = jax.lax.map(block, jax.tree_util.tree_map(blocked, tangents))
        jac = jax.tree_util.tree_map(lambda t: t.reshape((n_blocks * b,) + t.shape[2:])[:S.size],
                                     out)
        return self._with_primordial(jac, S, m, tr, srcs, bg, prim, dprim, table_args, values)

    def _with_primordial(self, jac, S, m, tr, srcs, bg, prim, dprim, table_args, values):
        """(values, ∂outputs with the direction axis last): the solve's directions' ``jac``
        (S.size, …) widened to all m, the primordial parameters' added from the transfer
        functions ``tr`` on."""
        jac = widen(jac, S, m)
        rest = np.setdiff1d(np.arange(m), S)
        if rest.size:
            after = jax.vmap(lambda p: jax.jvp(
                lambda q: self._from_transfers(tr, srcs, bg, q, table_args), (prim,), (p,))[1])(
                jax.tree_util.tree_map(lambda t: t[rest], dprim))
            jac = jax.tree_util.tree_map(lambda j, a: j.at[rest].set(a), jac, after)
        return values, jax.tree_util.tree_map(lambda t: jnp.moveaxis(t, 0, -1), jac)

    # -- the public calls
    def _theta(self, theta):
        return self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)

    def _scatter(self, pieces):
        """Chunks' (five (c, …) arrays) → five (K, …) arrays in mode order."""
        order = np.concatenate([idx for idx, _, _ in self._chunks])
        inverse = np.empty(order.size, np.int64)
        inverse[order] = np.arange(order.size)
        return tuple(jnp.concatenate(parts)[jnp.asarray(inverse)] for parts in zip(*pieces))

    def _host_inputs(self, program, theta):
        """``program(theta)`` on the host CPU, its result moved to the default device, where
        ``inputs_on_host`` (and θ is concrete); else where θ is."""
        cpu = host_cpu() if self.inputs_on_host else None
        if cpu is None or isinstance(theta, jax.core.Tracer):
            return program(theta)
        return run_on_host(program, theta, cpu)

    def __call__(self, theta=None) -> dict:
        """The outputs at θ (default: the fiducial); raises RuntimeError naming the modes whose
        solve failed."""
        table, rows, y0, bg, prim = self._host_inputs(self._jit_inputs, self._theta(theta))
        pieces, failed = [], []
        for idx, pad in self._launches:
            sol = solve(self.model.rhs, y0[pad], self.plan.x, rows[pad], args=table,
                        t0=self.plan.x0[pad], rtol=self.rtol, atol=self.atol,
                        error_weights=self._weight_rows[pad], backend=self.backend,
                        max_steps=self.max_steps)
            status = np.asarray(sol.status)[:idx.size]
            failed += [float(self.plan.k[i]) for i in idx[status != 0]]
            srcs = self._jit_sources(sol.ys, rows[pad], table, bg, self.plan.streaming[pad])
            pieces.append(tuple(s[:idx.size] for s in srcs))
        _raise_failures(failed)
        sources = pieces[0] if len(pieces) == 1 else tuple(
            jnp.concatenate(parts) for parts in zip(*pieces))   # launches are in mode order
        return self._jit_spectra(sources, bg, prim, self._table_args)

    def jacobian(self, theta=None) -> tuple[dict, dict]:
        """(values, jac): jac[name] has the output's shape + (len(θ),). On the JAX backend the
        values come from the joint solves (the steps that also control the tangents).
        ``last_stage_seconds`` gets the wall seconds of its three stages (inputs, sources,
        spectra; each waited for, so that what bounds a Jacobian can be read)."""
        t0 = time.perf_counter()
        (table, rows, y0, bg, prim), (dtable, drows, dy0, dbg, dprim) = jax.block_until_ready(
            self._host_inputs(self._jit_inputs_jvp, self._theta(theta)))
        t1 = time.perf_counter()
        pieces, tangents = [], []
        for c, (idx, pad, _) in enumerate(self._chunks):
            srcs, dsrcs = self._jit_sources_jvp(
                table, rows[pad], y0[pad], self.plan.x0[pad], bg, self.plan.streaming[pad],
                dtable, drows[:, pad], dy0[:, pad], dbg, chunk=c)
            pieces.append(tuple(s[:idx.size] for s in srcs))
            tangents.append(tuple(jnp.moveaxis(d[:, :idx.size], 0, 1) for d in dsrcs))
        srcs = self._scatter(pieces)
        dsrcs = jax.block_until_ready(
            tuple(jnp.moveaxis(d, 1, 0) for d in self._scatter(tangents)))
        t2 = time.perf_counter()
        values, jac = jax.block_until_ready(self._jit_spectra_jvp(
            srcs, bg, prim, dsrcs, dbg, dprim, self._table_args))
        self.last_stage_seconds = {"inputs": t1 - t0, "sources": t2 - t1,
                                   "spectra": time.perf_counter() - t2}
        bad = [name for name in values if not (np.all(np.isfinite(np.asarray(values[name])))
                                               and np.all(np.isfinite(np.asarray(jac[name]))))]
        if bad:
            raise RuntimeError(f"C_ℓ gradients: {', '.join(bad)} not finite: a mode's "
                               "sensitivity solve failed (raise max_steps or loosen rtol)")
        return values, jac

    def dcl(self, theta=None) -> dict:
        """The dcl.csv table: ell (L,), parameters, theta, D_ℓ per output (TT, EE, TE, BB as
        ℓ(ℓ+1)C_ℓ/2π [μK²], PP as [ℓ(ℓ+1)]²C_ℓ/2π), and ``derivative[name]`` (L, n_θ):
        ∂ln D_ℓ/∂θ for ``LOG_SPECTRA``, ∂D_ℓ/∂θ [μK²] for TE; with the wall time."""
        t0 = time.perf_counter()
        values, jac = self.jacobian(theta)
        ell = np.arange(2, self.l_out + 1, dtype=np.float64)
        f = ell * (ell + 1.0) / (2.0 * math.pi)
        d_ell, derivative = {}, {}
        for name, v in values.items():
            scale = f * ell * (ell + 1.0) if name == "PP" else f
            d_ell[name] = scale * np.asarray(v)
            dj = np.asarray(jac[name]) * scale[:, None]
            derivative[name] = dj / d_ell[name][:, None] if name in LOG_SPECTRA else dj
        return {"ell": ell, "parameters": self.parameters,
                "theta": np.asarray(self._theta(theta)), "D_ell": d_ell,
                "derivative": derivative, "seconds": time.perf_counter() - t0}


def _raise_failures(k_failed) -> None:
    if k_failed:
        raise RuntimeError("C_ℓ: the solve failed for the modes at k = "
                           + ", ".join(f"{k:.4g}" for k in k_failed[:10])
                           + (" ..." if len(k_failed) > 10 else "") + " 1/Mpc")

