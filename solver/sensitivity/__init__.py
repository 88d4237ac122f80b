"""Forward sensitivities: ``solve_diff`` (the solve as a differentiable JAX function),
``joint_solve`` (states and sensitivities for explicit directions, eagerly) and
``grad_by_forward_mode``. Built on the backends' interface only (``backends.base``)."""
from .differentiable import grad_by_forward_mode, joint_solve, solve_diff
from .spec import CudaSensitivityUnavailable

__all__ = ["solve_diff", "joint_solve", "grad_by_forward_mode", "CudaSensitivityUnavailable"]
