"""Structural Jacobian sparsity of an rhs by dependency tracing of its jaxpr.

The rhs is traced once to a jaxpr with abstract ``y``, ``t``, ``p`` (and ``args``); then every
array element of every intermediate carries the set of inputs it depends on (a boolean vector over
``y``, ``t`` and ``p``), propagated equation by equation:

* elementwise primitives: union of the operands' sets, element by element;
* data movement (slice, squeeze, reshape, broadcast, concatenate, transpose, gather with constant
  indices, ...): the primitive itself is evaluated on arrays of element ids, so every output
  element inherits exactly the set of the element it was copied from;
* reductions and ``dot_general``: union over the reduced / contracted axes;
* values with a zero derivative (booleans, integers, ``floor``/``sign``/...) carry no dependence:
  a table index computed from ``t``, or the predicate of ``jnp.where``, does not make an entry;
* sub-jaxprs (jit/pjit, closed_call, custom_jvp/vjp, remat, cond, while, scan) are analysed
  recursively (loops to a fixed point); anything unknown is handled conservatively as "every output
  element depends on everything any input depends on".

The result is structural: it is a superset of the numerical nonzeros at any point (which the
tests check against ``jax.jacfwd``) and equals them for generic coefficients.
"""
from __future__ import annotations

import numpy as np

__all__ = ["detect_sparsity", "detect_dependence", "detect_time_dependence", "validate_pattern"]

_ELEMENTWISE = frozenset("""
add sub mul div neg exp exp2 log log1p expm1 sin cos tan tanh sinh cosh asin acos atan atan2 asinh
acosh atanh sqrt rsqrt cbrt pow integer_pow abs max min select_n convert_element_type logistic erf
erfc erf_inv lgamma digamma igamma square rem nextafter clamp copy copy_p reduce_precision real imag
conj complex is_finite and or not xor eq ne lt le gt ge sign floor ceil round stop_gradient
polygamma bessel_i0e bessel_i1e random_gamma_grad zeta
""".split())
# primitives whose derivative is zero everywhere it exists
_ZERO_DERIVATIVE = frozenset("sign floor ceil round is_finite eq ne lt le gt ge and or not xor".split())
_REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod argmax argmin".split())
# data-movement primitives -> which operand positions carry data (others must be concrete)
_MOVEMENT = {
    "slice": (0,), "squeeze": (0,), "reshape": (0,), "broadcast_in_dim": (0,),
    "expand_dims": (0,), "transpose": (0,), "rev": (0,), "concatenate": None,
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "pad": (0, 1),
    "scatter": (0, 2), "copy": (0,), "copy_p": (0,),
}


def _is_float(aval) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and (np.issubdtype(dtype, np.floating)
                                  or np.issubdtype(dtype, np.complexfloating))


