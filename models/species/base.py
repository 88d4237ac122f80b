"""The contract between the EB composer (models/eb.py) and its emitters (one per species).

An emitter owns some state variables and parameters and writes, as text, the lines of the
generated right-hand side that concern it.  The composer calls every emitter phase by phase, so
that each intermediate is defined before anything that uses it:

1. ``densities``  -- background densities A_X = a^2 rho~_X (needed by the couplings);
2. ``moments``    -- the species' moments and its terms of the Einstein equations (``Sources``);
3. the metric sums the terms (h', eta'), see models/species/metric.py;
4. ``equations``  -- intermediates of the equations of motion and d/dtau of the own states
   (``Derivatives``), plus coupling terms in another species' equation;
5. ``observables``-- CLASS-named transfer quantities (``Observables``).

Expressions index ``y`` and ``p`` through a :class:`Layout` (``L.y(name)`` -> ``"y[7]"``), so an
emitter never hard-codes positions; the layout is fixed once all emitters have declared their
states and parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..codegen import Emitter


@dataclass(frozen=True)
class Layout:
    """Positions of the state variables and parameters; ``y``/``p`` give their source text."""

    states: dict
    params: dict

    def y(self, name: str) -> str:
        return f"y[{self.states[name]}]"

    def p(self, name: str) -> str:
        return f"p[{self.params[name]}]"


@dataclass
class Sources:
    """Terms of the Einstein equations and of the matter totals, in emission order.

    ``drho``: a^2 delta rho~ (h'); ``rpt``: a^2 (rho~ + p~) theta (eta'); ``shear``:
    a^2 (rho~ + p~) sigma (the anisotropic stress in the observables' alpha').  Species with
    w = 1/3 and MB95 F_l multipoles give ``rpt_radiation`` = a^2 rho~ theta and
    ``shear_radiation`` = a^2 rho~ F_2 instead, and the metric applies the common factors
    (rho + p = 4 rho / 3, sigma = F_2 / 2) once.  ``matter``: (A, a^2 delta rho~, is_cb) of each
    clustering species, for d_m (all of them) and d_cb (baryons and CDM).  ``rho_plus_p``:
    the background a^2 (rho~ + p~) of each species, which the PPF dark energy needs for the rest
    of the universe (models/species/dark_energy_ppf.py).
    """

    drho: list = field(default_factory=list)
    rpt: list = field(default_factory=list)
    rpt_radiation: list = field(default_factory=list)
    shear: list = field(default_factory=list)
    shear_radiation: list = field(default_factory=list)
    matter: list = field(default_factory=list)
    rho_plus_p: list = field(default_factory=list)


class Derivatives:
    """d/dtau of every state, as text; each state set by its owner, couplings added by others."""

    def __init__(self):
        self._exprs: dict[str, str] = {}
        self._couplings: dict[str, list[str]] = {}

    def set(self, name: str, expr: str):
        if name in self._exprs:
            raise ValueError(f"d/dtau of {name!r} set twice")
        self._exprs[name] = expr

    def couple(self, name: str, term: str):
        """Add ``+ term`` to the equation of ``name`` (a state another emitter owns)."""
        self._couplings.setdefault(name, []).append(term)

    def resolve(self, state_names) -> dict[str, str]:
        """{state: full expression}; every state must have exactly one owner's equation."""
        unmatched = set(state_names) ^ set(self._exprs)
        stray = set(self._couplings) - set(self._exprs)
        if unmatched or stray:
            raise AssertionError(f"equations do not match the states: {sorted(unmatched | stray)}")
        return {name: self._exprs[name] + "".join(f" + {t}" for t in self._couplings.get(name, ()))
                for name in state_names}


#: order of the observables' keys: the quantities every model has first, at fixed positions
#: (density contrasts, the matter totals, velocities, metric), then those of optional species
OBSERVABLE_GROUPS = ("background", "density", "total", "velocity", "metric", "optional")


class Observables:
    """Observable expressions by group (OBSERVABLE_GROUPS) and the extra lines they need."""

    def __init__(self):
        self.lines = Emitter()
        self._groups: dict[str, list] = {g: [] for g in OBSERVABLE_GROUPS}

    def add(self, group: str, key: str, expr: str):
        self._groups[group].append((key, expr))

    def items(self) -> list[tuple[str, str]]:
        out = [item for g in OBSERVABLE_GROUPS for item in self._groups[g]]
        keys = [k for k, _ in out]
        if len(set(keys)) != len(keys):
            raise AssertionError(f"observable keys repeat: {keys}")
        return out


class Species:
    """An emitter: its states, parameters and lines; each phase does nothing unless overridden.

    ``radiation``: the states a solver may leave out of error control (oscillating multipoles);
    ``free_streaming``: a label if the species' moments are MB95 F_l (theta = 3k F_1/4,
    sigma = F_2/2), named in the comment that introduces them.
    """

    states: tuple = ()
    params: tuple = ()
    radiation: tuple = ()
    free_streaming: str | None = None

    def densities(self, e: Emitter, L: Layout):
        pass

    def moments(self, e: Emitter, L: Layout, src: Sources):
        pass

    def equations(self, e: Emitter, L: Layout, d: Derivatives):
        pass

    def observables(self, L: Layout, obs: Observables):
        pass
