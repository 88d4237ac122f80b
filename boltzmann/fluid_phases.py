"""When each mode's neutrinos become fluids, and the hand-over between the phases of its solve.

A mode whose k τ reaches the precision's ``ur_fluid_k_tau`` or ``ncdm_fluid_k_tau`` before its
first save time continues from then in a neutrino-fluid form of the model
(models/species/neutrino_fluids.py; docs/perturbations.md). ``plan`` gives the switches in the
order they happen — the same order for every mode, since both are k τ thresholds — with each
mode's switch time, held fixed like the start times (a numerical choice, not a function of the
cosmological parameters). boltzmann.perturbations runs one solve per phase, of the modes still
running; ``to_next`` maps their states (and tangents) into the next form, ``to_full`` writes a
finished mode's states into the full model's layout so that one observables function reads all.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models.fluid_switch import fluid_state_map, full_layout_map

from . import modes

__all__ = ["plan", "phase_chunks", "phase_weights", "to_next", "to_full"]

#: the order in which a model's hierarchies are named in its form ("ur+ncdm")
_SPECIES = ("ur", "ncdm")


def plan(model, model_table, grid, k, cosmo_row, precision, x_save) -> list:
    """[(form, x (N,))]: the neutrino-fluid switches in the order they happen, each with the
    form the model takes (models.eb.FLUID_FORMS) and every mode's switch time, +inf where the
    mode does not switch — all modes whose k τ reaches the trigger only after their first save
    time (low-k modes, cheap in the full model). Empty when both keys are 0 (or, for ncdm, the
    model has no massive species). Equal triggers make one switch.

    k: (N,) wavenumbers [1/Mpc]; cosmo_row: (N,) each mode's row of ``model_table``."""
    triggers = [(float(precision.ur_fluid_k_tau), "ur")]
    if model.ncdm:
        triggers.append((float(precision.ncdm_fluid_k_tau), "ncdm"))
    triggers = [(kt, sp) for kt, sp in triggers if kt > 0.0]
    out, replaced = [], []
    for k_tau in sorted({kt for kt, _ in triggers}):
        replaced += [sp for kt, sp in triggers if kt == k_tau]
        x = modes.switch_times(model, model_table, grid, np.asarray(k, np.float64),
                               np.asarray(cosmo_row).astype(int), k_tau)
        out.append(("+".join(sorted(replaced, key=_SPECIES.index)),
                    np.where(x < np.asarray(x_save)[0], x, np.inf)))
    return out


def phase_chunks(chunks, active: np.ndarray, n_modes: int) -> list:
    """The chunks (index arrays into all ``n_modes``) restricted to the ``active`` modes, as
    positions in ``active``; empty chunks dropped (the order, by k, is kept)."""
    pos = np.full(n_modes, -1)
    pos[active] = np.arange(active.size)
    out = [pos[np.asarray(c)] for c in chunks]
    return [c[c >= 0] for c in out if np.any(c >= 0)]


def phase_weights(form_model, model, weights) -> np.ndarray:
    """The error weights of a form of ``model`` with the baryon weight ``weights`` gives."""
    return modes.error_weights(form_model, float(np.asarray(weights)[model.index("delta_b")]))


def to_next(current, nxt, y, x, rows, table, dy=None, drows=None, dtable=None):
    """``nxt``'s states (N, n') of states ``y`` (N, n) of ``current`` at times x (N,); with the
    tangents (m leading) also their tangents (m, N, n')."""
    fn = fluid_state_map(current, nxt)
    x = jnp.asarray(x)
    if dy is None:
        return fn(y, x, rows, table)

    def along(a, b, c):
        return jax.jvp(lambda yy, rr, tt: fn(yy, x, rr, tt), (y, rows, table), (a, b, c))[1]
    return fn(y, x, rows, table), jax.vmap(along)(dy, drows, dtable)


def to_full(form_model, model, ys, x_save, rows, dys=None, drows=None):
    """States (N, S, n_form) at the save times in ``model``'s layout (N, S, n) with the same
    observables; with tangents (m leading) also theirs."""
    N, S = ys.shape[:2]
    fn = full_layout_map(form_model, model)
    x = jnp.tile(jnp.asarray(x_save), N)

    def lift(yy, rr):
        return fn(yy.reshape(N * S, -1), x, jnp.repeat(rr, S, axis=0)).reshape(N, S, -1)
    if dys is None:
        return lift(ys, rows)
    return lift(ys, rows), jax.vmap(lambda a, b: jax.jvp(lift, (ys, rows), (a, b))[1])(dys, drows)
