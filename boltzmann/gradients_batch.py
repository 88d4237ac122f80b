"""Values and exact Jacobians of a ``PowerSpectrumFunction``'s outputs for C cosmologies at once.

A sampler with many walkers or chains, a Fisher grid or an emulator's training set asks for the
outputs and their θ-derivatives at C parameter vectors together. ``PowerSpectrumBatch(fn)`` runs
``fn.jacobian``'s three stages — θ → (tables, mode rows, initial states) with their tangents; one
joint sensitivity solve; the outputs' jvp — on the ensemble of the C cosmologies, so the solve is
one launch of C·K modes × the solve's directions (one CUDA kernel launch on the GPU), not C
launches one after another, each as long as its own slowest mode; as for ``fn``, the primordial
parameters get no direction in the solve (``ParameterMap.solve_directions``).

Why one direction per parameter serves all C cosmologies: cosmology c's outputs depend on its own θ_c alone
(the modes of cosmology c read only row c of the tables), so the directional derivative along
E_j — parameter j of every cosmology moved together — is, for cosmology c, ∂(output_c)/∂θ_{c,j}.

The numerical choices are ``fn``'s: its k grid (σ8's extra modes included), redshifts, tolerances,
error weights and the start time of each mode, fixed at the fiducial cosmology's (module
docstring of ``boltzmann.gradients``), so row c equals ``fn.jacobian(thetas[c])`` to the solver
tolerance (the modes of a joint solve share no step sizes, and the chunks differ).
"""
from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from solver.backends.registry import resolve_backend

from . import modes
from .params import ConfigError
from .perturbations import (N_CHUNKS_JAX, mode_inputs, solve_modes, solve_modes_with_tangents,
                            transfers_of_states)
from .spectra import power_spectra
from .tables import tables_one
from .theta import widen

__all__ = ["PowerSpectrumBatch"]


