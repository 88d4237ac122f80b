#!/usr/bin/env python
"""Gradient-based inference with the exact P(k) derivatives: a Fisher forecast and NUTS (numpyro).

    python scripts/infer.py --config configs/lcdm.yaml --fisher
    python scripts/infer.py --config lcdm --nuts 200 --params omega_cdm,h,ln10^{10}A_s
    python scripts/infer.py --config lcdm_massless --quick --nuts 150 --warmup 60 \\
        --params omega_cdm,h,ln10^{10}A_s --noiseless      # CPU demo, ~5 min on 2 cores

The data model is a mock galaxy-survey measurement of the linear matter power spectrum: P_m(k, z)
at the config's redshifts on log-spaced k bins (``--kmin``/``--kmax`` in h/Mpc), with the Gaussian
band-power covariance of a survey of volume V and number density n̄ (Feldman, Kaiser & Peacock
1994; Tegmark 1997):

    σ_P(k) = (P(k) + 1/n̄) · sqrt(2 / N_k),   N_k = V k² Δk / (2π²)  modes in a bin of width Δk,

plus independent Gaussian priors of Planck-2018-like widths on the parameters the linear P(k)
alone hardly constrains (τ_reio, and optionally any other; ``PRIORS``). The Fisher matrix is
F = Jᵀ C⁻¹ J + prior, J = ∂P/∂θ from ONE forward-sensitivity solve (boltzmann.gradients) — the
same derivatives CLASS/CAMB users get from noisy finite differences at 2·len(θ) extra runs.

NUTS (``--nuts N``) samples the posterior of mock data generated at the fiducial (a seeded noise
realisation, or the noiseless fiducial P with ``--noiseless``) with the same likelihood. The
Boltzmann model is NOT traced into numpyro's jitted sampler: its value-and-Jacobian is compiled
once as its own program (``boltzmann.likelihood.PowerSpectrumModel``) and the potential calls it
through ``jax.pure_callback`` with a ``custom_jvp`` (exact ∂P/∂θ, chain rule by JAX), so each
gradient is one call of the precompiled joint solve and numpyro's own compile stays small.
The sampler works in Fisher-whitened coordinates u = L⁻¹(θ − θ_fid) (L Lᵀ = F⁻¹: the Fisher
covariance is the mass matrix, not adapted further); warm-up adapts the step size only.
Priors: flat in the box ``FLAT`` for every parameter, times a Gaussian (``PRIORS`` width, centred
on the fiducial) for those in ``--priors``.

``--bao desi_dr2`` multiplies in the DESI DR2 BAO likelihood (``boltzmann.bao``: D_M/r_d, D_H/r_d
and D_V/r_d at the published effective redshifts with their covariance; real measurements, not
mock). It is a JAX function of θ through the differentiable background and thermodynamics, so it
is traced into numpyro's program directly (no callback; its reverse-mode gradient runs one
forward sweep). Its Fisher matrix Jᵀ C⁻¹ J (J: the BAO model vector's Jacobian) at the fiducial
is added to the survey's, and its score to the linear-Gaussian prediction of the posterior mean. The data pull away from the fiducial, so "recovered within 2 sd" is not expected
of it; ``deviation_from_linear_prediction_in_sd`` is the check.

Outputs (``--out DIR``, default output/infer): fisher.json (F, covariance, marginal σ, correlation;
with --nuts also the run's timings, posterior summary and diagnostics), and with --nuts
samples.npz and corner.png (samples, Fisher 1σ/2σ ellipses on the posterior mean, fiducial).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("JAX_ENABLE_X64", "1")

#: Gaussian prior widths (1σ) — Planck 2018 TT,TE,EE+lowE+lensing-like, used only where requested
#: (τ_reio always: P(k) barely depends on it). Values: Planck 2018 VI (arXiv:1807.06209) Table 2.
PRIORS = {"tau_reio": 0.0073, "omega_b": 0.00015, "n_s": 0.0042, "ln10^{10}A_s": 0.014,
          "h": 0.0054, "omega_cdm": 0.0012, "m_ncdm": 0.1, "N_ur": 0.2, "w0_fld": 0.5,
          "wa_fld": 1.0}

#: flat prior ranges for NUTS: wide compared with the mock survey's errors, inside the range where
#: the solver and recombination are valid (A_s, n_s never reach the solve: wider)
FLAT = {"h": (0.55, 0.80), "omega_b": (0.015, 0.030), "omega_cdm": (0.08, 0.16),
        "ln10^{10}A_s": (2.0, 4.0), "A_s": (0.7e-9, 5.5e-9), "n_s": (0.6, 1.3),
        "tau_reio": (0.02, 0.12), "m_ncdm": (0.01, 0.6), "N_ur": (1.0, 5.0),
        "w0_fld": (-1.5, -0.5), "wa_fld": (-1.5, 1.5), "YHe": (0.2, 0.3), "T_cmb": (2.6, 2.8)}

#: --quick: a CPU preset (ℓmax γ/pol/ur/ncdm 8/6/8/8, 3 momentum nodes, a 1000-node background/thermodynamics
#: table, rtol 1e-4, ≤ 8 k bins, one k-chunk); the mock data come from the same model, so the
#: reduced accuracy does not bias the inference (docs/inference.md)
QUICK_PRECISION = dict(l_max_g=8, l_max_pol_g=6, l_max_ur=8, l_max_ncdm=8, n_q_ncdm=3,
                       rtol=1e-4, bg_n_lna=1000)
QUICK_NK = 8


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
                   help="NUTS max tree depth (default 6; 2 with --quick)")
    p.add_argument("--noiseless", action="store_true",
                   help="mock data = the fiducial P exactly (default: a --seed noise realisation)")
    p.add_argument("--volume", type=float, default=4.0, help="survey volume [Gpc^3/h^3]")
    p.add_argument("--nbar", type=float, default=3e-4, help="number density [h^3/Mpc^3]")
    p.add_argument("--kmin", type=float, default=0.01, help="smallest k [h/Mpc]")
    p.add_argument("--kmax", type=float, default=0.2, help="largest k [h/Mpc]")
    p.add_argument("--nk", type=int, default=24, help="number of k bins")
    p.add_argument("--priors", default="tau_reio",
                   help="comma-separated parameters that get the PRIORS width (default tau_reio)")
    p.add_argument("--quick", action="store_true",
                   help="CPU preset: ℓmax 8/6/8/8, 3 momentum nodes, 1000 table nodes, rtol 1e-4, "
                        f"≤ {QUICK_NK} k bins, one k-chunk")
    p.add_argument("--bao", choices=("desi_dr2",), default=None,
                   help="add a BAO likelihood: desi_dr2 = the DESI DR2 D_M/r_d, D_H/r_d, D_V/r_d "
                        "measurements with their covariance (boltzmann.bao; real data, not mock)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise realisation and NUTS")
    p.add_argument("--progress", type=int, default=100, metavar="N",
                   help="NUTS: print a line every N gradient solves (0: never)")
    p.add_argument("--jax-cache", default=None, metavar="DIR",
                   help="JAX persistent compilation cache: a repeated run skips the Jacobian "
                        "program's compile")
    p.add_argument("--out", default="output/infer", help="output directory")
    return p


def _names(text):
    return tuple(s.strip() for s in text.split(",") if s.strip())


def validate_args(parser, args):
    """Argument checks that need no model (parser.error: exit status 2 and a clear message)."""
    from boltzmann.theta import parse_name as _parse_name
    from boltzmann.params import ConfigError

    if args.nuts < 0:
        parser.error(f"--nuts must be ≥ 0 (number of samples), got {args.nuts}")
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup must be ≥ 0, got {args.warmup}")
    if args.max_tree_depth is not None and args.max_tree_depth < 1:
        parser.error(f"--max-tree-depth must be ≥ 1, got {args.max_tree_depth}")
    if args.progress < 0:
        parser.error(f"--progress must be ≥ 0, got {args.progress}")
    if args.nk < 2:
        parser.error(f"--nk must be ≥ 2, got {args.nk}")
    if not 0 < args.kmin < args.kmax:
        parser.error(f"need 0 < --kmin < --kmax, got {args.kmin:g}, {args.kmax:g}")
    if not args.volume > 0 or not args.nbar > 0:
        parser.error(f"--volume and --nbar must be > 0, got {args.volume:g}, {args.nbar:g}")
    if args.params is not None:
        names = _names(args.params)
        if not names:
            parser.error("--params is empty")
        for name in names:
            try:
                _parse_name(name)
            except ConfigError as exc:
                parser.error(str(exc).replace("gradients: ", "--params: "))
        if len(set(names)) != len(names):
            parser.error(f"--params: repeated names in {','.join(names)}")
        if "A_s" in names and "ln10^{10}A_s" in names:
            parser.error("--params: give A_s or ln10^{10}A_s, not both")
    for name in _names(args.priors):
        if name not in PRIORS:
            parser.error(f"--priors: no prior width for {name!r}; known: {', '.join(PRIORS)}")


def _setup(args):
    from boltzmann.cli import resolve_config_path
    from boltzmann.gradients import available_parameters
    from boltzmann.likelihood import PowerSpectrumModel
    from boltzmann.params import load_config

    import yaml
    path = resolve_config_path(args.config)
    raw = yaml.safe_load(Path(path).read_text())
    kw = {}
    if args.quick:
        raw.setdefault("precision", {}).update(QUICK_PRECISION)
        args.nk = min(args.nk, QUICK_NK)
        kw["n_chunks"] = 1
    config = load_config(raw)
    cosmo = config.cosmology
    if args.params:
        names = _names(args.params)
    else:
        names = available_parameters(cosmo)
    h = float(cosmo.h)
    k = np.geomspace(args.kmin, args.kmax, args.nk) * h                      # 1/Mpc
    model = PowerSpectrumModel(config, names, k, **kw)
    return model, h, config


class BaoTerm:
    """``--bao``: the BAO likelihood as JAX functions of the inference parameters (background and
    thermodynamics only, differentiable): ``loglike`` (θ ↦ ln L, reverse mode by one forward
    sweep, traced into numpyro's program) and ``fisher_terms`` at a θ."""

    def __init__(self, name, config, parameters):
        from boltzmann.bao import desi_dr2, theory_function
        from solver import grad_by_forward_mode

        self.name = name
        self.data = {"desi_dr2": desi_dr2}[name]()
        self.theory, _ = theory_function(config, tuple(parameters), self.data)
        self.inv_cov = np.asarray(self.data.inv_cov)
        inv_cov, mean, theory = self.inv_cov, self.data.mean, self.theory

        def loglike(theta):
            r = theory(theta) - mean
            return -0.5 * r @ inv_cov @ r

        self.loglike = grad_by_forward_mode(loglike)

    def __call__(self, theta):
        return self.loglike(theta)

    def fisher_terms(self, theta):
        """(ln L, score ∂ln L/∂θ, Fisher Jᵀ C⁻¹ J) at θ, J = ∂(model vector)/∂θ."""
        import jax
        import jax.numpy as jnp

        th = jnp.asarray(theta, jnp.float64)
        model, J = jax.jit(lambda t: (self.theory(t), jax.jacfwd(self.theory)(t)))(th)
        model, J = np.asarray(model), np.asarray(J)
        r = self.data.mean - model
        return float(-0.5 * r @ self.inv_cov @ r), J.T @ self.inv_cov @ r, J.T @ self.inv_cov @ J


def bao_term(args, config, parameters):
    """The ``--bao`` likelihood (``BaoTerm``) or None."""
    return BaoTerm(args.bao, config, parameters) if args.bao else None


def _noise(model, h, P, args):
    """σ_P per (z, k) for the mock survey."""
    lnk = np.log(model.k)
    dlnk = np.gradient(lnk)
    volume = args.volume * 1e9 / h**3                       # Mpc^3
    nbar = args.nbar * h**3                                 # 1/Mpc^3
    n_modes = volume * model.k**3 * dlnk / (2 * math.pi**2)
    return (P + 1.0 / nbar) * np.sqrt(2.0 / n_modes)


def _prior_names(args, parameters):
    return [n for n in _names(args.priors) if n in parameters]


def fisher(model, h, args, P=None, J=None, seconds=None, bao=None):
    """The Fisher matrix of the mock P(k) survey (+ the Gaussian priors asked for, + with ``bao``
    (a ``BaoTerm``) the BAO data's Jᵀ C⁻¹ J at the fiducial) and what follows from it."""
    t0 = time.perf_counter()
    if P is None:
        P, J = model(model.theta0)
    wall = time.perf_counter() - t0 if seconds is None else seconds
    if not (np.all(np.isfinite(P)) and np.all(np.isfinite(J))):
        raise SystemExit("infer: the Jacobian solve failed (non-finite P or ∂P/∂θ)")
    sigma = _noise(model, h, P, args)
    Jw = (J / sigma[..., None]).reshape(-1, J.shape[-1])
    F = Jw.T @ Jw
    prior_names = _prior_names(args, model.parameters)
    for name in prior_names:
        i = model.parameters.index(name)
        F[i, i] += 1.0 / PRIORS[name] ** 2
    bao_info = None
    if bao is not None:
        lnl_bao, g_bao, F_bao = bao.fisher_terms(model.theta0)
        F = F + F_bao
        bao_info = {"data": bao.name, "reference": bao.data.name,
                    "loglike_at_fiducial": lnl_bao, "gradient_at_fiducial": g_bao.tolist(),
                    "fisher": F_bao.tolist()}
    cov = np.linalg.inv(F)
    err = np.sqrt(np.diag(cov))
    corr = cov / np.outer(err, err)
    print(f"Fisher forecast: V = {args.volume:g} Gpc^3/h^3, nbar = {args.nbar:g} h^3/Mpc^3, "
          f"{args.kmin:g} < k < {args.kmax:g} h/Mpc ({len(model.k)} bins), z = {model.z}, "
          f"priors on {prior_names}" + (f", + {args.bao} BAO" if bao is not None else ""))
    print(f"Jacobian (exact, {len(model.parameters)} parameters, "
          f"{len(model.solve_parameters)} solve directions): {wall:.1f} s (first call: "
          "includes compilation)")
    for name, th, e in zip(model.parameters, model.theta0, err):
        print(f"  {name:>14s} = {th:.6g} ± {e:.3g}")
    return {"parameters": list(model.parameters), "fiducial": [float(x) for x in model.theta0],
            "fisher": F.tolist(), "covariance": cov.tolist(), "sigma": err.tolist(),
            "correlation": corr.tolist(), "jacobian_seconds": wall,
            "survey": {"volume_Gpc3_h3": args.volume, "nbar_h3_Mpc3": args.nbar,
                       "k_h_Mpc": (model.k / h).tolist(), "z": model.z},
            "priors": {n: PRIORS[n] for n in prior_names}, "bao": bao_info}


def nuts(model, h, args, out_dir, fisher_result, P0, bao=None):
    """NUTS over the mock P(k) likelihood (+ ``bao``: a ``BaoTerm``, traced into the sampler's
    program). A failed solve makes the potential +inf at that θ (the trajectory is rejected),
    never a crash."""
    try:
        import numpyro
        import numpyro.distributions as dist
        from numpyro.diagnostics import summary
        from numpyro.infer import MCMC, NUTS, init_to_value
    except ImportError as exc:
        raise SystemExit("infer: --nuts needs numpyro (pip install -e '.[infer]')") from exc
    import jax
    import jax.numpy as jnp

    from boltzmann.likelihood import CachedJacobian, callback_function

    names = model.parameters
    n = len(names)
    theta0 = model.theta0
    sigma = _noise(model, h, P0, args)
    rng = np.random.default_rng(args.seed)
    data = P0 if args.noiseless else P0 + sigma * rng.standard_normal(P0.shape)
    prior_names = _prior_names(args, names)
    box = [FLAT.get(n_.split("[")[0]) for n_ in names]          # m_ncdm[i] -> m_ncdm's range
    if None in box:
        raise SystemExit(f"infer: no flat prior range for {names[box.index(None)]!r} (FLAT)")
    lo, hi = np.array(box, np.float64).T
    if np.any(theta0 <= lo) or np.any(theta0 >= hi):
        raise SystemExit(f"infer: fiducial {dict(zip(names, theta0))} outside the flat prior "
                         f"ranges {FLAT}")
    cov_F = np.asarray(fisher_result["covariance"])
    L = np.linalg.cholesky(cov_F)
    sigma_F = np.sqrt(np.diag(cov_F))

    # the model outside numpyro's program: θ -> P through pure_callback, exact Jacobian
    t_start, count, failed = time.perf_counter(), [0], []

    def host(theta):
        P, J = model(theta)
        count[0] += 1
        if args.progress and count[0] % args.progress == 0:
            print(f"  ... {count[0]} gradient solves, {time.perf_counter() - t_start:.0f} s",
                  flush=True)
        P, J = np.asarray(P, np.float64), np.asarray(J, np.float64)
        if not (np.all(np.isfinite(P)) and np.all(np.isfinite(J))):
            # a failed solve: NaN values (the potential turns them into -inf log density) and
            # a zero Jacobian (so no NaN reaches the gradient through the masked branch)
            failed.append(np.asarray(theta, np.float64).tolist())
            return np.full(model.out_shape, np.nan), np.zeros(model.out_shape + (n,))
        return P, J

    cached = CachedJacobian(host, model.out_shape, n)
    pk = callback_function(cached)
    cached(theta0)                                          # warm: the program is compiled
    jdata, jsigma = jnp.asarray(data), jnp.asarray(sigma)
    jtheta0, jL = jnp.asarray(theta0), jnp.asarray(L)
    jlo, jhi = jnp.asarray(lo), jnp.asarray(hi)
    prior_idx = np.array([names.index(p) for p in prior_names], int)
    prior_w = np.array([PRIORS[p] for p in prior_names])

    def numpyro_model():
        u = numpyro.sample("u", dist.ImproperUniform(dist.constraints.real_vector, (), (n,)))
        theta = jtheta0 + jL @ u
        inside = jnp.all((theta > jlo) & (theta < jhi))
        numpyro.factor("flat_prior", jnp.where(inside, 0.0, -jnp.inf))
        if prior_idx.size:
            r = (theta[prior_idx] - jtheta0[prior_idx]) / prior_w
            numpyro.factor("gaussian_prior", -0.5 * jnp.sum(r * r))
        # the solve only ever sees θ inside the box (outside, the potential is +inf anyway)
        P = pk(jnp.clip(theta, jlo, jhi))
        # where the solve failed the log density is -inf: NUTS rejects the point as a
        # divergence and goes on (no NaN reaches the sampler's arithmetic)
        ok = jnp.all(jnp.isfinite(P))
        numpyro.factor("failed_solve", jnp.where(ok, 0.0, -jnp.inf))
        numpyro.sample("P", dist.Normal(jnp.where(ok, P, jdata), jsigma), obs=jdata)
        if bao is not None:
            numpyro.factor("bao", bao(jnp.clip(theta, jlo, jhi)))

    warmup = args.warmup if args.warmup is not None else max(args.nuts // 2, 10)
    depth = args.max_tree_depth or (2 if args.quick else 6)
    # start away from the fiducial: a seeded draw of 2 Fisher σ per whitened direction
    u_init = 2.0 * np.random.default_rng(args.seed + 1).standard_normal(n)
    theta_init = np.clip(theta0 + L @ u_init, lo, hi)
    if not (np.all((theta_init > lo) & (theta_init < hi))
            and np.all(np.isfinite(cached(theta_init)[0]))):
        print("  the start point's solve failed or left the prior box: starting at the fiducial")
        u_init = np.zeros(n)
    kernel = NUTS(numpyro_model, init_strategy=init_to_value(values={"u": jnp.asarray(u_init)}),
                  max_tree_depth=depth, adapt_mass_matrix=False, dense_mass=False)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=args.nuts, progress_bar=False)
    fields = ("num_steps", "diverging", "accept_prob")
    t0 = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(args.seed), collect_warmup=True, extra_fields=fields)
    t1 = time.perf_counter()
    warm_extra = {k: np.asarray(v) for k, v in mcmc.get_extra_fields().items()}
    mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=fields)
    t2 = time.perf_counter()
    extra = {k: np.asarray(v) for k, v in mcmc.get_extra_fields().items()}
    u = np.asarray(mcmc.get_samples()["u"])                              # (N, n)
    theta = theta0 + u @ L.T
    st_w, st_s = cached.stats(t0), cached.stats(t1)
    st_w = {"solves": st_w["solves"] - st_s["solves"],
            "solve_seconds": st_w["solve_seconds"] - st_s["solve_seconds"]}
    grads = st_w["solves"] + st_s["solves"]
    per_grad = (st_w["solve_seconds"] + st_s["solve_seconds"]) / max(grads, 1)
    diag = summary({"theta": theta[None]}, group_by_chain=True)["theta"]
    mean, sd = theta.mean(0), theta.std(0, ddof=1)
    dev = (mean - theta0) / sd
    # linear-Gaussian expectation of the posterior mean for this data: θ0 + F⁻¹ Jᵀ C⁻¹ (d − P0)
    _, J0 = cached(theta0)
    r = ((data - P0) / sigma**2)[..., None] * J0
    score = r.reshape(-1, n).sum(0)
    if bao is not None:     # BAO's pull from the fiducial: its score at θ0
        score = score + np.asarray(fisher_result["bao"]["gradient_at_fiducial"])
    mean_lin = theta0 + cov_F @ score
    recovered = bool(np.all(np.abs(dev) <= 2.0))
    res = {
        "data": "noiseless fiducial" if args.noiseless else f"noise realisation, seed {args.seed}",
        "warmup": warmup, "samples": args.nuts, "max_tree_depth": depth,
        "seconds": {"warmup": t1 - t0, "sampling": t2 - t1,
                    "warmup_solves": st_w["solve_seconds"], "sampling_solves": st_s["solve_seconds"],
                    "warmup_other": t1 - t0 - st_w["solve_seconds"],
                    "sampling_other": t2 - t1 - st_s["solve_seconds"]},
        "gradient_evaluations": {"warmup": st_w["solves"], "sampling": st_s["solves"],
                                 "seconds_each": per_grad, "cache_hits": cached.n_hits},
        "leapfrog_steps": {"warmup": int(warm_extra["num_steps"].sum()),
                           "sampling": int(extra["num_steps"].sum())},
        "divergences": {"warmup": int(warm_extra["diverging"].sum()),
                        "sampling": int(extra["diverging"].sum())},
        "mean_accept_prob": float(extra["accept_prob"].mean()),
        "failed_solves": len(failed), "failed_theta": failed[:20],
        "step_size": float(mcmc.last_state.adapt_state.step_size),
        "init_theta": (theta0 + L @ u_init).tolist(),
        "parameters": list(names), "fiducial": theta0.tolist(),
        "mean": mean.tolist(), "sd": sd.tolist(), "deviation_in_sd": dev.tolist(),
        "linear_prediction_of_mean": mean_lin.tolist(),
        "deviation_from_linear_prediction_in_sd": ((mean - mean_lin) / sd).tolist(),
        "fisher_sigma": sigma_F.tolist(), "sd_over_fisher_sigma": (sd / sigma_F).tolist(),
        "n_eff": np.asarray(diag["n_eff"]).tolist(), "r_hat": np.asarray(diag["r_hat"]).tolist(),
        "recovered_within_2sd": recovered,
    }
    print(f"NUTS ({res['data']}): {warmup} warm-up + {args.nuts} samples, max tree depth {depth}, "
          f"step size {res['step_size']:.3g} (whitened), accept {res['mean_accept_prob']:.2f}")
    print(f"  warm-up {t1 - t0:.1f} s ({st_w['solves']} gradients, "
          f"{st_w['solve_seconds']:.1f} s in solves, {res['seconds']['warmup_other']:.1f} s other "
          f"incl. numpyro's compile); sampling {t2 - t1:.1f} s ({st_s['solves']} gradients, "
          f"{st_s['solve_seconds']:.1f} s in solves); {per_grad:.2f} s per gradient")
    print(f"  divergences: {res['divergences']['warmup']} in warm-up, "
          f"{res['divergences']['sampling']} in sampling; failed solves (rejected, -inf log "
          f"density): {len(failed)}")
    print(f"  {'':>14s}  {'fiducial':>10s} {'mean':>10s} {'sd':>9s} {'(m-f)/sd':>8s} "
          f"{'sd/σ_F':>7s} {'lin.mean':>10s} {'n_eff':>6s} {'r_hat':>6s}")
    for i, name in enumerate(names):
        print(f"  {name:>14s}  {theta0[i]:10.5g} {mean[i]:10.5g} {sd[i]:9.3g} {dev[i]:8.2f} "
              f"{sd[i] / sigma_F[i]:7.2f} {mean_lin[i]:10.5g} {res['n_eff'][i]:6.0f} "
              f"{res['r_hat'][i]:6.3f}")
    print(f"  recovered within 2 sd: {recovered}")
    np.savez(out_dir / "samples.npz", parameters=np.array(names), theta=theta,
             **{f"extra_{k}": v for k, v in extra.items()})
    corner_plot(names, theta, theta0, cov_F, out_dir / "corner.png",
                title=f"NUTS {args.nuts} samples ({res['data']}) vs Fisher")
    return res