class _Analysis:
    """Dependency propagation; a dep is None (no dependence) or bool array ``shape + (m,)``."""

    def __init__(self, width: int):
        self.m = width

    # -- helpers --------------------------------------------------------------------------
    def _full_union(self, deps):
        acc = None
        for d in deps:
            if d is None:
                continue
            flat = d.reshape(-1, self.m).any(axis=0)
            acc = flat if acc is None else (acc | flat)
        return acc

    def _broadcast(self, vec, aval):
        if vec is None or not _is_float(aval) or not vec.any():
            return None
        shape = tuple(getattr(aval, "shape", ()))
        return np.broadcast_to(vec, shape + (self.m,)).copy()

    def _conservative(self, eqn, in_deps):
        vec = self._full_union(in_deps)
        return [self._broadcast(vec, v.aval) for v in eqn.outvars]

    # -- main loop ------------------------------------------------------------------------
    def run(self, jaxpr, consts_values, in_deps, in_values):
        """Analyse an (open) jaxpr; returns (out_deps, out_values)."""
        from jax.extend.core import Literal

        deps: dict = {}
        vals: dict = {}

        def read(v):
            if isinstance(v, Literal):
                return None, np.asarray(v.val)
            return deps.get(v), vals.get(v)

        for v, c in zip(jaxpr.constvars, consts_values):
            deps[v] = None
            vals[v] = c
        for v, d, c in zip(jaxpr.invars, in_deps, in_values):
            deps[v] = d
            if c is not None:
                vals[v] = c
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            in_d = [d for d, _ in ins]
            in_v = [c for _, c in ins]
            out_d, out_v = self.eqn(eqn, in_d, in_v)
            for v, d, c in zip(eqn.outvars, out_d, out_v):
                if type(v).__name__ == "DropVar":
                    continue
                if d is not None and (not _is_float(v.aval) or not d.any()):
                    d = None
                deps[v] = d
                if c is not None:
                    vals[v] = c
        outs = [read(v) for v in jaxpr.outvars]
        return [d for d, _ in outs], [c for _, c in outs]

    def _try_eval(self, eqn, in_v):
        if any(c is None for c in in_v):
            return [None] * len(eqn.outvars)
        if any(int(np.prod(getattr(v.aval, "shape", ()))) > 100_000 for v in eqn.outvars):
            return [None] * len(eqn.outvars)
        try:
            out = _bind(eqn, in_v)
        except Exception:  # noqa: BLE001 - evaluation is only an optimisation
            return [None] * len(eqn.outvars)
        if not eqn.primitive.multiple_results:
            out = [out]
        return [np.asarray(o) for o in out]

    def eqn(self, eqn, in_d, in_v):
        name = eqn.primitive.name
        n_out = len(eqn.outvars)
        if all(d is None for d in in_d):
            return [None] * n_out, self._try_eval(eqn, in_v)
        if name in _ZERO_DERIVATIVE:
            return [None] * n_out, [None] * n_out
        if name in _ELEMENTWISE:
            return [self._elementwise(eqn, in_d)], [None]
        if name in _REDUCTIONS:
            return [self._reduce(eqn, in_d[0])], [None]
        if name in _MOVEMENT:
            return [self._movement(eqn, in_d, in_v)], [None]
        if name == "dot_general":
            return [self._dot_general(eqn, in_d)], [None]
        sub = self._subjaxpr(eqn, in_d, in_v)
        if sub is not None:
            return sub, [None] * n_out
        return self._conservative(eqn, in_d), [None] * n_out

    # -- rules --------------------------------------------------------------------------
    def _elementwise(self, eqn, in_d):
        aval = eqn.outvars[0].aval
        shape = tuple(aval.shape)
        acc = np.zeros(shape + (self.m,), dtype=bool)
        for v, d in zip(eqn.invars, in_d):
            if d is None:
                continue
            acc |= d  # numpy broadcasting handles rank-0 operands
        return acc

    def _reduce(self, eqn, d):
        axes = tuple(eqn.params.get("axes", ()))
        return d.any(axis=axes) if axes else d

    def _dot_general(self, eqn, in_d):
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs_aval, rhs_aval = eqn.invars[0].aval, eqn.invars[1].aval
        out_shape = tuple(eqn.outvars[0].aval.shape)

        def reduced(d, aval, contract, batch):
            if d is None:
                return None
            d = d.any(axis=tuple(contract)) if contract else d
            kept = [a for a in range(len(aval.shape)) if a not in contract]
            perm = [kept.index(a) for a in batch] + [i for i, a in enumerate(kept) if a not in batch]
            return np.transpose(d, perm + [len(kept)])

        dl = reduced(in_d[0], lhs_aval, lc, lb)
        dr = reduced(in_d[1], rhs_aval, rc, rb)
        nb = len(lb)
        n_lfree = len(lhs_aval.shape) - len(lc) - nb
        n_rfree = len(rhs_aval.shape) - len(rc) - nb
        acc = np.zeros(out_shape + (self.m,), dtype=bool)
        if dl is not None:
            idx = (slice(None),) * (nb + n_lfree) + (None,) * n_rfree
            acc |= dl[idx]
        if dr is not None:
            idx = (slice(None),) * nb + (None,) * n_lfree + (slice(None),) * n_rfree
            acc |= dr[idx]
        return acc

    def _movement(self, eqn, in_d, in_v):
        name = eqn.primitive.name
        data_pos = range(len(eqn.invars)) if _MOVEMENT[name] is None else _MOVEMENT[name]
        args = []
        tables = []
        offset = 0
        for pos, var in enumerate(eqn.invars):
            aval = var.aval
            if pos in data_pos:
                dtype = np.dtype(aval.dtype)
                if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
                    return self._conservative(eqn, in_d)[0]
                size = int(np.prod(aval.shape))
                ids = (np.arange(size) + offset).reshape(aval.shape).astype(dtype)
                if np.issubdtype(dtype, np.integer) and offset + size >= np.iinfo(dtype).max:
                    return self._conservative(eqn, in_d)[0]
                d = in_d[pos]
                tables.append(np.zeros((size, self.m), bool) if d is None else d.reshape(size, self.m))
                args.append(ids)
                offset += size
            else:
                if in_v[pos] is None:  # dynamic index: every element may be read
                    return self._conservative(eqn, in_d)[0]
                args.append(in_v[pos])
        try:
            out = np.asarray(_bind(eqn, args))
        except Exception:  # noqa: BLE001
            return self._conservative(eqn, in_d)[0]
        table = np.concatenate(tables + [np.zeros((1, self.m), bool)])
        ids = np.rint(out).astype(np.int64)
        ids = np.where((ids >= 0) & (ids < offset), ids, offset)
        return table[ids]

    def _subjaxpr(self, eqn, in_d, in_v):
        name = eqn.primitive.name
        params = eqn.params
        closed = None
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            if key in params and name not in ("scan", "while"):
                closed = params[key]
                break
        if closed is not None:
            jaxpr, consts = _open(closed)
            if len(jaxpr.invars) != len(in_d):
                return None
            out_d, _ = self.run(jaxpr, consts, in_d, in_v)
            return out_d
        if name == "cond":
            branches = params["branches"]
            ops_d, ops_v = in_d[1:], in_v[1:]
            acc = None
            for br in branches:
                jaxpr, consts = _open(br)
                out_d, _ = self.run(jaxpr, consts, ops_d, ops_v)
                acc = out_d if acc is None else [_or(a, b) for a, b in zip(acc, out_d)]
            return acc
        if name == "while":
            cj, cc = _open(params["cond_jaxpr"])
            bj, bc = _open(params["body_jaxpr"])
            nc, nb = params["cond_nconsts"], params["body_nconsts"]
            body_consts_d = in_d[nc:nc + nb]
            body_consts_v = in_v[nc:nc + nb]
            carry = list(in_d[nc + nb:])
            for _ in range(1000):
                out_d, _ = self.run(bj, bc, body_consts_d + carry, body_consts_v + [None] * len(carry))
                new = [_or(a, b) for a, b in zip(carry, out_d)]
                if all(_same(a, b) for a, b in zip(new, carry)):
                    return new
                carry = new
            return None
        if name == "scan":
            jaxpr, consts = _open(params["jaxpr"])
            n_consts, n_carry = params["num_consts"], params["num_carry"]
            length = params["length"]
            c_d, c_v = in_d[:n_consts], in_v[:n_consts]
            carry = list(in_d[n_consts:n_consts + n_carry])
            xs = [None if d is None else d.any(axis=0) for d in in_d[n_consts + n_carry:]]
            ys_acc = None
            for _ in range(1000):
                out_d, _ = self.run(jaxpr, consts, c_d + carry + xs,
                                    c_v + [None] * (len(carry) + len(xs)))
                new = [_or(a, b) for a, b in zip(carry, out_d[:n_carry])]
                ys = out_d[n_carry:]
                ys_acc = ys if ys_acc is None else [_or(a, b) for a, b in zip(ys_acc, ys)]
                if all(_same(a, b) for a, b in zip(new, carry)):
                    break
                carry = new
            else:
                return None
            ys_full = [None if d is None else np.broadcast_to(d, (length,) + d.shape).copy()
                       for d in ys_acc]
            return carry + ys_full
        return None


