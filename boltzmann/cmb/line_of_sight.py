"""Line-of-sight integration: transfer functions Δ_ℓ^X(k) from the sources (JAX).

For each sampled ℓ and the k of its window of the transfer grid (boltzmann.cmb.sampling:
``transfer_window``; Δ_ℓ is zero outside it),

    Δ_ℓ^T(k) = Σ_i w_i [S_0 j_ℓ(x_i) + S_1 j_ℓ'(x_i) + S_2 j_ℓ''(x_i)],
    Δ_ℓ^E(k) = √((ℓ+2)!/(ℓ-2)!) Σ_i w_i S_E j_ℓ(x_i)/x_i²,
    Δ_ℓ^φ(k) = Σ_i w_i S_φ j_ℓ(x_i),                   x_i = k (τ0 - τ_i),

with trapezoid weights w_i on the source times τ_i (τ_i, τ0 may be traced: the samples are fixed
in ln a, so a change of cosmology moves τ_i, τ0 and the weights), and the sources carried from
the source k grid to the transfer k grid by a quintic spline in ln k (a banded operator,
``k_spline``). The Bessel values come from boltzmann.cmb.bessel's table. The window bounds the
cost: a multipole
costs its window's width (a third of the grid at the default sampling) times the source times;
Δ^φ, smooth in k, is computed on every ``phi_stride``-th wavenumber only.

Late sources (τ > ``late_cut_tau``, default the conformal time at z = 30: late ISW,
reionisation) are included for ℓ ≤ ``l_late`` only; at higher ℓ they contribute below 1e-4
(their k range projects to low ℓ), as in CLASS (``transfer_neglect_late_source``). The lensing
potential lives at late times and is integrated over all τ for ℓ ≤ ``l_limber``; above it
boltzmann.cmb.spectra uses Limber's approximation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import bessel
from .k_spline import BandedSpline
from .sampling import ClSampling, TransferWindow

__all__ = ["Transfers", "transfer_functions", "plan_of", "fine_sources", "trapezoid",
           "multipole_batch"]

def multipole_batch(width: int, n_tau: int, copies: int = 1) -> int:
    """Multipoles per iteration of the line of sight's loops when the caller gives none: 1 on
    every backend (``width``, ``n_tau``, ``copies``: the slab one multipole works on, kept for
    callers that size a batch by it).

    Why not more on a GPU: several multipoles per ``lax.map`` iteration was meant to spend fewer
    kernel launches, but compiled whole on an H100 (configs/planck_cl.yaml, the 182 multipoles
    above l_late) four per iteration took 0.040 s against 0.023 s for one
    (scripts/profile_los_forms.py, docs/benchmarks.md): the iterations' arithmetic, not their
    launches, bounds it. An explicit ``batch`` still takes several (the transfers are the same
    for any batch)."""
    del width, n_tau, copies
    return 1


@dataclass(frozen=True)
class Transfers:
    """Δ_ℓ^X(k) on the sampled multipoles ``ells`` (L,) and the transfer grid ``k`` (K,).

    T, E: (L, K) temperature and E polarisation (units of Θ per unit curvature), zero outside
    each multipole's window; P: (L_P, K_P) the lensing potential at ``ells_p`` (the ℓ ≤ l_limber
    part) on the wavenumbers ``k_p`` (a subset of ``k``), or None.
    """

    ells: np.ndarray
    k: np.ndarray
    T: jnp.ndarray
    E: jnp.ndarray
    ells_p: np.ndarray
    P: jnp.ndarray | None
    k_p: np.ndarray | None = None


def trapezoid(t):
    """Trapezoid weights on the nodes t (jnp: differentiable in t)."""
    half = 0.5 * jnp.diff(t)
    zero = jnp.zeros(1, half.dtype)
    return jnp.concatenate([half, zero]) + jnp.concatenate([zero, half])


def fine_sources(src, k_fine, degree: int = ClSampling.k_spline_degree):
    """{name: (K_fine, S)} the sources on ``k_fine``: the spline of ``degree`` in ln k through
    the source modes (``k_spline.BandedSpline``, the banded form of ``spline_matrix``)."""
    spline = BandedSpline.build(src.k, k_fine, degree)
    return {name: spline.apply(getattr(src, name)) for name in ("t0", "t1", "t2", "e", "phi")}


def _window_rows(table, ils, starts, width, lo, hi, k, chi, w, srcs, batch: int = 1,
                 dot=None):
    """Δ^T, Δ^E (len(ils), K) of the multipoles ``ils``, each integrated over the ``width``
    transfer wavenumbers from its ``starts`` entry and kept on its window [lo, hi) (zero
    elsewhere in its row); ``batch`` multipoles per iteration. With ``dot`` = (χ̇, ẇ, sources'
    tangents) also their tangents (``_line_of_sight_jvp``): (Δ^T, Δ^E, Δ̇^T, Δ̇^E)."""
    n_k = k.shape[0]
    names = ("t0", "t1", "t2", "e")

    def body(args):
        il, start, first, end = args
        ks = jax.lax.dynamic_slice_in_dim(k, start, width)
        s0, s1, s2, se = (jax.lax.dynamic_slice_in_dim(srcs[n], start, width) for n in names)
        x = ks[:, None] * chi[None, :]
        if dot is None:
            j, dj, d2j, j_x2 = bessel.values(table, il, x)
        else:
            (j, dj, d2j, j_x2), slope = bessel.values_and_slopes(table, il, x)
        ell = jnp.asarray(table.ells)[il].astype(jnp.float64)
        pref_e = jnp.sqrt((ell + 2.0) * (ell + 1.0) * ell * (ell - 1.0))
        index = start + jnp.arange(width)
        keep = (index >= first) & (index < end)
        integrand_t = s0 * j + s1 * dj + s2 * d2j
        integrand_e = se * j_x2
        rows = [integrand_t @ w, pref_e * (integrand_e @ w)]
        if dot is not None:
            # x = k χ moves with χ: Σ_i w_i ∂(integrand)/∂x k χ̇_i is the slopes' integrand
            # against w χ̇ (a matrix product over the directions, the slopes shared by all)
            chi_dot, w_dot, sd = dot
            d0, d1, d2, de = (jax.lax.dynamic_slice_in_dim(sd[n], start, width) for n in names)
            wc = w * chi_dot
            slope_t = s0 * slope[0] + s1 * slope[1] + s2 * slope[2]
            # Σ_i ṡ(k, i) j(k, i) w_i as a product per k (under vmap one pass over the
            # tangents), not an integrand per direction written out and then summed
            along = functools.partial(jnp.einsum, "ki,ki->k")
            rows.append(along(d0, j * w) + along(d1, dj * w) + along(d2, d2j * w)
                        + ks * (slope_t @ wc) + integrand_t @ w_dot)
            rows.append(pref_e * (along(de, j_x2 * w) + ks * ((se * slope[3]) @ wc)
                                  + integrand_e @ w_dot))
        row = jnp.zeros(n_k, rows[0].dtype)
        return tuple(jax.lax.dynamic_update_slice_in_dim(row, jnp.where(keep, r, 0.0), start, 0)
                     for r in rows)

    return jax.lax.map(body, tuple(jnp.asarray(a, jnp.int32) for a in (ils, starts, lo, hi)),
                       batch_size=batch if batch > 1 else None)


def _phi_rows(table, ils, kp, chi, w, s_phi, batch: int = 1, dot=None):
    """Δ^φ (len(ils), K_φ) on the lensing potential's wavenumbers ``kp``; ``batch`` multipoles
    per iteration; with ``dot`` = (χ̇, ẇ, ṡ_φ) also its tangent: (Δ^φ, Δ̇^φ)."""
    x = kp[:, None] * chi[None, :]
    if dot is None:
        return jax.lax.map(lambda il: (s_phi * bessel.j_only(table, il, x)) @ w,
                           jnp.asarray(ils), batch_size=batch if batch > 1 else None)
    chi_dot, w_dot, sd = dot

    def body(il):
        j, slope = bessel.j_and_slope(table, il, x)
        integrand = s_phi * j
        return (integrand @ w, (sd * j) @ w + kp * ((s_phi * slope) @ (w * chi_dot))
                + integrand @ w_dot)

    return jax.lax.map(body, jnp.asarray(ils), batch_size=batch if batch > 1 else None)


def _grouped(idx, window, n_k):
    """(multipole indices, starts, width, lo, hi) of one group: every multipole is computed over
    the group's widest window (one shape for ``lax.map``), moved left where it would run past
    the grid's end, and kept on its own window [lo, hi)."""
    lo, hi = window.lo[idx], window.hi[idx]
    width = int(np.max(hi - lo))
    return idx, np.minimum(lo, n_k - width), width, lo, hi


