"""Sampling of the CMB computation: multipoles, wavenumbers and conformal times.

Three grids, chosen once per run on the host (numerical choices, held fixed under derivatives):

* ``multipoles(l_max)`` — the ℓ at which transfer functions are computed: every ℓ up to
  ``l_all``, then steps growing by ``l_logstep`` up to ``l_linstep``; C_ℓ at the other ℓ come
  from a cubic spline of ℓ(ℓ+1)C_ℓ (boltzmann.cmb.spectra).
* ``source_wavenumbers`` — the modes the perturbation solver integrates: log-spaced at small k
  (super-horizon modes, smooth in ln k), then linear with a step that is a fraction of the
  acoustic period in k, 2π/r_s, up to ``k_max_tau0_over_l_max · l_max / τ0``.
* ``transfer_wavenumbers`` — the finer k grid of the line-of-sight integrals and the C_ℓ
  integral: Δ_ℓ(k) oscillates in k with period ≈ 2π/τ0, so the step is a fraction ``q_step`` of
  that; log-spaced below the point where the log step would exceed it.  Sources are carried
  from the source grid to this grid by a quintic spline in ln k (a fixed linear operator:
  ``spline_matrix`` as one matrix, ``k_spline.BandedSpline`` as the line of sight applies it).
* ``transfer_window`` — which of those wavenumbers each multipole integrates: from the Bessel
  turning point (j_ℓ(kχ) vanishes below it at every distance χ of the sources) to
  ℓ/χ_rec + ``k_window_extra`` (above it the sources' projection onto j_ℓ is damped: the part of
  each C_ℓ's k integral beyond is measured in docs/cmb.md, Sampling), and the stride of the
  coarser k grid of the lensing potential's Δ^φ_ℓ(k), which is smooth in k.
* ``source_times`` — conformal times of the sources: a fine uniform step through recombination
  (where the visibility lives and the sources oscillate fastest), then a step growing
  geometrically up to a maximum step for the late ISW and reionisation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.interpolate import make_interp_spline

from .bessel import turning_point

__all__ = ["ClSampling", "TransferWindow", "multipoles", "source_wavenumbers",
           "transfer_wavenumbers", "transfer_window", "lensing_wavenumbers",
           "source_times", "spline_matrix", "trapezoid_weights"]


@dataclass(frozen=True)
class ClSampling:
    """Sampling knobs of the CMB stage (defaults: the accuracy measured in docs/cmb.md).

    l_all: every ℓ up to this one is computed; l_logstep, l_linstep: then ℓ grows by this factor
    per sample, with at most this step.
    k_min_tau0: smallest k times τ0; largest k: the larger of k_max_tau0_over_l_max · ℓ_max/τ0
    and ℓ_max/τ0 + k_max_extra [1/Mpc] (Δ_ℓ(k) reaches well past k = ℓ/τ0: with 2 ℓ_max/τ0
    alone, ℓ_max = 300 left TT 11 % low at ℓ = 300);
    k_log_per_decade: source modes per decade below the linear part; k_step_super: the linear
    step of the source modes below k_super_end [1/Mpc], in units of 2π/τ0; k_step_growth: then
    the step's growth per mode up to k_step_acoustic, the linear source step in units of 2π/r_s
    (r_s: sound horizon at recombination ≈ 145 Mpc);
    k_photon_control: modes below this k [1/Mpc] keep the photon multipoles ℓ ≤ 2 in the
    solver's error control to the end (they carry the reionisation sources); above it they do
    not, and after ``z_streaming`` their photon sources take the free-streaming values
    (boltzmann.cmb.sources).
    k_lensing_max, k_lensing_per_decade: with the lensing potential, extra modes beyond the CMB
    grid up to this k [1/Mpc], for Limber's k = (ℓ + ½)/χ at small distances χ.
    q_step: step of the transfer k grid in units of 2π/τ0; q_log_per_decade: its log part.
    k_window_extra: Δ^T_ℓ, Δ^E_ℓ are integrated up to k = ℓ/χ_rec + this [1/Mpc] (None: the whole
    grid); phi_k_stride: Δ^φ_ℓ on every this-th transfer wavenumber.
    tau_step_rec: conformal-time step [Mpc] through recombination, up to tau_fine_end · τ_rec;
    tau_growth: growth factor of the step after that; tau_step_max: the largest step [Mpc].
    visibility_start: sources start where the visibility g is this fraction of its maximum.
    rtol: relative tolerance of the perturbation solve of the CMB modes.
    k_spline_degree: degree of the spline in ln k carrying the sources from the source modes to
    the transfer grid (``spline_matrix``); l_spline_degree: of the spline of ℓ(ℓ+1)C_ℓ from the
    sampled multipoles to every ℓ (``spectra.ell_spline_matrix``). Odd; docs/cmb.md, Sampling,
    says why 5.
    """

    l_all: int = 30
    l_logstep: float = 1.08
    l_linstep: int = 20
    k_min_tau0: float = 0.1
    k_max_tau0_over_l_max: float = 2.0
    k_max_extra: float = 0.15
    k_log_per_decade: float = 12.0
    k_step_acoustic: float = 0.12
    k_step_super: float = 0.25
    k_super_end: float = 0.008
    k_step_growth: float = 1.05
    k_photon_control: float = 0.02
    z_streaming: float = 200.0
    k_lensing_max: float = 5.0
    k_lensing_per_decade: float = 12.0
    q_step: float = 0.125
    q_log_per_decade: float = 320.0
    k_window_extra: float | None = 0.25
    phi_k_stride: int = 3
    tau_step_rec: float = 1.5
    tau_fine_end: float = 2.5
    tau_growth: float = 1.02
    tau_step_max: float = 20.0
    visibility_start: float = 1e-5
    rtol: float = 1e-6
    k_spline_degree: int = 5
    l_spline_degree: int = 5

    def coarser(self, factor: float) -> "ClSampling":
        """The same sampling with every step ``factor`` times larger (tests, quick looks)."""
        return replace(
            self, l_logstep=1.0 + (self.l_logstep - 1.0) * factor,
            l_linstep=int(round(self.l_linstep * factor)),
            k_log_per_decade=self.k_log_per_decade / factor,
            k_step_acoustic=self.k_step_acoustic * factor,
            k_step_super=self.k_step_super * factor,
            k_step_growth=1.0 + (self.k_step_growth - 1.0) * factor,
            k_lensing_per_decade=self.k_lensing_per_decade / factor,
            q_step=self.q_step * factor, q_log_per_decade=self.q_log_per_decade / factor,
            tau_step_rec=self.tau_step_rec * factor,
            tau_growth=1.0 + (self.tau_growth - 1.0) * factor,
            tau_step_max=self.tau_step_max * factor)

    def refined(self, k: float = 1.0, tau: float = 1.0, ell: float = 1.0) -> "ClSampling":
        """This sampling with ``k`` times as many wavenumbers (source modes, transfer grid and
        the lensing modes), ``tau`` times as many source times and ``ell`` times as many sampled
        multipoles (every step divided by the factor, every per-decade density multiplied).

        The convergence test (tests/test_cmb_convergence.py, docs/cmb.md) compares the default
        with ``refined(2, 2, 2)`` and with each factor alone: what the spectra change by then is
        the sampling error left in the defaults. The ranges (k_min, k_max, the fine-τ window, the
        ℓ below which every ℓ is computed) stay: refining a step must not move an end point.
        """
        if min(k, tau, ell) <= 0:
            raise ValueError(f"refined: factors must be positive, got k={k}, tau={tau}, ell={ell}")
        return replace(
            self,
            k_log_per_decade=self.k_log_per_decade * k, k_step_acoustic=self.k_step_acoustic / k,
            k_step_super=self.k_step_super / k, k_step_growth=1.0 + (self.k_step_growth - 1.0) / k,
            k_lensing_per_decade=self.k_lensing_per_decade * k, q_step=self.q_step / k,
            q_log_per_decade=self.q_log_per_decade * k,
            tau_step_rec=self.tau_step_rec / tau, tau_growth=1.0 + (self.tau_growth - 1.0) / tau,
            tau_step_max=self.tau_step_max / tau,
            l_logstep=1.0 + (self.l_logstep - 1.0) / ell,
            l_linstep=max(1, int(round(self.l_linstep / ell))))


def multipoles(l_max: int, s: ClSampling = ClSampling(), breaks=()) -> np.ndarray:
    """Sampled ℓ: 2..l_all, then ℓ_{i+1} = ℓ_i + min(l_linstep, (l_logstep - 1) ℓ_i), and l_max;
    with each ℓ of ``breaks`` and the one after it (where the computation changes method: the
    spline to every ℓ is taken on each side apart, ``spectra.ell_spline_matrix``)."""
    ells = list(range(2, min(s.l_all, l_max) + 1))
    while ells[-1] < l_max:
        step = max(1, min(s.l_linstep, int((s.l_logstep - 1.0) * ells[-1])))
        ells.append(min(ells[-1] + step, l_max))
    ells += [b + i for b in breaks for i in (0, 1) if 2 <= b + i <= l_max]
    return np.unique(np.asarray(ells, dtype=np.int64))


def _log_then_linear(k_min, k_max, per_decade, step):
    """Log-spaced from k_min (per_decade) until the log step exceeds ``step``, then linear."""
    dlnk = math.log(10.0) / per_decade
    k_switch = step / dlnk
    if k_switch <= k_min:
        return np.arange(k_min, k_max + 0.5 * step, step)
    n_log = int(math.ceil(math.log(min(k_switch, k_max) / k_min) / dlnk))
    logs = k_min * np.exp(dlnk * np.arange(n_log))
    lin = np.arange(logs[-1] + step, k_max + 0.5 * step, step) if k_switch < k_max else []
    out = np.concatenate([logs, lin])
    return out[out <= k_max * (1 + 1e-12)] if out[-1] > k_max * (1 + 1e-12) else out


def source_wavenumbers(l_max: int, tau0: float, r_s: float,
                       s: ClSampling = ClSampling()) -> np.ndarray:
    """k [1/Mpc] of the perturbation modes whose sources are computed.

    Log-spaced from k_min until the step reaches ``k_step_super``·2π/τ0, linear with that step to
    ``k_super_end`` (the reionisation sources oscillate in k with period ≈ 2π/τ_reio ≈ 2π/τ0 — a
    coarser grid cannot carry them to the transfer grid), then the step grows by
    ``k_step_growth`` per mode up to the acoustic step, linear from there to k_max."""
    k_min = s.k_min_tau0 / tau0
    k_max = max(s.k_max_tau0_over_l_max * l_max / tau0, l_max / tau0 + s.k_max_extra)
    dlnk = math.log(10.0) / s.k_log_per_decade
    fine = s.k_step_super * 2.0 * math.pi / tau0
    coarse = s.k_step_acoustic * 2.0 * math.pi / r_s
    ks, step = [k_min], 0.0
    while ks[-1] < k_max:
        k = ks[-1]
        if k * dlnk < fine:
            step = k * dlnk
        elif k < s.k_super_end:
            step = fine
        else:
            step = min(coarse, max(step, fine) * s.k_step_growth)
        ks.append(k + step)
    ks[-1] = min(ks[-1], k_max)
    if ks[-1] - ks[-2] < 0.2 * step:
        ks.pop(-2)
    return np.asarray(ks)


def lensing_wavenumbers(k_cmb_max: float, s: ClSampling = ClSampling()) -> np.ndarray:
    """Extra modes [1/Mpc] for the lensing potential's Limber integral, above the CMB grid."""
    if s.k_lensing_max <= k_cmb_max:
        return np.zeros(0)
    n = max(2, int(math.ceil(math.log10(s.k_lensing_max / k_cmb_max) * s.k_lensing_per_decade)))
    return np.geomspace(k_cmb_max, s.k_lensing_max, n + 1)[1:]


