"""CMB angular power spectra: line-of-sight sources, Bessel projection, C_ℓ (docs/cmb.md).

Entry: :func:`compute_cl` (stage 4, after the perturbations) → :class:`ClSpectra`;
:func:`cl_for_config` runs the tables and this stage for a config.
"""
from .sampling import ClSampling
from .spectra import ClSpectra
from .stage import SPECTRA, cl_for_config, compute_cl

__all__ = ["ClSampling", "ClSpectra", "SPECTRA", "cl_for_config", "compute_cl"]
