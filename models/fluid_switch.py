"""The hand-over from a model to a neutrino-fluid form of it (models/species/neutrino_fluids.py).

A mode switches at one time: its state in the first model becomes the second's state there.
States both models have (the metric, CDM, baryons, photons, F_ur_0..2, dark energy) carry over;
each massive species' fluid variables are the quadrature sums of its hierarchy, which the first
model's observables already compute: delta = d_ncdm[s], theta = t_ncdm[s], sigma = s_ncdm[s].
Both models take the same parameter row and tables, so only the state changes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .species.neutrino_fluids import fluid_state_names

__all__ = ["fluid_state_map", "check_pair"]


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
