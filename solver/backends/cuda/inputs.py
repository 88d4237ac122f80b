"""Kernel arguments: validated host inputs laid out as the generated kernels take them.

The kernels read contiguous float64 arrays with a trajectory axis and pass ``p`` as a tuple of
length >= 1, so P = 0 is padded with a dummy column; tangent inputs of the sensitivity kernel are
checked and padded the same way.
"""
from __future__ import annotations

import numpy as np

from ...problem.inputs import norm_rows, validate_inputs
from ...problem.sensitivity_spec import sec_weight
from .tables import args_array

__all__ = ["kernel_inputs", "prepare", "sens_inputs", "check_lookup_p", "sens_outputs",
           "refuse_lookup_tangents", "plain_outputs", "sens_call_args", "probe_inputs",
           "direction_warps", "pad_directions", "trim_directions"]


def kernel_inputs(v, rtol) -> dict:
    """The kernel's inputs from :class:`~solver.problem.ValidatedInputs` ``v``."""
    y0, params, ts, t0a, tea, atol_a, w, h0 = v
    N, n = y0.shape
    rows, n_weighted = norm_rows(w)   # (1, n) shared or (N, n) per trajectory
    if params.shape[1] == 0:  # the kernel passes p as a tuple of length >= 1
        params_k = np.zeros((N, 1))
    else:
        params_k = params
    return dict(y0=np.ascontiguousarray(y0), t0=np.ascontiguousarray(t0a, dtype=np.float64),
                t_end=np.ascontiguousarray(tea, dtype=np.float64),
                t_save=np.ascontiguousarray(ts), params=np.ascontiguousarray(params_k),
                rtol=float(rtol), atol=atol_a, weights=np.ascontiguousarray(rows),
                h0=np.ascontiguousarray(h0, dtype=np.float64),
                n_weighted=n_weighted, N=N, n=n, P=params.shape[1])


def prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps, first_step):
    """Validate raw inputs (``validate_inputs``) and lay them out for the kernel."""
    return kernel_inputs(validate_inputs(y0, t_save, params, rtol, atol, t0, t_end,
                                         error_weights, max_steps, first_step), rtol)


def sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol, sens_atol, sec,
                t0, t_end, error_weights, max_steps, first_step):
    """Validated kernel inputs: the plain solve's (:func:`prepare`) plus the tangents.

    s0 (m, N, n), dparams (m, N, P), dargs (m, *args.shape): any may be None (zero), at least
    one gives m.  ``error_weights`` (n,) or (N, n): a trajectory's directions take its row.
    dparams is padded like params (P = 0 -> one dummy column); without a
    differentiated table the kernel gets ONE all-zero tangent table (not m copies)."""
    inp = prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                  first_step)
    N, n, P = inp["N"], inp["n"], inp["P"]
    present = [np.asarray(x) for x in (s0, dparams, dargs) if x is not None]
    if not present:
        raise ValueError("sensitivities need at least one tangent (s0, dparams or dargs)")
    m = int(present[0].shape[0])
    if m < 1:
        raise ValueError("sensitivities need at least one direction")
    s0 = np.zeros((m, N, n)) if s0 is None else np.asarray(s0, np.float64)
    if s0.shape != (m, N, n):
        raise ValueError(f"s0 must have shape {(m, N, n)}, got {s0.shape}")
    Pk = inp["params"].shape[1]
    dp = np.zeros((m, N, Pk))
    if dparams is not None and P:
        dparams = np.asarray(dparams, np.float64)
        if dparams.shape != (m, N, P):
            raise ValueError(f"dparams must have shape {(m, N, P)}, got {dparams.shape}")
        dp[:, :, :P] = dparams
    if args is None:
        if dargs is not None:
            raise ValueError("dargs given without args")
        da = np.zeros((1, 1))
    else:
        a = args_array(args)
        if dargs is None:
            da = np.zeros((1,) + a.shape)
        else:
            da = np.asarray(dargs, np.float64)
            if da.shape != (m,) + a.shape:
                raise ValueError(f"dargs must have shape {(m,) + a.shape}, got {da.shape}")
    if not (np.all(np.isfinite(s0)) and np.all(np.isfinite(dp)) and np.all(np.isfinite(da))):
        raise ValueError("tangents contain non-finite values")
    atol_s = inp["atol"] if sens_atol is None else np.ascontiguousarray(
        np.broadcast_to(np.asarray(sens_atol, np.float64), (n,)))
    if np.any(atol_s <= 0):
        raise ValueError("sensitivity_atol must be positive")
    w = inp["weights"]      # (1, n) for every trajectory or (N, n), as the plain kernel's
    inp.update(s0=np.ascontiguousarray(s0), dparams=np.ascontiguousarray(dp),
               dargs=np.ascontiguousarray(da), atol_s=np.ascontiguousarray(atol_s, np.float64),
               weights=np.ascontiguousarray(w),
               weights_s=np.ascontiguousarray(w * sec_weight(sec)), m=m)
    return inp


