"""Which perturbation states the CMB sources read, derived from the source program itself.

The C_ℓ Jacobian needs the states and their tangents only where the sources read them
(``solver.solve_with_tangents``'s ``saved_states``): of the EB model's states, the metric, the
matter and the low photon and neutrino multipoles, and whatever φ' + ψ' reaches through the rhs —
a few tens of states where the model has near a hundred. On the CUDA backend the tangents of
every state at every source sample cross from the GPU to the host and back (gigabytes for the
Planck-like run), so the set matters.

The set is structural, not probed: the sources of one mode at one time
(``sources.source_terms``) are traced with each state a scalar input of their own, and the
dependence of the outputs on those inputs is followed through the trace, every operation's
outputs depending on all its inputs (calls into nested programs are followed inside). A state
is read if some output depends on it for some value of the parameters — a coefficient that
vanishes at one cosmology (1 + w at Λ) does not hide it, as probing with tangents would.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from .sources import source_terms

__all__ = ["states_read", "output_dependence"]


def states_read(model, tab_shape) -> np.ndarray:
    """Increasing indices of the states of ``model`` the sources of a mode read (module
    docstring); ``tab_shape``: the shape of the table the source program takes (only shapes
    are traced; a mode's parameter row has one entry per ``model.param_names``)."""
    f64 = jnp.float64
    scalar = jax.ShapeDtypeStruct((), f64)
    n = int(model.n)

    def sources(ys, x, p, tab, exp_mk, g, tau, tau0, tau_rec, streaming):
        return source_terms(model, tuple(ys), x, p, tab, exp_mk, g, tau, tau0, tau_rec,
                            streaming)

    closed = jax.make_jaxpr(sources)(
        [scalar] * n, scalar, jax.ShapeDtypeStruct((len(model.param_names),), f64),
        jax.ShapeDtypeStruct(tuple(tab_shape), f64), scalar, scalar, scalar, scalar, scalar,
        jax.ShapeDtypeStruct((), jnp.bool_))
    n_in = len(closed.jaxpr.invars)
    deps = output_dependence(closed.jaxpr, [frozenset([i]) if i < n else frozenset()
                                            for i in range(n_in)])
    return np.array(sorted(frozenset().union(*deps)), dtype=np.int64)


def _inner(eqn):
    """The jaxpr a call-like equation runs on its own operands (pjit, custom_jvp_call, ...), or
    None."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is None:
            continue
        sub = getattr(sub, "jaxpr", sub)          # a ClosedJaxpr's own jaxpr
        if isinstance(sub, core.Jaxpr) and len(sub.invars) == len(eqn.invars):
            return sub
    return None


def output_dependence(jaxpr, in_deps) -> list[frozenset]:
    """For each output of ``jaxpr``, the union of the labels ``in_deps`` (one frozenset per
    input) it depends on: every equation's outputs take the union of its inputs' labels, a call
    into a nested jaxpr with the same operands is followed inside (finer than the union)."""
    env: dict = {}

    def read(atom):
        return frozenset() if isinstance(atom, core.Literal) else env.get(atom, frozenset())

    for var, labels in zip(jaxpr.invars, in_deps):
        env[var] = labels
    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        sub = _inner(eqn)
        if sub is not None:
            outs = output_dependence(sub, ins)
        else:
            union = frozenset().union(*ins)
            outs = [union] * len(eqn.outvars)
        for var, labels in zip(eqn.outvars, outs):
            env[var] = labels
    return [read(v) for v in jaxpr.outvars]
