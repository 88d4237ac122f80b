"""How models/eb.py composes the model from its per-species emitters (models/species/).

* every emitter contributes exactly its own state names and parameters, and the composed layout
  is the documented one (docs/perturbations.md, "State layout"), with the expected count;
* the generated rhs and observables agree with an independent, hand-written numpy implementation
  of the equations in docs/perturbations.md on random inputs -- a check of the composition
  (couplings, Einstein sums, ordering) that shares no code with the emitters.
"""
import math

import numpy as np
import pytest

from models.eb import NcdmQuadrature, build_eb_model, emitters
from models.tables import interpolate, pack_table, uniform_grid

QUAD3 = NcdmQuadrature((0.9, 2.6, 5.1), (0.3, 0.5, 0.2), (-0.65, -2.4, -5.07))
QUAD2 = NcdmQuadrature((1.4, 4.0), (0.6, 0.4), (-1.1, -3.9))

CONFIGS = {
    "massless": dict(l_max_g=5, l_max_pol_g=4, l_max_ur=6),
    "ncdm_fluid": dict(l_max_g=5, l_max_pol_g=4, l_max_ur=6, ncdm=(QUAD3,), l_max_ncdm=5,
                       de_fluid=True),
    "two_ncdm_at_lambda": dict(l_max_g=4, l_max_pol_g=5, l_max_ur=4, ncdm=(QUAD3, QUAD2),
                               l_max_ncdm=4, de_at_lambda=True),
}


def _args(kw):
    full = dict(l_max_g=20, l_max_pol_g=15, l_max_ur=50, ncdm=(), l_max_ncdm=20,
                de_fluid=False, de_at_lambda=False)
    full.update(kw)
    return full


def _expected_layout(kw):
    """Per emitter, its states and parameters, written out from the documentation."""
    a = _args(kw)
    ncdm = [(
        [f"Psi_{s}_q{i}_l{l}" for i in range(len(sp.q)) for l in range(a["l_max_ncdm"] + 1)],
        [f"ncdm_norm_{s}", f"ncdm_m_over_T_{s}"]) for s, sp in enumerate(a["ncdm"])]
    de = ([], [])
    if a["de_fluid"]:
        de = (["delta_de", "theta_de"], ["rho_de0", "w0", "wa", "cs2_de"])
    if a["de_at_lambda"]:
        de = (["delta_de_A", "theta_de_A", "delta_de_B", "theta_de_B"],
              ["rho_de0", "w0", "wa", "cs2_de"])
    return {
        "Metric": (["eta"], []),
        "BaryonsCdm": (["delta_c", "delta_b", "theta_b"], ["rho_b0", "rho_cdm0"]),
        "Photons": ([f"F_g_{l}" for l in range(a["l_max_g"] + 1)]
                    + [f"G_g_{l}" for l in range(a["l_max_pol_g"] + 1)], ["rho_g0"]),
        "MasslessNeutrinos": ([f"F_ur_{l}" for l in range(a["l_max_ur"] + 1)], ["rho_ur0"]),
        **{f"MassiveNeutrinos{s}": v for s, v in enumerate(ncdm)},
        **({"DarkEnergy": de} if de[0] else {}),
    }


def _key(emitter):
    name = type(emitter).__name__
    if name.startswith("DarkEnergy"):
        return "DarkEnergy"
    return name + (str(emitter.s) if name == "MassiveNeutrinos" else "")


@pytest.mark.parametrize("config", [dict(), *CONFIGS.values()], ids=["default", *CONFIGS])
def test_each_emitter_contributes_exactly_its_states_and_parameters(config):
    a = _args(config)
    em = emitters(**a)
    expected = _expected_layout(config)
    assert sorted(_key(c) for c in em.owners) == sorted(expected)
    for c in em.owners:
        states, params = expected[_key(c)]
        assert list(c.states) == states, _key(c)
        assert list(c.params) == params, _key(c)

    model = build_eb_model(**config)
    # layout: metric, baryons + CDM, photons, massless nu, massive nu by species, dark energy
    order = ["Metric", "BaryonsCdm", "Photons", "MasslessNeutrinos"]
    order += [f"MassiveNeutrinos{s}" for s in range(len(a["ncdm"]))]
    order += ["DarkEnergy"] if "DarkEnergy" in expected else []
    assert list(model.state_names) == [nm for key in order for nm in expected[key][0]]
    n_q = sum(len(sp.q) for sp in a["ncdm"])
    assert model.n == (1 + 3 + (a["l_max_g"] + 1) + (a["l_max_pol_g"] + 1) + (a["l_max_ur"] + 1)
                       + n_q * (a["l_max_ncdm"] + 1) + 2 * a["de_fluid"] + 4 * a["de_at_lambda"])
    assert list(model.param_names) == (
        ["k", "cosmo_row", "table_x_min", "table_dx", "rho_g0", "rho_b0", "rho_cdm0", "rho_ur0"]
        + [p for s in range(len(a["ncdm"])) for p in expected[f"MassiveNeutrinos{s}"][1]]
        + (expected["DarkEnergy"][1] if "DarkEnergy" in expected else []))
    radiation = [model.state_names[i] for i in model.radiation_indices]
    assert radiation == expected["Photons"][0] + expected["MasslessNeutrinos"][0]