def _bind(eqn, values):
    """Evaluate one equation on concrete values (handles both get_bind_params conventions)."""
    res = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(res, tuple) and len(res) == 2 and isinstance(res[1], dict):
        subfuns, params = res
    else:
        subfuns, params = (), res
    return eqn.primitive.bind(*subfuns, *values, **params)


def _open(closed):
    if hasattr(closed, "jaxpr") and hasattr(closed, "consts"):
        return closed.jaxpr, [np.asarray(c) if _np_able(c) else None for c in closed.consts]
    return closed, []


def _np_able(c) -> bool:
    try:
        np.asarray(c)
        return True
    except Exception:  # noqa: BLE001
        return False


def _or(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


def detect_dependence(rhs, n: int, n_params: int, args=None):
    """Structural dependence of each output on ``(y, t, p)``: bool arrays ``(n, n), (n,), (n, n_params)``."""
    import jax
    import jax.numpy as jnp

    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if int(n_params) != n_params or n_params < 0:
        raise ValueError(f"n_params must be a non-negative integer, got {n_params!r}")
    y = jax.ShapeDtypeStruct((n,), jnp.float64)
    t = jax.ShapeDtypeStruct((), jnp.float64)
    p = jax.ShapeDtypeStruct((n_params,), jnp.float64)

    if args is None:
        def f(y_, t_, p_):
            return tuple(rhs(y_, t_, p_))
        closed = jax.make_jaxpr(f)(y, t, p)
        n_args = 0
    else:
        args_abstract = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), args)

        def f(y_, t_, p_, a_):
            return tuple(rhs(y_, t_, p_, a_))
        closed = jax.make_jaxpr(f)(y, t, p, args_abstract)
        n_args = len(jax.tree_util.tree_leaves(args))
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != n:
        raise ValueError(f"rhs returned {len(jaxpr.outvars)} values for n={n}; it must return "
                         "a tuple of n scalars")
    m = n + 1 + n_params
    eye = np.eye(m, dtype=bool)
    in_deps = [eye[:n], eye[n], eye[n + 1:]] + [None] * n_args
    analysis = _Analysis(m)
    consts = [np.asarray(c) if _np_able(c) else None for c in closed.consts]
    out_d, _ = analysis.run(jaxpr, consts, in_deps, [None] * len(in_deps))
    dep = np.zeros((n, m), dtype=bool)
    for i, (d, v) in enumerate(zip(out_d, jaxpr.outvars)):
        shape = tuple(getattr(v.aval, "shape", ()))
        if shape != ():
            raise ValueError(f"rhs output {i} has shape {shape}; each output must be a scalar")
        if d is not None:
            dep[i] = d
    return dep[:, :n], dep[:, n], dep[:, n + 1:]