@dataclass(frozen=True, eq=False)
class _Plan:
    """The line of sight's plan: the multipoles and the Bessel table's step, each group's
    (multipole indices, starts, width, lo, hi) as ``_grouped`` gives them (None: an empty
    group), the late-source cut, the Δ^φ multipoles and wavenumbers, and the multipoles per
    iteration of each loop. ``shape`` (hashable) is what fixes the compiled program; the
    groups' indices, starts and windows, which move with the cosmology (τ0, τ_rec), are its
    arguments."""

    ells: tuple
    dx: float
    late: tuple | None
    early: tuple | None
    n_cut: int
    with_p: tuple
    ip: tuple
    batches: tuple

    @property
    def shape(self) -> tuple:
        """The static part: everything but the groups' index arrays (their widths stay)."""
        return (self.ells, self.dx, None if self.late is None else self.late[2],
                None if self.early is None else self.early[2], self.n_cut, self.with_p,
                self.ip, self.batches)


def _group_arrays(group):
    """A group's (indices, starts, lo, hi) as int32 arrays, the program's arguments."""
    return None if group is None else tuple(jnp.asarray(group[n], jnp.int32) for n in (0, 1, 3, 4))


def _integrate(plan: _Plan, j, dj, k, tau, tau0, fine):
    """(T, E (L, K), P (L_P, K_P) or None) of ``transfer_functions``: one compiled program per
    ``plan.shape``, the groups' windows passed to it (a cosmology that moves them reuses it).
    Run op by op, the loops and the scatters around them took 5-10 times as long on a GPU as
    the same arithmetic compiled whole (scripts/profile_los_forms.py, docs/cmb.md)."""
    return _program(plan.shape, j, dj, k, tau, tau0, fine, _group_arrays(plan.late),
                    _group_arrays(plan.early))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _line_of_sight(shape, j, dj, k, tau, tau0, fine, late, early):
    """(T, E, P) of ``_integrate``, differentiable in the source times ``tau``, τ0 and the
    sources ``fine`` by ``_line_of_sight_jvp`` (the Bessel table and k are data)."""
    return _run(shape, j, dj, k, tau, tau0, fine, late, early)


