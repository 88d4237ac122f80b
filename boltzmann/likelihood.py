"""A precompiled model with an exact Jacobian, called from JAX programs through a host callback.

Why: a sampler such as numpyro's NUTS jits its whole loop (``lax.while_loop`` over trajectories
and tree doublings).  Tracing the Boltzmann solve's joint [y, S] Jacobian into that program makes
one enormous XLA program — on the 2-core dev machine numpyro's compile of it did not finish in 11
minutes (docs/inference.md).  Here the model stays outside: its value-and-Jacobian is compiled
ONCE as its own jitted function (``PowerSpectrumFunction.jacobian``: values and ∂P/∂θ from one
joint solve), and the sampler's program only contains a ``jax.pure_callback`` to it.

``CachedJacobian(value_and_jacobian, ...)`` wraps a host function θ ↦ (y, ∂y/∂θ) with a small
θ-keyed cache and counters; ``callback_function(cached)`` turns it into a JAX function θ ↦ y that
can be jitted, used inside ``lax.while_loop`` (numpyro), and differentiated:

* primal: ``pure_callback`` returning y (one solve, or a cache hit);
* ``custom_jvp`` rule: one ``pure_callback`` returning (y, J) — the same cached solve — and the
  tangent J·θ̇.  The tangent is linear in θ̇ with J a residual, so JAX transposes it for reverse
  mode: ``jax.grad`` of any JAX function of y gets the exact chain rule
  ∂L/∂θ = (∂L/∂y)·(∂y/∂θ) at the cost of one Jacobian solve.  ``jvp``/``jacfwd`` work too.

A value request followed by a gradient request at the same θ solves once (the cache stores the
Jacobian with the value).  No second derivatives (J is treated as a constant of θ̇'s transpose,
and its own derivative is not defined).  ``vmap`` of the callback (numpyro's vectorised chains,
an ensemble of walkers) hands the host ONE batch of θ's when the CachedJacobian has a batched
host function (``batched=``: ``PowerSpectrumModel.many``, one joint solve for all of them via
``boltzmann.gradients_batch``); without one the θ's are solved one after another.

``PowerSpectrumModel(config, parameters, k)`` is the host function for P_m(k, z) (one compiled
``PowerSpectrumFunction`` Jacobian program; A_s and n_s analytic) and ``.callback()`` the JAX
function of it; ``gaussian_loglike(model, data, sigma)`` is the independent-Gaussian
log-likelihood of data with errors σ used by scripts/infer.py and tests/test_infer.py.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


__all__ = ["CachedJacobian", "callback_function", "PowerSpectrumModel", "PRIMORDIAL",
           "gaussian_loglike"]


class CachedJacobian:
    """Host-side θ ↦ (y, ∂y/∂θ) with an LRU cache keyed by θ's bytes, and cost counters.

    ``value_and_jacobian(theta: np.ndarray) -> (y, jac)`` with ``y.shape == out_shape`` and
    ``jac.shape == out_shape + (n_theta,)``; any array types (converted to float64 numpy).
    Counters: ``n_solves`` (cache misses), ``n_hits``, ``seconds`` (wall time in solves), and
    ``log``: one (start time, seconds) per solve, for splitting a run into phases.
    """

    def __init__(self, value_and_jacobian: Callable, out_shape, n_theta: int,
                 cache_size: int = 16, batched: Callable | None = None):
        self._fun = value_and_jacobian
        #: optional thetas (B, n_theta) ↦ (ys (B, *out_shape), jacs (B, *out_shape, n_theta)):
        #: what ``many`` calls for the θ's it does not hold
        self.batched = batched
        self.n_batched_calls = 0
        self.out_shape = tuple(int(s) for s in out_shape)
        self.n_theta = int(n_theta)
        self.cache_size = int(cache_size)
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self.n_solves = 0
        self.n_hits = 0
        self.seconds = 0.0
        self.log: list[tuple[float, float]] = []

    def __call__(self, theta):
        theta = np.ascontiguousarray(np.asarray(theta, np.float64))
        if theta.shape != (self.n_theta,):
            raise ValueError(f"likelihood: θ must have shape ({self.n_theta},), got {theta.shape}")
        key = theta.tobytes()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.n_hits += 1
            return hit
        t0 = time.perf_counter()
        y, jac = self._fun(theta)
        y = np.asarray(y, np.float64).reshape(self.out_shape)
        jac = np.asarray(jac, np.float64).reshape(self.out_shape + (self.n_theta,))
        dt = time.perf_counter() - t0
        self.n_solves += 1
        self.seconds += dt
        self.log.append((t0, dt))
        self._cache[key] = (y, jac)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return y, jac

    def many(self, thetas):
        """(ys (B, *out_shape), jacs (B, *out_shape, n_theta)) for thetas (B, n_theta): cached
        rows from the cache, the others in one ``batched`` call (or one by one without it)."""
        thetas = np.ascontiguousarray(np.asarray(thetas, np.float64))
        if thetas.ndim != 2 or thetas.shape[1] != self.n_theta:
            raise ValueError(f"likelihood: θ's must have shape (B, {self.n_theta}), got "
                             f"{thetas.shape}")
        keys = [t.tobytes() for t in thetas]
        missing = [i for i, key in enumerate(keys) if key not in self._cache]
        # a θ repeated in the batch is solved once
        first = list({keys[i]: i for i in reversed(missing)}.values())
        if first and self.batched is not None and len(first) > 1:
            t0 = time.perf_counter()
            ys, jacs = self.batched(thetas[first])
            ys = np.asarray(ys, np.float64).reshape((len(first),) + self.out_shape)
            jacs = np.asarray(jacs, np.float64).reshape(
                (len(first),) + self.out_shape + (self.n_theta,))
            dt = time.perf_counter() - t0
            self.n_solves += len(first)
            self.n_batched_calls += 1
            self.seconds += dt
            self.log.append((t0, dt))
            for j, i in enumerate(first):
                self._cache[keys[i]] = (ys[j], jacs[j])
            while len(self._cache) > max(self.cache_size, len(first)):
                self._cache.popitem(last=False)
        rows = [self(t) for t in thetas]       # hits now, or single solves without ``batched``
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def stats(self, since: float | None = None) -> dict:
        """Solves, cache hits, solve seconds (only solves started after ``since`` if given)."""
        log = self.log if since is None else [e for e in self.log if e[0] >= since]
        return {"solves": len(log), "solve_seconds": float(sum(dt for _, dt in log))}


def callback_function(cached: CachedJacobian) -> Callable:
    """The JAX function θ ↦ y of a :class:`CachedJacobian`, differentiable by its exact J."""
    y_spec = jax.ShapeDtypeStruct(cached.out_shape, jnp.float64)
    j_spec = jax.ShapeDtypeStruct(cached.out_shape + (cached.n_theta,), jnp.float64)

    # JAX runs host callbacks with the default device set to the CPU device, which is part of
    # the jit cache key: a jitted model called from the callback as is would be traced and
    # compiled a second time (measured: 60-100 s on the CPU for the Boltzmann Jacobian). The
    # callback therefore restores the default-device setting that was current here.
    device = jax.config.jax_default_device

    def _both(theta):
        theta = np.asarray(theta, np.float64)
        with jax.default_device(device):
            if theta.ndim == 1:
                return cached(theta)
            # under vmap ("expand_dims"): leading batch axes, one host call for all of them
            lead = theta.shape[:-1]
            ys, jacs = cached.many(theta.reshape(-1, theta.shape[-1]))
            return ys.reshape(lead + ys.shape[1:]), jacs.reshape(lead + jacs.shape[1:])

    def _value(theta):
        return _both(theta)[0]

    # a batched host function gets vmapped θ's in one call; otherwise one call per θ
    vmap_method = "expand_dims" if cached.batched is not None else "sequential"

    @jax.custom_jvp
    def f(theta):
        return jax.pure_callback(_value, y_spec, theta, vmap_method=vmap_method)

    @f.defjvp
    def f_jvp(primals, tangents):
        (theta,), (dtheta,) = primals, tangents
        y, jac = jax.pure_callback(_both, (y_spec, j_spec), theta, vmap_method=vmap_method)
        return y, jnp.tensordot(jac, dtheta, axes=1)

    f_jit = jax.jit(f)

    def wrapped(theta):
        theta = jnp.asarray(theta, jnp.float64)
        if theta.shape != (cached.n_theta,):
            raise ValueError(f"likelihood: θ must have shape ({cached.n_theta},), "
                             f"got {theta.shape}")
        return f_jit(theta)

    wrapped.cached = cached
    return wrapped


#: parameters that only enter P through the primordial spectrum A_s (k/k_pivot)^(n_s − 1):
#: their derivatives are analytic (no sensitivity direction in the solve)
PRIMORDIAL = ("ln10^{10}A_s", "A_s", "n_s")


class PowerSpectrumModel:
    """Host-side θ ↦ (P_m (n_z, n_k) [Mpc³], ∂P_m/∂θ) for a config, ONE compiled program.

    ``PowerSpectrumModel(config, parameters, k, **kw)``: ``kw`` goes to
    ``boltzmann.gradients.PowerSpectrumFunction`` (``z``, ``rtol``, ``n_chunks``, …).  The
    transfer functions do not depend on A_s or n_s, and P = 2π²/k³ A_s (k/k_pivot)^(n_s−1) T², so
    ln10^{10}A_s, A_s and n_s are applied here analytically — P(θ) = P_fn(θ_s) ·
    (A_s/A_s⁰) (k/k_pivot)^(n_s−n_s⁰), ∂P/∂ln10^{10}A_s = P, ∂P/∂A_s = P/A_s,
    ∂P/∂n_s = P ln(k/k_pivot) — and only the other parameters θ_s are directions of the joint
    solve (``PowerSpectrumFunction.jacobian``: values and ∂P/∂θ_s from one compiled program).
    With no such parameter the transfer functions are computed once and reused.

    ``theta0``: the fiducial vector (numpy, order ``parameters``); ``model(theta)`` →
    (P, J) as float64 numpy arrays; ``callback()`` → (JAX function θ ↦ P, its CachedJacobian).
    """

    def __init__(self, config, parameters, k, **kw):
        from .gradients import PowerSpectrumFunction   # heavy import only when used

        self.parameters = tuple(parameters)
        if not self.parameters:
            raise ValueError("likelihood: no parameters")
        if "A_s" in self.parameters and "ln10^{10}A_s" in self.parameters:
            raise ValueError("likelihood: give A_s or ln10^{10}A_s, not both")
        self.solve_parameters = tuple(p for p in self.parameters if p not in PRIMORDIAL)
        self._solve_idx = [self.parameters.index(p) for p in self.solve_parameters]
        kw.setdefault("with_sigma8", False)
        # with only primordial parameters the function is built for ω_cdm (never varied) and
        # only its value program is used, once
        self.fn = PowerSpectrumFunction(config, parameters=self.solve_parameters or ("omega_cdm",),
                                        k=k, **kw)
        cosmo = self.fn.cosmo0
        self.k = np.asarray(self.fn.k)
        self.z = list(self.fn.z)
        self.out_shape = (len(self.z), self.k.size)
        self._A_s0 = float(cosmo.A_s)
        self._n_s0 = float(cosmo.n_s)
        self._lnk = np.log(self.k / float(cosmo.k_pivot))
        fid_s = np.asarray(self.fn.theta0, np.float64)
        fiducial = {"ln10^{10}A_s": math.log(1e10 * self._A_s0), "A_s": self._A_s0,
                    "n_s": self._n_s0}
        fiducial.update(zip(self.solve_parameters, fid_s[:len(self.solve_parameters)]))
        self.theta0 = np.array([fiducial[p] for p in self.parameters], np.float64)
        self._fid_s = fid_s
        self._base = None                   # P at the fiducial transfer (no solve parameters)
        self._batch = None                  # PowerSpectrumBatch for ``many``, built on first use

    def __call__(self, theta):
        theta = np.asarray(theta, np.float64)
        if self.solve_parameters:
            val, jac = self.fn.jacobian(theta[self._solve_idx])
            P = np.asarray(val["P_m"], np.float64)
            Js = np.asarray(jac["P_m"], np.float64)
        else:                               # the value program once, no Jacobian program
            P, Js = self._fiducial_transfer(), None
        return self._with_primordial(theta, P, Js)

    def many(self, thetas):
        """(P (B, n_z, n_k), J (B, n_z, n_k, n_θ)) for thetas (B, n_θ): the solve parameters of
        all B in ONE joint solve (``boltzmann.gradients_batch.PowerSpectrumBatch``), the
        primordial ones analytic per row."""
        thetas = np.asarray(thetas, np.float64)
        if self.solve_parameters and getattr(self.fn, "fluid_phases", None):
            # the batched solve has no neutrino-fluid phases: one Jacobian per row instead
            rows = [self(t) for t in thetas]
        elif self.solve_parameters:
            if self._batch is None:
                from .gradients_batch import PowerSpectrumBatch
                self._batch = PowerSpectrumBatch(self.fn)
            val, jac = self._batch.value_and_jacobian(thetas[:, self._solve_idx])
            Ps, Jss = np.asarray(val["P_m"], np.float64), np.asarray(jac["P_m"], np.float64)
            rows = [self._with_primordial(t, P, Js) for t, P, Js in zip(thetas, Ps, Jss)]
        else:
            base = self._fiducial_transfer()
            rows = [self._with_primordial(t, base, None) for t in thetas]
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def _fiducial_transfer(self):
        if self._base is None:
            self._base = np.asarray(self.fn(self._fid_s)["P_m"], np.float64)
        return self._base

    def _with_primordial(self, theta, P, Js):
        """(P, J) at θ from the solve's P and ∂P/∂θ_s (None without solve parameters), with
        A_s and n_s applied analytically."""
        amp = np.ones(())
        tilt = np.ones(self.k.size)
        for i, name in enumerate(self.parameters):
            if name == "ln10^{10}A_s":
                amp = amp * np.exp(theta[i]) * 1e-10 / self._A_s0
            elif name == "A_s":
                amp = amp * theta[i] / self._A_s0
            elif name == "n_s":
                tilt = np.exp((theta[i] - self._n_s0) * self._lnk)
        scale = amp * tilt                                   # broadcasts over (n_z, n_k)
        P = P * scale
        J = np.empty(self.out_shape + (len(self.parameters),))
        if self.solve_parameters:
            J[..., self._solve_idx] = Js * scale[..., None]
        for i, name in enumerate(self.parameters):
            if name == "ln10^{10}A_s":
                J[..., i] = P
            elif name == "A_s":
                J[..., i] = P / theta[i]
            elif name == "n_s":
                J[..., i] = P * self._lnk
        return P, J

    def callback(self, cache_size: int = 16, batched: bool = True):
        """(θ ↦ P_m as a differentiable JAX function via ``pure_callback``, its CachedJacobian);
        ``batched``: a ``jax.vmap`` of it (vectorised chains, walkers) solves its θ's in one
        joint solve (``many``)."""
        cached = CachedJacobian(self, self.out_shape, len(self.parameters), cache_size,
                                batched=self.many if batched else None)
        return callback_function(cached), cached


def gaussian_loglike(model: Callable, data, sigma) -> Callable:
    """θ ↦ Σ −½((data − model(θ))/σ)² − ln(σ√(2π)): independent Gaussian errors σ (fixed)."""
    data = jnp.asarray(data, jnp.float64)
    sigma = jnp.asarray(sigma, jnp.float64)
    const = -jnp.sum(jnp.log(sigma * jnp.sqrt(2.0 * jnp.pi)))

    def loglike(theta):
        r = (data - model(theta)) / sigma
        return const - 0.5 * jnp.sum(r * r)

    return loglike
