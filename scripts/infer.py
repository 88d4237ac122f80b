#!/usr/bin/env python
"""Gradient-based inference with the exact P(k) derivatives: a Fisher forecast and NUTS (numpyro).

    python scripts/infer.py --config configs/lcdm.yaml --fisher
    python scripts/infer.py --config configs/lcdm.yaml --nuts 200 --params omega_cdm,h,ln10^{10}A_s
    python scripts/infer.py --config lcdm --fisher --nuts 50 --quick      # small, CPU-friendly

The data model is a mock galaxy-survey measurement of the linear matter power spectrum: P_m(k, z)
at the config's redshifts on log-spaced k bins (``--kmin``/``--kmax`` in h/Mpc), with the Gaussian
band-power covariance of a survey of volume V and number density n̄ (Feldman, Kaiser & Peacock
1994; Tegmark 1997):

    σ_P(k) = (P(k) + 1/n̄) · sqrt(2 / N_k),   N_k = V k² Δk / (2π²)  modes in a bin of width Δk,

plus independent Gaussian priors of Planck-2018-like widths on the parameters the linear P(k)
alone hardly constrains (τ_reio, and optionally any other; ``PRIORS``). The Fisher matrix is
F = Jᵀ C⁻¹ J + prior, J = ∂P/∂θ from ONE forward-sensitivity solve (boltzmann.gradients) — the
same derivatives CLASS/CAMB users get from noisy finite differences at 2·len(θ) extra runs.

NUTS (``--nuts N``) samples the posterior of mock data generated at the fiducial with the same
likelihood; the potential's gradient is the exact one (``solver.sensitivity.grad_by_forward_mode``:
one joint solve with len(θ) directions per gradient). Each gradient costs a Jacobian solve, so on
a CPU keep ``--quick`` (reduced ℓmax, few k) and a handful of parameters; on a GPU the same script
runs at full precision.

Outputs (``--out DIR``, default output/infer): fisher.json (F, covariance, marginal σ, correlation)
and, with --nuts, samples.npz and a summary table on stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: Gaussian prior widths (1σ) — Planck 2018 TT,TE,EE+lowE+lensing-like, used only where requested
#: (τ_reio always: P(k) barely depends on it). Values: Planck 2018 VI (arXiv:1807.06209) Table 2.
PRIORS = {"tau_reio": 0.0073, "omega_b": 0.00015, "n_s": 0.0042, "ln10^{10}A_s": 0.014,
          "h": 0.0054, "omega_cdm": 0.0012, "m_ncdm": 0.1, "N_ur": 0.2, "w0_fld": 0.5,
          "wa_fld": 1.0}


def build_parser():
    p = argparse.ArgumentParser(prog="infer", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="YAML config (path or name in configs/)")
    p.add_argument("--params", default=None,
                   help="comma-separated parameters (default: all of boltzmann.gradients.PARAMETERS "
                        "that the cosmology has)")
    p.add_argument("--fisher", action="store_true", help="Fisher forecast")
    p.add_argument("--nuts", type=int, default=0, metavar="N", help="NUTS samples (numpyro)")
    p.add_argument("--warmup", type=int, default=None, help="NUTS warm-up steps (default N/2)")
    p.add_argument("--max-tree-depth", type=int, default=None,
                   help="NUTS max tree depth (default 6; 3 with --quick)")
    p.add_argument("--volume", type=float, default=4.0, help="survey volume [Gpc^3/h^3]")
    p.add_argument("--nbar", type=float, default=3e-4, help="number density [h^3/Mpc^3]")
    p.add_argument("--kmin", type=float, default=0.01, help="smallest k [h/Mpc]")
    p.add_argument("--kmax", type=float, default=0.2, help="largest k [h/Mpc]")
    p.add_argument("--nk", type=int, default=24, help="number of k bins")
    p.add_argument("--priors", default="tau_reio",
                   help="comma-separated parameters that get the PRIORS width (default tau_reio)")
    p.add_argument("--quick", action="store_true",
                   help="reduced precision (ℓmax 10/8/12/8, 3 momentum nodes, 8 k bins): a CPU demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="output/infer", help="output directory")
    return p


def _setup(args):
    from boltzmann.cli import resolve_config_path
    from boltzmann.gradients import PARAMETERS, PowerSpectrumFunction
    from boltzmann.params import load_config

    import yaml
    path = resolve_config_path(args.config)
    raw = yaml.safe_load(Path(path).read_text())
    if args.quick:
        raw.setdefault("precision", {}).update(l_max_g=10, l_max_pol_g=8, l_max_ur=12,
                                               l_max_ncdm=8, n_q_ncdm=3)
        args.nk = min(args.nk, 8)
    config = load_config(raw)
    cosmo = config.cosmology
    if args.params:
        names = tuple(s.strip() for s in args.params.split(",") if s.strip())
    else:
        names = tuple(p for p in PARAMETERS if p != "m_ncdm" or cosmo.n_ncdm > 0)
    h = float(cosmo.h)
    if not 0 < args.kmin < args.kmax:
        raise SystemExit(f"infer: need 0 < --kmin < --kmax, got {args.kmin}, {args.kmax}")
    k = np.geomspace(args.kmin, args.kmax, args.nk) * h                      # 1/Mpc
    fn = PowerSpectrumFunction(config, parameters=names, k=k, with_sigma8=False)
    return fn, h


def _noise(fn, h, P, args):
    """σ_P per (z, k) for the mock survey."""
    lnk = np.log(fn.k)
    dlnk = np.gradient(lnk)
    volume = args.volume * 1e9 / h**3                       # Mpc^3
    nbar = args.nbar * h**3                                 # 1/Mpc^3
    n_modes = volume * fn.k**3 * dlnk / (2 * math.pi**2)
    return (P + 1.0 / nbar) * np.sqrt(2.0 / n_modes)


def fisher(fn, h, args):
    t0 = time.perf_counter()
    d = fn.dlnpk()
    wall = time.perf_counter() - t0
    P = d["P_m"]                                           # (n_z, n_k)
    J = d["dlnP_m"] * P[..., None]                         # ∂P/∂θ
    sigma = _noise(fn, h, P, args)
    Jw = (J / sigma[..., None]).reshape(-1, J.shape[-1])
    F = Jw.T @ Jw
    prior_names = [s.strip() for s in args.priors.split(",") if s.strip()]
    for name in prior_names:
        if name in fn.parameters:
            i = fn.parameters.index(name)
            F[i, i] += 1.0 / PRIORS[name] ** 2
    cov = np.linalg.inv(F)
    err = np.sqrt(np.diag(cov))
    corr = cov / np.outer(err, err)
    print(f"Fisher forecast: V = {args.volume:g} Gpc^3/h^3, nbar = {args.nbar:g} h^3/Mpc^3, "
          f"{args.kmin:g} < k < {args.kmax:g} h/Mpc ({len(fn.k)} bins), z = {fn.z}, "
          f"priors on {prior_names}")
    print(f"Jacobian (exact, {len(fn.parameters)} parameters): {wall:.1f} s")
    for name, th, e in zip(fn.parameters, np.asarray(fn.theta0), err):
        print(f"  {name:>14s} = {th:.6g} ± {e:.3g}")
    return {"parameters": list(fn.parameters), "fiducial": [float(x) for x in fn.theta0],
            "fisher": F.tolist(), "covariance": cov.tolist(), "sigma": err.tolist(),
            "correlation": corr.tolist(), "jacobian_seconds": wall,
            "survey": {"volume_Gpc3_h3": args.volume, "nbar_h3_Mpc3": args.nbar,
                       "k_h_Mpc": (fn.k / h).tolist(), "z": fn.z},
            "priors": {n: PRIORS[n] for n in prior_names if n in fn.parameters}}


def nuts(fn, h, args, out_dir):
    try:
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import MCMC, NUTS
    except ImportError as exc:
        raise SystemExit("infer: --nuts needs numpyro (pip install -e '.[infer]')") from exc
    import jax
    import jax.numpy as jnp
    from solver.sensitivity import grad_by_forward_mode

    theta0 = np.asarray(fn.theta0)
    P0 = np.asarray(fn(theta0)["P_m"])
    sigma = _noise(fn, h, P0, args)
    rng = np.random.default_rng(args.seed)
    data = P0 + sigma * rng.standard_normal(P0.shape)
    prior_names = [s.strip() for s in args.priors.split(",") if s.strip()]

    model_pk = grad_by_forward_mode(lambda th: fn._evaluate(th)["P_m"])
    # flat priors ±10 σ_prior-ish boxes around the fiducial (wide), Gaussian where requested
    width = np.array([PRIORS.get(n, 0.1 * abs(t) + 1e-3) for n, t in zip(fn.parameters, theta0)])

    def model():
        th = []
        for i, name in enumerate(fn.parameters):
            if name in prior_names:
                th.append(numpyro.sample(name, dist.Normal(theta0[i], width[i])))
            else:
                th.append(numpyro.sample(name, dist.Uniform(theta0[i] - 10 * width[i],
                                                            theta0[i] + 10 * width[i])))
        pk = model_pk(jnp.stack(th))
        numpyro.sample("P", dist.Normal(pk, jnp.asarray(sigma)), obs=jnp.asarray(data))

    warmup = args.warmup if args.warmup is not None else max(args.nuts // 2, 10)
    kernel = NUTS(model, init_strategy=numpyro.infer.init_to_value(
        values={n: float(t) for n, t in zip(fn.parameters, theta0)}),
        max_tree_depth=args.max_tree_depth or (3 if args.quick else 6))
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=args.nuts, progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(args.seed))
    wall = time.perf_counter() - t0
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    extra = mcmc.get_extra_fields()
    n_grad = int(np.sum(np.asarray(extra.get("num_steps", np.zeros(1)))))
    print(f"NUTS: {warmup} warm-up + {args.nuts} samples in {wall:.1f} s "
          f"({n_grad} gradient evaluations in the sampling phase)")
    for name in fn.parameters:
        s = samples[name]
        print(f"  {name:>14s}: mean {s.mean():.6g}  sd {s.std():.3g}  (fiducial "
              f"{theta0[fn.parameters.index(name)]:.6g})")
    np.savez(out_dir / "samples.npz", **samples)
    return {"seconds": wall, "warmup": warmup, "samples": args.nuts,
            "means": {n: float(samples[n].mean()) for n in fn.parameters},
            "sd": {n: float(samples[n].std()) for n in fn.parameters}}


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.fisher and not args.nuts:
        args.fisher = True
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    fn, h = _setup(args)
    result = {}
    if args.fisher:
        result["fisher"] = fisher(fn, h, args)
    if args.nuts:
        result["nuts"] = nuts(fn, h, args, out_dir)
    (out_dir / "fisher.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / 'fisher.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