# ------------------------------------------------------------------ independent implementation


def _reference(model, y, p, x, tv):
    """d y/d ln a and some observables from docs/perturbations.md, written out with numpy."""
    Y = dict(zip(model.state_names, y))
    P = dict(zip(model.param_names, p))
    k, a = P["k"], math.exp(x)
    cH, itau, kd, cs2b = math.exp(tv[0]), math.exp(-tv[1]), math.exp(tv[2]), tv[3]
    Ag, Ab, Ac, Aur = P["rho_g0"] / a**2, P["rho_b0"] / a, P["rho_cdm0"] / a, P["rho_ur0"] / a**2
    F = {pre: [Y[f"{pre}{l}"] for l in range(lmax + 1)]
         for pre, lmax in (("F_g_", model.l_max_g), ("G_g_", model.l_max_pol_g),
                           ("F_ur_", model.l_max_ur))}
    th_g, th_ur = 0.75 * k * F["F_g_"][1], 0.75 * k * F["F_ur_"][1]

    drho = Ag * F["F_g_"][0] + Ab * Y["delta_b"] + Ac * Y["delta_c"] + Aur * F["F_ur_"][0]
    rpt = 4.0 / 3.0 * (Ag * th_g + Aur * th_ur) + Ab * Y["theta_b"]
    shear = 2.0 / 3.0 * (Ag * F["F_g_"][2] + Aur * F["F_ur_"][2])
    A_m, dA_m = Ab + Ac, Ab * Y["delta_b"] + Ac * Y["delta_c"]
    obs = {}
    ncdm = []
    for s, sp in enumerate(model.ncdm):
        q, w, dlnf = (np.asarray(v) for v in (sp.q, sp.weights, sp.dlnf0_dlnq))
        eps = np.sqrt(q**2 + (a * P[f"ncdm_m_over_T_{s}"]) ** 2)
        nrm = P[f"ncdm_norm_{s}"] / a**2
        psi = np.array([[Y[f"Psi_{s}_q{i}_l{l}"] for l in range(model.l_max_ncdm + 1)]
                        for i in range(len(q))])
        A_n, Pa_n = nrm * np.sum(w * eps), nrm * np.sum(w * q**2 / (3.0 * eps))
        dA_n, rpt_n = nrm * np.sum(w * eps * psi[:, 0]), nrm * k * np.sum(w * q * psi[:, 1])
        drho, rpt, A_m, dA_m = drho + dA_n, rpt + rpt_n, A_m + A_n, dA_m + dA_n
        shear += nrm * 2.0 / 3.0 * np.sum(w * q**2 / eps * psi[:, 2])
        obs[f"d_ncdm[{s}]"], obs[f"t_ncdm[{s}]"] = dA_n / A_n, rpt_n / (A_n + Pa_n)
        ncdm.append((s, q * k / eps, dlnf, psi))
    if model.de_fluid or model.de_at_lambda:
        w0, wa, cs2 = P["w0"], P["wa"], P["cs2_de"]
        w = w0 + wa * (1.0 - a)
        A_de = P["rho_de0"] * a ** (-1.0 - 3.0 * (w0 + wa)) * math.exp(3.0 * wa * (a - 1.0))
    if model.de_fluid:
        drho += A_de * Y["delta_de"]
        rpt += (1.0 + w) * A_de * Y["theta_de"]
    if model.de_at_lambda:
        g = {"A": 1.0 + w0 - wa, "B": wa * (2.0 - a)}      # (1 + w) = g_A + g_B
        drho += A_de * sum(g[u] * Y[f"delta_de_{u}"] for u in "AB")
        rpt += A_de * sum(g[u] * Y[f"theta_de_{u}"] for u in "AB")

    hp = 2.0 * (k * k * Y["eta"] + 1.5 * drho) / cH
    ep = 1.5 * rpt / (k * k)
    d = {"eta": ep, "delta_c": -hp / 2, "delta_b": -Y["theta_b"] - hp / 2,
         "theta_b": (-cH * Y["theta_b"] + cs2b * k * k * Y["delta_b"]
                     + 4.0 * Ag / (3.0 * Ab) * kd * (th_g - Y["theta_b"]))}

    def free(X, l, rate):
        """k/(2l+1)(l X_{l-1} - (l+1) X_{l+1}), or the MB95 eq. 51 closure at the top."""
        if l == len(X) - 1:
            return rate * X[l - 1] - (l + 1) * itau * X[l]
        return rate / (2 * l + 1) * (l * X[l - 1] - (l + 1) * X[l + 1])

    Fg, Gg, Fu = F["F_g_"], F["G_g_"], F["F_ur_"]
    Pi = Fg[2] + Gg[0] + Gg[2]
    for l in range(len(Fg)):
        v = free(Fg, l, k) - kd * Fg[l] if l >= 1 else -k * Fg[1] - 2.0 / 3.0 * hp
        if l == 1:
            v = k / 3.0 * (Fg[0] - 2.0 * Fg[2]) + kd * (4.0 * Y["theta_b"] / (3.0 * k) - Fg[1])
        if l == 2:
            v += 4.0 * hp / 15.0 + 8.0 * ep / 5.0 + kd * Pi / 10.0
        d[f"F_g_{l}"] = v
    for l in range(len(Gg)):
        d[f"G_g_{l}"] = (-k * Gg[1] + kd * (Pi / 2.0 - Gg[0]) if l == 0
                         else free(Gg, l, k) - kd * Gg[l] + (kd * Pi / 10.0 if l == 2 else 0.0))
    for l in range(len(Fu)):
        d[f"F_ur_{l}"] = (-k * Fu[1] - 2.0 / 3.0 * hp if l == 0 else free(Fu, l, k)
                          + (4.0 * hp / 15.0 + 8.0 * ep / 5.0 if l == 2 else 0.0))
    for s, rates, dlnf, psi in ncdm:
        for i, (rate, g) in enumerate(zip(rates, dlnf)):
            for l in range(psi.shape[1]):
                v = -rate * psi[i, 1] + hp / 6.0 * g if l == 0 else free(psi[i], l, rate)
                d[f"Psi_{s}_q{i}_l{l}"] = v - (hp / 15.0 + 0.4 * ep) * g if l == 2 else v
    if model.de_fluid:
        ca2 = w + wa * a / (3.0 * (1.0 + w))
        dd, td = Y["delta_de"], Y["theta_de"]
        d["delta_de"] = (-(1.0 + w) * (td + hp / 2) - 3.0 * (cs2 - w) * cH * dd
                         - 9.0 * (1.0 + w) * (cs2 - ca2) * cH**2 * td / k**2)
        d["theta_de"] = -(1.0 - 3.0 * cs2) * cH * td + cs2 * k**2 * dd / (1.0 + w)
        obs["d_de"], obs["t_de"] = dd, td
    if model.de_at_lambda:
        for u, c in (("A", 0.0), ("B", -a * cH / (2.0 - a))):
            dd, td = Y[f"delta_de_{u}"], Y[f"theta_de_{u}"]
            d[f"delta_de_{u}"] = (-(td + hp / 2) - 3.0 * (cs2 - w) * cH * dd
                                  - 9.0 * cH**2 / k**2 * ((cs2 - w) + c / (3.0 * cH)) * td - c * dd)
            d[f"theta_de_{u}"] = -(1.0 - 3.0 * cs2) * cH * td + cs2 * k**2 * dd

    alpha = (hp + 6.0 * ep) / (2.0 * k * k)
    alpha_p = -2.0 * cH * alpha + Y["eta"] - 4.5 * shear / (k * k)
    obs.update(d_m=dA_m / A_m, d_cb=(Ab * Y["delta_b"] + Ac * Y["delta_c"]) / (Ab + Ac),
               t_g=th_g, t_ur=th_ur, h_prime=hp, eta_prime=ep, h=-2.0 * Y["delta_c"],
               phi=Y["eta"] - cH * alpha, psi=cH * alpha + alpha_p, a=a, conformal_hubble=cH)
    return np.array([d[nm] / cH for nm in model.state_names]), obs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rhs_and_observables_match_independent_implementation(name):
    model = build_eb_model(**CONFIGS[name])
    rng = np.random.default_rng(11)
    xg, dx = uniform_grid(-3.0, 0.5, 8)
    cols = {c: (rng.uniform(-1.0, 1.0, xg.size), rng.uniform(-1.0, 1.0, xg.size))
            for c in model.table_columns}
    tab = pack_table(cols, model.table_columns)[None]
    values = dict(k=0.7, cosmo_row=0.0, table_x_min=-3.0, table_dx=dx, rho_g0=0.8, rho_b0=0.5,
                  rho_cdm0=1.3, rho_ur0=0.6, rho_de0=0.9, w0=-0.8, wa=0.3, cs2_de=1.0)
    for s in range(len(model.ncdm)):
        values.update({f"ncdm_norm_{s}": 0.4 + s, f"ncdm_m_over_T_{s}": 3.0 + s})
    p = model.make_params(**{nm: values[nm] for nm in model.param_names})
    rhs = model.make_rhs(math)
    for x in (-1.7, -0.2):
        y = rng.normal(size=model.n)
        tv = [float(interpolate(tab, 0, c, x, -3.0, dx)) for c in range(4)]
        want, want_obs = _reference(model, y, p, x, tv)
        got = np.array(rhs(y, x, p, tab))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        got_obs = {key: float(v) for key, v in model.observables(y, x, p, tab).items()}
        for key, v in want_obs.items():
            assert got_obs[key] == pytest.approx(v, rel=1e-11, abs=1e-13), key
