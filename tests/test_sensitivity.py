"""Exact gradients through the solve by forward sensitivities (solver.sensitivity)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import (JaxBackend, grad_by_forward_mode, joint_solve, solve, solve_diff,
                    solve_with_tangents)
from stiff_problems import ROBERTSON

TIGHT = dict(rtol=1e-10, atol=1e-12)


# --- closed forms ---------------------------------------------------------------------------
def linear_rhs(y, t, p):
    # y' = A(θ) y with A = [[-a, b], [0, -c]]
    return (-p[0] * y[0] + p[1] * y[1], -p[2] * y[1])


def linear_exact(y0, p, t):
    a, b, c = p[0], p[1], p[2]
    y2 = y0[1] * jnp.exp(-c * t)
    y1 = y0[0] * jnp.exp(-a * t) + b * y0[1] * (jnp.exp(-c * t) - jnp.exp(-a * t)) / (a - c)
    return jnp.stack([y1, y2], -1)


def forced_rhs(y, t, p):
    # y' = -k y + c sin t
    return (-p[0] * y[0] + p[1] * jnp.sin(t),)


def forced_exact(y0, p, t):
    k, c = p[0], p[1]
    part = c * (k * jnp.sin(t) - jnp.cos(t)) / (1 + k * k)
    return ((y0[0] - c * (-1.0) / (1 + k * k)) * jnp.exp(-k * t) + part)[:, None]


TS = jnp.linspace(0.0, 3.0, 7)


def _exact_ensemble(exact, y0, p):
    return jax.vmap(lambda y, q: exact(y, q, TS))(y0, p)


@pytest.mark.parametrize("rhs, exact, y0, p", [
    (linear_rhs, linear_exact, [[1.0, 2.0], [0.5, -1.0]], [[0.7, 1.3, 2.1], [1.5, -0.4, 0.3]]),
    (forced_rhs, forced_exact, [[1.0], [2.0]], [[0.5, 1.0], [1.5, 0.3]]),
])
def test_closed_form_sensitivities(rhs, exact, y0, p):
    y0, p = jnp.asarray(y0), jnp.asarray(p)
    f = lambda y, q: solve_diff(rhs, y, TS, q, **TIGHT)  # noqa: E731
    ref = lambda y, q: _exact_ensemble(exact, y, q)      # noqa: E731
    np.testing.assert_allclose(f(y0, p), ref(y0, p), atol=1e-9)
    # jvp in a random direction (y0 and params together)
    rng = np.random.default_rng(0)
    dy, dp = jnp.asarray(rng.normal(size=y0.shape)), jnp.asarray(rng.normal(size=p.shape))
    _, t = jax.jvp(f, (y0, p), (dy, dp))
    _, t_ref = jax.jvp(ref, (y0, p), (dy, dp))
    np.testing.assert_allclose(t, t_ref, atol=1e-6)
    # full Jacobians, forward and reverse
    J = jax.jacfwd(f, argnums=(0, 1))(y0, p)
    J_ref = jax.jacfwd(ref, argnums=(0, 1))(y0, p)
    Jr = jax.jacrev(f, argnums=(0, 1))(y0, p)
    for a, b, c in zip(J, J_ref, Jr):
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(c, b, atol=1e-6)


# --- Robertson: grad vs central finite differences of the same code -------------------------
ROB_TS = jnp.array([0.0, 0.4, 4.0, 40.0])


def _rob_loss(k, tol):
    ys = solve_diff(ROBERTSON.rhs, jnp.asarray(ROBERTSON.y0)[None], ROB_TS, k[None],
                    rtol=tol, atol=tol * 1e-6)
    return ys[0, -1, 0] + 1e4 * ys[0, -1, 1] + 0.5 * ys[0, 1, 2]


def test_robertson_grad_matches_central_differences_and_jacfwd():
    k = jnp.asarray(ROBERTSON.params)
    g = jax.grad(_rob_loss)(k, 1e-10)
    fd = []
    for i in range(3):
        h = 1e-4 * k[i]
        e = jnp.zeros(3).at[i].set(h)
        fd.append((_rob_loss(k + e, 1e-12) - _rob_loss(k - e, 1e-12)) / (2 * h))
    fd = jnp.stack(fd)
    np.testing.assert_allclose(g, fd, rtol=1e-5)
    # jacfwd (batched directions) and grad (transpose) agree
    Jf = jax.jacfwd(_rob_loss)(k, 1e-10)
    np.testing.assert_allclose(Jf, g, rtol=1e-6)
    # under jit too, with every input traced (plans get built inside traces: regression test for
    # construction-time constants leaking as tracers into the plan cache)
    def loss_y0(y0, k):
        ys = solve_diff(ROBERTSON.rhs, y0, ROB_TS, k, rtol=1e-10, atol=1e-16)
        return ys[0, -1, 0] + 1e4 * ys[0, -1, 1] + 0.5 * ys[0, 1, 2]

    y0 = jnp.asarray(ROBERTSON.y0)[None]
    Jj = jax.jit(jax.jacfwd(loss_y0, argnums=(0, 1)))(y0, k[None])
    gj = jax.jit(jax.grad(loss_y0, argnums=(0, 1)))(y0, k[None])
    np.testing.assert_allclose(gj[1][0], g, rtol=1e-10)
    for a, b in zip(Jj, gj):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


# --- tangents of tables in args, jacfwd through a θ → (tables, params, y0) pipeline -----------
GRID = jnp.linspace(0.0, 2.0, 21)


def table_rhs(y, t, p, args):
    k = jnp.interp(t, args["grid"], args["k"])
    return (-k * p[0] * y[0], -p[1] * y[1] + k * y[0])


def _pipeline(theta, tol=1e-10):
    args = {"grid": GRID, "k": theta[0] * (1 + GRID) + theta[1] * GRID ** 2}
    p = jnp.stack([jnp.full(3, theta[2]), jnp.linspace(0.5, 1.5, 3)], axis=1)
    y0 = jnp.stack([jnp.full(3, theta[3]), jnp.zeros(3)], axis=1)
    return solve_diff(table_rhs, y0, jnp.linspace(0.0, 2.0, 4), p, args=args, rtol=tol,
                      atol=tol * 1e-2)


def test_args_tangents_jacfwd_grad_vmap():
    th = jnp.array([0.7, 0.2, 1.1, 1.3])
    J = jax.jacfwd(_pipeline)(th)
    eps = 1e-4
    # FD noise: the 1e-12 solves differ by ~2e-11 between neighbouring θ (adaptive steps over the
    # table's kinks) -> ~2e-7 after dividing by 2ε
    fd = jnp.stack([(_pipeline(th + eps * e, 1e-12) - _pipeline(th - eps * e, 1e-12)) / (2 * eps)
                    for e in jnp.eye(4)], -1)
    np.testing.assert_allclose(J, fd, atol=2e-6)
    loss = lambda th: jnp.sum(_pipeline(th)[:, -1] ** 2)  # noqa: E731
    g = jax.grad(loss)(th)
    np.testing.assert_allclose(g, jax.jacfwd(loss)(th), rtol=1e-8)
    gfm = jax.grad(grad_by_forward_mode(loss))(th)
    np.testing.assert_allclose(gfm, g, rtol=1e-8)
    # vmap over primals (batched residuals: one joint solve per batch element)
    ths = jnp.stack([th, 1.1 * th])
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(ths)[1], jax.grad(loss)(1.1 * th),
                               rtol=1e-10)


class _PlainPlusTangentBackend(JaxBackend):
    """The JAX backend without a joint values-and-sensitivities solve (as the CUDA backend):
    ``solve_with_tangents`` must fall back to the plain solve and the tangent primitive."""

    def solve_with_sensitivities(self, *args, **kwargs):
        return None


def test_solve_with_tangents_is_one_joint_loop_with_the_jvp_derivatives():
    """Values and m directional derivatives in one traced solve: derivatives equal vmap of jvp of
    solve_diff (the same joint solve), values equal the plain solve's to the tolerance (the
    joint solve's own y) and, without sensitivity error control (the plain solve's steps), to
    ~1e-11 (the same steps; the joint arithmetic rounds differently); the program has one
    integration loop (the jvp route has two); a backend without the joint values gives the jvp
    route's numbers."""
    y0, k = ROBERTSON.y0[None], ROBERTSON.params[None]
    ts = jnp.array([0.0, 1e-2, 1.0, 1e2, 1e4])
    tol = dict(rtol=1e-6, atol=1e-10)
    dp = jnp.eye(3)[:, None, :] * k                                  # (m, N, P)
    dy = jnp.zeros((3,) + y0.shape)

    def via_jvp(q_dirs, **kw):
        f = lambda q: solve_diff(ROBERTSON.rhs, y0, ts, q, **tol, **kw)  # noqa: E731
        return jax.vmap(lambda d: jax.jvp(f, (k,), (d,)), out_axes=(None, 0))(q_dirs)

    def direct(**kw):
        return solve_with_tangents(ROBERTSON.rhs, y0, ts, k, dy0=dy, dparams=dp, **tol, **kw)

    ys_j, dys_j = jax.jit(via_jvp)(dp)
    ys, dys = jax.jit(direct)()
    assert dys.shape == (3,) + ys.shape
    np.testing.assert_allclose(dys, dys_j, rtol=1e-12, atol=1e-300)
    scale = np.abs(np.asarray(ys_j)).max(axis=(0, 1))
    assert np.all(np.abs(ys - ys_j) <= 1e-5 * scale + 1e-10)      # the joint solve's own y
    ys_off, _ = direct(sensitivity_error_control=False)
    np.testing.assert_allclose(ys_off, solve(ROBERTSON.rhs, y0, ts, k, **tol).ys, rtol=1e-9)
    loops = lambda fn, *a: jax.jit(fn).lower(*a).as_text().count("stablehlo.while")  # noqa: E731
    assert loops(direct) < loops(via_jvp, dp)
    fallback = _PlainPlusTangentBackend()
    ys_f, dys_f = direct(backend=fallback)
    np.testing.assert_allclose(ys_f, ys_j, rtol=1e-9)            # the plain solve (eager vs jit)
    np.testing.assert_allclose(dys_f, dys_j, rtol=1e-12, atol=1e-300)
    with pytest.raises(ValueError, match="at least one tangent"):
        solve_with_tangents(ROBERTSON.rhs, y0, ts, k, **tol)


