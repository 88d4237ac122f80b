"""Linear algebra of a Rosenbrock step, derived once per RHS: the Jacobian's sparsity (traced from
the RHS), its column colouring, the compressed Jacobian plan, the compiled sparse LU and the
linear solver on its slot layout, and the generated-source helpers they compile through.
Backend-independent: the JAX backend calls these functions, the CUDA kernel generator compiles
their generated text (docs/solver_linear_algebra.md)."""
from .jacobian import JacobianPlan, build_jacobian_plan
from .linear import LinearSolver, build_block_triangular_solver, build_linear_solver
from .sparsity import detect_sparsity, solver_pattern, validate_pattern

__all__ = ["JacobianPlan", "build_jacobian_plan", "LinearSolver", "build_linear_solver",
           "build_block_triangular_solver", "detect_sparsity", "solver_pattern",
           "validate_pattern"]
