"""Embedded stiff ensemble solver: Rodas5P with compiled sparse linear algebra.

``solve`` is the entry point; see docs/solver.md. This package knows nothing about cosmology.
"""
import jax as _jax

_jax.config.update("jax_enable_x64", True)

from .api import Solution, solve  # noqa: E402
from .controller import PIDController  # noqa: E402
from .status import Status  # noqa: E402
from .tableau import RODAS5P, RosenbrockTableau  # noqa: E402

__all__ = ["solve", "Solution", "Status", "PIDController", "RODAS5P", "RosenbrockTableau"]
