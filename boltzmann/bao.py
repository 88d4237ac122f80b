"""BAO data and their Gaussian likelihood, independent of any sampler.

``desi_dr2()`` reads the DESI DR2 data vector (boltzmann/data/desi_dr2_bao.yaml: D_V/r_d, D_M/r_d
and D_H/r_d at seven effective redshifts, with DESI's covariance). ``BaoData.theory`` builds the
model vector from D_M(z), H(z) and r_d, and ``BaoData.log_likelihood`` is −χ²/2. Both are written
with an array namespace argument (numpy by default, ``jax.numpy`` for gradients), so the same
likelihood serves Cobaya (boltzmann.cobaya_bao) and a JAX sampler fed by the differentiable
background outputs of ``PowerSpectrumFunction``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

__all__ = ["BaoData", "desi_dr2", "theory_function", "log_likelihood_function"]

DATA = Path(__file__).parent / "data"
KINDS = ("DV_over_rd", "DM_over_rd", "DH_over_rd")


@dataclass(frozen=True)
class BaoData:
    """One BAO data vector: entry i is quantity ``kinds[i]`` at redshift ``z_of[i]``.

    z: the distinct effective redshifts (sorted as in the file); z_of, kinds: per entry;
    mean (M,), cov (M, M); name: where the numbers come from.
    """

    name: str
    z: np.ndarray
    z_of: np.ndarray
    kinds: tuple
    mean: np.ndarray
    cov: np.ndarray

    @property
    def inv_cov(self) -> np.ndarray:
        return np.linalg.inv(self.cov)

    def theory(self, d_m, hubble, r_d, xp=np):
        """The model vector from D_M [Mpc] and H [1/Mpc] at ``self.z`` and r_d [Mpc]."""
        d_m, d_h = xp.asarray(d_m), 1.0 / xp.asarray(hubble)
        d_v = (self.z * d_m ** 2 * d_h) ** (1.0 / 3.0)
        table = {"DM_over_rd": d_m, "DH_over_rd": d_h, "DV_over_rd": d_v}
        where = {float(z): i for i, z in enumerate(self.z)}
        return xp.stack([table[k][where[float(z)]] for k, z in zip(self.kinds, self.z_of)]) / r_d

    def log_likelihood(self, d_m, hubble, r_d, xp=np):
        """−χ²/2 of the model (``theory``'s arguments) against the data."""
        r = self.theory(d_m, hubble, r_d, xp) - self.mean
        return -0.5 * r @ xp.asarray(self.inv_cov) @ r


def desi_dr2() -> BaoData:
    """DESI DR2 BAO (arXiv:2503.14738): BGS D_V/r_d and D_M/r_d, D_H/r_d of six more tracers."""
    spec = yaml.safe_load((DATA / "desi_dr2_bao.yaml").read_text())
    z_of, kinds, mean, blocks = [], [], [], []
    for tracer in spec["tracers"]:
        for kind in tracer["quantities"]:
            if kind not in KINDS:
                raise ValueError(f"desi_dr2_bao.yaml: unknown quantity {kind!r} ({KINDS})")
            z_of.append(float(tracer["z"]))
            kinds.append(kind)
        mean += [float(v) for v in tracer["mean"]]
        blocks.append(np.asarray(tracer["cov"], np.float64))
    cov = np.zeros((len(mean), len(mean)))
    i = 0
    for block in blocks:
        cov[i:i + len(block), i:i + len(block)] = block
        i += len(block)
    z = np.asarray(sorted(set(z_of)), np.float64)
    return BaoData(name=spec["reference"], z=z, z_of=np.asarray(z_of), kinds=tuple(kinds),
                   mean=np.asarray(mean), cov=cov)


def theory_function(config, parameters=("h", "omega_cdm"), data: BaoData | None = None):
    """(θ ↦ model vector (M,), θ0): ``data``'s BAO quantities (default DESI DR2) as a JAX function
    of the cosmological parameters (``PowerSpectrumFunction``'s names and order), through the
    differentiable background and thermodynamics only (no perturbation solve). Its Jacobian gives
    the Fisher matrix Jᵀ C⁻¹ J of the data without second derivatives."""
    from .gradients import PowerSpectrumFunction

    data = data if data is not None else desi_dr2()
    fn = PowerSpectrumFunction(config, parameters=tuple(parameters), z_background=data.z,
                               derived=("rs_d",), with_sigma8=False,
                               k=np.array([0.01, 0.1]))

    def theory(theta):
        import jax.numpy as jnp

        bg = fn.background(theta)
        return data.theory(bg["D_M"], bg["H"], jnp.reshape(bg["rs_d"], ()), xp=jnp)

    return theory, fn.theta0


def log_likelihood_function(config, parameters=("h", "omega_cdm"), data: BaoData | None = None):
    """(θ ↦ ln L, θ0): the BAO log-likelihood as a JAX function of the cosmological parameters
    (``theory_function``'s). ``jax.jit``, ``jax.grad`` and a JAX sampler's potential (e.g.
    numpyro's ``potential_fn``) take it as it is; for a few parameters reverse mode through the
    thermodynamics' loops is slower than forward mode (``solver.grad_by_forward_mode`` wraps it
    so that ``jax.grad`` runs one forward sweep: ~2× faster for three parameters on the CPU)."""
    import jax.numpy as jnp

    data = data if data is not None else desi_dr2()
    theory, theta0 = theory_function(config, parameters, data)
    inv_cov = jnp.asarray(data.inv_cov)

    def log_likelihood(theta):
        r = theory(theta) - data.mean
        return -0.5 * r @ inv_cov @ r

    return log_likelihood, theta0
