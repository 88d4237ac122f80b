"""The states the CMB sources read (boltzmann.cmb.source_states), derived from the source
program's trace: the set the C_ℓ Jacobian keeps the tangents of. A state missing from it would
silently drop part of a derivative, so the set is checked against the physics of the sources:
SW, Doppler and polarisation read δ_γ, θ_b, F_γ2, G_γ0, G_γ2; the metric's α, α' and φ' + ψ'
read the Einstein sources (densities, velocities, shears) and, through the rhs of the shears,
the ℓ = 3 moments; nothing above ℓ = 3 of any species."""
from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

from boltzmann import modes
from boltzmann.cmb.source_states import output_dependence, states_read
from boltzmann.params import load_config
from boltzmann.tables import tables_one
from boltzmann.theta import ParameterMap, available_parameters, one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _read_names(config: str, *, de_at_lambda=None) -> tuple[list[str], int]:
    cfg = load_config(CONFIGS / config)
    pmap = ParameterMap(cfg.cosmology, available_parameters(cfg.cosmology))
    at_lambda = pmap.de_at_lambda if de_at_lambda is None else de_at_lambda
    model = modes.model_for(pmap.cosmo0, cfg.precision, de_at_lambda=at_lambda)
    grid = modes.make_grid(cfg.precision)
    table = jax.eval_shape(lambda c: jax.vmap(lambda x: tables_one(x, grid, model)[0])(c),
                           one(pmap.cosmo0))
    idx = states_read(model, table.shape)
    return [model.state_names[i] for i in idx], model.n


def _highest_multipole(names):
    return max(int(m.group(1)) for m in (re.search(r"_l?(\d+)$", n) for n in names) if m)


def test_massless_lcdm_sources_read_the_low_moments_and_the_fluid_linearised_at_lambda():
    names, n = _read_names("planck_cl.yaml")
    assert names == ["eta", "delta_c", "delta_b", "theta_b", "F_g_0", "F_g_1", "F_g_2", "F_g_3",
                     "G_g_0", "G_g_2", "F_ur_0", "F_ur_1", "F_ur_2", "F_ur_3", "delta_de_A",
                     "theta_de_A", "delta_de_B", "theta_de_B"]
    assert n > 5 * len(names)


@pytest.mark.parametrize("config", ["lcdm.yaml", "desi_w0wa.yaml"])
def test_massive_neutrinos_and_fluids_are_read_to_l3_of_every_momentum(config):
    names, n = _read_names(config)
    ncdm = [s for s in names if s.startswith("Psi_")]
    assert ncdm and _highest_multipole(ncdm) == 3
    assert {re.sub(r"_l\d+$", "", s) for s in ncdm} == {
        re.sub(r"_l\d+$", "", s) for s in modes.model_for(
            ParameterMap(load_config(CONFIGS / config).cosmology, ("h",)).cosmo0,
            load_config(CONFIGS / config).precision).state_names if s.startswith("Psi_")}
    assert {"eta", "theta_b", "G_g_2", "F_ur_3"} <= set(names)
    assert not [s for s in names if re.fullmatch(r"[FG]_(g|ur)_\d+", s)
                and int(s.rsplit("_", 1)[1]) > 3]


def test_dependence_follows_nested_programs_not_their_whole_operand_list():
    """A jitted inner function reading one of its two inputs: the outer output depends on that
    input only (the walk goes inside the call rather than taking the union of its operands)."""
    inner = jax.jit(lambda a, b: a * 2.0)
    closed = jax.make_jaxpr(lambda a, b: inner(a, b) + 1.0)(1.0, 2.0)
    assert output_dependence(closed.jaxpr, [frozenset({0}), frozenset({1})]) == [frozenset({0})]