class PowerSpectrumBatch:
    """``fn``'s outputs and Jacobian at C parameter vectors, in one solve per stage.

    ``batch = PowerSpectrumBatch(fn)``; ``batch.values(thetas)`` and
    ``batch.value_and_jacobian(thetas)`` take thetas (C, len(fn.parameters)) and return what
    ``fn(theta)`` / ``fn.jacobian(theta)`` return with a leading axis of C on every output (and θ's
    axis last on every derivative), plus ``"ok"`` (C,) in the values: True where every output
    (and derivative) of that cosmology is finite — a mode whose solve failed makes its
    cosmology's outputs NaN, never another cosmology's. ``n_chunks`` as for
    ``PowerSpectrumFunction`` (default: one solve on the CUDA backend, ``N_CHUNKS_JAX`` lock-step
    solves on the JAX backend). Each C compiles its programs once.
    """

    def __init__(self, fn, *, n_chunks: int | None = None):
        if getattr(fn, "fluid_phases", None):
            raise ValueError("PowerSpectrumBatch does not run the neutrino-fluid phases "
                             "(docs/perturbations.md); build its function with precision "
                             "ur_fluid_k_tau and ncdm_fluid_k_tau at 0")
        self.fn = fn
        self.parameters = fn.parameters
        self.last_stage_seconds = None   # the last call's wall seconds per stage
        self._n_chunks = n_chunks
        self._programs: dict = {}

    # -- per-C constants: the modes of all cosmologies, their start times and solve chunks
    def _layout(self, C: int) -> dict:
        fn = self.fn
        K = fn.k_solve.size
        k = np.broadcast_to(fn.k_solve, (C, K)).copy()
        x0 = np.tile(np.asarray(fn.x0, np.float64), C)
        # sorted by k across cosmologies: neighbouring trajectories take similar step counts
        on_jax = resolve_backend(fn.backend).name == "jax"
        order = modes.solve_order(k, not on_jax)
        n_chunks = self._n_chunks
        if n_chunks is None:
            n_chunks = N_CHUNKS_JAX if on_jax else 1
        n_chunks = max(1, min(int(n_chunks), order.size))
        size = int(math.ceil(order.size / n_chunks))
        chunks = [order[i:i + size] for i in range(0, order.size, size)]
        # the P(k) axis the solved modes ``k`` are part of (fn.sampling fills in the others)
        k_axis = np.broadcast_to(fn.k_axis, (C, fn.k_axis.size)).copy()
        return {"k": k, "k_axis": k_axis, "x0": x0, "chunks": chunks}

    # -- the stages on C cosmologies (traceable in thetas)
    def _cosmologies(self, thetas):
        one = lambda th: jax.tree_util.tree_map(  # noqa: E731
            lambda x: jnp.asarray(x, jnp.float64), self.fn.cosmology(th))
        return jax.vmap(one)(thetas)

    def _solve_inputs(self, thetas, lay):
        """((table, rows, y0), the thermodynamic redshifts) of the C cosmologies."""
        fn = self.fn
        cosmos = self._cosmologies(thetas)
        table, thermo = jax.vmap(lambda c: tables_one(c, fn.grid, fn.model))(cosmos)
        rows, y0 = mode_inputs(table, cosmos, lay["k"], lay["x0"], fn.model, fn.grid)
        return (table, rows, y0), thermo

    def _background(self, thetas, thermo):
        """The background outputs: they depend on θ and the thermodynamics alone (computed
        with the tables)."""
        fn = self.fn
        return jax.vmap(lambda th, td: fn._background(
            fn.cosmology(th), {name: v[None] for name, v in td.items()}))(thetas, thermo)

    def _inputs(self, thetas, lay):
        (table, rows, y0), thermo = self._solve_inputs(thetas, lay)
        return table, rows, y0, self._background(thetas, thermo)

    def _outputs(self, thetas, ys, rows, table, background, lay):
        fn = self.fn
        cosmos = self._cosmologies(thetas)
        fields = transfers_of_states(ys, rows, table, lay["k"], fn.z, fn.model)
        spec = power_spectra(fields, lay["k_axis"], cosmos, with_sigma8=fn.with_sigma8,
                             sampling=fn.sampling)
        keep = fn.keep
        out = {"P_m": spec["P_m"][:, :, keep], "P_cb": spec["P_cb"][:, :, keep],
               "d_m": fn.sampling.fill_transfer(fields["d_m"])[:, :, keep]}
        if fn.with_sigma8:
            out["sigma8"] = spec["sigma8"]
            out["sigma8_cb"] = spec["sigma8_cb"]
        out.update(background)
        return out

    def _solve_options(self, lay) -> dict:
        fn = self.fn
        return dict(rtol=fn.rtol, atol=fn.atol, chunks=lay["chunks"], backend=fn.backend,
                    sensitivity_error_control=fn.sensitivity_error_control,
                    max_steps=fn.MAX_STEPS, weights=fn.weights)

    def _build(self, C: int) -> dict:
        fn, lay = self.fn, self._layout(C)
        opts = self._solve_options(lay)
        P = len(self.parameters)

        def value(thetas):
            table, rows, y0, background = self._inputs(thetas, lay)
            ys = solve_modes(table, rows, y0, lay["x0"], fn.z, fn.model, **opts)
            return self._outputs(thetas, ys, rows, table, background, lay)

        S = fn._map.solve_directions

        def directions(thetas, which=slice(None)):
            # E_j: parameter j of every cosmology moved together (module docstring)
            eye = jnp.eye(P, dtype=thetas.dtype)[which]
            return jax.vmap(lambda e: jnp.broadcast_to(e, thetas.shape))(eye)

        def inputs_jvp(thetas):
            # the solve's inputs along its directions only (ParameterMap.solve_directions),
            # the background outputs along every parameter
            f = lambda th: self._solve_inputs(th, lay)  # noqa: E731
            (solve_in, thermo), (dsolve_in, dthermo) = jax.vmap(
                lambda e: jax.jvp(f, (thetas,), (e,)), out_axes=(None, 0))(
                directions(thetas, S))
            background, dbackground = jax.vmap(
                lambda e, dt: jax.jvp(self._background, (thetas, thermo), (e, dt)),
                out_axes=(None, 0))(directions(thetas), widen(dthermo, S, P))
            return (*solve_in, background), (*dsolve_in, dbackground)

        def solve_jvp(table, rows, y0, dtable, drows, dy0):
            return solve_modes_with_tangents(table, rows, y0, dtable, drows, dy0, lay["x0"],
                                             fn.z, fn.model, **opts)

        def outputs_jvp(thetas, ys, rows, table, background, dys, drows, dtable, dbackground):
            f = lambda *a: self._outputs(*a, lay)  # noqa: E731
            dys, drows, dtable = widen((dys, drows, dtable), S, P)
            return jax.vmap(
                lambda e, a, b, c, d: jax.jvp(f, (thetas, ys, rows, table, background),
                                              (e, a, b, c, d)),
                out_axes=(None, -1))(directions(thetas), dys, drows, dtable, dbackground)

        return {"value": jax.jit(value), "inputs_jvp": jax.jit(inputs_jvp),
                "solve_jvp": jax.jit(solve_jvp), "outputs_jvp": jax.jit(outputs_jvp)}

    def _programs_for(self, thetas):
        thetas = jnp.asarray(thetas, jnp.float64)
        P = len(self.parameters)
        if thetas.ndim != 2 or thetas.shape[1] != P or thetas.shape[0] < 1:
            raise ConfigError(
                f"PowerSpectrumBatch: thetas must have shape (C, {P}) — one row per cosmology, "
                f"columns {list(self.parameters)} — got {tuple(thetas.shape)}")
        C = int(thetas.shape[0])
        if C not in self._programs:
            self._programs[C] = self._build(C)
        return thetas, self._programs[C]

    # -- public
    def values(self, thetas) -> dict:
        """Outputs at every row of thetas (C, n_θ): one plain ensemble solve of all modes."""
        thetas, prog = self._programs_for(thetas)
        t0 = time.perf_counter()
        out = jax.block_until_ready(prog["value"](thetas))
        self.last_stage_seconds = {"all": time.perf_counter() - t0}
        out["ok"] = _finite_per_cosmology(out)
        return out

    def value_and_jacobian(self, thetas) -> tuple[dict, dict]:
        """(values, jac) at every row of thetas (C, n_θ): jac[name] has values[name]'s shape +
        (n_θ,); the solve is one joint sensitivity solve of C·K modes × n_θ directions."""
        thetas, prog = self._programs_for(thetas)
        t0 = time.perf_counter()
        (table, rows, y0, background), (dtable, drows, dy0, dbackground) = jax.block_until_ready(
            prog["inputs_jvp"](thetas))
        t1 = time.perf_counter()
        ys, dys = jax.block_until_ready(prog["solve_jvp"](table, rows, y0, dtable, drows, dy0))
        t2 = time.perf_counter()
        val, jac = jax.block_until_ready(prog["outputs_jvp"](thetas, ys, rows, table, background,
                                                             dys, drows, dtable, dbackground))
        self.last_stage_seconds = {"inputs": t1 - t0, "solve": t2 - t1,
                                   "outputs": time.perf_counter() - t2}
        val = dict(val)
        val["ok"] = _finite_per_cosmology(val) & _finite_per_cosmology(jac)
        return val, jac

    def jacobian(self, thetas) -> tuple[dict, dict]:
        """The name ``PowerSpectrumFunction`` uses for what ``value_and_jacobian`` returns."""
        return self.value_and_jacobian(thetas)


def _finite_per_cosmology(out: dict) -> np.ndarray:
    """(C,) True where every entry of every output (leading axis C) is finite."""
    ok = None
    for name, v in out.items():
        if name == "ok":
            continue
        a = np.asarray(v)
        f = np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
        ok = f if ok is None else ok & f
    return ok
