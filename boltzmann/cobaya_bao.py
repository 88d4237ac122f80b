"""DESI DR2 BAO as a Cobaya likelihood: ``boltzmann.cobaya_bao.DesiDr2Bao``.

It asks the theory (``boltzmann.cobaya.BoltzmannTheory``, or Cobaya's classy or camb) for
D_A(z), H(z) and r_drag at the seven DESI DR2 effective redshifts and returns ``boltzmann.bao``'s
−χ²/2. An example run is ``configs/cobaya_desi_bao.yaml`` (``cobaya-run`` it; docs/cobaya.md).
"""
from __future__ import annotations

try:
    from cobaya.likelihood import Likelihood
except ImportError as exc:  # the package works without Cobaya; this module needs it
    raise ImportError("boltzmann.cobaya_bao needs Cobaya: pip install 'boltzmann-gpu[cobaya]' "
                      "(or pip install cobaya)") from exc

from .bao import desi_dr2

__all__ = ["DesiDr2Bao"]


class DesiDr2Bao(Likelihood):
    """DESI DR2 BAO (arXiv:2503.14738): D_V/r_d, D_M/r_d, D_H/r_d with DESI's covariance."""

    def initialize(self):
        self.data = desi_dr2()

    def get_requirements(self):
        z = self.data.z
        return {"angular_diameter_distance": {"z": z}, "Hubble": {"z": z}, "rdrag": None}

    def logp(self, **params_values):
        z = self.data.z
        d_m = self.provider.get_angular_diameter_distance(z) * (1.0 + z)
        hubble = self.provider.get_Hubble(z, units="1/Mpc")
        return float(self.data.log_likelihood(d_m, hubble, self.provider.get_param("rdrag")))