def transfer_wavenumbers(k_source: np.ndarray, tau0: float,
                         s: ClSampling = ClSampling()) -> np.ndarray:
    """k [1/Mpc] of the line-of-sight integrals, inside the source grid's range."""
    k = _log_then_linear(k_source[0], k_source[-1], s.q_log_per_decade,
                         s.q_step * 2.0 * math.pi / tau0)
    return np.clip(k, k_source[0], k_source[-1])


@dataclass(frozen=True)
class TransferWindow:
    """Per sampled ℓ, the transfer-grid indices [lo, hi) over which Δ^T_ℓ, Δ^E_ℓ are integrated
    (zero outside), and ``phi_stride``: Δ^φ_ℓ is computed on k[::phi_stride] (and the last k)."""

    lo: np.ndarray
    hi: np.ndarray
    phi_stride: int = 1

    @classmethod
    def whole(cls, n_ells: int, n_k: int) -> "TransferWindow":
        """Every wavenumber for every multipole."""
        return cls(lo=np.zeros(n_ells, np.int64), hi=np.full(n_ells, n_k, np.int64))

    def phi_indices(self, n_k: int) -> np.ndarray:
        """Indices of the Δ^φ grid in the transfer grid of ``n_k`` wavenumbers."""
        return np.unique(np.r_[np.arange(0, n_k, self.phi_stride), n_k - 1])


