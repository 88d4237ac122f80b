"""The hand-over from a model to a neutrino-fluid form of it (models/species/neutrino_fluids.py).

A mode switches at one time: its state in the first model becomes the second's state there.
States both models have (the metric, CDM, baryons, photons, F_ur_0..2, dark energy) carry over;
each massive species' fluid variables are the quadrature sums of its hierarchy, which the first
model's observables already compute: delta = d_ncdm[s], theta = t_ncdm[s], sigma = s_ncdm[s].
Both models take the same parameter row and tables, so only the state changes.

``full_layout_map`` goes the other way for the outputs: it writes a fluid state into the full
model's layout so that the full model's observables of it are the fluid model's (replaced
multipoles above the fluid's are zero, every momentum node of a massive species carries the
same moments, scaled so that the quadrature sums give back delta, theta and sigma). A pipeline
whose modes end in different forms then hands one array of states to one observables function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .species.neutrino_fluids import fluid_state_names

__all__ = ["fluid_state_map", "full_layout_map", "check_pair"]


def _replaced(model) -> set:
    return set(filter(None, model.neutrino_fluid.split("+")))


def check_pair(full, fluid) -> None:
    """Raise ValueError unless ``fluid`` replaces more hierarchies of the same model than
    ``full`` does (a later form of it)."""
    if not _replaced(full) < _replaced(fluid):
        raise ValueError("fluid_state_map: the second model must replace more neutrino "
                         "hierarchies than the first, got neutrino_fluid = "
                         f"({full.neutrino_fluid!r}, {fluid.neutrino_fluid!r})")
    if full.param_names != fluid.param_names or full.ncdm != fluid.ncdm:
        raise ValueError("fluid_state_map: the two models differ in their parameters or "
                         "massive species; build both from the same arguments")


def _sources(full, fluid) -> list[tuple[str, object]]:
    """For each fluid state: ("y", index in the full state) or ("obs", observable key)."""
    by_name = {}
    for s in range(len(full.ncdm) if "ncdm" not in _replaced(full) else 0):
        for name, key in zip(fluid_state_names(s), ("d_ncdm", "t_ncdm", "s_ncdm")):
            by_name[name] = ("obs", f"{key}[{s}]")
    out = []
    for name in fluid.state_names:
        if name in by_name:
            out.append(by_name[name])
        elif name in full.state_names:
            out.append(("y", full.index(name)))
        else:
            raise ValueError(f"fluid_state_map: no source for the fluid state {name!r}")
    return out


def fluid_state_map(full, fluid):
    """``f(y (N, n_full), x (N,), rows (N, P), tab) -> (N, n_fluid)``: the fluid model's state of
    each mode at its switch time x, traceable (the map is linear in y)."""
    check_pair(full, fluid)
    sources = _sources(full, fluid)
    needs_obs = any(kind == "obs" for kind, _ in sources)

    def one(y, x, p, tab):
        obs = full.observables(y, x, p, tab) if needs_obs else {}
        return jnp.stack([y[v] if kind == "y" else obs[v] for kind, v in sources])

    return jax.vmap(one, in_axes=(0, 0, 0, None))


def full_layout_map(fluid, full):
    """``f(y (N, n_fluid), x (N,), rows (N, P)) -> (N, n_full)``: the fluid state in the full
    model's layout, with the same observables (module docstring); traceable, linear in y."""
    check_pair(full, fluid)
    replaced_ncdm = "ncdm" in _replaced(fluid) and "ncdm" not in _replaced(full)
    copies = [(full.index(name), fluid.index(name)) for name in fluid.state_names
              if name in full.state_names]
    k_col = full.param_index("k")

    def one(y, x, p):
        out = jnp.zeros(full.n, y.dtype).at[jnp.array([i for i, _ in copies])].set(
            y[jnp.array([j for _, j in copies])])
        if not replaced_ncdm:
            return out
        a = jnp.exp(x)
        for s, quad in enumerate(full.ncdm):
            q, w = jnp.asarray(quad.q), jnp.asarray(quad.weights)
            eps = jnp.sqrt(q * q + (a * p[full.param_index(f"ncdm_m_over_T_{s}")]) ** 2)
            rho_plus_p = jnp.sum(w * eps) + jnp.sum(w * q * q / eps) / 3.0   # / nrm
            d, t, sg = (y[fluid.index(n)] for n in fluid_state_names(s))
            moments = (d, t * rho_plus_p / (p[k_col] * jnp.sum(w * q)),
                       sg * rho_plus_p / (2.0 / 3.0 * jnp.sum(w * q * q / eps)))
            for i in range(len(quad.q)):
                for l, value in enumerate(moments):
                    out = out.at[full.index(f"Psi_{s}_q{i}_l{l}")].set(value)
        return out

    return jax.vmap(one)