def direction_warps(m: int, most: int) -> int:
    """Direction warps per block of the warp sensitivity kernel for ``m`` directions: the
    fewest blocks of at most ``most`` warps, the directions spread evenly over them (8 at most 4
    -> 2 blocks of 4; 7 -> 2 of 4, one warp a zero direction)."""
    if most < 1:
        raise ValueError(f"direction warps per block must be at least 1, got {most}")
    blocks = -(-m // most)
    return -(-m // blocks)


def pad_directions(inp: dict, nw: int) -> dict:
    """``inp`` with its directions padded by zero ones to a multiple of ``nw`` (a zero
    direction's sensitivity stays zero and adds nothing to its block's error norm)."""
    m = inp["m"]
    mp = -(-m // nw) * nw
    if mp == m:
        return inp

    def padded(a):
        return np.ascontiguousarray(np.concatenate([a, np.zeros((mp - m,) + a.shape[1:])]))

    out = dict(inp, m=mp, s0=padded(inp["s0"]), dparams=padded(inp["dparams"]))
    if inp["dargs"].shape[0] == m:
        out["dargs"] = padded(inp["dargs"])
    return out


def trim_directions(out: dict, m: int) -> dict:
    """The sensitivity outputs of the first ``m`` directions (the padding dropped)."""
    return {k: (v if k == "ys" else v[:m]) for k, v in out.items()}


def check_lookup_p(plan, rhs, inp, args):
    """The kernel's tangent table values are lookup(t, p, dargs_d): exact because the Hermite
    lookup is linear in the table, but blind to the lookup's own dependence on p (for the EB
    model: the grid's x_min and dx, constants of the table).  Finds those p columns once per plan
    (jax.jacfwd of split.lookup at the first trajectory's start) and refuses a nonzero tangent
    there rather than returning a wrong derivative.  ``plan``: a ``SensPlan``."""
    if plan.plain.split is None:
        return
    P = inp["P"]
    if plan.lookup_p is None:
        import jax
        import jax.numpy as jnp

        split = plan.plain.split
        tab = jnp.asarray(args_array(args))
        t = float(inp["t0"][0])
        J = jax.jacfwd(lambda p: jnp.stack([jnp.asarray(v, jnp.float64)
                                            for v in split.lookup(t, p, tab)]))(
            jnp.asarray(inp["params"][0, :P]))
        plan.lookup_p = tuple(int(c) for c in np.nonzero(np.any(np.asarray(J) != 0, axis=0))[0])
    cols = list(plan.lookup_p)
    if cols and np.any(inp["dparams"][:, :, cols] != 0):
        refuse_lookup_tangents(cols)


def refuse_lookup_tangents(cols):
    """The error of a nonzero tangent in the parameter columns ``cols`` the table lookup
    reads (``check_lookup_p``)."""
    raise NotImplementedError(
        f"backend='cuda' sensitivities: the table lookup depends on params columns {list(cols)} "
        "(table geometry) and their tangent is nonzero; the CUDA kernel does not "
        "differentiate the lookup with respect to p. Use backend='jax'.")


def plain_outputs(N: int, m: int, n: int):
    """Host outputs of the plain kernel (ys, t_out, status, n_accepted, n_rejected), filled
    with values no thread writes (a missing write shows)."""
    return (np.full((N, m, n), -12345.0), np.zeros(N), np.full(N, -7, np.int32),
            np.zeros(N, np.int32), np.zeros(N, np.int32))


def sens_outputs(inp, fill: bool = True):
    """Host output arrays of the sensitivity kernel, filled with values no thread writes (a
    missing write shows); ``fill=False``: ``np.empty`` arrays that only carry the shapes and
    types (a launch whose device outputs are filled on the device: ``DeviceBuffer.unwritten``;
    for the CMB sources' Jacobian dys is gigabytes, whose host fill and copy would cost more
    than the kernel)."""
    N, n, m, ns = inp["N"], inp["n"], inp["m"], inp["t_save"].shape[1]
    f8, i4 = np.float64, np.int32
    outputs = {"ys": ((N, ns, n), f8, -12345.0), "dys": ((m, N, ns, n), f8, -12345.0),
               "t_out": ((m, N), f8, 0.0), "status": ((m, N), i4, -7),
               "n_accepted": ((m, N), i4, 0), "n_rejected": ((m, N), i4, 0)}
    return {k: np.full(shape, v, t) if fill else np.empty(shape, t)
            for k, (shape, t, v) in outputs.items()}


def sens_call_args(inp, args_h, out):
    """The kernel's positional arguments in the order of ``codegen.SENS_KERNEL_ARGS``."""
    return (inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], args_h, inp["s0"],
            inp["dparams"], inp["dargs"], inp["rtol"], inp["atol"], inp["atol_s"],
            inp["weights"], inp["weights_s"], inp["h0"], inp["n_weighted"], out["ys"],
            out["dys"], out["t_out"], out["status"], out["n_accepted"], out["n_rejected"],
            inp["N"], inp["m"])


def probe_inputs(plan, y, s, u, t, params, dparams, args, dargs):
    """Host arrays of sens_probe_kernel's inputs (params/dparams padded like the kernel's)."""
    y = np.ascontiguousarray(np.atleast_2d(np.asarray(y, np.float64)))
    N = y.shape[0]
    s, u = (np.ascontiguousarray(np.reshape(np.asarray(v, np.float64), y.shape)) for v in (s, u))
    t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
    P = plan.plain.n_params
    pk, dpk = np.zeros((N, max(P, 1))), np.zeros((N, max(P, 1)))
    pk[:, :P] = np.asarray(params, np.float64).reshape(N, P)
    dpk[:, :P] = np.asarray(dparams, np.float64).reshape(N, P)
    if args is None:
        a, da = np.zeros(1), np.zeros((1, 1))
    else:
        a = args_array(args)
        da = np.zeros((1,) + a.shape) if dargs is None else \
            np.ascontiguousarray(np.asarray(dargs, np.float64))
    return y, s, u, t, pk, dpk, a, da
