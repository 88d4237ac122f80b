"""Primordial spectrum, P(k) from transfers, top-hat window and sigma_R (boltzmann.spectra)."""
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from scipy import integrate

from boltzmann import spectra
from boltzmann.output import read_pk_csv

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def reference_params():
    return yaml.safe_load((DATA / "params.yaml").read_text())


def _bbks_power(k, h=0.6736, omega_m=0.14237, A_s=2.1e-9, n_s=0.9649, k_pivot=0.05, wiggles=True):
    """A smooth analytic LCDM-like P(k) [Mpc^3] (BBKS 1986 transfer, optional BAO-like wiggles)."""
    gamma_h = omega_m / h  # shape parameter Gamma*h in 1/Mpc units: q = k / (Gamma h)
    q = k / gamma_h
    t = np.log(1 + 2.34 * q) / (2.34 * q) * (1 + 3.89 * q + (16.1 * q) ** 2 + (5.46 * q) ** 3 + (6.71 * q) ** 4) ** -0.25
    if wiggles:
        t = t * (1 + 0.04 * np.sin(k * 147.0) * np.exp(-((k / 0.25) ** 2)))
    # T normalised to ~k^2 at low k, like a synchronous-gauge density transfer for unit curvature
    d = 1e5 * k**2 * t
    return 2 * np.pi**2 / k**3 * A_s * (k / k_pivot) ** (n_s - 1) * d**2


def _sigma_quad(power, R, k_min, k_max):
    def integrand(lnk):
        k = math.exp(lnk)
        x = k * R
        w = 3 * (math.sin(x) - x * math.cos(x)) / x**3 if x > 1e-3 else 1 - x * x / 10
        return k**3 * power(np.array([k]))[0] / (2 * math.pi**2) * w * w

    # split at many points so quad resolves each oscillation of W^2 and the wiggles
    edges = np.linspace(math.log(k_min), math.log(k_max), 400)
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:]):
        val, _ = integrate.quad(integrand, a, b, epsabs=0, epsrel=1e-12, limit=200)
        total += val
    return math.sqrt(total)


def test_primordial_spectrum_amplitude_tilt_and_running():
    A_s, n_s, k_p = 2.1e-9, 0.9649, 0.05
    assert float(spectra.primordial_curvature_power(k_p, A_s, n_s, k_p)) == pytest.approx(A_s, rel=1e-14)
    slope = jax.grad(lambda lnk: jnp.log(spectra.primordial_curvature_power(jnp.exp(lnk), A_s, n_s, k_p)))
    assert float(slope(math.log(k_p))) == pytest.approx(n_s - 1, abs=1e-12)
    curvature = jax.grad(jax.grad(lambda lnk: jnp.log(
        spectra.primordial_curvature_power(jnp.exp(lnk), A_s, n_s, k_p, alpha_s=-0.01))))
    assert float(curvature(math.log(0.3))) == pytest.approx(-0.01, abs=1e-12)


def test_tophat_window_series_matches_closed_form_and_is_smooth_at_zero():
    x = np.array([0.0, 1e-8, 0.05, 0.0999, 0.1, 0.1001, 1.0, 10.0])
    closed = np.where(x > 0, 3 * (np.sin(x) - x * np.cos(x)) / np.where(x > 0, x, 1) ** 3, 1.0)
    w = np.asarray(spectra.tophat_window(x))
    assert w[0] == 1.0
    # closed form loses ~eps/x^2 relative accuracy at small x, so compare where it is reliable
    np.testing.assert_allclose(w[2:], closed[2:], rtol=1e-13)
    # accurate on both sides of the series/closed-form switch (long-double reference)
    for x_check in (0.1, 0.2999, 0.3, 0.3001, 0.5, 1.0):
        xl = np.longdouble(x_check)
        exact = 3 * (np.sin(xl) - xl * np.cos(xl)) / xl**3
        assert abs(float(spectra.tophat_window(x_check)) / float(exact) - 1) < 5e-15
    dw = jax.grad(spectra.tophat_window)
    assert float(dw(0.0)) == 0.0
    assert float(dw(0.05)) == pytest.approx(-0.05 / 5 + 4 * 0.05**3 / 280 - 6 * 0.05**5 / 15120, rel=1e-12)


def test_power_from_class_transfer_matches_class_pk(reference_params):
    """P_m from CLASS's own d_m (tk file) must reproduce CLASS's P_m (pk file)."""
    common = reference_params["class_input"]["common"]
    k_tk, cols = read_pk_csv(DATA / "class_lcdm_tk.csv")
    k_pk, pk_cols = read_pk_csv(DATA / "class_lcdm_pk.csv")
    pk = np.asarray(spectra.power_from_transfer(k_tk, cols["d_m"], common["A_s"], common["n_s"], common["k_pivot"]))
    sel = (k_tk > k_pk[0]) & (k_tk < k_pk[-1])
    ref = np.exp(np.interp(np.log(k_tk[sel]), np.log(k_pk), np.log(pk_cols["P_m_z0_Mpc3"])))
    assert np.max(np.abs(pk[sel] / ref - 1)) < 2e-3  # linear interpolation of the reference in ln-ln


