"""End-to-end parameter derivatives of P(k) and sigma8 (boltzmann.gradients).

The exact Jacobian (forward sensitivities through background, thermodynamics, initial conditions
and the perturbation solve) is compared with central finite differences of the same code, and with
central finite differences of CLASS (tests/data/class_dlnpk_dtheta.csv, made by
tests/data/generate_class_derivatives.py).

One module-scoped fixture evaluates the Jacobian once (all parameters, a reduced-precision model:
the comparison is of a derivative with the function it differentiates, so ℓmax need not be
converged for the self-consistency test), without σ8; σ8's derivative has a fixture of its own
(three parameters, ``-m slow``). CPU cost: a few minutes of compile + run.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from boltzmann.gradients import PARAMETERS, PowerSpectrumFunction
from boltzmann.params import ConfigError, load_config

DATA = Path(__file__).parent / "data"
H = 0.6736

#: relative/absolute FD steps (absolute for parameters that sit at or near zero)
FD_STEP = {"h": 2e-3 * H, "omega_b": 2e-3 * 0.02237, "omega_cdm": 2e-3 * 0.12,
           "ln10^{10}A_s": 1e-2, "n_s": 2e-3, "tau_reio": 2e-3, "m_ncdm": 4e-3, "N_ur": 4e-3,
           "w0_fld": 2e-3, "wa_fld": 2e-3}


def _config(rtol, precision=None):
    """configs/lcdm_reduced.yaml (lcdm's cosmology, a short hierarchy, 1e-3..1 h/Mpc, z = 0) at
    ``rtol``, with optional further precision overrides."""
    cfg = load_config("lcdm_reduced")
    prec = dataclasses.replace(cfg.precision, rtol=rtol, **(precision or {}))
    return dataclasses.replace(cfg, precision=prec)


def _reference():
    """CLASS's derivative table: (k [1/Mpc], {parameter: column})."""
    path = DATA / "class_dlnpk_dtheta.csv"
    with open(path) as fh:
        header = [line for line in fh if line.startswith("#")][-1].lstrip("# ").strip().split(",")
    ref = np.loadtxt(path, delimiter=",")
    return ref[:, 0], {name: ref[:, i] for i, name in enumerate(header) if i > 0}


#: our k = every 8th wavenumber of the CLASS reference table (1e-3 ... 1 h/Mpc): compared
#: point by point, no interpolation (the table has ~2 points per BAO wiggle of ∂ln P/∂omega_b)
K_ROWS = np.arange(0, 60, 8)


@pytest.fixture(scope="module")
def exact():
    k_ref, _ = _reference()
    # two chunks of unequal size: the chunk loop (a lax.map over padded chunks) is differentiated
    # σ8 left out here: its extra modes (to ~7 h/Mpc, 10 directions at rtol 1e-7) cost more than
    # the rest of the module; test_sigma8_derivative_matches_finite_differences has its own
    fn = PowerSpectrumFunction(_config(1e-7), k=k_ref[K_ROWS], n_chunks=2,
                               z_background=(0.5, 2.0), with_sigma8=False)
    return fn, fn.dlnpk()


@pytest.fixture(scope="module")
def with_sigma8():
    """σ8 with modes.sigma8_grid's extra modes, in the three parameters the test checks."""
    k_ref, _ = _reference()
    fn = PowerSpectrumFunction(_config(1e-7), k=k_ref[K_ROWS][:3], n_chunks=2,
                               parameters=("omega_cdm", "h", "m_ncdm"))
    return fn, fn.dlnpk()


def test_fiducial_vector_and_names(exact):
    fn, d = exact
    assert fn.parameters == PARAMETERS
    assert d["dlnP_m"].shape == (1, fn.k.size, len(PARAMETERS))
    theta = dict(zip(fn.parameters, np.asarray(fn.theta0)))
    assert theta["h"] == H and theta["w0_fld"] == -1.0 and theta["wa_fld"] == 0.0
    assert theta["ln10^{10}A_s"] == pytest.approx(np.log(21.0))
    assert fn.de_at_lambda   # Λ config: w0/wa derivatives with the fluid linearised about Λ
    # what the CLI reports as the Jacobian's stages: each timed, together at most the whole
    stages = fn.last_stage_seconds
    assert set(stages) == {"inputs", "solve", "outputs"} and min(stages.values()) > 0
    assert sum(stages.values()) <= d["seconds"]


def test_amplitude_and_tilt_are_exact(exact):
    """P ∝ A_s (k/k_pivot)^(n_s-1) T(k)^2 and T does not depend on A_s, n_s.

    ``jacobian`` takes P and ∂P/∂θ from one joint [y, S] solve (``solver.solve_with_tangents``),
    so the ratio is exact to rounding; the tolerance stays at ~rtol (1e-7 here), what it is
    when P comes from a separate plain solve (``jax.jacfwd`` of the function, or the CUDA
    backend), whose steps differ.
    """
    fn, d = exact
    i_as, i_ns = PARAMETERS.index("ln10^{10}A_s"), PARAMETERS.index("n_s")
    np.testing.assert_allclose(d["dlnP_m"][0, :, i_as], 1.0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(d["dlnP_m"][0, :, i_ns], np.log(fn.k / 0.05), rtol=0,
                               atol=1e-6 * np.abs(np.log(fn.k / 0.05)).max())


#: the default run's finite-difference parameters: one per distinct path through the code
#: (h: everything; omega_b: recombination; m_ncdm: the massive species; N_ur: the massless
#: hierarchy; wa_fld: the Λ-linearised fluid's (1, 1) direction); ln10^{10}A_s and n_s are exact
#: (test_amplitude_and_tilt_are_exact); -m slow runs all ten
FD_DEFAULT = ("h", "omega_b", "m_ncdm", "N_ur", "wa_fld")


@pytest.mark.parametrize("names", [
    FD_DEFAULT,
    pytest.param(tuple(p for p in PARAMETERS if p not in FD_DEFAULT), marks=pytest.mark.slow)])
def test_jacobian_matches_finite_differences_of_our_code(exact, names):
    """∂ln P_m/∂θ vs central differences of the same function, to 1e-3 of each parameter's
    largest |∂ln P/∂θ| over 1e-3 <= k <= 1 h/Mpc.

    FD: central 2-point stencil, steps FD_STEP (~2e-3 of each parameter's scale), of the same
    function at a tightened rtol 1e-9 (truncation ~(step/scale)² ~ 1e-5).  At the Jacobian's
    rtol 1e-7 the FD of τ_reio is noise-limited: its max |∂ln P/∂τ| is only 1.6e-3, and
    solver noise of ~1e-8 in ln P over the 4e-3 stencil is 2.5e-3 of that (with the
    Λ-linearised fluid out of error control, the steps are not forced small); at 1e-9
    FD and the rtol-1e-7 Jacobian agree to 7e-5 for τ_reio.
    """
    fn, d = exact
    k_ref, _ = _reference()
    f = PowerSpectrumFunction(_config(1e-9), k=k_ref[K_ROWS], n_chunks=1,
                              with_sigma8=False)._jit_value
    theta0 = np.asarray(fn.theta0)
    worst = {}
    for name in names:
        j = fn.parameters.index(name)
        step = FD_STEP[name]
        lnp = {}
        for s in (-1, 1):
            th = theta0.copy()
            th[j] += s * step
            lnp[s] = np.log(np.asarray(f(th)["P_m"])[0])
        fd = (lnp[1] - lnp[-1]) / (2 * step)
        ad = d["dlnP_m"][0, :, j]
        scale = np.max(np.abs(ad))
        worst[name] = np.max(np.abs(ad - fd)) / scale
    bad = {n: v for n, v in worst.items() if not v <= 1e-3}
    assert not bad, f"AD vs FD (relative to max |dlnP/dθ|): {worst}"


@pytest.mark.slow  # its own Jacobian program and σ8's extra modes: minutes on 2 cores
def test_sigma8_derivative_matches_finite_differences(with_sigma8):
    fn, d = with_sigma8
    assert "dlnsigma8" in d   # σ8's modes are added whatever k the function was asked for
    f = fn._jit_value
    theta0 = np.asarray(fn.theta0)
    for name in ("omega_cdm", "h", "m_ncdm"):
        j = fn.parameters.index(name)
        step = FD_STEP[name]
        vals = []
        for s in (-1, 1):
            th = theta0.copy()
            th[j] += s * step
            vals.append(np.log(float(np.asarray(f(th)["sigma8"])[0])))
        fd = (vals[1] - vals[0]) / (2 * step)
        assert d["dlnsigma8"][0, j] == pytest.approx(fd, rel=2e-3, abs=1e-6), name


def test_background_and_derived_derivatives_match_finite_differences(exact):
    """The Jacobian's background and derived outputs (H, D_A at z_background, r_d, 100θ_s, z_d:
    through the thermodynamics of the same tables) vs central differences of
    ``fn.background``, which evaluates them without the perturbation solve."""
    fn, d = exact
    assert d["background"]["D_A"].shape == (2,) and d["dbackground"]["rs_d"].shape == (
        len(fn.parameters),)
    theta0 = np.asarray(fn.theta0)
    for name in ("h", "omega_b", "omega_cdm", "N_ur"):
        j = fn.parameters.index(name)
        e = np.zeros(theta0.size)
        e[j] = 0.1 * FD_STEP[name]             # smooth: truncation ~1e-8, rounding below
        up, down = fn.background(theta0 + e), fn.background(theta0 - e)
        for out in ("H", "D_A", "rs_d", "100*theta_s", "z_d"):
            fd = (np.asarray(up[out]) - np.asarray(down[out])) / (2 * e[j])
            ad = d["dbackground"][out][..., j]
            np.testing.assert_allclose(ad, fd, rtol=1e-5, atol=1e-8 * np.max(np.abs(fd)),
                                       err_msg=f"d{out}/d{name}")
    np.testing.assert_allclose(d["background"]["rs_d"], fn.background()["rs_d"], rtol=1e-12)


def test_unknown_parameter_and_missing_species_are_errors():
    cfg = _config(1e-5)
    with pytest.raises(ConfigError, match="unknown parameter 'Omega_k'"):
        PowerSpectrumFunction(cfg, parameters=("h", "Omega_k"))
    massless = load_config({"cosmology": {"h": H, "omega_b": 0.02237, "omega_cdm": 0.12,
                                          "A_s": 2.1e-9, "n_s": 0.9649, "tau_reio": 0.0544},
                            "output": {"z": [0.0], "k_min": 1e-3, "k_max": 1.0,
                                       "k_per_decade": 2}})
    with pytest.raises(ConfigError, match="no massive neutrino"):
        PowerSpectrumFunction(massless, parameters=("m_ncdm",))


def test_jacobian_matches_class_finite_differences(exact):
    """∂ln P_m/∂θ vs CLASS v3.4.1 central differences at high precision (tests/data/
    class_dlnpk_dtheta.csv, 1e-3 <= k <= 1 h/Mpc, at the table's own k) to 2% of each parameter's
    largest |∂ln P/∂θ| over the table. Our side runs the reduced ℓmax of the fixture.

    The reference's own finite-difference error (|D(s) - D(s/2)| in its yaml) bounds what it can
    resolve: for tau_reio (max |∂ln P/∂τ| = 1.6e-3) it is 1.9% of the maximum, so the tolerance
    is max(2%, 3 × that estimate) per parameter (tau_reio: 5.7%; all others stay at 2%).
    Measured: h 1.1e-4, omega_b 1.0e-3, omega_cdm 3.0e-3, m_ncdm 1.4e-3, N_ur 5.4e-3,
    w0 3.0e-4, wa 9.7e-4, tau_reio 2.3e-2 (a model difference at the lowest k: RECFAST vs HyRec
    residual ionisation moves z_reio(τ)).
    """
    import yaml

    fn, d = exact
    k_ref, cols = _reference()
    meta = yaml.safe_load((DATA / "class_dlnpk_dtheta.yaml").read_text())
    np.testing.assert_allclose(fn.k, k_ref[K_ROWS], rtol=1e-12)
    worst, tol = {}, {}
    for j, name in enumerate(fn.parameters):
        col = cols[name]
        conv = meta["step_convergence"][name]
        tol[name] = max(2e-2, 3.0 * conv["max_abs_D(s)-D(s/2)"] / conv["max_abs_value"])
        worst[name] = np.max(np.abs(d["dlnP_m"][0, :, j] - col[K_ROWS])) / np.max(np.abs(col))
    bad = {n: (v, tol[n]) for n, v in worst.items() if not v <= tol[n]}
    assert not bad, f"ours vs CLASS (relative to max |dlnP/dθ|): {worst}"


def test_solver_options_reach_the_sensitivity_solve(monkeypatch):
    """``sensitivity_error_control`` (as its weight, False = 0) and ``backend`` are handed to
    solve_diff."""
    import jax
    import jax.numpy as jnp

    import boltzmann.perturbations as stage

    seen = {}

    def fake_solve_diff(rhs, y0, t_save, params, **kw):
        seen.update(kw)
        return jnp.zeros((y0.shape[0], len(t_save), y0.shape[1]))

    monkeypatch.setattr(stage, "solve_diff", fake_solve_diff)
    fn = PowerSpectrumFunction(_config(1e-5), parameters=("h",), n_chunks=1, with_sigma8=False,
                               sensitivity_error_control=False, backend="jax")
    jax.eval_shape(fn._evaluate, fn.theta0)  # a trace reaches solve_diff; nothing runs
    assert seen["sensitivity_error_control"] == 0.0  # the non-default value arrives, as a weight
    assert seen["backend"] == "jax"
    # without the argument the precision's sensitivity_error_weight is the weight
    from boltzmann.schema import PRECISION_TABLE

    default = PRECISION_TABLE["sensitivity_error_weight"].default
    for cfg, want in ((_config(1e-5), default),
                      (_config(1e-5, {"sensitivity_error_weight": 0.5}), 0.5)):
        seen.clear()
        fn = PowerSpectrumFunction(cfg, parameters=("h",), n_chunks=1, with_sigma8=False)
        jax.eval_shape(fn._evaluate, fn.theta0)
        assert seen["sensitivity_error_control"] == want


def test_jacobian_programs_are_persisted(tmp_path):
    """With a program store the Jacobian's three programs are exported on first use and a second
    object built alike loads them (no tracing); another sensitivity weight is another key, and
    the CUDA solve stage (a host callback) is never exported. Tracing only: nothing compiles."""
    import jax
    import jax.numpy as jnp

    from solver import set_program_store

    def build(**kw):
        return PowerSpectrumFunction(_config(1e-5), parameters=("h", "omega_cdm"),
                                     k=np.array([0.01, 0.1]), n_chunks=1, with_sigma8=False,
                                     z_background=(), derived=(), **kw)

    shapes = {}   # the inputs' shapes, alike for every build here: traced once

    def prepare(fn):
        theta = fn.theta0
        if not shapes:
            shapes["inputs"] = jax.eval_shape(fn._inputs_and_tangents, theta)
        (table, rows, y0, bg), (dtable, drows, dy0, dbg) = jax.tree_util.tree_map(
            lambda s: jnp.zeros(s.shape, s.dtype), shapes["inputs"])
        return (fn._jit_inputs_jvp.prepare(theta),
                fn._jit_solve_jvp.prepare(table, rows, y0, dtable, drows, dy0,
                                          *fn._chunk_groups[:1]))

    set_program_store(tmp_path)
    try:
        assert prepare(build()) == ("exported", "exported")
        assert prepare(build()) == ("loaded", "loaded")
        assert prepare(build(sensitivity_error_control=1.0)) == ("exported", "exported")
        cuda = build(backend="cuda")
        assert cuda._jit_solve_jvp._digest_of_parts() is None      # not keyed: plain jit
        assert cuda._jit_inputs_jvp._digest_of_parts() is not None
        # a backend object (the CLI's): its inputs and outputs programs, which run no solver,
        # are keyed as for its name -- a later process loads them --, its solve is not
        from solver import CudaBackend, JaxBackend
        for obj, name in ((JaxBackend(), "jax"), (CudaBackend(launch="emulated"), "cuda")):
            by_obj, by_name = build(backend=obj), build(backend=name)
            assert by_obj._jit_solve_jvp._digest_of_parts() is None
            for stage in ("_jit_inputs_jvp", "_jit_outputs_jvp"):
                assert getattr(by_obj, stage)._digest_of_parts() == \
                    getattr(by_name, stage)._digest_of_parts() is not None
    finally:
        set_program_store(None)
    assert len(list(tmp_path.iterdir())) == 4


@pytest.mark.slow  # ~2 min on 2 cores: outside the default run, which must stay under 20 min
def test_sensitivity_problem_reproduces_the_jacobian(exact):
    """``PowerSpectrumFunction.sensitivity_problem`` hands out the solve that ``jacobian``
    differentiates: one parameter's direction through ``joint_solve`` (m = 1, as a CUDA thread
    runs it) and scripts/sensitivity_steps.py's contraction give the fixture's ∂ln P_m/∂θ, to
    the solve tolerance (the m = 10 joint solve takes other steps)."""
    import importlib.util

    from solver import joint_solve

    spec = importlib.util.spec_from_file_location(
        "sensitivity_steps", Path(__file__).resolve().parents[1] / "scripts" / "sensitivity_steps.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fn, d = exact
    prob = fn.sensitivity_problem()
    mine = np.array([1, 5])                       # two of the fixture's k ...
    keep = fn.keep[mine]                          # ... among the solved modes (σ8 adds some)
    sub = {key: prob[key][keep] for key in ("y0", "params", "t0")}
    sub.update({key: prob[key][:, keep] for key in ("dy0", "dparams")})
    sub.update(dargs=prob["dargs"], observables=prob["observables"], args=prob["args"])
    j = fn.parameters.index("omega_cdm")
    ys, dys, info = joint_solve(prob["rhs"], sub["y0"], prob["t_save"], sub["params"],
                                args=prob["args"], t0=sub["t0"], rtol=prob["rtol"],
                                atol=prob["atol"], error_weights=prob["error_weights"],
                                **script.direction(sub, j))
    assert np.all(info["status"] == 0)
    got = script.dlnp_from_states(sub, ys, dys[0], j)
    want = d["dlnP_m"][0, mine, j]
    scale = np.abs(d["dlnP_m"][0, :, j]).max()
    assert np.abs(got - want).max() <= 1e-4 * scale, (got, want)


def test_primordial_parameters_get_no_sensitivity_direction(exact):
    """The solve's inputs (initial states, mode rows, tables) do not depend on A_s and n_s (the
    modes start at unit curvature), so ``jacobian``'s joint solve leaves those two directions
    out (``ParameterMap.solve_directions``) and their columns come from the outputs stage alone
    (exact: test_amplitude_and_tilt_are_exact). Checked with the inputs program ``jacobian``
    itself runs (compiled once for the module): moving ln10^{10}A_s and n_s far leaves the
    inputs and their tangents along the kept directions bit for bit as they were, while moving
    ω_cdm changes both."""
    fn, _ = exact
    kept = fn._map.solve_directions
    dropped = [PARAMETERS.index("ln10^{10}A_s"), PARAMETERS.index("n_s")]
    assert sorted(set(range(len(PARAMETERS))) - set(kept.tolist())) == dropped

    import jax.numpy as jnp

    def solve_inputs(theta):
        inputs, tangents = fn._jit_inputs_jvp(jnp.asarray(theta))
        return [np.asarray(a) for a in (*inputs[:3], *tangents[:3])]

    theta0 = np.asarray(fn.theta0)
    here = solve_inputs(theta0)
    assert all(t.shape[0] == kept.size for t in here[3:])
    moved = theta0.copy()
    moved[dropped] += (0.3, -0.05)
    for a, b in zip(here, solve_inputs(moved)):
        np.testing.assert_array_equal(a, b)
    other = theta0.copy()
    other[PARAMETERS.index("omega_cdm")] *= 1.05
    changed = solve_inputs(other)
    assert not np.array_equal(here[0], changed[0]) and not np.array_equal(here[3], changed[3])


@pytest.mark.slow  # its own Jacobian program (~35 s): outside the 20-minute default run
def test_lambda_linearised_fluid_is_passive_and_out_of_error_control():
    """The rule behind UNCONTROLLED's fluid entries, checked on the model itself: at Λ no other
    state's derivative depends on the linearised fluid's four states (so the value cannot see
    their error), while along w0 it does (so the w0 sensitivity carries the fluid) — and the
    error weights leave exactly those four out."""
    import jax
    import jax.numpy as jnp

    from boltzmann import modes
    from boltzmann.gradients import _one

    fn = PowerSpectrumFunction(_config(1e-5), parameters=("w0_fld",), k=np.array([0.1]),
                               n_chunks=1, with_sigma8=False)
    model = fn.model
    fluid = [i for i, n in enumerate(model.state_names) if n.startswith(("delta_de_",
                                                                         "theta_de_"))]
    other = [i for i in range(model.n) if i not in fluid]
    assert len(fluid) == 4
    w = modes.error_weights(model)
    assert np.all(w[fluid] == 0.0) and np.count_nonzero(w[other]) > 0
    cosmo, table = jax.jit(fn._solve_inputs)(fn.theta0)
    rows = modes.mode_rows(model, cosmo, fn.k[None], fn.grid)
    y0 = modes.initial_states_at(model, rows, fn.x0)
    y = y0[0] * (1.0 + 0.1 * np.random.default_rng(0).standard_normal(model.n))
    x = float(fn.x0[0]) + 3.0

    def coupling(p):     # ∂f_other/∂y_fluid
        J = jax.jacfwd(lambda y_: jnp.stack(model.rhs(y_, x, p, table)))(jnp.asarray(y))
        return J[np.ix_(other, fluid)]

    c0 = np.asarray(coupling(rows[0]))
    assert np.all(c0 == 0.0)
    drows = jax.jacfwd(lambda th: modes.mode_rows(model, _one(fn.cosmology(th)), fn.k[None],
                                                  fn.grid))(fn.theta0)[0, :, 0]
    _, dc = jax.jvp(coupling, (rows[0],), (drows,))
    assert np.abs(np.asarray(dc)).max() > 0.0


def test_solve_device_follows_a_default_device_context():
    """The Jacobian's solve runs where a ``jax.default_device`` context says (a GPU test's JAX
    reference on the host CPU), else on the default backend's first device; its argument
    sharding is that device's."""
    import jax

    from boltzmann.gradients_ahead import solve_device, solve_sharding

    cpu = jax.devices("cpu")[-1]
    assert solve_device() == jax.devices()[0]
    with jax.default_device(cpu):
        assert solve_device() == cpu
        assert solve_sharding().device_set == {cpu}
    with jax.default_device("cpu"):
        assert solve_device() == jax.devices("cpu")[0]


def test_preload_loads_the_inputs_and_solve_programs_in_threads_of_their_own(monkeypatch):
    """``preload`` starts a load per stored Jacobian program -- the inputs program with θ as
    ``jacobian`` passes it, the solve program with shape structs of the inputs' outputs -- and
    ``_wait_for_preload`` joins them; a solve program not stored is not loaded (nor compiled).
    With no stored inputs program nothing starts on a CPU-only machine, and on a GPU machine
    (inputs on the host CPU) one thread builds the inputs program (``load(build=True)``)."""
    import threading

    import jax
    import jax.numpy as jnp

    from boltzmann.gradients_ahead import AheadOfCall

    class Program:
        def __init__(self, outputs=None, stored=True):
            self.outputs, self.stored, self.loads = outputs, stored, []

        def stored_output_shapes(self, theta):
            return self.outputs if self.stored else None

        def has_stored(self, *args):
            return self.stored

        def load(self, *args, build=False):
            self.loads.append((threading.current_thread().name, args, build))
            return True

    def shape(*s):
        return jax.ShapeDtypeStruct(s, jnp.float64)

    outputs = ((shape(1, 5), shape(1, 3, 2), shape(1, 3, 4), None),
               (shape(2, 1, 5), shape(2, 1, 3, 2), shape(2, 1, 3, 4), None))

    class Fn(AheadOfCall):
        theta0 = jnp.array([0.7, 0.02])
        inputs_on_host = False
        backend = "jax"
        _chunk_groups = None

        def __init__(self, solve_stored, inputs_stored=True):
            self._jit_inputs_jvp = Program(outputs, inputs_stored)
            self._jit_solve_jvp = Program(stored=solve_stored)

    fn = Fn(solve_stored=True)
    assert fn.preload() is True
    assert len(fn._preloading) == 2
    fn._wait_for_preload()
    assert fn._preloading == ()
    (where_in, (theta,), build_in), = fn._jit_inputs_jvp.loads
    (where_solve, solve_args, build_solve), = fn._jit_solve_jvp.loads
    assert build_in is build_solve is False
    assert where_in == where_solve == "boltzmann-preload"
    np.testing.assert_array_equal(np.asarray(theta), np.asarray(fn.theta0))
    assert [a.shape for a in solve_args] == [(1, 5), (1, 3, 2), (1, 3, 4), (2, 1, 5),
                                             (2, 1, 3, 2), (2, 1, 3, 4)]

    fn = Fn(solve_stored=False)
    assert fn.preload() is True
    fn._wait_for_preload()
    assert len(fn._jit_inputs_jvp.loads) == 1 and fn._jit_solve_jvp.loads == []

    fn = Fn(solve_stored=True, inputs_stored=False)
    assert fn.preload() is False and fn._preloading == ()
    assert fn._jit_inputs_jvp.loads == [] and fn._jit_solve_jvp.loads == []

    # a GPU machine (mocked: the host CPU device is the CPU): the inputs program is built ahead
    from boltzmann import gradients_ahead

    monkeypatch.setattr(gradients_ahead, "host_cpu", lambda: jax.devices("cpu")[0])
    fn = Fn(solve_stored=True, inputs_stored=False)
    fn.inputs_on_host = True
    assert fn.preload() is True and len(fn._preloading) == 1
    fn._wait_for_preload()
    (where_in, (theta,), build_in), = fn._jit_inputs_jvp.loads
    assert where_in == "boltzmann-preload" and build_in is True
    assert theta.devices() == {jax.devices("cpu")[0]} and fn._jit_solve_jvp.loads == []
