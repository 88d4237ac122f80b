"""models/hermite.py: the one cubic Hermite, its emitted (generated-code) form and its integral."""
import numpy as np

from models.hermite import (cumulative_hermite, emitted_basis, emitted_basis_dx, emitted_powers,
                            emitted_value, emitted_value_dx, hermite)


def _run_emitted(pairs, value, scope):
    for name, expr in pairs:
        exec(f"{name} = {expr}", {}, scope)  # noqa: S102 - the module's own text
    return eval(value, {}, scope)  # noqa: S307


def test_emitted_cubic_equals_hermite_to_the_last_bit():
    """The generated rhs inlines the text; the numeric cubic must be the same arithmetic."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        t, dx = rng.uniform(-0.2, 1.2), rng.uniform(1e-3, 0.1)
        f0, d0, f1, d1 = rng.normal(size=4) * 10.0 ** rng.integers(-3, 4, size=4)
        scope = dict(tc=t, dxg=dx, f0=f0, d0=d0, f1=f1, d1=d1)
        got = _run_emitted(emitted_powers("tc") + emitted_basis("tc", "dxg"),
                           emitted_value("f0", "d0", "f1", "d1"), scope)
        assert got == hermite(t, dx, f0, d0, f1, d1)


def test_emitted_derivative_is_exact_for_cubics():
    rng = np.random.default_rng(3)
    c = rng.normal(size=4)
    f = np.polynomial.Polynomial(c)
    df = f.deriv()
    x0, dx = 0.3, 0.05
    for t in (0.0, 0.25, 0.5, 0.9, 1.0, 1.3):
        scope = dict(tc=t, dxg=dx)
        got = _run_emitted(emitted_powers("tc") + emitted_basis_dx("tc", "dxg"),
                           emitted_value_dx(*(repr(float(v)) for v in
                                              (f(x0), df(x0), f(x0 + dx), df(x0 + dx)))), scope)
        assert abs(got - df(x0 + t * dx)) < 1e-9 * max(1.0, abs(df(x0 + t * dx)))


def test_cumulative_hermite_is_exact_for_cubics():
    """The corrected trapezoid rule integrates cubics exactly on every panel."""
    f = np.polynomial.Polynomial([0.5, -1.0, 2.0, 0.7])
    x = np.linspace(-1.0, 2.0, 31)
    h = x[1] - x[0]
    got = np.asarray(cumulative_hermite(h, f(x), f.deriv()(x)))
    want = f.integ()(x) - f.integ()(x[0])
    assert got[0] == 0.0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