def transfer_window(ells, k: np.ndarray, tau, tau0: float, tau_rec: float,
                    s: ClSampling = ClSampling()) -> TransferWindow:
    """The window of each multipole (module docstring) for sources at the conformal times
    ``tau`` [Mpc] (ascending), today ``tau0`` and the last scattering at ``tau_rec``; host values
    of the fiducial cosmology (a window is held fixed under derivatives, like the grids)."""
    ells = np.asarray(ells, np.float64)
    chi_max, chi_rec = tau0 - float(np.asarray(tau)[0]), tau0 - tau_rec
    # 2 % below the turning point at the largest distance: the Bessel table holds zeros there
    lo = np.searchsorted(k, 0.98 * turning_point(ells) / chi_max, side="right") - 1
    if s.k_window_extra is None:
        hi = np.full(ells.shape, k.size)
    else:
        hi = np.searchsorted(k, ells / chi_rec + s.k_window_extra, side="right")
    lo = np.clip(lo, 0, k.size - 1).astype(np.int64)
    hi = np.clip(hi, lo + 1, k.size).astype(np.int64)
    return TransferWindow(lo=lo, hi=hi, phi_stride=max(1, int(s.phi_k_stride)))


def spline_matrix(k_from: np.ndarray, k_to: np.ndarray,
                  degree: int = ClSampling.k_spline_degree) -> np.ndarray:
    """(len(k_to), len(k_from)) matrix of the interpolating spline of ``degree`` in ln k.

    Why degree 5: at the acoustic step (12.5 modes per period 2π/r_s) a cubic spline's error in
    the sources, ∝ (k step)^4, moved TT, EE and TE by 2–4e-4 at every ℓ ≥ 500 — as much as halving
    the step did; the quintic's, ∝ (k step)^6, leaves 2e-6 there, for the same modes and the same
    matrix product (docs/cmb.md, Convergence)."""
    eye = np.eye(k_from.size)
    return make_interp_spline(np.log(k_from), eye, k=int(degree), axis=0)(np.log(k_to))


