"""Classic stiff test problems in the solver's RHS form (tuple-returning, literal indices), for the
solver's tests and benchmarks (scripts/bench_solver.py, scripts/bench_gpu.py).

Each problem is a ``StiffProblem``: the RHS ``rhs(y, t, p)``, a default initial state, default
parameters and a time span. They exercise the solver on the behaviours the Boltzmann hierarchy
has: huge stiffness ratios (Robertson), relaxation oscillations (van der Pol), a mildly nonlinear
chemical network (HIRES) and a sparse banded system (a van der Pol lattice).

References: Robertson (1966); Hairer & Wanner, *Solving ODEs II* (2nd ed.), §IV.10 (VDPOL,
HIRES); Mazzia & Magherini, *Test Set for IVP Solvers* (HIRES data).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from solver.linalg.codegen import compile_functions


@dataclass(frozen=True)
class StiffProblem:
    name: str
    rhs: Callable
    y0: np.ndarray
    params: np.ndarray
    t_span: tuple[float, float]
    source: str = ""

    @property
    def n(self) -> int:
        return len(self.y0)


def robertson_rhs(y, t, p):
    """Robertson's autocatalytic reaction; p = (k1, k2, k3) = (0.04, 3e7, 1e4) classically."""
    r1 = p[0] * y[0]
    r2 = p[1] * y[1] * y[1]
    r3 = p[2] * y[1] * y[2]
    return (-r1 + r3, r1 - r2 - r3, r2)


ROBERTSON = StiffProblem("robertson", robertson_rhs, np.array([1.0, 0.0, 0.0]),
                         np.array([0.04, 3e7, 1e4]), (0.0, 1e5))


def robertson_ensemble(N: int, n_save: int, spread: float = 0.2, seed: int = 0):
    """(y0 (N, 3), t_save (n_save + 1,), params (N, 3)): Robertson with rates spread by
    ±spread/2 around the standard ones, saved at 0 and n_save log-spaced times to 1e5 (the
    child processes of the kernel-cache tests)."""
    rng = np.random.default_rng(seed)
    params = ROBERTSON.params[None, :] * (1.0 + spread * (rng.random((N, 3)) - 0.5))
    ts = np.concatenate([[0.0], np.logspace(-4, 5, n_save)])
    return np.tile(ROBERTSON.y0, (N, 1)), ts, params


def van_der_pol_rhs(y, t, p):
    """van der Pol oscillator y'' = mu (1 - y^2) y' - y; p = (mu,). Stiff for mu >> 1.

    Relaxation oscillations of period ≈ (3 − 2 ln 2) mu; the fast jumps take O(1/mu).
    """
    return (y[1], p[0] * (1.0 - y[0] * y[0]) * y[1] - y[0])


VAN_DER_POL = StiffProblem("van_der_pol", van_der_pol_rhs, np.array([2.0, 0.0]),
                           np.array([1e3]), (0.0, 3000.0))


def hires_rhs(y, t, p):
    """HIRES (plant physiology, 8 species); p = (k,) with k = 280 the fast rate constant."""
    k = p[0]
    r = k * y[5] * y[7]
    return (
        -1.71 * y[0] + 0.43 * y[1] + 8.32 * y[2] + 0.0007,
        1.71 * y[0] - 8.75 * y[1],
        -10.03 * y[2] + 0.43 * y[3] + 0.035 * y[4],
        8.32 * y[1] + 1.71 * y[2] - 1.12 * y[3],
        -1.745 * y[4] + 0.43 * y[5] + 0.43 * y[6],
        -r + 0.69 * y[3] + 1.71 * y[4] - 0.43 * y[5] + 0.69 * y[6],
        r - 1.81 * y[6],
        -r + 1.81 * y[6],
    )


HIRES = StiffProblem("hires", hires_rhs,
                     np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057]),
                     np.array([280.0]), (0.0, 321.8122))


def van_der_pol_lattice(n_osc: int = 32) -> StiffProblem:
    """A chain of van der Pol oscillators with nearest-neighbour diffusive coupling.

    State (x_0, v_0, x_1, v_1, ...), 2·n_osc variables; p = (mu, D). Oscillator i has stiffness
    mu·(1 + i/n_osc) so the chain never synchronises. v_i' = mu_i (1 − x_i²) v_i − x_i
    + D (x_{i−1} − 2 x_i + x_{i+1}) with free ends. The RHS is generated straight-line source
    with literal indices, the same form as the Boltzmann hierarchy.
    """
    lines = ["def vdp_lattice_rhs(y, t, p):", "    mu = p[0]", "    D = p[1]"]
    outs = []
    for i in range(n_osc):
        x, v = 2 * i, 2 * i + 1
        scale = 1.0 + i / n_osc
        coup = []
        if i > 0:
            coup.append(f"(y[{x - 2}] - y[{x}])")
        if i < n_osc - 1:
            coup.append(f"(y[{x + 2}] - y[{x}])")
        lines.append(f"    dx{i} = y[{v}]")
        lines.append(f"    dv{i} = mu * {scale!r} * (1.0 - y[{x}] * y[{x}]) * y[{v}] - y[{x}]"
                     f" + D * ({' + '.join(coup) if coup else '0.0'})")
        outs += [f"dx{i}", f"dv{i}"]
    lines.append("    return (" + ", ".join(outs) + ",)")
    source = "\n".join(lines) + "\n"
    rhs = compile_functions(source, ["vdp_lattice_rhs"],
                            f"vdp_lattice n_osc={n_osc}")["vdp_lattice_rhs"]
    y0 = np.zeros(2 * n_osc)
    y0[0::2] = 2.0 * np.cos(np.linspace(0.0, np.pi, n_osc))
    return StiffProblem(f"vdp_lattice_{n_osc}", rhs, y0, np.array([10.0, 1.0]), (0.0, 20.0),
                        source)
