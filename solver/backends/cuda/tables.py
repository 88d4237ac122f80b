"""Tables (``args``) on the CUDA backend: the ``rhs.table_split`` protocol and its checks.

Enzyme's CUDA ``jvp`` accepts scalars and homogeneous tuples only, never an array, so an RHS
``rhs(y, t, p, args)`` that reads tables must say how to keep the reads out of the differentiated
function. It does so with the attribute ``rhs.table_split`` (duck-typed here: the solver knows
nothing about what the tables hold):

* ``n_tv``: number of table values; ``core_device(y, t, p, tv)``: the RHS given the tuple ``tv``
  (math-module scalars, literal indices; compiled as the device primal and differentiated);
* ``lookup_device(t, p, args)`` / ``lookup_dt_device(t, p, args)``: ``tv`` and d tv/dt from the
  args array (plain device functions, outside Enzyme, cell index clipped to the grid);
* ``core`` / ``lookup``: the JAX flavours of the same text (the CPU emulator's ``jax.jvp``);
* contract ``rhs(y, t, p, args) == core(y, t, p, lookup(t, p, args))`` (checked once per plan at
  the first trajectory's initial point) and tv independent of y.

The colour sweeps then hold tv fixed (seed 0) and the ∂f/∂t sweep seeds ``tv`` with d tv/dt: the
chain rule through the table. ``args`` goes to the kernel as one C-contiguous float64 device
array; without args the kernel gets a (1,) dummy. The JAX backend ignores the split and keeps
calling ``rhs(y, t, p, args)``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["table_split_of", "args_array", "check_split", "check_args_structure"]

_SPLIT_ATTRS = ("n_tv", "core", "lookup", "core_device", "lookup_device", "lookup_dt_device")


def table_split_of(rhs, args):
    """``rhs.table_split`` when ``args`` is given (checked), None without args.

    Raises TypeError when ``args`` is given and the RHS lacks the protocol (what it must provide is
    in the message), or when ``args`` is not one numeric array.
    """
    if args is None:
        return None
    split = getattr(rhs, "table_split", None)
    missing = [a for a in _SPLIT_ATTRS if not hasattr(split, a)] if split is not None else None
    if split is None or missing:
        what = "has no attribute 'table_split'" if split is None else \
            f"has a table_split lacking {missing}"
        raise TypeError(
            f"backend='cuda' with args: the rhs {getattr(rhs, '__name__', rhs)!r} {what}. "
            "Enzyme's CUDA jvp cannot take an array, so an RHS that reads tables must provide "
            "rhs.table_split (docs/solver.md, 'RHS with tables'): n_tv; core_device(y, t, p, "
            "tv) -> tuple of n (the RHS given the n_tv interpolated table values tv as a tuple "
            "of scalars); "
            "lookup_device(t, p, args) -> tv and lookup_dt_device(t, p, args) -> d tv/dt (plain "
            "device functions); core / lookup, their JAX flavours; with rhs(y, t, p, args) == "
            "core(y, t, p, lookup(t, p, args)). Use backend='jax' for other RHS with args.")
    a = np.asarray(args)
    if a.dtype == object or not np.issubdtype(a.dtype, np.number) or a.ndim == 0:
        raise TypeError("backend='cuda': args must be one numeric array (the tables), got "
                        f"{type(args).__name__}")
    return split


def check_args_structure(rhs, has_args, leaf_meta) -> None:
    """``args`` of a differentiable solve, known only by its leaves' (shape, dtype) (it may be a
    tracer): ONE numeric array read through ``rhs.table_split``."""
    if not has_args:
        return
    if len(leaf_meta) != 1:
        raise TypeError("backend='cuda': args must be one numeric array (the tables, read through "
                        f"rhs.table_split), got a pytree with {len(leaf_meta)} leaves")
    shape, dtype = leaf_meta[0]
    table_split_of(rhs, np.zeros(shape, dtype))


def args_array(args):
    return np.ascontiguousarray(np.asarray(args, dtype=np.float64))


#: allowed difference between the split and the rhs, per unit of a component's terms (64 ulp)
SPLIT_ROUNDING = 64 * np.finfo(np.float64).eps


def check_split(rhs, split, y, t, p, args):
    """The split must reproduce the rhs (one point; a wrong split would silently change the
    physics on the GPU).  Compares the device flavour with the JAX rhs."""
    import jax.numpy as jnp

    import jax

    P = int(p.shape[0])
    # one compiled program on the host CPU: run op by op on a GPU the rhs is thousands of kernel
    # launches and as many small executables to load, seconds of every new process
    with jax.default_device(jax.devices("cpu")[0]):
        f = jax.jit(rhs)
        y = np.asarray(y, np.float64)

        def rhs_at(v):
            return np.array(f(jnp.asarray(v), jnp.asarray(t), jnp.asarray(p), jnp.asarray(args)),
                            np.float64)

        ref = rhs_at(y)
        # where a component is a small difference of large terms (a tight coupling's
        # κ'(θ_γ − θ_b); 13 orders of magnitude at a high-k mode's start), two correct
        # evaluations in different orders differ by the terms' rounding, far above 1e-10 of the
        # largest component. Each state's share of every component is what setting it to zero
        # removes (exact for the linear perturbation equations, a scale otherwise): the sum of
        # their sizes is the size of the terms that round
        terms = np.zeros_like(ref)
        for j in np.flatnonzero(y):
            y_j = y.copy()
            y_j[j] = 0.0
            terms += np.abs(ref - rhs_at(y_j))
    a = args_array(args)
    pt = np.ascontiguousarray(p, dtype=np.float64)
    got = np.array(split.core_device(tuple(float(v) for v in y), float(t),
                                     tuple(float(v) for v in p[:P]),
                                     split.lookup_device(float(t), pt, a)), dtype=np.float64)
    scale = max(float(np.abs(ref).max()), 1e-300)
    # rounding of the terms: a few 1e-16 of them, allowed up to SPLIT_ROUNDING of them; a wrong
    # coefficient in the split moves its component by its relative error of its term
    if got.shape != ref.shape or not np.all(np.abs(got - ref)
                                            <= 1e-10 * scale + SPLIT_ROUNDING * terms):
        bad = np.argmax(np.abs(got - ref)) if got.shape == ref.shape else None
        raise ValueError(f"rhs.table_split does not reproduce rhs at t = {t}: component {bad} "
                         f"differs ({got.shape} vs {ref.shape} values)")