#: Δχ² of the 68.3% / 95.4% regions of a 2-d Gaussian
_DCHI2_2D = (2.30, 6.18)
_LABELS = {"omega_cdm": r"$\omega_{\rm cdm}$", "omega_b": r"$\omega_{\rm b}$", "h": "$h$",
           "ln10^{10}A_s": r"$\ln 10^{10}A_s$", "A_s": "$A_s$", "n_s": "$n_s$",
           "tau_reio": r"$\tau_{\rm reio}$", "m_ncdm": r"$m_\nu$ [eV]", "N_ur": r"$N_{\rm ur}$",
           "w0_fld": "$w_0$", "wa_fld": "$w_a$"}


def corner_plot(names, samples, theta0, cov, path, title=""):
    """Pairwise scatter of the samples and 1-d histograms, with the Fisher 1σ/2σ ellipses (and
    Gaussian) centred on the sample mean — the Fisher prediction of the posterior's shape — and
    the fiducial marked (red)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(names)
    sig = np.sqrt(np.diag(cov))
    mean = samples.mean(0)
    lo = np.minimum(mean, theta0) - 3.5 * sig
    hi = np.maximum(mean, theta0) + 3.5 * sig
    fig, axes = plt.subplots(n, n, figsize=(2.2 * n + 0.5, 2.2 * n + 0.5), squeeze=False)
    t = np.linspace(0, 2 * np.pi, 200)
    circle = np.stack([np.cos(t), np.sin(t)])
    for i in range(n):
        for j in range(n):
            ax = axes[i, j]
            if j > i:
                ax.set_visible(False)
                continue
            if i == j:
                ax.hist(samples[:, i], bins=18, range=(lo[i], hi[i]), density=True,
                        color="0.65", label="NUTS")
                x = np.linspace(lo[i], hi[i], 200)
                ax.plot(x, np.exp(-0.5 * ((x - mean[i]) / sig[i]) ** 2)
                        / (sig[i] * np.sqrt(2 * np.pi)), "C0", label="Fisher")
                ax.axvline(theta0[i], color="C3", lw=1.2, label="fiducial")
                ax.set_yticks([])
            else:
                ax.plot(samples[:, j], samples[:, i], ".", ms=2.5, color="0.35", alpha=0.7)
                Lc = np.linalg.cholesky(cov[np.ix_([j, i], [j, i])])
                for dchi2, ls in zip(_DCHI2_2D, ("-", "--")):
                    e = np.sqrt(dchi2) * Lc @ circle
                    ax.plot(mean[j] + e[0], mean[i] + e[1], "C0", ls=ls, lw=1.2)
                ax.plot(theta0[j], theta0[i], "+", color="C3", ms=11, mew=1.8)
                ax.set_ylim(lo[i], hi[i])
            ax.set_xlim(lo[j], hi[j])
            ax.tick_params(labelsize=7)
            ax.locator_params(nbins=4)
            if i == n - 1:
                ax.set_xlabel(_LABELS.get(names[j], names[j]), fontsize=10)
            else:
                ax.set_xticklabels([])
            if j == 0 and i > 0:
                ax.set_ylabel(_LABELS.get(names[i], names[i]), fontsize=10)
            elif j > 0:
                ax.set_yticklabels([])
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, frameon=False,
               bbox_to_anchor=(0.95, 0.9))
    fig.suptitle(title + "\nFisher 1σ/2σ (solid/dashed) centred on the posterior mean; "
                 "fiducial in red", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    validate_args(parser, args)
    if not args.fisher and not args.nuts:
        args.fisher = True
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.jax_cache:
        import jax
        jax.config.update("jax_compilation_cache_dir", str(Path(args.jax_cache).resolve()))
    t0 = time.perf_counter()
    model, h, config = _setup(args)
    bao = bao_term(args, config, model.parameters)
    t_setup = time.perf_counter() - t0
    # one Jacobian solve at the fiducial (compiles the program): Fisher, mock data, NUTS
    t0 = time.perf_counter()
    P0, J0 = model(model.theta0)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    model(model.theta0 * (1 + 1e-4))
    t_second = time.perf_counter() - t0
    print(f"model: setup {t_setup:.1f} s, first Jacobian solve (incl. compile) {t_first:.1f} s, "
          f"second {t_second:.2f} s")
    result = {"timing": {"setup": t_setup, "first_jacobian": t_first,
                         "second_jacobian": t_second}}
    result["fisher"] = fisher(model, h, args, P0, J0, seconds=t_first, bao=bao)
    if args.nuts:
        result["nuts"] = nuts(model, h, args, out_dir, result["fisher"], P0, bao=bao)
    (out_dir / "fisher.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / 'fisher.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