def test_saved_states_keep_only_those_states_of_dys():
    """``saved_states``: ys and dys of the named states only, equal to those states of the full ones,
    from the joint solve and from the fallback route (plain solve + tangent primitive); bad
    index sets are refused."""
    y0, k = ROBERTSON.y0[None], ROBERTSON.params[None]
    ts = jnp.array([0.0, 1e-2, 1.0, 1e2])
    tol = dict(rtol=1e-6, atol=1e-10)
    dp = jnp.eye(3)[:, None, :] * k
    ys, dys = solve_with_tangents(ROBERTSON.rhs, y0, ts, k, dparams=dp, **tol)
    for backend in (None, _PlainPlusTangentBackend()):
        kw = {} if backend is None else {"backend": backend}
        ys_s, dys_s = solve_with_tangents(ROBERTSON.rhs, y0, ts, k, dparams=dp,
                                          saved_states=[0, 2], **tol, **kw)
        assert dys_s.shape == dys.shape[:-1] + (2,)
        np.testing.assert_allclose(dys_s, np.asarray(dys)[..., [0, 2]], rtol=1e-9, atol=1e-300)
        # the joint solve's own y, or (fallback) the plain solve's: equal to the tolerance
        assert ys_s.shape == ys.shape[:-1] + (2,)
        assert np.max(np.abs(ys_s - np.asarray(ys)[..., [0, 2]])) <= 1e-5
    for bad in ([], [2, 0], [1, 1], [3], [-1]):
        with pytest.raises(ValueError, match="saved_states"):
            solve_with_tangents(ROBERTSON.rhs, y0, ts, k, dparams=dp, saved_states=bad, **tol)


