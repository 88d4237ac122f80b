"""Embedded stiff ensemble solver: Rodas5P with compiled sparse linear algebra.

Layers, each importing only the ones before it: ``caches``; ``problem`` (inputs and their
validation, statuses, ``Solution``); ``method`` (tableau, Rosenbrock step, controller);
``linalg`` (sparsity, colouring, Jacobian plan, sparse LU, linear solver); ``backends`` (one
interface; ``jax/`` and ``cuda/``); ``sensitivity`` (forward sensitivities through that
interface); ``api`` (``solve``). ``cost`` estimates the work of a step. This package knows nothing
about cosmology, and it computes in float64: enable ``jax_enable_x64`` before using it.
``persisted`` keeps the large jitted programs' traced form on disk (``jax.export``) when a store
is set (``set_program_store``), so later processes skip tracing them. See docs/solver.md.
"""
from .api import solve
from .backends.availability import cuda_available, pick_backend
from .backends.base import Backend
from .backends.cuda import CudaBackend, CudaBackendUnavailable
from .backends.jax import JaxBackend
from .caches import Cache, clear_caches
from .method.controller import PIDController
from .persisted import set_program_store
from .method.tableau import RODAS5P, RosenbrockTableau
from .problem.sensitivity_spec import sec_weight
from .problem.solution import Solution
from .problem.status import Status, describe
from .sensitivity import grad_by_forward_mode, joint_solve, solve_diff, solve_with_tangents

__all__ = ["solve", "solve_diff", "joint_solve", "solve_with_tangents", "grad_by_forward_mode",
           "sec_weight",
           "Solution", "Status", "describe", "PIDController", "RODAS5P", "RosenbrockTableau", "Backend", "JaxBackend",
           "CudaBackend", "CudaBackendUnavailable", "cuda_available", "pick_backend", "Cache",
           "clear_caches", "set_program_store"]