@_line_of_sight.defjvp
def _line_of_sight_jvp(shape, primals, tangents):
    """The line of sight and its tangent in one pass of its loops. Δ is linear in the sources,
    so a direction's tangent is the sources' tangents integrated against the same Bessel values,
    plus the moved samples' terms (x = k(τ0 − τ) and the weights), which are matrix products
    of integrands shared by every direction: under ``vmap`` over directions the per-direction
    work is one product and sum over the sources' tangents. Traced instead, each direction
    repeated the Bessel lookups' arithmetic and re-read the integrands."""
    _, _, _, tau_dot, tau0_dot, fine_dot, _, _ = tangents
    return _run(shape, *primals, dot=(tau_dot, tau0_dot, fine_dot))


_program = jax.jit(_line_of_sight, static_argnums=0)


def _run(shape, j, dj, k, tau, tau0, fine, late, early, dot=None):
    """(T, E, P), and with ``dot`` = (τ̇, τ̇0, the sources' tangents) ((T, E, P), their
    tangents)."""
    ells, dx, late_width, early_width, n_cut, with_p, ip, batches = shape
    table = bessel.BesselTable(ells=np.asarray(ells), dx=dx, j=j, dj=dj).interleaved()
    chi = tau0 - tau
    w = trapezoid(tau)
    n_ells, n_k = len(ells), k.shape[0]
    out = [jnp.zeros((n_ells, n_k)), jnp.zeros((n_ells, n_k))]     # T, E (and their tangents)
    if dot is not None:
        tau_dot, tau0_dot, fine_dot = dot
        chi_dot = tau0_dot - tau_dot
        out += [jnp.zeros((n_ells, n_k)), jnp.zeros((n_ells, n_k))]
    # T and E: every τ up to l_late, early τ only above it; φ: every τ, ℓ ≤ l_limber
    for group, width, cut, batch in ((late, late_width, None, batches[0]),
                                     (early, early_width, n_cut, batches[1])):
        if group is None:
            continue
        ils, starts, lo, hi = group
        part = slice(None, cut)
        srcs = {name: v[:, part] for name, v in fine.items()}
        moved = None if dot is None else (
            chi_dot[part], trapezoid(tau_dot[part]),
            {name: v[:, part] for name, v in fine_dot.items()})
        rows = _window_rows(table, ils, starts, width, lo, hi, k, chi[part],
                            trapezoid(tau[part]), srcs, batch=batch, dot=moved)
        out = [o.at[ils].set(r) for o, r in zip(out, rows)]
    P = dP = None
    if with_p:
        ipa = np.asarray(ip)
        moved = None if dot is None else (chi_dot, trapezoid(tau_dot), fine_dot["phi"][ipa])
        P = _phi_rows(table, np.asarray(with_p), k[ipa], chi, w, fine["phi"][ipa],
                      batch=batches[2], dot=moved)
        if dot is not None:
            P, dP = P
    if dot is None:
        return out[0], out[1], P
    return (out[0], out[1], P), (out[2], out[3], dP)