# --- the exact joint Jacobian keeps step counts near the plain solve's ------------------------
def test_joint_step_count_close_to_plain_on_bilinear_problem():
    # Robertson is bilinear (k2 y1², k3 y1 y2): d²f/dy² ≠ 0 couples s to y in the joint Jacobian
    y0, k = ROBERTSON.y0[None], ROBERTSON.params[None]
    ts = np.array([0.0, 1e-2, 1.0, 1e2, 1e4, 1e5])
    tol = dict(rtol=1e-6, atol=1e-10)
    plain = solve(ROBERTSON.rhs, y0, ts, k, **tol)
    dp = np.eye(3)[:, None, :] * k            # relative directions, all three rates at once
    _, dys, info = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp, **tol)
    assert info["status"][0] == 0
    ratio = info["n_accepted"][0] / plain.n_accepted[0]
    assert ratio <= 1.5, (info["n_accepted"], plain.n_accepted)
    # without sensitivity error control the joint solve takes exactly the plain solve's steps
    _, _, info_off = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp,
                                 sensitivity_error_control=False, **tol)
    assert info_off["n_accepted"][0] == plain.n_accepted[0]
    # a weight between: the sensitivities controlled at rtol / weight, so the steps fall between
    # (and the weights 1 and 0 are True and False)
    steps = {}
    for w in (1.0, 0.1, 0.0):
        ys_w, dys_w, info_w = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp,
                                          sensitivity_error_control=w, **tol)
        steps[w] = int(info_w["n_accepted"][0])
        if w == 1.0:
            np.testing.assert_array_equal(dys_w, dys)
    assert steps[1.0] == info["n_accepted"][0] and steps[0.0] == plain.n_accepted[0]
    assert steps[0.0] < steps[0.1] < steps[1.0], steps
    with pytest.raises(ValueError, match="between 0 and 1"):
        joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp, sensitivity_error_control=2.0, **tol)


