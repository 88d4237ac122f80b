"""Tutorial: P(k) of a configuration, two cosmologies compared, the exact Jacobian, a Fisher
forecast — the public API of ``boltzmann`` in four steps, each ending in a figure.

Run from the repository root:

    python docs/tutorial.py                 # the figures of docs/tutorial.md (docs/figures/)
    python docs/tutorial.py --quick         # test-sized: short hierarchies, a few wavenumbers
    python docs/tutorial.py --figures DIR   # write the figures elsewhere

tests/test_tutorial.py runs the ``--quick`` version, so every line below is executed by the test
suite; docs/tutorial.md shows the figures of the full run and what each step says.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import boltzmann  # noqa: E402
import boltzmann.runtime  # noqa: E402

FIGURES = Path(__file__).resolve().parent / "figures"
#: the parameters of the Jacobian and the Fisher forecast (names as in the config)
PARAMETERS = ("h", "omega_cdm", "ln10^{10}A_s", "n_s")


def settings(quick: bool) -> dict:
    """What the run computes. The full run is configs/lcdm.yaml as shipped (k to 10 h/Mpc at 20
    per decade, z = 0 and 1; one 0.06 eV neutrino) and the Jacobian in h, ω_cdm, ln10¹⁰A_s, n_s
    on 24 k up to 0.5 h/Mpc. ``quick`` keeps every step but shortens the hierarchies and grids
    and differentiates only ln10¹⁰A_s and n_s: their derivatives need no sensitivity solve
    (they enter through the primordial spectrum), which keeps the compile, and the script, near
    a minute on two cores."""
    if quick:
        return {"config": "lcdm_massless", "k": (1e-3, 0.3, 4), "z": [0.0, 1.0],
                "precision": {"l_max_g": 6, "l_max_pol_g": 4, "l_max_ur": 6, "rtol": 1e-4,
                              "bg_n_lna": 600},
                "jacobian_k": (1e-2, 0.2, 6), "parameters": PARAMETERS[2:], "n_chunks": 1}
    return {"config": "lcdm", "k": None, "z": None, "precision": {},
            "jacobian_k": (1e-3, 0.5, 24), "parameters": PARAMETERS, "n_chunks": 1}


def step1_power_spectrum(s: dict, figures: Path):
    """A configuration → P(k, z), σ8 and the derived parameters."""
    config = boltzmann.load_config(s["config"])          # configs/<name>.yaml
    output = config.output
    if s["k"] is not None:
        k_min, k_max, per_decade = s["k"]
        output = dataclasses.replace(output, k_min=k_min, k_max=k_max, k_per_decade=per_decade,
                                     z=tuple(s["z"]))
    config = dataclasses.replace(config, output=output,
                                 precision=dataclasses.replace(config.precision, **s["precision"]))
    result = boltzmann.compute(config)
    k = result.k[0]                                       # 1/Mpc
    derived = boltzmann.derived_parameters(result)
    print(f"σ8 = {derived['sigma8']:.5f}, 100θ_s = {derived['100*theta_s']:.6f}, "
          f"r_d = {derived['rs_d']:.3f} Mpc, age = {derived['age']:.4f} Gyr")

    fig, ax = plt.subplots(figsize=(6, 4))
    for iz, z in enumerate(result.z):
        ax.loglog(k, result.spectra.pk_m[0, iz], label=f"P_m, z = {z:g}")
        ax.loglog(k, result.spectra.pk_cb[0, iz], "--", label=f"P_cb, z = {z:g}")
    ax.set(xlabel="k [1/Mpc]", ylabel="P(k) [Mpc³]", title=f"{config.name}: linear P(k)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figures / "tutorial_pk.png", dpi=110)
    plt.close(fig)
    return config, result


def step2_compare(config, result, figures: Path):
    """A second cosmology, +5 % ω_cdm, against the fiducial: the same configuration with another
    CosmoParams (``compute`` reuses every compiled program of step 1; ``compute_many`` would
    solve a list of cosmologies in one launch)."""
    fid = config.cosmology
    more_cdm = dataclasses.replace(fid, omega_cdm=1.05 * float(fid.omega_cdm))
    other = boltzmann.compute(dataclasses.replace(config, cosmology=more_cdm))
    assert other.ok().all(), other.failures()
    ratio = other.spectra.pk_m[0, 0] / result.spectra.pk_m[0, 0]
    print(f"σ8: {result.spectra.sigma8[0, 0]:.5f} → {other.spectra.sigma8[0, 0]:.5f} "
          f"with ω_cdm × 1.05")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.semilogx(other.k[0], ratio - 1.0)
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set(xlabel="k [1/Mpc]", ylabel="P_m ratio − 1 (z = 0)",
           title="ω_cdm × 1.05 against the fiducial (same h, A_s)")
    fig.tight_layout()
    fig.savefig(figures / "tutorial_compare.png", dpi=110)
    plt.close(fig)
    return other


def step3_jacobian(config, s: dict, figures: Path):
    """The exact Jacobian ∂P/∂θ at the fiducial, by forward sensitivities (one joint solve)."""
    k_min, k_max, n = s["jacobian_k"]
    k = np.logspace(np.log10(k_min), np.log10(k_max), n) * float(config.cosmology.h)  # 1/Mpc
    pk = boltzmann.power_spectrum(config, parameters=s["parameters"], k=k, z=[0.0],
                                  with_sigma8=False, n_chunks=s["n_chunks"])
    t0 = time.perf_counter()
    values, jac = pk.value_and_jacobian()                 # at pk.theta0
    print(f"Jacobian of P(k) in {len(pk.parameters)} parameters at {k.size} k: "
          f"{time.perf_counter() - t0:.1f} s")
    dlnp = np.asarray(jac["P_m"][0]) / np.asarray(values["P_m"][0])[:, None]  # (n_k, n_θ)

    fig, ax = plt.subplots(figsize=(6, 4))
    for j, name in enumerate(pk.parameters):
        ax.semilogx(k, dlnp[:, j], marker="o", ms=3, label=name)
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set(xlabel="k [1/Mpc]", ylabel="∂ ln P_m / ∂θ (z = 0)", title="exact derivatives")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figures / "tutorial_dlnpk.png", dpi=110)
    plt.close(fig)
    return pk, np.asarray(values["P_m"][0]), np.asarray(jac["P_m"][0])


#: a CMB-like prior on the amplitude, σ(ln10¹⁰A_s) (Planck 2018 TT,TE,EE+lowE+lensing: 0.014)
A_S_PRIOR = 0.014


def step4_fisher(pk, p, dp, figures: Path, volume_gpc3: float = 1.0):
    """A toy Fisher forecast: P_m(k, z = 0) measured with cosmic-variance errors in a volume
    V = ``volume_gpc3`` Gpc³, k bins of the Jacobian's grid, no shot noise, no AP effect:
    σ_P / P = sqrt(2 / N_k), N_k = V k² Δk / (2π²); F = Jᵀ C⁻¹ J, plus a prior on ln10¹⁰A_s.

    Without the prior h and A_s are degenerate: at fixed ω_b, ω_cdm and k [1/Mpc], h changes
    only Ω_Λ, hence the growth, which rescales P(k, z = 0) at every k as A_s does (∂ln P/∂h is
    flat in the figure of step 3)."""
    k = pk.k
    dk = np.gradient(k)
    n_modes = volume_gpc3 * 1e9 * k**2 * dk / (2 * np.pi**2)
    sigma = p * np.sqrt(2.0 / n_modes)
    fisher = (dp / sigma[:, None]).T @ (dp / sigma[:, None])
    alone = np.sqrt(np.diag(np.linalg.inv(fisher)))
    prior = np.zeros_like(fisher)
    if "ln10^{10}A_s" in pk.parameters:
        j = pk.parameters.index("ln10^{10}A_s")
        prior[j, j] = A_S_PRIOR**-2
    cov = np.linalg.inv(fisher + prior)
    errors = np.sqrt(np.diag(cov))
    print(f"marginalised errors, P(k) alone | with σ(ln10¹⁰A_s) = {A_S_PRIOR}:")
    for name, value, err0, err in zip(pk.parameters, np.asarray(pk.theta0), alone, errors):
        print(f"  {name:>14s} = {value:.5g} ± {err0:.2g} | ± {err:.2g}")

    fig, ax = plt.subplots(figsize=(4.5, 4))
    i, j = 0, 1
    c2 = cov[np.ix_([i, j], [i, j])]
    vals, vecs = np.linalg.eigh(c2)
    t = np.linspace(0, 2 * np.pi, 200)
    theta0 = np.asarray(pk.theta0)
    for n_sigma, style in ((1.52, "-"), (2.48, "--")):    # 68 % and 95 % for two parameters
        ellipse = vecs @ (n_sigma * np.sqrt(vals)[:, None] * np.stack([np.cos(t), np.sin(t)]))
        ax.plot(theta0[i] + ellipse[0], theta0[j] + ellipse[1], style, color="C0")
    ax.plot(theta0[i], theta0[j], "k+")
    ax.set(xlabel=pk.parameters[i], ylabel=pk.parameters[j],
           title=f"P(k), V = {volume_gpc3:g} Gpc³, + A_s prior (68, 95 %)")
    fig.tight_layout()
    fig.savefig(figures / "tutorial_fisher.png", dpi=110)
    plt.close(fig)
    return fisher, errors


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="test-sized settings")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="folder of the figures")
    args = parser.parse_args(argv)
    args.figures.mkdir(parents=True, exist_ok=True)
    # an entry point: keep compiled programs between runs (BOLTZMANN_CACHE=0 turns it off)
    boltzmann.runtime.configure(boltzmann.runtime.Settings.from_environment())
    s = settings(args.quick)
    t0 = time.perf_counter()
    config, result = step1_power_spectrum(s, args.figures)
    other = step2_compare(config, result, args.figures)
    pk, p, dp = step3_jacobian(config, s, args.figures)
    fisher, errors = step4_fisher(pk, p, dp, args.figures)
    print(f"tutorial done in {time.perf_counter() - t0:.0f} s; figures in {args.figures}")
    return {"result": result, "other": other, "pk_values": p, "jacobian": dp, "fisher": fisher,
            "errors": errors,
            "figures": sorted(args.figures.glob("tutorial_*.png"))}


if __name__ == "__main__":
    main()
