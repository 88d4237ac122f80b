"""Generated kernel text for the CUDA backend: the plain ensemble kernel and the forward-sensitivity
kernel, both from one :class:`KernelSpec` and one emitter of the Rodas algorithm."""
from .plain import generate_kernel_source
from .sensitivity import generate_sens_kernel_source
from .spec import KERNEL_ARGS, MAX_DIRECTIONS, SENS_KERNEL_ARGS, KernelSpec, build_spec

__all__ = ["generate_kernel_source", "generate_sens_kernel_source", "KernelSpec", "build_spec",
           "KERNEL_ARGS", "SENS_KERNEL_ARGS", "MAX_DIRECTIONS"]