def transfer_functions(src, ells, k, table: bessel.BesselTable, *, l_late: int = 400,
                       late_cut_tau: float | None = None, l_limber: int = 100,
                       window: TransferWindow | None = None,
                       spline_degree: int = ClSampling.k_spline_degree,
                       batch: int | None = None) -> Transfers:
    """Δ_ℓ^T, Δ_ℓ^E (and Δ_ℓ^φ for ℓ ≤ l_limber) of the sources ``src`` (a SourceGrid), each
    multipole over its ``window`` of the k grid (sampling.transfer_window; None: all of it);
    the sources reach the k grid by the spline of ``spline_degree`` in ln k. ``batch``:
    multipoles per loop iteration (None: ``multipole_batch``)."""
    ells = np.asarray(ells)
    if not np.array_equal(np.asarray(table.ells), ells):
        raise ValueError("transfer_functions: the Bessel table must hold exactly ``ells``")
    window = TransferWindow.whole(ells.size, k.size) if window is None else window
    if window.lo.shape != ells.shape:
        raise ValueError("transfer_functions: the window must have one entry per multipole")
    if late_cut_tau is None:             # the samples are fixed in ln a: cut by x, not by τ
        n_cut = int(np.searchsorted(np.asarray(src.x), -np.log(31.0))) + 1
    else:
        n_cut = int(np.searchsorted(np.asarray(src.tau), late_cut_tau)) + 1
    plan = plan_of(ells, k, table, int(np.shape(src.tau)[0]), n_cut, l_late=l_late,
                   l_limber=l_limber, window=window, batch=batch)
    fine = fine_sources(src, k, spline_degree)
    T, E, P = _integrate(plan, table.j, table.dj, jnp.asarray(k), jnp.asarray(src.tau),
                         jnp.asarray(src.tau0, jnp.float64), fine)
    ip = np.asarray(plan.ip, np.int64)
    return Transfers(ells=ells, k=np.asarray(k), T=T, E=E, ells_p=ells[list(plan.with_p)],
                     P=P, k_p=np.asarray(k)[ip])


def plan_of(ells, k, table, n_tau: int, n_cut: int, *, l_late: int, l_limber: int,
            window: TransferWindow, batch: int | None) -> _Plan:
    """The static plan of ``transfer_functions``'s program for ``n_tau`` source times, the
    first ``n_cut`` of them before the late-source cut."""
    if np.count_nonzero(ells <= l_limber) > np.count_nonzero(ells <= l_late):
        raise ValueError("l_limber must not exceed l_late")
    late = np.nonzero(ells <= l_late)[0]
    early = np.nonzero(ells > l_late)[0]
    groups = [_grouped(idx, window, k.size) if idx.size else None for idx in (late, early)]
    with_p = np.nonzero(ells <= l_limber)[0]
    ip = window.phi_indices(k.size)

    def per_iteration(width, tau_count):
        return batch if batch is not None else multipole_batch(width, tau_count)

    batches = (per_iteration(groups[0][2], n_tau) if groups[0] else 1,
               per_iteration(groups[1][2], n_cut) if groups[1] else 1,
               per_iteration(ip.size, n_tau))
    return _Plan(ells=tuple(int(v) for v in ells), dx=float(table.dx),
                 late=groups[0], early=groups[1], n_cut=n_cut,
                 with_p=tuple(int(i) for i in with_p), ip=tuple(int(i) for i in ip),
                 batches=tuple(int(b) for b in batches))
