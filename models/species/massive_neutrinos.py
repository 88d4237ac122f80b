"""Massive relics (non-cold dark matter): one Boltzmann hierarchy per momentum node (MB95 eq. 57).

Each species s carries Psi_l(q_i) on the nodes of its :class:`NcdmQuadrature`.  Its density,
pressure, delta rho, (rho + p) theta and (rho + p) sigma are the quadrature sums of MB95 eq. 55,
computed inline from the nodes, so the model needs no ncdm table.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen import lit
from .base import Derivatives, Layout, Observables, Sources, Species
from .hierarchy import stream


@dataclass(frozen=True)
class NcdmQuadrature:
    """Momentum quadrature of one non-cold relic, in units of its temperature today.

    ``weights`` integrate against q^2 f0(q):  int q^2 f0(q) g(q) dq ~= sum_i w_i g(q_i);
    any overall constant is absorbed by the parameter ``ncdm_norm_s``.  ``dlnf0_dlnq`` is
    d ln f0 / d ln q at the nodes (Fermi-Dirac: -q / (1 + exp(-q))).
    """

    q: tuple
    weights: tuple
    dlnf0_dlnq: tuple

    def __post_init__(self):
        n = len(self.q)
        if n == 0 or len(self.weights) != n or len(self.dlnf0_dlnq) != n:
            raise ValueError("NcdmQuadrature: q, weights, dlnf0_dlnq must be non-empty and of "
                             f"equal length, got {len(self.q)}, {len(self.weights)}, "
                             f"{len(self.dlnf0_dlnq)}")
        if any(float(q) <= 0.0 for q in self.q):
            raise ValueError("NcdmQuadrature: momentum nodes q must be > 0")


def background_sums(e, L: Layout, s: int, quad: NcdmQuadrature) -> None:
    """Emit species s's background from its quadrature: eps{s}_i = sqrt(q_i^2 + (a m/T)^2) and
    its inverse per node, A_ncdm{s} = a^2 rho~ and Pa_ncdm{s} = a^2 p~ (MB95 eq. 55 without the
    perturbation), nrm{s} = ncdm_norm_s / a^2."""
    e(f"mT{s}", f"a * {L.p(f'ncdm_m_over_T_{s}')}")
    e(f"mT2_{s}", f"mT{s} * mT{s}")
    e(f"nrm{s}", f"{L.p(f'ncdm_norm_{s}')} * ia2")
    rho, prs = [], []
    for i, (q, w) in enumerate(zip(quad.q, quad.weights)):
        e(f"eps{s}_{i}", f"M.sqrt({lit(q * q)} + mT2_{s})")
        e(f"ieps{s}_{i}", f"1.0 / eps{s}_{i}")
        rho.append(f"{lit(w)} * eps{s}_{i}")
        prs.append(f"{lit(w * q * q / 3.0)} * ieps{s}_{i}")
    e(f"A_ncdm{s}", f"nrm{s} * ({' + '.join(rho)})")
    e(f"Pa_ncdm{s}", f"nrm{s} * ({' + '.join(prs)})")


def einstein_terms(src: Sources, s: int, rho_plus_p: str) -> None:
    """Species s's terms of the Einstein equations and matter totals (the emitted dA_ncdm{s},
    rpt_ncdm{s}, shr_ncdm{s}), with ``rho_plus_p`` the background a^2 (rho~ + p~)."""
    src.drho.append(f"dA_ncdm{s}")
    src.rpt.append(f"rpt_ncdm{s}")
    src.shear.append(f"shr_ncdm{s}")
    src.matter.append((f"A_ncdm{s}", f"dA_ncdm{s}", False))
    src.rho_plus_p.append(rho_plus_p)


class MassiveNeutrinos(Species):
    """Species number ``s`` with quadrature ``quad`` and multipoles 0..l_max on every node.

    rho~_s(a) a^4 = ncdm_norm_s * sum_i w_i eps_i, eps_i = sqrt(q_i^2 + (a m/T)^2).
    """

    def __init__(self, s: int, quad: NcdmQuadrature, l_max: int):
        self.s, self.quad, self.l_max = s, quad, l_max
        self.params = (f"ncdm_norm_{s}", f"ncdm_m_over_T_{s}")
        self.states = tuple(f"Psi_{s}_q{i}_l{l}" for i in range(len(quad.q))
                            for l in range(l_max + 1))

    def moments(self, e, L: Layout, src: Sources):
        s, sp, Y = self.s, self.quad, L.y
        e.comment(f"ncdm species {s}: MB95 eq. 55 on {len(sp.q)} momentum nodes")
        background_sums(e, L, s, sp)
        drho, rpt, shr = [], [], []
        for i, (q, w) in enumerate(zip(sp.q, sp.weights)):
            drho.append(f"{lit(w)} * eps{s}_{i} * {Y(f'Psi_{s}_q{i}_l0')}")
            rpt.append(f"{lit(w * q)} * {Y(f'Psi_{s}_q{i}_l1')}")
            shr.append(f"{lit(w * q * q)} * ieps{s}_{i} * {Y(f'Psi_{s}_q{i}_l2')}")
        e(f"dA_ncdm{s}", f"nrm{s} * ({' + '.join(drho)})")
        e(f"rpt_ncdm{s}", f"nrm{s} * k * ({' + '.join(rpt)})")
        e(f"shr_ncdm{s}", f"nrm{s} * 0.6666666666666666 * ({' + '.join(shr)})")
        einstein_terms(src, s, f"A_ncdm{s} + Pa_ncdm{s}")

    def equations(self, e, L: Layout, d: Derivatives):
        s, Y = self.s, L.y
        for i, (q, dlnf) in enumerate(zip(self.quad.q, self.quad.dlnf0_dlnq)):
            pre = f"Psi_{s}_q{i}_l"
            rate = f"qk{s}_{i}"
            e(rate, f"{lit(q)} * k * ieps{s}_{i}")
            d.set(f"{pre}0", f"-{rate} * {Y(pre + '1')} + {lit(dlnf / 6.0)} * h_prime")
            for l in range(1, self.l_max + 1):
                metric = (f" - {lit(dlnf)} * (0.06666666666666667 * h_prime + 0.4 * eta_prime)"
                          if l == 2 else "")
                d.set(f"{pre}{l}", stream(L, pre, l, self.l_max, rate) + metric)

    def observables(self, L: Layout, obs: Observables):
        s = self.s
        obs.add("optional", f"d_ncdm[{s}]", f"dA_ncdm{s} / A_ncdm{s}")
        obs.add("optional", f"t_ncdm[{s}]", f"rpt_ncdm{s} / (A_ncdm{s} + Pa_ncdm{s})")
        obs.add("optional", f"s_ncdm[{s}]", f"shr_ncdm{s} / (A_ncdm{s} + Pa_ncdm{s})")