def detect_sparsity(rhs, n: int, n_params: int, args=None) -> np.ndarray:
    """Boolean ``(n, n)``: ``[i, j]`` True when ``f_i`` structurally depends on ``y_j``."""
    return detect_dependence(rhs, n, n_params, args)[0]


def detect_time_dependence(rhs, n: int, n_params: int, args=None) -> np.ndarray:
    """Boolean ``(n,)``: ``f_i`` depends explicitly on ``t`` (through tables in args, too)."""
    return detect_dependence(rhs, n, n_params, args)[1]


def validate_pattern(pattern, n: int) -> np.ndarray:
    """Check a user-supplied pattern and return it as a bool ``(n, n)`` array WITH the diagonal.

    Accepts a boolean array, or a numeric array of 0/1 values; anything else raises ValueError.
    """
    pat = np.asarray(pattern)
    if pat.shape != (n, n):
        raise ValueError(f"pattern must have shape ({n}, {n}), got {pat.shape}")
    if pat.dtype != bool:
        if not np.issubdtype(pat.dtype, np.number):
            raise ValueError(f"pattern must be boolean or 0/1 numeric, got dtype {pat.dtype}")
        if not np.all((pat == 0) | (pat == 1)):
            raise ValueError("numeric pattern must contain only 0 and 1")
        pat = pat != 0
    return pat | np.eye(n, dtype=bool)


def solver_pattern(rhs, n, n_params, sparsity=None, args=None) -> np.ndarray:
    """The Jacobian pattern a solver plan uses: ``sparsity`` validated, or detected from ``rhs``
    (with ``args`` when the rhs takes tables), plus the diagonal (W = I/(hγ) - J needs it)."""
    if sparsity is None:
        pattern = detect_sparsity(rhs, n, n_params, args=args) if args is not None else \
            detect_sparsity(rhs, n, n_params)
    else:
        pattern = validate_pattern(np.asarray(sparsity), n)
    return np.asarray(pattern, bool) | np.eye(n, dtype=bool)