# --- an undifferentiated call never builds or runs the joint system ---------------------------
def test_plain_call_does_not_run_joint_system():
    def rhs(y, t, p):   # a fresh rhs: nothing cached for it
        return (-p[0] * y[0] * y[1], p[0] * y[0] * y[1] - y[1])

    y0, p = jnp.array([[1.0, 0.1]]), jnp.array([[2.0]])
    backend = JaxBackend()   # its own counters
    ys = solve_diff(rhs, y0, TS, p, backend=backend)
    ys_jit = jax.jit(lambda y, q: solve_diff(rhs, y, TS, q, backend=backend))(y0, p)
    assert backend.stats["joint_traces"] == 0 and backend.stats["joint_plans"] == 0
    np.testing.assert_array_equal(ys, solve(rhs, y0, TS, p).ys)
    np.testing.assert_array_equal(ys_jit, ys)
    jaxpr = str(jax.make_jaxpr(lambda y, q: solve_diff(rhs, y, TS, q, backend=backend))(y0, p))
    assert "sensitivity_tangent" not in jaxpr
    # ... while a derivative does
    jax.jvp(lambda q: solve_diff(rhs, y0, TS, q, backend=backend), (p,), (jnp.ones_like(p),))
    assert backend.stats["joint_traces"] > 0 and backend.stats["joint_plans"] == 1


def test_errors_are_clear():
    from solver import CudaBackendUnavailable, cuda_available

    with pytest.raises(ValueError, match="backend"):
        solve_diff(forced_rhs, [[1.0]], TS, [[1.0, 1.0]], backend="gpu")
    if not cuda_available()[0]:
        with pytest.raises(CudaBackendUnavailable):
            solve_diff(forced_rhs, [[1.0]], TS, [[1.0, 1.0]], backend="cuda")
    with pytest.raises(TypeError, match="unexpected"):
        solve_diff(forced_rhs, [[1.0]], TS, [[1.0, 1.0]], bogus=1)
    with pytest.raises(ValueError, match="params"):
        solve_diff(forced_rhs, [[1.0]], TS, [1.0, 1.0])
