"""The warp kernel (solver/backends/cuda/codegen/warp.py) and what it is built from, on the CPU.

* forward mode (solver/linalg/forward_mode.py): the tangent of generated straight-line code equals
  ``jax.jvp``, on a small function and on the EB model's Jacobian entries;
* the depth ordering (solver/linalg/ordering.py) gives a valid LU with far fewer levels than AMD;
* the lane tables (warp_schedule.py): every level is race-free, the tables factor and solve as
  the straight-line LU does, each state has exactly one owner;
* the kernel text run lane by lane with its synchronisations (warp_emulation.py): the same steps
  and statuses as the JAX backend, values to rounding, the same bits whatever order the lanes
  run in, failures reported per trajectory; its Jacobian kernel against ``jax.jacfwd``;
* the XLA FFI packing of its arguments (the lane table after the tables), and the kernel choice.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import CudaBackend, Status, solve
from solver.backends.cuda.inputs import prepare
from solver.backends.cuda.warp_emulation import emulate_warp, warp_jacobian_emulated
from solver.backends.cuda.warp_plan import build_warp_plan, warp_eligible
from solver.backends.cuda.warp_schedule import (build_warp_schedule, check_levels, run_factor,
                                                run_solve)
from solver.linalg.codegen import compile_functions
from solver.linalg.direct import build_direct_jacobian, declared_pattern
from solver.linalg.entry_terms import expand_entries
from solver.linalg.forward_mode import NotDifferentiable, tangent_source
from solver.linalg.linear import build_linear_solver
from solver.linalg.ordering import elimination_levels
from stiff_problems import ROBERTSON
from test_cuda_backend import EB_ATOL, EB_RTOL, _eb_setup, check_eb_jacobian

_SMALL = '''def f(x, p, tv):
    a = M.exp(x)
    b = M.sqrt(a * tv[0] + 2.0)
    c = p[0] * b / (1.0 + tv[1] ** 2.0)
    d = M.log(c * c) - a / b
    e = -d + 3.0 * p[1]
    return (c, d, e, p[0])
'''


def test_tangent_of_straight_line_code_equals_jvp():
    ts = tangent_source(_SMALL, "f", {"x": "1.0", "tv": ("array", "dtv")}, "f_dt")
    assert ts.args == ("x", "p", "tv", "dtv") and ts.n_out == 4
    out = {}
    for mod, name in ((math, "py"), (jnp, "jax")):
        out[name] = compile_functions(ts.source, ["f_dt"], "t", {"M": mod})["f_dt"]
    f = compile_functions(_SMALL, ["f"], "f", {"M": jnp})["f"]
    p, tv, dtv = np.array([1.3, 0.4]), np.array([0.7, -0.2]), np.array([0.3, 1.1])
    x = -0.6
    prim, tan = jax.jvp(lambda x_, tv_: jnp.stack(f(x_, p, tv_)), (x, jnp.asarray(tv)),
                        (1.0, jnp.asarray(dtv)))
    got = np.array(out["py"](x, p, tv, dtv))
    np.testing.assert_allclose(got[:4], prim, rtol=1e-15)
    np.testing.assert_allclose(got[4:], tan, rtol=1e-13, atol=1e-15)
    assert got[7] == 0.0   # p[0] is constant: its tangent is the literal zero
    with pytest.raises(NotDifferentiable, match="abs"):
        tangent_source("def g(x):\n    y = abs(x)\n    return (y,)\n", "g", {"x": "1.0"}, "h")


@pytest.fixture(scope="module")
def eb_small():
    k = np.array([0.005, 0.05, 0.3])
    return (k,) + _eb_setup(k)


def test_entries_as_terms_of_monomials(eb_small):
    """The default model's 680 entries are sums of at most two multiples of 29 monomials of 41
    atoms; recomputed from them they equal the straight-line entries to rounding."""
    from boltzmann import modes
    from boltzmann.params import load_config

    cfg = load_config("lcdm")
    lj = modes.model_for(cfg.cosmology, cfg.precision).linear_jacobian
    et = expand_entries(lj.device_source)
    assert len(et.monomials) <= 40 and max(len(t) for t in et.terms) <= 2
    atoms = compile_functions(et.atom_source, ["atoms"], "a", {"M": math})["atoms"]
    core = compile_functions(lj.device_source, ["jacobian_core"], "j", {"M": math})[
        "jacobian_core"]
    rng = np.random.default_rng(0)
    for _ in range(4):
        p = rng.uniform(0.5, 2.0, 10)
        tv, x = rng.uniform(-2, 2, 4), rng.uniform(-10, 0)
        ref = np.array(core(x, p, tv))
        got = np.array(et.evaluate(atoms(x, p, tv)))
        assert np.all(np.abs(got - ref) <= 2e-15 * np.abs(ref) + 1e-300)
    with pytest.raises(ValueError, match="division by a coefficient"):
        expand_entries("def j(x, p, tv):\n    a = x * 2.0\n    c_u_1 = a * p[0]\n"
                       "    c_v_1 = a / c_u_1\n    return (c_v_1,)\n")


def test_eb_entries_tangent_equals_jvp(eb_small):
    _, model, *_ = eb_small
    lj = model.linear_jacobian
    ts = tangent_source(lj.device_source, "jacobian_core", {"x": "1.0", "tv": ("array", "dtv")},
                        "jac_dt")
    fn = compile_functions(ts.source, ["jac_dt"], "t", {"M": math})["jac_dt"]
    rng = np.random.default_rng(1)
    P = len(model.param_names)
    p = rng.uniform(0.5, 2.0, P)
    p[1] = 0.0
    tv, dtv = rng.uniform(-2, 2, 4), rng.uniform(-2, 2, 4)
    got = np.array(fn(-7.0, p, tv, dtv))
    prim, tan = jax.jvp(lambda x_, t_: jnp.stack(lj.core(x_, p, t_)), (-7.0, jnp.asarray(tv)),
                        (1.0, jnp.asarray(dtv)))
    m = lj.nnz
    np.testing.assert_allclose(got[:m], prim, rtol=1e-14, atol=0)
    scale = np.abs(np.asarray(tan)).max()
    assert np.abs(got[m:] - np.asarray(tan)).max() <= 1e-13 * scale


def test_depth_order_and_lane_tables(eb_small):
    _, model, *_ = eb_small
    lj = model.linear_jacobian
    pat = declared_pattern(lj, model.n)
    amd = build_linear_solver(pat, method="sparse")
    deep = build_linear_solver(pat, method="sparse", ordering="depth")
    assert sorted(deep.symbolic.order.tolist()) == list(range(model.n))
    assert sum(elimination_levels(deep.symbolic)) < sum(elimination_levels(amd.symbolic))
    placed = build_direct_jacobian(lj, deep.slot_rows, deep.slot_cols)
    terms = expand_entries(lj.device_source)
    for lanes in (1, 5, 32):
        ws = build_warp_schedule(deep, lj.rows, lj.cols, placed.entry_slots, terms, lanes)
        check_levels(ws)
        own = np.concatenate([ws.ints[o:o + lanes] for o in ws.own_row]).astype(int)
        assert sorted(own[own < model.n].tolist()) == list(range(model.n))
        rng = np.random.default_rng(lanes)
        A = np.zeros((model.n, model.n))
        A[np.asarray(lj.rows), np.asarray(lj.cols)] = rng.standard_normal(lj.nnz)
        A += 8.0 * np.eye(model.n)
        w = deep.from_dense(A)
        w[deep.is_fill] = 0.0
        lu = run_factor(ws, w)
        b = rng.standard_normal(model.n)
        np.testing.assert_allclose(A @ run_solve(ws, lu, b, deep.symbolic.position), b,
                                   atol=1e-12)
    with pytest.raises(ValueError, match="ordering"):
        build_linear_solver(pat, method="sparse", ordering="metis")


def test_depth_order_shortens_the_default_model_solves():
    """configs/lcdm.yaml's model (n = 192): 57 + 57 solve levels under AMD, 15 + 15 in depth
    order, at 28 % more LU slots."""
    from boltzmann import modes
    from boltzmann.params import load_config

    cfg = load_config("lcdm")
    model = modes.model_for(cfg.cosmology, cfg.precision)
    pat = declared_pattern(model.linear_jacobian, model.n)
    amd = build_linear_solver(pat, method="sparse")
    deep = build_linear_solver(pat, method="sparse", ordering="depth")
    assert sum(elimination_levels(deep.symbolic)) <= 0.3 * sum(elimination_levels(amd.symbolic))
    assert deep.nslots <= 1.35 * amd.nslots


def test_emulated_warp_kernel_matches_jax_in_any_lane_order(eb_small):
    k, model, table, params, x0, y0, w = eb_small
    xs = np.linspace(x0.max(), -9.0, 4)
    a = solve(model.rhs, y0, xs, params, args=table, t0=x0, rtol=EB_RTOL, atol=EB_ATOL,
              error_weights=w)
    plan = build_warp_plan(model.rhs, model.n, params.shape[1], args=table, lanes=8)
    inp = prepare(y0, np.tile(xs, (len(k), 1)), params, EB_RTOL, EB_ATOL, x0, None, w, 100_000,
                  None)
    runs = {order: emulate_warp(plan, inp, table, lane_order=order)
            for order in ("forward", "reverse", "shuffle")}
    b = runs["forward"]
    assert np.all(b.status == Status.OK)
    np.testing.assert_array_equal(b.n_accepted, np.asarray(a.n_accepted))
    ctrl = w > 0
    ya, yb = np.asarray(a.ys)[..., ctrl], b.ys[..., ctrl]
    rel = np.abs(yb - ya) / np.maximum(np.abs(ya), EB_ATOL / EB_RTOL)
    assert rel.max() <= 1e-9, rel.max()
    for order in ("reverse", "shuffle"):
        np.testing.assert_array_equal(runs[order].ys, b.ys)
        np.testing.assert_array_equal(runs[order].n_accepted, b.n_accepted)


def test_per_trajectory_error_weights(eb_small):
    """Error weights (N, n), a row per trajectory (the CMB sources' two groups of modes in one
    launch): on the JAX backend a trajectory is, to rounding, the solve with its row as the
    shared weights (checked for the rows with the photons); the emulated warp kernel, which
    gets each row divided by the square root of its count, takes the same steps."""
    from boltzmann.cmb.sources import PHOTON_CONTROL

    k, model, table, params, x0, y0, w = eb_small
    wp = w.copy()
    for name in PHOTON_CONTROL:
        wp[model.index(name)] = 1.0
    rows = np.stack([wp, w, wp])
    assert (rows[0] > 0).sum() > (rows[1] > 0).sum()
    xs = np.linspace(x0.max(), -10.0, 4)
    kw = dict(args=table, t0=x0, rtol=EB_RTOL, atol=EB_ATOL)
    a = solve(model.rhs, y0, xs, params, error_weights=rows, **kw)
    assert np.all(np.asarray(a.status) == Status.OK)
    scale = np.maximum(np.abs(np.asarray(a.ys)), EB_ATOL / EB_RTOL)
    shared = solve(model.rhs, y0, xs, params, error_weights=wp, **kw)
    for i in (0, 2):                # the rows that are wp: the shared solve's steps
        assert int(shared.n_accepted[i]) == int(a.n_accepted[i])
        rel = np.abs(np.asarray(shared.ys)[i] - np.asarray(a.ys)[i]) / scale[i]
        assert rel.max() <= 1e-9, (i, rel.max())
    # the row without the photons takes fewer steps than the same mode with them
    assert int(a.n_accepted[1]) < int(shared.n_accepted[1])
    b = solve(model.rhs, y0, xs, params, error_weights=rows,
              backend=CudaBackend(launch="emulated"), **kw)
    assert b.info["kernel"] == "warp"
    np.testing.assert_array_equal(b.n_accepted, np.asarray(a.n_accepted))
    ctrl = w > 0
    rel = np.abs(np.asarray(b.ys)[..., ctrl] - np.asarray(a.ys)[..., ctrl]) / scale[..., ctrl]
    assert rel.max() <= 1e-9, rel.max()
    with pytest.raises(ValueError, match=r"shape \(\d+,\) or \(3, \d+\)"):
        solve(model.rhs, y0, xs, params, error_weights=rows[:2], **kw)
    bad = rows.copy()
    bad[1] = 0.0
    with pytest.raises(ValueError, match="in every row"):
        solve(model.rhs, y0, xs, params, error_weights=bad, **kw)


def test_emulated_warp_kernel_reports_failures(eb_small):
    k, model, table, params, x0, y0, w = eb_small
    xs = np.linspace(x0.max(), -9.0, 3)
    kw = dict(args=table, t0=x0, rtol=EB_RTOL, atol=EB_ATOL, error_weights=w, max_steps=40)
    a = solve(model.rhs, y0, xs, params, **kw)
    b = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="emulated"), **kw)
    assert b.info["kernel"] == "warp"
    np.testing.assert_array_equal(b.status, np.asarray(a.status))
    assert np.any(b.status == Status.MAX_STEPS) and np.any(b.status == Status.OK)
    np.testing.assert_array_equal(np.isnan(b.ys), np.isnan(np.asarray(a.ys)))


def test_emulated_warp_jacobian_kernel(eb_small):
    k, model, table, params, x0, y0, _ = eb_small
    rng = np.random.default_rng(3)
    xs = np.concatenate([x0, [-14.0, np.log(1.0 / 1100.0) + 0.03, -0.4]])
    P = np.concatenate([params, params])
    y = np.concatenate([y0, y0 * (1.0 + 0.3 * rng.standard_normal(y0.shape))])
    plan = build_warp_plan(model.rhs, model.n, params.shape[1], args=table, lanes=4)
    f, jv, dfdt = warp_jacobian_emulated(plan, y, xs, P, table)
    check_eb_jacobian(model, table, y, xs, P, f, jv, dfdt, plan)


def test_kernel_choice():
    assert not warp_eligible(ROBERTSON.rhs, False)
    y0 = np.tile(ROBERTSON.y0, (2, 1))
    params = np.tile(ROBERTSON.params, (2, 1))
    sol = solve(ROBERTSON.rhs, y0, np.array([0.0, 1.0]), params, rtol=1e-5, atol=1e-10,
                backend=CudaBackend(launch="emulated"))
    assert sol.info.get("kernel", "thread") == "thread"
    with pytest.raises(ValueError, match="kernel='warp'"):
        solve(ROBERTSON.rhs, y0, np.array([0.0, 1.0]), params,
              backend=CudaBackend(launch="emulated", kernel="warp"))
    with pytest.raises(ValueError, match="kernel must be"):
        CudaBackend(kernel="block")


def test_affine_rhs_is_refused(eb_small):
    from solver.backends.cuda.codegen.warp_entries import check_homogeneous

    _, model, *_ = eb_small
    core = model.table_split.core_device
    check_homogeneous(core, model.n, len(model.param_names), 4)

    def affine(y, x, p, tv):
        return tuple(v + 1e-3 for v in core(y, x, p, tv))

    with pytest.raises(ValueError, match="affine"):
        check_homogeneous(affine, model.n, len(model.param_names), 4)


def test_ffi_packs_the_lane_table_after_the_tables(eb_small):
    """Through a real ffi_call on the CPU (the handler's packing twin): the warp kernel's
    arguments in WARP_KERNEL_ARGS order, the two schedule tables as the last arrays."""
    import shutil

    from solver import RODAS5P
    from solver.backends.cuda.codegen.warp import WARP_KERNEL_ARGS

    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the FFI handler cannot be built")
    k, model, table, params, x0, y0, w = eb_small
    xs = np.linspace(x0.max(), -9.0, 3)
    N, n, m = len(k), model.n, xs.size
    dump = np.asarray(CudaBackend(launch="ffi").solve_jax(
        model.rhs, y0, xs, params, args=table, rtol=1e-5, atol=1e-10, t0=x0, t_end=None,
        sparsity=None, error_weights=w, max_steps=1000, first_step=None, controller=None,
        tableau=RODAS5P, probe=True, jit_eager=False)[5])[0]
    plan = build_warp_plan(model.rhs, n, params.shape[1], args=table)
    P = params.shape[1]
    shapes = {"y0": (N, n), "t0": (N,), "t_end": (N,), "t_save": (N, m), "params": (N, P),
              "args": table.shape, "atol": (n,), "weights": (1, n), "h0": (N,), "ys": (N, m, n),
              "t_out": (N,), "status": (N,), "n_accepted": (N,), "n_rejected": (N,),
              "sched": plan.sched.shape, "sched_f": plan.sched_f.shape}
    pos = 1
    for name in WARP_KERNEL_ARGS:
        if name in shapes:
            r = len(shapes[name])
            assert list(dump[pos + 3:pos + 3 + r]) == list(shapes[name]), name
            pos += 3 + 2 * r
        else:
            pos += 1
    assert dump[0] == pos - 1 and dump[pos - 1 - 10] == N   # n_traj just before the tables


def _two_modes_and_directions(eb_small, m):
    """Two modes of the small EB setup and the sensitivity solve's keywords for m (2 or 3)
    directions: a combined one (tangent table, parameter, initial state), one along k, and a
    half of the first's initial tangent alone."""
    from test_cuda_sensitivity import _eb_direction

    k, model, table, params, x0, y0, w = eb_small
    sel = [1, 2]
    params, x0, y0 = params[sel], x0[sel], y0[sel]
    xs = np.linspace(x0.max(), -11.0, 3)
    dtab, dp, dy0 = _eb_direction(model, table, params, y0)
    dk = np.zeros_like(dp)
    dk[:, 0] = 0.01 * params[:, 0]
    kw = dict(s0=np.stack([dy0, 0 * dy0, 0.5 * dy0])[:m], dparams=np.stack([dp, dk, 0 * dp])[:m],
              dargs=np.stack([dtab, 0 * dtab, 0 * dtab])[:m], args=table, t0=x0, rtol=EB_RTOL,
              atol=EB_ATOL, error_weights=w)
    return model, params, y0, xs, w, kw


def test_emulated_warp_sensitivities_equal_the_thread_kernel(eb_small):
    """The warp sensitivity kernel at one direction warp a block (a warp per (trajectory,
    direction); J_θ from the monomials' directional derivatives, W's one LU for both blocks of
    the joint system) against the thread sensitivity kernel
    (Enzyme's jvp / jvp(jvp), emulated by jax.jvp): the same steps, tangents to rounding, for a
    direction with a tangent table, a parameter tangent and an initial tangent, and one along k."""
    from solver.backends.cuda.emulation import sensitivity_emulated

    model, params, y0, xs, w, kw = _two_modes_and_directions(eb_small, 2)
    warp = sensitivity_emulated(model.rhs, y0, xs, params, lanes=8, dir_warps=1, **kw)
    thread = sensitivity_emulated(model.rhs, y0, xs, params, kernel_kind="thread", **kw)
    assert warp.info["kernel"] == "warp" and np.all(warp.status == Status.OK)
    np.testing.assert_array_equal(warp.n_accepted, thread.n_accepted)
    ctrl = w > 0
    for d in range(2):
        a, b = thread.dys[d][..., ctrl], warp.dys[d][..., ctrl]
        assert np.abs(a - b).max() <= 1e-10 * np.abs(a).max()
    assert np.abs(warp.ys - thread.ys)[..., ctrl].max() <= 1e-12 * np.abs(thread.ys).max()


def test_emulated_direction_warps_share_one_step_sequence(eb_small):
    """The warp sensitivity kernel's block of direction warps (warp 0 also carries y, its
    factorisation and stage solves; one error norm over the block): three directions at two
    warps a block run as blocks [d0, d1] and [d2, zero direction].  The zero direction adds
    exactly nothing to its block's norm, so d2 equals its own one-warp block to the bit; [d0, d1]
    take one step sequence for both, the same bits whichever warp or lane runs first, and
    tangents within the tolerance of the one-warp blocks' (each controlled alone)."""
    from solver.backends.cuda.emulation import sensitivity_emulated

    model, params, y0, xs, w, kw = _two_modes_and_directions(eb_small, 3)
    one = sensitivity_emulated(model.rhs, y0, xs, params, lanes=8, dir_warps=1, **kw)
    two = sensitivity_emulated(model.rhs, y0, xs, params, lanes=8, dir_warps=2, **kw)
    rev = sensitivity_emulated(model.rhs, y0, xs, params, lanes=8, dir_warps=2,
                               warp_order="reverse", **kw)
    assert two.info["direction_warps"] == 2 and np.all(two.status == Status.OK)
    assert two.dys.shape == one.dys.shape == (3, 2, 3, model.n)
    for f in ("ys", "dys", "n_accepted", "n_rejected", "t_final"):
        np.testing.assert_array_equal(getattr(two, f), getattr(rev, f))
    np.testing.assert_array_equal(two.dys[2], one.dys[2])
    np.testing.assert_array_equal(two.n_accepted[2], one.n_accepted[2])
    # one step sequence for the block's two directions, at least as fine as either alone
    np.testing.assert_array_equal(two.n_accepted[0], two.n_accepted[1])
    assert np.all(two.n_accepted[0] >= one.n_accepted[:2].max(axis=0) - 1)
    ctrl = w > 0
    for d in range(2):
        a, b = one.dys[d][..., ctrl], two.dys[d][..., ctrl]
        assert np.abs(a - b).max() <= 100 * EB_RTOL * np.abs(a).max()
    assert np.abs(two.ys - one.ys)[..., ctrl].max() <= 100 * EB_RTOL * np.abs(one.ys).max()


def test_emulated_direction_blocks_take_their_trajectory_s_row_of_weights(eb_small):
    """Per-trajectory error weights (N, n) in the warp sensitivity kernel: each mode's block of
    direction warps takes the steps its row gives as the shared weights of a launch of that mode
    alone (the rows here: the model's, and the same with the baryons out of the norm)."""
    from solver.backends.cuda.emulation import sensitivity_emulated

    model, params, y0, xs, w, kw = _two_modes_and_directions(eb_small, 2)
    loose = w.copy()
    loose[[model.index("delta_b"), model.index("theta_b")]] = 0.0
    rows = np.stack([w, loose])
    both = sensitivity_emulated(model.rhs, y0, xs, params, lanes=8, dir_warps=2,
                                **(kw | {"error_weights": rows}))
    assert np.all(both.status == Status.OK)
    for i in range(2):
        alone = sensitivity_emulated(
            model.rhs, y0[i:i + 1], xs, params[i:i + 1], lanes=8, dir_warps=2,
            **(kw | {"error_weights": rows[i], "t0": kw["t0"][i:i + 1],
                     "s0": kw["s0"][:, i:i + 1], "dparams": kw["dparams"][:, i:i + 1]}))
        np.testing.assert_array_equal(both.n_accepted[:, i], alone.n_accepted[:, 0])
        ref = alone.dys[:, 0]
        assert np.abs(both.dys[:, i] - ref).max() <= 1e-9 * np.abs(ref).max()
    assert both.n_accepted[0, 0] != both.n_accepted[0, 1]      # the rows change the steps


def test_direction_groups_padding_and_settings():
    """How directions are grouped into blocks (the fewest blocks of at most ``most`` warps,
    spread evenly), the host's zero padding and its removal, and the settings that cap the
    warps: a bad value names what to give."""
    from boltzmann import runtime
    from solver.backends.cuda.inputs import direction_warps, pad_directions, trim_directions

    assert [direction_warps(m, 4) for m in (1, 2, 3, 4, 5, 7, 8, 9, 10)] == \
        [1, 2, 3, 4, 3, 4, 4, 3, 4]
    assert direction_warps(8, 1) == 1
    with pytest.raises(ValueError, match="at least 1"):
        direction_warps(3, 0)
    N, n, P = 2, 5, 3
    inp = {"m": 3, "N": N, "s0": np.ones((3, N, n)), "dparams": np.ones((3, N, P)),
           "dargs": np.ones((3, 4, 2)), "y0": np.zeros((N, n))}
    pad = pad_directions(inp, 2)
    assert pad["m"] == 4 and pad["s0"].shape == (4, N, n) and pad["dargs"].shape == (4, 4, 2)
    assert np.all(pad["s0"][3] == 0) and np.all(pad["dparams"][3] == 0) and \
        np.all(pad["dargs"][3] == 0) and np.all(pad["s0"][:3] == 1)
    shared = dict(inp, dargs=np.zeros((1, 4, 2)))    # one zero table for every direction
    assert pad_directions(shared, 2)["dargs"].shape == (1, 4, 2)
    assert pad_directions(inp, 3) is inp
    out = {"ys": np.zeros((N, 1, n)), "dys": np.zeros((4, N, 1, n)), "status": np.zeros((4, N))}
    cut = trim_directions(out, 3)
    assert cut["dys"].shape[0] == 3 and cut["status"].shape == (3, N) and cut["ys"] is out["ys"]
    env = runtime.Settings.from_environment
    assert env({}).direction_warps is None
    assert env({"BOLTZMANN_DIRECTION_WARPS": "2"}).direction_warps == 2
    with pytest.raises(ValueError, match="positive integer"):
        env({"BOLTZMANN_DIRECTION_WARPS": "0"})
    with pytest.raises(ValueError, match="direction_warps"):
        CudaBackend(direction_warps=0)
    assert CudaBackend(direction_warps=2).direction_warps == 2
