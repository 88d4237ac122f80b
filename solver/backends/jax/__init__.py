"""The JAX backend: all trajectories advanced in lock-step by one ``lax.while_loop``, and its
forward sensitivities by the joint system [y, s_1 .. s_m] on the same loop."""
from .backend import JaxBackend

__all__ = ["JaxBackend"]
