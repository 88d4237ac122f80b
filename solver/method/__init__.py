"""The integration method: the Rosenbrock tableau (data), one step for any tableau, and the
step-size controller. Backend-independent: the JAX backend runs the step, the CUDA kernel
generator writes the same arithmetic with the tableau's numbers as literals."""
from .controller import PIDController
from .tableau import RODAS5P, RosenbrockTableau

__all__ = ["PIDController", "RODAS5P", "RosenbrockTableau"]
