"""Thermodynamics stage: recombination + reionisation -> tables of x_e, kappa', T_b, c_s^2, ...

Input: the expansion rate H(a) [1/Mpc] as a JAX-traceable callable, omega_b, Y_He, T_cmb and
tau_reio.  Output: a :class:`ThermoTable` on a uniform grid in ln a holding, at every node, each
quantity AND its derivative d/dlna, so that consumers interpolate with cubic Hermite polynomials
(error O(h^4); at the default 4000 nodes, h ~ 0.006, far below 1e-4 where the functions are
smooth).  Everything is JAX, so d(table)/d(parameters) comes from jax.jvp / jax.grad.

Numerical method (see docs/thermodynamics.md):
1. z > z_ode_start (4000): hydrogen and He I in Saha equilibrium, He II/III Saha,
   T_b / T_gamma = K / (1 + K) (quasi-static Compton equilibrium, K = Compton rate / H).
2. z_ode_start > z: the RECFAST rate equations (boltzmann.recombination) integrated node to node
   by an L-stable 2-stage Radau IIA step (pass A, no reionisation); below z = 3000 a step may
   span several nodes (``ode_stride``), the nodes between Hermite-interpolated.
3. z_reio from tau_reio (boltzmann.reionization), using pass A's x_e below z_start.
4. Below z = 50 the baryon temperature is re-integrated (pass B, a linear scalar ODE, exact
   2x2 Radau stage solve) with the reionised x_e in the Compton coupling.
5. kappa' = a n_e sigma_T, the optical depth kappa, exp(-kappa) and the visibility
   g = kappa' e^{-kappa} (per conformal time), derived numbers z_star, z_drag, conformal times.

The d/dlna column of a quantity is the exact derivative of its closed form along the ODE
solution (forward-mode jvp with the ODE right-hand side as the state tangent), not a finite
difference of the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import recombination as rec
from boltzmann import reionization as reio
from boltzmann.radau_path import affine_recurrence, radau_path
from models.hermite import cumulative_hermite, hermite, hermite_interp, hermite_panels

#: quantities tabulated with a derivative column ``d<name>``
TABULATED = ("x_e", "kappa_dot", "ln_kappa_dot", "T_b", "cs2", "exp_m_kappa", "visibility")


class ThermoTable(NamedTuple):
    """Thermodynamics on a uniform ln a grid; ``d*`` are d/dlna at the same nodes.

    kappa_dot = a n_e sigma_T [1/Mpc] (conformal Thomson rate), visibility g = kappa' e^{-kappa}
    [1/Mpc], T_b [K], cs2 = baryon sound speed squared (units of c^2).
    Derived scalars (CLASS's definitions): z_reio, tau_reio (input echoed), z_rec (maximum of g)
    and the conformal time there tau_rec [Mpc], z_star (photon optical depth kappa = 1), tau_star,
    z_drag (baryon drag depth int kappa'/R dtau = 1, CLASS's z_d), tau_drag [Mpc].
    """

    lna: jnp.ndarray
    x_e: jnp.ndarray
    dx_e: jnp.ndarray
    kappa_dot: jnp.ndarray
    dkappa_dot: jnp.ndarray
    ln_kappa_dot: jnp.ndarray
    dln_kappa_dot: jnp.ndarray
    T_b: jnp.ndarray
    dT_b: jnp.ndarray
    cs2: jnp.ndarray
    dcs2: jnp.ndarray
    exp_m_kappa: jnp.ndarray
    dexp_m_kappa: jnp.ndarray
    visibility: jnp.ndarray
    dvisibility: jnp.ndarray
    z_reio: jnp.ndarray
    tau_reio: jnp.ndarray
    z_rec: jnp.ndarray
    tau_rec: jnp.ndarray
    z_star: jnp.ndarray
    tau_star: jnp.ndarray
    z_drag: jnp.ndarray
    tau_drag: jnp.ndarray

    def interp(self, name: str, lna):
        """Cubic Hermite interpolation of column ``name`` (one of TABULATED) at ``lna``."""
        if name not in TABULATED:
            raise ValueError(f"name={name!r}: expected one of {TABULATED}")
        return hermite_interp(self.lna, getattr(self, name), getattr(self, "d" + name), lna)


def _integral_to_end(h, q, dq):
    """Integral of q from each node to the last node, summed from the late end so that small
    late-time values are not lost against the huge early-time ones (kappa ~ 1e10 at a = 1e-10)."""
    tail = jnp.cumsum(hermite_panels(h, q, dq)[::-1])[::-1]
    return jnp.concatenate([tail, jnp.zeros(1, q.dtype)])


@dataclass(frozen=True)
class LoopShape:
    """How the sequential node-to-node loops (passes A and B) are written — not what they compute.

    newton_unrolled: the Radau step's Newton iterations written out rather than a nested loop
        (``recombination.radau_step``'s ``unrolled``), and so are the fixed-count iterations
        outside the loops (the Saha start, the z_rec / z_star / z_drag Newton solves:
        ``recombination.iterate``);
    scan_unroll: nodes per iteration of each pass's ``lax.scan`` (XLA's ``unroll``);
    inline_solves: the Radau step's small linear systems in straight-line code rather than a
        LAPACK / cuSOLVER call each (``recombination.radau_step``'s ``inline_solves``). On by
        default: on the CPU, batched LAPACK calls (``getrf``/``getrs`` under ``vmap``) split their
        batch over XLA's intra-op thread pool, and two such calls running at once can each wait
        for the pool the other holds — a deadlock seen on a 2-core machine in the tables' tangent
        program. It is also faster there (docs/thermodynamics.md); the LAPACK form is kept for
        comparisons (``scripts/bench_tables.py``).
    The arithmetic is the same; XLA may fuse it differently, which moves the tables at the level
    of rounding. A GPU runs every loop iteration at kernel-launch latency, so fewer, longer
    iterations pay there; on the CPU the Newton loop rolled compiles fastest.
    """

    newton_unrolled: bool = False
    scan_unroll: int = 1
    inline_solves: bool = True

    def __post_init__(self):
        if int(self.scan_unroll) < 1:
            raise ValueError(f"LoopShape.scan_unroll={self.scan_unroll}: must be >= 1")


def photon_density_parameter(T_cmb):
    """omega_gamma = Omega_gamma h^2 = a_R T_cmb^4 / (c^2 rho_crit,100)."""
    rho_crit100 = 3.0 * rec.H100_SI**2 / (8.0 * math.pi * rec.G_SI)
    return rec.A_RAD_SI * T_cmb**4 / rec.C_SI**2 / rho_crit100


def default_grid(n_nodes: int = 4000, lna_min: float = math.log(1e-10) - 0.01, lna_max: float = 0.01):
    """The default ln a grid: uniform, ln(1e-10) ... 0 plus a small margin on both sides."""
    if n_nodes < 100:
        raise ValueError(f"n_nodes={n_nodes}: need at least 100 nodes")
    if not lna_min < math.log(1.0 / 5001.0) < 0.0 <= lna_max:
        raise ValueError(f"grid [lna_min={lna_min}, lna_max={lna_max}] must cover z = 5000 ... 0")
    return np.linspace(lna_min, lna_max, n_nodes)


def ode_step_nodes(i_ode: int, n_nodes: int, stride: int, i_stride: int | None = None) -> np.ndarray:
    """Indices of the grid nodes where pass A's Radau steps start and end, from ``i_ode`` to the
    last node: a step per node up to ``i_stride`` (default ``i_ode``), then every ``stride``-th
    node counted back from the last, so that only the step crossing ``i_stride`` may be shorter."""
    if int(stride) < 1:
        raise ValueError(f"ode_stride={stride}: must be an integer >= 1")
    i_stride = i_ode if i_stride is None else max(int(i_stride), i_ode)
    ends = np.arange(n_nodes - 1, i_stride, -int(stride))[::-1]
    return np.concatenate([np.arange(i_ode, i_stride + 1), ends]).astype(np.int64)


def _fill_nodes(lna_np, step_nodes, ys, dys):
    """(states, d/dlna) at every grid node from ``step_nodes[0]`` on: the cubic Hermite through
    the step ends' states ``ys`` and derivatives ``dys``, and its derivative; a step end keeps its
    own pair."""
    fine = np.arange(step_nodes[0], len(lna_np))
    cell = np.clip(np.searchsorted(step_nodes, fine, side="right") - 1, 0, len(step_nodes) - 2)
    t0, t1 = lna_np[step_nodes[cell]], lna_np[step_nodes[cell + 1]]
    width = jnp.asarray(t1 - t0)[:, None]
    u = jnp.asarray((lna_np[fine] - t0) / (t1 - t0))[:, None]
    ends = (ys[cell], dys[cell], ys[cell + 1], dys[cell + 1])
    value, du = jax.jvp(lambda u_: hermite(u_, width, *ends), (u,), (jnp.ones_like(u),))
    return value, du / width


def _hubble_on_nodes(hubble_of_a: Callable, lna):
    """H(a) [1/Mpc] as the cubic Hermite in ln a through ln H and d ln H/dlna at the nodes
    ``lna`` (uniform), both from one evaluation of ``hubble_of_a`` on the whole grid.

    Why: the thermodynamics needs H at the nodes, at the Radau stage times and inside the
    reionisation integral, each site under its own vmap and jvp. Called directly, every site
    inlined its own copy of the background (densities, the massive-neutrino integrals): about
    a third of the P(k) Jacobian's inputs program, whose compile and load bound a ``--gradients``
    run's first and later processes. ln H is smooth on the grid's scale (power laws joined over
    e-folds), so the cubic is exact to ~1e-12 relative at the default spacing, and its
    derivative continuous."""
    lnH, dlnH = jax.jvp(lambda t: jnp.log(hubble_of_a(jnp.exp(t))), (lna,), (jnp.ones_like(lna),))

    def hubble(a):
        return jnp.exp(hermite_interp(lna, lnH, dlnH, jnp.log(a)))
    return hubble


def thermodynamics_from_hubble(
    hubble_of_a: Callable,
    omega_b,
    Y_He,
    T_cmb,
    tau_reio,
    *,
    lna_grid: np.ndarray | None = None,
    z_ode_start: float = 4000.0,
    z_late: float = 50.0,
    settings: rec.RecombinationSettings = rec.RecombinationSettings(),
    loops: "LoopShape | None" = None,
    ode_stride: int = 1,
    z_stride_start: float = 3000.0,
) -> ThermoTable:
    """Compute the :class:`ThermoTable` for the expansion history ``hubble_of_a(a)`` [1/Mpc].

    ``lna_grid`` (a static numpy array, uniform, increasing) defaults to :func:`default_grid`.
    Parameters may be JAX tracers (jit/grad over omega_b, Y_He, T_cmb, tau_reio and anything
    ``hubble_of_a`` closes over). ``loops`` shapes the node-to-node loops for the device they
    run on (:class:`LoopShape`; default: rolled, the CPU's best). ``ode_stride``: grid cells per
    Radau step of pass A below ``z_stride_start`` (above it a step per cell: the start from Saha
    leaves a transient there); the nodes between step ends are Hermite-interpolated, and pass B
    then starts at z_ode_start (docs/thermodynamics.md, "Steps over several nodes").
    """
    loops = LoopShape() if loops is None else loops
    lna_np = default_grid() if lna_grid is None else np.asarray(lna_grid, dtype=np.float64)
    steps = np.diff(lna_np)
    if lna_np.ndim != 1 or not np.allclose(steps, steps[0], rtol=1e-9, atol=0):
        raise ValueError("lna_grid: must be a 1-d uniform increasing grid")
    if not (z_late < z_ode_start):
        raise ValueError(f"z_late={z_late} must be below z_ode_start={z_ode_start}")
    i_ode = int(np.searchsorted(lna_np, -math.log1p(z_ode_start)))
    i_late = int(np.searchsorted(lna_np, -math.log1p(z_late)))
    if i_ode < 1 or i_late >= len(lna_np) - 2:
        raise ValueError("lna_grid: must extend beyond z_ode_start at the early end and to z < z_late")
    h = float(steps[0])
    lna = jnp.asarray(lna_np)

    p = rec.make_params(omega_b, Y_He, T_cmb)
    tau_reio = jnp.asarray(tau_reio, dtype=jnp.float64)
    hubble = _hubble_on_nodes(hubble_of_a, lna)

    def H_si(lna_):
        return hubble(jnp.exp(lna_)) * rec.INV_MPC_TO_INV_S

    def aH(lna_):
        return jnp.exp(lna_) * hubble(jnp.exp(lna_))

    def x_e_rec(lna_, y):
        return rec.free_electron_fraction(lna_, y, p)[0]

    # ---- 1. early quasi-equilibrium
    def early_state(lna_):
        y = rec.saha_state(lna_, p, unrolled=loops.newton_unrolled)
        K = rec.compton_rate_per_lna(lna_, x_e_rec(lna_, y), p, H_si(lna_))
        return y.at[2].set(K / (1.0 + K))

    # ---- 2. pass A: rate equations without reionisation
    def rhs_A_given_h(t, y, h_at_t, p_):
        return rec.recombination_rhs(t, y, p_, lambda a: h_at_t, settings)

    # H at every Radau stage time, for all steps at once: inside the sequential loop each
    # evaluation would be repeated at every Newton iteration
    i_stride = int(np.searchsorted(lna_np, -math.log1p(z_stride_start)))
    ode_nodes = ode_step_nodes(i_ode, len(lna_np), ode_stride, i_stride)
    t_lo, t_hi = lna[ode_nodes[:-1]], lna[ode_nodes[1:]]
    c_stage = jnp.asarray(rec.RADAU_C)
    h_stage = [hubble(jnp.exp(t_lo + c_stage[i] * (t_hi - t_lo))) for i in range(2)]

    # the early state with its first and second d/dlna in one trace (the second is what the
    # sound speed's derivative reads below), through the first ODE node: each separate trace of
    # the Saha start under the Jacobian's tangents is another copy of it in the program
    def early_jet(t):
        (y, dy), (_, ddy) = jax.jvp(lambda s: jax.jvp(early_state, (s,), (jnp.ones_like(s),)),
                                    (t,), (jnp.ones_like(t),))
        return y, dy, ddy

    ys_early, dys_early, ddys_early = jax.vmap(early_jet)(lna[:i_ode + 1])

    # the states at the step ends and their d/dlna from the collocation polynomial: the stiff
    # rhs there would multiply the Newton iteration's residual by the rates (up to ~1e8 H). At
    # the first node, the early state's own derivative: the rhs at the Saha state is its
    # relaxation onto the rate equations' quasi-equilibrium, over a far shorter ln a than a cell
    y_start = ys_early[i_ode]
    ys_path, dys_path = radau_path(rhs_A_given_h, t_lo, t_hi, y_start, h_stage, p, loops)
    ys_steps = jnp.concatenate([y_start[None], ys_path])
    dys_steps = jnp.concatenate([dys_early[i_ode][None], dys_path])
    ys_early, dys_early, ddys_early = ys_early[:i_ode], dys_early[:i_ode], ddys_early[:i_ode]
    stepped = len(ode_nodes) == len(lna_np) - i_ode        # a step ends at every node
    if stepped:
        ys_ode, dys_ode = ys_steps, dys_steps
    else:
        # between step ends, the cubic Hermite through the ends' states and derivatives, and the
        # Hermite's own derivative: the stiff rhs at an interpolated state would amplify the
        # interpolation error by the rates
        ys_ode, dys_ode = _fill_nodes(lna_np, ode_nodes, ys_steps, dys_steps)
    ys_A = jnp.concatenate([ys_early, ys_ode])
    dys_A = jnp.concatenate([dys_early, dys_ode])

    # recombination-only x_e and its derivative at the nodes
    xrec, dxrec = jax.vmap(lambda t, y, dy: jax.jvp(x_e_rec, (t, y), (jnp.ones_like(t), dy)))(lna, ys_A, dys_A)

    def xrec_of_lna(t):
        return hermite_interp(lna, xrec, dxrec, t)

    # ---- 3. z_reio from tau_reio
    n_H0_sigma = p.n_H0 * rec.SIGMA_T_SI * rec.MPC_M  # a^2 kappa' / x_e  [1/Mpc]

    def kappa_dot_per_xe(t):
        return n_H0_sigma * jnp.exp(-2.0 * t)

    z_reio = reio.solve_z_reio(tau_reio, xrec_of_lna, kappa_dot_per_xe, aH, p.f_He)

    def x_e_total(t, x_before):
        return reio.reionised_fraction(jnp.expm1(-t), x_before, z_reio, p.f_He)

    # ---- 4. pass B: baryon temperature with the reionised x_e (linear in theta)
    A = jnp.asarray(rec.RADAU_A)
    c = jnp.asarray(rec.RADAU_C)

    def compton_total(t):
        return rec.compton_rate_per_lna(t, x_e_total(t, xrec_of_lna(t)), p, H_si(t))

    # The Compton rates at both stage times of every step depend on time alone, and the step is
    # linear in theta: theta_{n+1} = alpha_n theta_n + beta_n. So every step's (alpha, beta) is
    # computed at once and the recurrence is an associative scan of affine maps — log2(steps)
    # vectorised levels instead of a sequential loop (on a GPU, a kernel launch per step).
    # with steps over several nodes, pass B starts where pass A does: the temperature's rhs is as
    # stiff as the rates (K ~ 1e5 at z = 4000), so its tabulated derivative must come from a
    # solution at every node, not from an interpolated state
    i_b = i_late if stepped else i_ode
    tb_lo, tb_hi = lna[i_b:-1], lna[i_b + 1:]
    hh = tb_hi - tb_lo
    K0, K1 = jax.vmap(compton_total)(tb_lo + c[:, None] * hh)        # both stage times at once
    # stages: Theta = theta 1 + hh A (K - (1 + K) Theta); theta_{n+1} = Theta_1 (stiffly accurate)
    m00, m01 = 1.0 + hh * A[0, 0] * (1.0 + K0), hh * A[0, 1] * (1.0 + K1)
    m10, m11 = hh * A[1, 0] * (1.0 + K0), 1.0 + hh * A[1, 1] * (1.0 + K1)
    det = m00 * m11 - m01 * m10
    alpha = (m00 - m10) / det
    beta = (m00 * hh * (A[1, 0] * K0 + A[1, 1] * K1) - m10 * hh * (A[0, 0] * K0 + A[0, 1] * K1)) / det

    th_late = affine_recurrence(alpha, beta, ys_A[i_b, 2])
    theta = jnp.concatenate([ys_A[: i_b + 1, 2], th_late])

    # ---- node values and their exact d/dlna
    T_to_cs2 = rec.K_B_SI / (rec.M_H_SI * rec.C_SI**2)

    def node_values(t, xr, th, dth):
        x = x_e_total(t, xr)
        kd = x * kappa_dot_per_xe(t)
        T_b = th * p.T_cmb * jnp.exp(-t)
        dlnT = dth / th - 1.0
        inv_mu = 1.0 + (1.0 / rec.NOT4 - 1.0) * p.Y_He + x * (1.0 - p.Y_He)
        cs2 = T_to_cs2 * T_b * inv_mu * (1.0 - dlnT / 3.0)
        return x, kd, jnp.log(kd), T_b, cs2

    def theta_rhs(t, th, xr):
        return rec.temperature_ratio_rhs(th, rec.compton_rate_per_lna(t, x_e_total(t, xr), p, H_si(t)))

    def node_with_derivative(t, xr, dxr, th):
        def f(t_, xr_, th_):
            return node_values(t_, xr_, th_, theta_rhs(t_, th_, xr_))
        return jax.jvp(f, (t, xr, th), (jnp.ones_like(t), dxr, theta_rhs(t, th, xr)))

    # the early region's theta is the quasi-static K/(1+K), whose derivative is not the ODE rhs:
    # the chain rule through the early state's jet
    def node_early(t, y, dy, ddy):
        xr, dxr = jax.jvp(x_e_rec, (t, y), (jnp.ones_like(t), dy))
        return jax.jvp(node_values, (t, xr, y[2], dy[2]), (jnp.ones_like(t), dxr, dy[2], ddy[2]))

    vals_e, ders_e = jax.vmap(node_early)(lna[:i_ode], ys_early, dys_early, ddys_early)
    vals_o, ders_o = jax.vmap(node_with_derivative)(lna[i_ode:], xrec[i_ode:], dxrec[i_ode:], theta[i_ode:])
    vals = [jnp.concatenate([a_, b_]) for a_, b_ in zip(vals_e, vals_o)]
    ders = [jnp.concatenate([a_, b_]) for a_, b_ in zip(ders_e, ders_o)]
    x_e, kappa_dot, ln_kappa_dot, T_b, cs2 = vals
    dx_e, dkappa_dot, dln_kappa_dot, dT_b, dcs2 = ders

    # ---- 5. optical depth, visibility, derived numbers
    aH_n, daH_n = jax.vmap(lambda t: jax.jvp(aH, (t,), (jnp.ones_like(t),)))(lna)
    q = kappa_dot / aH_n                                   # d kappa / d(-ln a)
    dq = q * (dln_kappa_dot - daH_n / aH_n)
    to_end = _integral_to_end(h, q, dq)                    # int_{lna}^{lna_max} q
    kappa = to_end - hermite_interp(lna, to_end, -q, 0.0)  # optical depth from lna to today
    exp_m_kappa = jnp.exp(-kappa)
    dexp_m_kappa = q * exp_m_kappa
    visibility = kappa_dot * exp_m_kappa
    dvisibility = exp_m_kappa * (dkappa_dot + kappa_dot * q)

    # conformal time tau(lna) = 1/(aH) at the first node (radiation era) + int dlna / (aH)
    r = 1.0 / aH_n
    conformal = r[0] + cumulative_hermite(h, r, -r * daH_n / aH_n)

    def conformal_time_at(t):
        return hermite_interp(lna, conformal, r, t)

    # z_rec: maximum of g (Newton on the Hermite interpolant's derivative, from the best node)
    g_of = lambda t: hermite_interp(lna, visibility, dvisibility, t)  # noqa: E731
    dg_of = jax.grad(g_of)
    ddg_of = jax.grad(dg_of)
    mask = lna < -math.log1p(100.0)
    t_star = lna[jnp.argmax(jnp.where(mask, visibility, -jnp.inf))]
    t_star = jax.lax.stop_gradient(t_star)
    t_star = rec.iterate(lambda t: t - dg_of(t) / ddg_of(t), t_star, 6, loops.newton_unrolled)
    z_rec = jnp.expm1(-t_star)
    t_rec = t_star

    def depth_crossing(depth, rate, drate):
        """ln a where the optical depth ``depth`` (d depth/dlna = -rate) crosses one (z > 100)."""
        i = jnp.argmin(jnp.abs(jnp.where(mask, depth, jnp.inf) - 1.0))
        def step(t):
            return t + (hermite_interp(lna, depth, -rate, t) - 1.0) / hermite_interp(lna, rate,
                                                                                      drate, t)
        return rec.iterate(step, jax.lax.stop_gradient(lna[i]), 6, loops.newton_unrolled)

    # z_star: photon optical depth kappa = 1 (CLASS's definition of z_star)
    t_star = depth_crossing(kappa, q, dq)
    z_star = jnp.expm1(-t_star)

    # z_drag: baryon drag depth int kappa' / R dtau = 1, R = 3 rho_b / (4 rho_gamma)
    R_over_a = 0.75 * jnp.asarray(omega_b) / photon_density_parameter(p.T_cmb)
    a_n = jnp.exp(lna)
    qd = q / (R_over_a * a_n)
    dqd = qd * (dq / q - 1.0)
    to_end_d = _integral_to_end(h, qd, dqd)
    kappa_drag = to_end_d - hermite_interp(lna, to_end_d, -qd, 0.0)
    t_drag = depth_crossing(kappa_drag, qd, dqd)
    z_drag = jnp.expm1(-t_drag)

    return ThermoTable(
        lna=lna,
        x_e=x_e, dx_e=dx_e,
        kappa_dot=kappa_dot, dkappa_dot=dkappa_dot,
        ln_kappa_dot=ln_kappa_dot, dln_kappa_dot=dln_kappa_dot,
        T_b=T_b, dT_b=dT_b,
        cs2=cs2, dcs2=dcs2,
        exp_m_kappa=exp_m_kappa, dexp_m_kappa=dexp_m_kappa,
        visibility=visibility, dvisibility=dvisibility,
        z_reio=z_reio, tau_reio=tau_reio,
        z_rec=z_rec, tau_rec=conformal_time_at(t_rec),
        z_star=z_star, tau_star=conformal_time_at(t_star),
        z_drag=z_drag, tau_drag=conformal_time_at(t_drag),
    )


def compute_thermodynamics(cosmo, *, lna_grid: np.ndarray | None = None,
                           settings: rec.RecombinationSettings = rec.RecombinationSettings(),
                           **kwargs) -> ThermoTable:
    """ThermoTable for a :class:`boltzmann.params.CosmoParams` (H(a) from boltzmann.background).

    Differentiable in every CosmoParams leaf it uses (omega_b, YHe, T_cmb, tau_reio and, through
    H(a), h, omega_cdm, N_ur, the neutrino masses...).  Extra keyword arguments go to
    :func:`thermodynamics_from_hubble` (z_ode_start, z_late).
    """
    from boltzmann import background

    return thermodynamics_from_hubble(
        lambda a: background.hubble(cosmo, a), cosmo.omega_b, cosmo.YHe, cosmo.T_cmb, cosmo.tau_reio,
        lna_grid=lna_grid, settings=settings, **kwargs)