def test_cb_transfer_is_density_weighted():
    d = spectra.cb_transfer(jnp.array([1.0, 2.0]), jnp.array([3.0, 2.0]), omega_cdm=0.12, omega_b=0.02)
    np.testing.assert_allclose(np.asarray(d), [(0.12 + 0.06) / 0.14, 2.0], rtol=1e-15)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # quad's roundoff notice at 1e-12
@pytest.mark.parametrize("points_per_decade", [30, 80])
def test_sigma_R_converged_against_quad(points_per_decade):
    k = np.logspace(-5, math.log10(30.0), int(points_per_decade * (math.log10(30) + 5)))
    R = 8 / 0.6736
    smooth = points_per_decade < 50  # wiggles need a BAO-resolving grid, as in CLASS
    power = lambda kk: _bbks_power(kk, wiggles=not smooth)  # noqa: E731
    ours = float(spectra.sigma_R(k, power(k), R, check_coverage=False))
    ref = _sigma_quad(power, R, k[0], k[-1])
    assert ours == pytest.approx(ref, rel=1e-5)


def test_sigma8_of_class_pk_matches_class_sigma8(reference_params):
    h = reference_params["class_input"]["common"]["h"]
    derived = reference_params["derived"]["class_massive"]
    k, cols = read_pk_csv(DATA / "class_lcdm_pk.csv")
    assert float(spectra.sigma8(k, cols["P_m_z0_Mpc3"], h)) == pytest.approx(derived["sigma8"], rel=2e-5)
    assert float(spectra.sigma8(k, cols["P_cb_z0_Mpc3"], h)) == pytest.approx(derived["sigma8_cb"], rel=2e-5)


def test_sigma8_errors_when_k_range_too_narrow_and_names_the_range(reference_params):
    h = reference_params["class_input"]["common"]["h"]
    k, cols = read_pk_csv(DATA / "class_lcdm_pk.csv")
    pk = cols["P_m_z0_Mpc3"]
    high_cut = k < 0.8
    with pytest.raises(spectra.KRangeError, match=r"needs k from <= .* to >= .* 1/Mpc") as err:
        spectra.sigma8(k[high_cut], pk[high_cut], h)
    needed_max = float(str(err.value).split(">= ")[1].split(" ")[0])
    assert 0.8 < needed_max < 6.7
    # the named k_max is sufficient: cutting there passes and is accurate to the tolerance
    enough = k <= needed_max * 1.05
    full = float(spectra.sigma8(k, pk, h))
    assert float(spectra.sigma8(k[enough], pk[enough], h)) == pytest.approx(full, rel=1e-4)
    low_cut = k > 0.01
    with pytest.raises(spectra.KRangeError, match="low-k"):
        spectra.sigma8(k[low_cut], pk[low_cut], h)


def test_sigma8_gradients(reference_params):
    common = reference_params["class_input"]["common"]
    k_tk, cols = read_pk_csv(DATA / "class_lcdm_tk.csv")
    sel = k_tk > 1e-5
    k, d_m = k_tk[sel], cols["d_m"][sel]

    def s8(A_s, h):
        pk = spectra.power_from_transfer(k, d_m, A_s, common["n_s"], common["k_pivot"])
        return spectra.sigma8(k, pk, h, check_coverage=False)

    A_s, h = common["A_s"], common["h"]
    s, (dA, dh) = jax.value_and_grad(s8, argnums=(0, 1))(A_s, h)
    assert float(dA) == pytest.approx(float(s) / (2 * A_s), rel=1e-10)
    eps = 1e-5
    fd = (float(s8(A_s, h + eps)) - float(s8(A_s, h - eps))) / (2 * eps)
    assert float(dh) == pytest.approx(fd, rel=1e-6)


def test_sigma_R_rejects_bad_input():
    k = np.logspace(-4, 1, 50)
    with pytest.raises(ValueError, match="strictly increasing"):
        spectra.sigma_R(k[::-1], np.ones(50), 8.0)
    with pytest.raises(ValueError, match="shape"):
        spectra.sigma_R(k, np.ones(49), 8.0)
    pk = _bbks_power(k)
    pk[10] = np.nan
    with pytest.raises(ValueError, match="finite and positive"):
        spectra.sigma_R(k, pk, 8.0)
