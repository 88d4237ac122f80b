"""Forward sensitivities: ``solve_diff`` (the solve as a differentiable JAX function),
``joint_solve`` (states and sensitivities for explicit directions, eagerly),
``solve_with_tangents`` (the same, traceable: values from the joint solve) and
``grad_by_forward_mode``. Built on the backends' interface only (``backends.base``)."""
from .differentiable import grad_by_forward_mode, joint_solve, solve_diff, solve_with_tangents
from .spec import CudaSensitivityUnavailable

__all__ = ["solve_diff", "joint_solve", "solve_with_tangents", "grad_by_forward_mode",
           "CudaSensitivityUnavailable"]
