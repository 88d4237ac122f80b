"""The solver's error weights of the P(k) modes (boltzmann.modes.error_weights): the baryons at
``baryon_error_weight`` below ``baryon_error_k_max`` and out of the norm above it."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from boltzmann import fluid_phases, modes, pipeline
from boltzmann.params import ConfigError, load_config
from models.eb import NcdmQuadrature, build_eb_model

ARGS = dict(l_max_g=6, l_max_pol_g=5, l_max_ur=7, l_max_ncdm=6,
            ncdm=(NcdmQuadrature((0.9, 2.6, 5.1), (0.3, 0.5, 0.2), (-0.65, -2.4, -5.07)),))


def test_rows_per_mode_drop_the_baryons_above_the_cut():
    model = build_eb_model(**ARGS)
    row = modes.error_weights(model, 0.03)
    k = np.array([0.01, 0.2, 0.21, 5.0])
    rows = modes.error_weights(model, 0.03, k=k, baryon_k_max=0.2)
    assert rows.shape == (4, model.n)
    baryons = [model.index(n) for n in modes.BARYON_STATES]
    others = [i for i in range(model.n) if i not in baryons]
    np.testing.assert_array_equal(rows[:2], np.tile(row, (2, 1)))
    assert np.all(rows[2:, baryons] == 0.0)
    np.testing.assert_array_equal(rows[2:, others], np.tile(row[others], (2, 1)))
    np.testing.assert_array_equal(modes.baryon_weights(rows, model), [0.03, 0.03, 0.0, 0.0])
    # a neutrino-fluid form keeps each mode's baryon weight
    fluid = modes.fluid_form(model, "ur")
    form_rows = fluid_phases.phase_weights(fluid, model, rows)
    assert form_rows.shape == (4, fluid.n)
    np.testing.assert_array_equal(modes.baryon_weights(form_rows, fluid), [0.03, 0.03, 0, 0])


def test_a_negative_cut_is_a_config_error():
    data = yaml.safe_load(open("configs/lcdm_reduced.yaml"))
    data["precision"]["baryon_error_k_max"] = -1.0
    with pytest.raises(ConfigError, match="baryon_error_k_max"):
        load_config(data)


def _run(k_max_baryons):
    data = yaml.safe_load(open("configs/lcdm_reduced.yaml"))
    data["precision"]["baryon_error_k_max"] = k_max_baryons
    data["output"].update(k_min=0.01, k_max=10.0, k_per_decade=2, z=[0.0])
    return pipeline.run(load_config(data), backend="jax")


def test_the_cut_saves_steps_at_high_k_and_keeps_pk():
    """Above the cut the modes take fewer steps (the baryons' acoustic oscillations no longer
    set them) and P_m stays within a few rtol of every mode at the baryon weight; below the
    cut nothing changes."""
    cut, every = _run(0.2), _run(1e3)
    k = cut.transfers.k[0]
    assert not cut.transfers.failures()
    high = k > 0.2
    steps_cut, steps_every = cut.transfers.n_accepted[0], every.transfers.n_accepted[0]
    np.testing.assert_array_equal(steps_cut[~high], steps_every[~high])
    assert steps_cut[k.argmax()] < 0.92 * steps_every[k.argmax()]
    rel = np.asarray(cut.spectra.pk_m) / np.asarray(every.spectra.pk_m) - 1
    assert np.abs(rel[..., ~high]).max() == 0.0
    assert np.abs(rel).max() < 1e-4
