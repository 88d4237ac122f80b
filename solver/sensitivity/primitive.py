"""The tangent of the ensemble solve as one linear JAX primitive, and its AD rules.

``sensitivity_tangent_p`` takes operands (y0, params, *args_leaves, ts, t0, te, *tangents), each
tangent with a leading direction axis m, and returns the sensitivities (m, N, n_save, n); its
implementation is the backend's ``solve_sensitivities``. Its static parameters are the
:class:`~solver.problem.SensitivitySpec` (``cfg``) and ``mask`` = (y0 differentiated, params
differentiated, indices of differentiated args leaves).

* Batching (``jax.jacfwd`` = ``vmap`` over tangents): all B requested directions go into ONE
  sensitivity solve -- or, when B exceeds the number K of independent input components per
  trajectory (K = n for y0 + P for params + the size of every differentiated args leaf), the K
  unit-direction sensitivities are computed once and contracted with the tangents (``jacfwd``
  w.r.t. an (N, P) params array asks for N·P directions, but trajectories are independent, so P
  suffice). Batched primals (vmap over ensembles) bind once per batch element.
* Transposition (``grad``/``jacrev``/``vjp``): the primitive is linear in the tangents, so its
  transpose computes the K unit-direction sensitivities (forward mode) and contracts them with
  the cotangent: exact, at the cost of one sensitivity solve with K directions, independent of
  the number of outputs.
* Second derivatives (jvp of the tangent primitive) are not implemented.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

try:  # public home since JAX 0.4.3x
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
    from jax.core import Primitive

__all__ = ["sensitivity_tangent_p"]

sensitivity_tangent_p = Primitive("sensitivity_tangent")


def _split(operands, n_leaves):
    y0, params = operands[0], operands[1]
    leaves = tuple(operands[2:2 + n_leaves])
    ts, t0, te = operands[2 + n_leaves:5 + n_leaves]
    tans = tuple(operands[5 + n_leaves:])
    return y0, params, leaves, ts, t0, te, tans


def _unpack_tangents(mask, tans):
    i = 0
    dy0 = dp = None
    if mask[0]:
        dy0, i = tans[0], 1
    if mask[1]:
        dp, i = tans[i], i + 1
    return dy0, dp, tuple(tans[i:])


def _tangent_impl(*operands, cfg, mask):
    y0, params, leaves, ts, t0, te, tans = _split(operands, len(cfg.leaf_meta))
    dy0, dp, dargs = _unpack_tangents(mask, tans)
    return cfg.backend.solve_sensitivities(cfg, mask, y0, params, leaves, ts, t0, te, dy0, dp,
                                           dargs)


def _tangent_abstract(*avals, cfg, mask):
    y0, _, leaves, ts, _, _, tans = _split(avals, len(cfg.leaf_meta))
    m = tans[0].shape[0]
    return jax.core.ShapedArray((m, y0.shape[0], ts.shape[1], cfg.n), jnp.float64)


sensitivity_tangent_p.def_impl(_tangent_impl)
sensitivity_tangent_p.def_abstract_eval(_tangent_abstract)
mlir.register_lowering(sensitivity_tangent_p,
                       mlir.lower_fun(_tangent_impl, multiple_results=False))


def _n_inputs(cfg, mask):
    """K: independent input components per trajectory among the differentiated inputs."""
    return (cfg.n if mask[0] else 0) + (cfg.P if mask[1] else 0) + \
        sum(cfg.leaf_size[i] for i in mask[2])


def _unit_sensitivities(cfg, mask, res_ops):
    """Sensitivities for the K unit directions: list of blocks, each (k_block, N, ns, n)."""
    y0 = res_ops[0]
    N, n, P = y0.shape[0], cfg.n, cfg.P
    seeds = []
    if mask[0]:
        seeds.append(jnp.broadcast_to(jnp.eye(n)[:, None, :], (n, N, n)))
    if mask[1]:
        seeds.append(jnp.broadcast_to(jnp.eye(P)[:, None, :], (P, N, P)))
    for i in mask[2]:
        size = cfg.leaf_size[i]
        seeds.append(jnp.eye(size).reshape((size,) + cfg.leaf_meta[i][0]))
    K = _n_inputs(cfg, mask)
    # every block gets K directions: block b's seeds sit at its own offset, zeros elsewhere
    full, off = [], 0
    for s in seeds:
        k = s.shape[0]
        pad = [(off, K - off - k)] + [(0, 0)] * (s.ndim - 1)
        full.append(jnp.pad(s, pad))
        off += k
    T = sensitivity_tangent_p.bind(*res_ops, *full, cfg=cfg, mask=mask)   # (K, N, ns, n)
    blocks, off = [], 0
    for s in seeds:
        blocks.append(T[off:off + s.shape[0]])
        off += s.shape[0]
    return blocks


def _contract(cfg, mask, blocks, tans):
    """Σ_blocks T_block · tangent: tans have a leading direction axis m; returns (m, N, ns, n)."""
    out = 0.0
    for T, (kind, tan) in zip(blocks, _tagged(mask, tans)):
        if kind == "y0" or kind == "p":     # per-trajectory components
            out = out + jnp.einsum("kNsi,mNk->mNsi", T, tan)
        else:                                # shared args leaf
            out = out + jnp.einsum("kNsi,mk->mNsi", T, tan.reshape(tan.shape[0], -1))
    return out


def _tagged(mask, tans):
    dy0, dp, dargs = _unpack_tangents(mask, tans)
    out = []
    if dy0 is not None:
        out.append(("y0", dy0))
    if dp is not None:
        out.append(("p", dp))
    out += [("a", d) for d in dargs]
    return out


def _tangent_transpose(ct, *operands, cfg, mask):
    n_res = 5 + len(cfg.leaf_meta)
    res_ops = operands[:n_res]
    lin = operands[n_res:]
    if any(ad.is_undefined_primal(x) for x in res_ops):
        raise ValueError("sensitivity_tangent: residual operands must be known in transposition")
    if type(ct) is ad.Zero:
        return [None] * n_res + [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None
                                 for x in lin]
    blocks = _unit_sensitivities(cfg, mask, res_ops)
    cts = []
    tagged = _tagged(mask, lin)
    for T, (kind, x) in zip(blocks, tagged):
        if kind in ("y0", "p"):
            c = jnp.einsum("kNsi,mNsi->mNk", T, ct)
        else:
            shape = x.aval.shape
            c = jnp.einsum("kNsi,mNsi->mk", T, ct).reshape(shape)
        cts.append(c if ad.is_undefined_primal(x) else None)
    return [None] * n_res + cts


ad.primitive_transposes[sensitivity_tangent_p] = _tangent_transpose


def _tangent_batch(args, dims, *, cfg, mask):
    n_res = 5 + len(cfg.leaf_meta)
    res_ops, res_dims = args[:n_res], dims[:n_res]
    lin, lin_dims = args[n_res:], dims[n_res:]
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    if any(d is not None for d in res_dims):
        # batched primals (vmap over cosmologies/ensembles): one bind per batch element
        moved = [jnp.moveaxis(x, d, 0) if d is not None else x
                 for x, d in zip(args, dims)]
        mapped = [d is not None for d in dims]

        def one(xs):
            it = iter(xs)
            ops = [next(it) if mp else x for x, mp in zip(moved, mapped)]
            return sensitivity_tangent_p.bind(*ops, cfg=cfg, mask=mask)

        out = jax.lax.map(one, [x for x, mp in zip(moved, mapped) if mp])
        return out, 0
    # only tangents batched: fold the batch into the direction axis
    flat = []
    for x, d in zip(lin, lin_dims):
        if d is None:
            x = jnp.broadcast_to(x[None], (size,) + x.shape)
        else:
            x = jnp.moveaxis(x, d, 0)
        flat.append(x.reshape((size * x.shape[1],) + x.shape[2:]))
    m_total = flat[0].shape[0]
    if m_total > _n_inputs(cfg, mask):
        blocks = _unit_sensitivities(cfg, mask, res_ops)
        out = _contract(cfg, mask, blocks, tuple(flat))
    else:
        out = sensitivity_tangent_p.bind(*res_ops, *flat, cfg=cfg, mask=mask)
    return out.reshape((size, m_total // size) + out.shape[1:]), 0


batching.primitive_batchers[sensitivity_tangent_p] = _tangent_batch


