"""The top-level ``boltzmann`` API: documented public names, and ``compute`` is the pipeline."""
import dataclasses

import numpy as np

import boltzmann
from boltzmann import pipeline


def test_public_names_are_documented():
    assert boltzmann.__all__
    for name in boltzmann.__all__:
        obj = getattr(boltzmann, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"boltzmann.{name} has no docstring"


def test_compute_is_the_pipeline_and_compute_many_the_ensemble():
    cfg = boltzmann.load_config("lcdm_massless")
    prec = dataclasses.replace(cfg.precision, l_max_g=6, l_max_pol_g=4, l_max_ur=6, rtol=1e-4,
                               bg_n_lna=400)
    out = dataclasses.replace(cfg.output, z=(0.0,), k_min=1e-3, k_max=3.0, k_per_decade=2)
    cfg = dataclasses.replace(cfg, precision=prec, output=out)
    one = boltzmann.compute(cfg, backend="jax")
    ref = pipeline.run(cfg, backend="jax")
    np.testing.assert_array_equal(one.spectra.pk_m, ref.spectra.pk_m)
    assert one.failures() == [] and one.spectra.pk_m.shape == (1, 1, one.k.shape[1])
    # an ensemble of one through compute_many: the same numbers (a list of several cosmologies
    # is tests/test_ensemble.py's business)
    many = boltzmann.compute_many(cfg, [cfg.cosmology], backend="jax")
    assert many.ok().tolist() == [True]
    np.testing.assert_array_equal(many.spectra.sigma8, one.spectra.sigma8)
