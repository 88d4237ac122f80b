"""Pieces shared by the multipole hierarchies (photons, massless and massive neutrinos)."""
from __future__ import annotations

from ..codegen import lit
from .base import Layout

#: metric source of the l = 2 moment of photons and massless neutrinos, F_2' ∋ 4h'/15 + 8eta'/5
METRIC_QUADRUPOLE = "0.26666666666666666 * h_prime + 1.6 * eta_prime"


def stream(L: Layout, prefix: str, l: int, lmax: int, rate: str = "k") -> str:
    """Free streaming rate/(2l+1) [l F_{l-1} - (l+1) F_{l+1}], or at l = lmax the MB95 eq. 51
    closure rate F_{l-1} - (l+1)/tau F_l.  ``rate`` is k, or qk/eps for massive relics."""
    if l == lmax:
        return (f"{rate} * {L.y(f'{prefix}{l - 1}')}"
                f" - {lit(l + 1)} * itau * {L.y(f'{prefix}{l}')}")
    return (f"{rate} * ({lit(l / (2 * l + 1))} * {L.y(f'{prefix}{l - 1}')}"
            f" - {lit((l + 1) / (2 * l + 1))} * {L.y(f'{prefix}{l + 1}')})")


def free_streaming_comment(labels) -> str:
    """The comment that introduces the F_l species' moments, naming them."""
    return f"{' and '.join(labels)}: theta = 3k F_1/4, sigma = F_2/2"


def radiation_density(e, L: Layout, name: str) -> None:
    """A_x = a^2 rho~_x of a relativistic species x (rho ∝ a^-4), from its parameter rho_x0."""
    e(f"A_{name}", f"{L.p(f'rho_{name}0')} * ia2")


def radiation_moments(e, L: Layout, src, name: str) -> None:
    """theta_x = 3k F_1/4 of a free-streaming F_l hierarchy, and its density, momentum and
    shear terms in the Einstein sources (the metric applies the common factors)."""
    e(f"theta_{name}", f"0.75 * k * {L.y(f'F_{name}_1')}")
    src.drho.append(f"A_{name} * {L.y(f'F_{name}_0')}")
    src.rpt_radiation.append(f"A_{name} * theta_{name}")
    src.shear_radiation.append(f"A_{name} * {L.y(f'F_{name}_2')}")
    src.rho_plus_p.append(f"1.3333333333333333 * A_{name}")