def source_times(tau_of_x, x_nodes, tau_rec: float, tau_start: float,
                 s: ClSampling = ClSampling()) -> tuple[np.ndarray, np.ndarray]:
    """(τ [Mpc], x = ln a) of the source samples, from ``tau_start`` to today (x = 0).

    ``tau_of_x``: conformal time at the nodes ``x_nodes`` (increasing); τ0 = τ(x = 0).
    """
    tau0 = float(np.interp(0.0, x_nodes, tau_of_x))
    fine_end = s.tau_fine_end * tau_rec
    taus = list(np.arange(tau_start, fine_end, s.tau_step_rec))
    step = s.tau_step_rec
    while taus[-1] + step < tau0:
        taus.append(taus[-1] + step)
        step = min(step * s.tau_growth, s.tau_step_max)
    taus = np.asarray(taus)
    taus = taus[taus < tau0 - 0.5 * s.tau_step_rec]
    x = np.interp(np.log(taus), np.log(tau_of_x), x_nodes)
    return np.append(taus, tau0), np.append(x, 0.0)


def trapezoid_weights(t: np.ndarray) -> np.ndarray:
    """Weights of the trapezoid rule on the nodes t (any spacing)."""
    w = np.zeros_like(t, dtype=np.float64)
    dt = np.diff(t)
    w[:-1] += 0.5 * dt
    w[1:] += 0.5 * dt
    return w
