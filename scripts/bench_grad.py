"""Part (d) of scripts/bench_gpu.py: the Jacobian ∂P(k)/∂θ of one cosmology against one P(k)
of the same PowerSpectrumFunction, per backend and sensitivity error weight, the batched
value-and-Jacobian row, and the backends' agreement (bench_gpu.py's docstring has the
whole description)."""
from __future__ import annotations

import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from bench_report import (PRIOR_FIRST_S, _short, _unavailable_reason, _warm_calls,
                          solver_backend)
from solver import sec_weight


# =========================================================================== (d) gradients
def grad_parameters(cfg) -> list:
    """Every parameter of boltzmann.gradients.PARAMETERS this config can be differentiated in."""
    from boltzmann.gradients import available_parameters

    return list(available_parameters(cfg.cosmology))


def run_grad(args, report, budget, cfg, dead):
    from boltzmann.tables import host_cpu

    names = grad_parameters(cfg)
    K = len(cfg.output.k_grid(float(cfg.cosmology.h)))
    report.print(f"\n## (d) gradients: {args.config}, {K} k, z = {list(cfg.output.z)}, "
                 f"{len(names)} parameters ({', '.join(names)}); Jacobian vs one P(k) of the same "
                 f"PowerSpectrumFunction; batch {args.grad_batch}")
    report.print("| backend | value first / warm [s] | Jacobian first / warm [s] | Jacobian / "
                 "value | batch of B: warm [s] | value+Jacobian per s | note |")
    report.print("|---|---|---|---|---|---|---|")
    dlnp = {}   # (backend, SEC) -> ∂ln P_m/∂θ at the fiducial (n_z, n_k, n_θ)
    secs = _sec_weights(args.grad_sec, cfg)
    for b in [b for b in args.backends if b in ("cuda", "jax")]:
        for sec in secs:
            key = f"grad:{b}"
            row = {"key": key, "size": 1, "backend": b, "parameters": names,
                   "sensitivity_error_control": sec}
            why = dead.get(b) or budget.refuse(PRIOR_FIRST_S[key])
            if why:
                row.update(status="skipped", note=why)
            elif b == "jax" and host_cpu() is not None:
                # the JAX joint solve is a chain of small dependent ops per step: on the GPU it
                # runs at launch latency (on an H200 it had not finished after 17 min), so the
                # JAX row of (d) is measured on this host's CPU and labelled so
                row["backend"] = "jax (host CPU)"
                with jax.default_device(host_cpu()):
                    dlnp[b, sec] = _grad_row(row, b, cfg, names, args.grad_batch, budget, sec)
            else:
                dlnp[b, sec] = _grad_row(row, b, cfg, names, args.grad_batch, budget, sec,
                                         args.device_inputs)
            if sec != 1.0:
                row["backend"] += " (SEC off)" if sec == 0.0 else f" (SEC weight {sec:g})"
            report.row("grad", row, _grad_line(row))
    for b in ("cuda", "jax"):
        for sec in secs[1:]:
            _agreement_line(report, f"grad_sec_{sec:g}_vs_{secs[0]:g}" + ("_jax" if b == "jax"
                                                                           else ""),
                            f"{b.upper()}, SEC weight {sec:g} vs {secs[0]:g}, same units",
                            dlnp.get((b, sec)), dlnp.get((b, secs[0])), names)
    _agreement_line(report, "grad_agreement",
                    "CUDA vs JAX ∂ln P_m/∂θ, max |difference| over k and z / the JAX "
                    "Jacobian's largest |∂ln P/∂θ| for that parameter",
                    dlnp.get(("cuda", secs[0])), dlnp.get(("jax", secs[0])), names)


def _sec_weights(choice: str, cfg) -> tuple:
    """The sensitivity error weights of (d)'s rows: "config" (the precision's
    ``sensitivity_error_weight``), "on" (1), "off" (0), "both" (1 and 0) or numbers, comma-separated."""
    named = {"config": (float(cfg.precision.sensitivity_error_weight),), "on": (1.0,),
             "off": (0.0,), "both": (1.0, 0.0)}
    if choice in named:
        return named[choice]
    try:
        return tuple(sec_weight(float(w)) for w in choice.split(","))
    except ValueError as err:
        raise SystemExit(f"--grad-sec {choice!r}: give config, on, off, both or weights in [0, 1] "
                         f"separated by commas ({err})") from None


def _agreement_line(report, key, title, got, ref, names):
    """Print and record ``gradient_agreement(got, ref)`` per parameter (when both exist)."""
    if got is None or ref is None:
        return
    err = gradient_agreement(got, ref)
    report.data[key] = dict(zip(names, err.tolist()))
    report.print(f"\n{title}: " + ", ".join(f"{n} {e:.1e}" for n, e in zip(names, err))
                 + f"; worst {err.max():.1e}")


def gradient_agreement(got, ref) -> np.ndarray:
    """Per parameter (last axis): max |got - ref| / max |ref| over every other axis."""
    got, ref = np.asarray(got), np.asarray(ref)
    axes = tuple(range(ref.ndim - 1))
    return np.abs(got - ref).max(axis=axes) / np.maximum(np.abs(ref).max(axis=axes), 1e-300)


def _grad_row(row, backend, cfg, names, batch, budget, sec=True, device_inputs=False):
    """Fills ``row``; returns ∂ln P_m/∂θ at the fiducial (None if the row failed)."""
    from boltzmann.gradients import PowerSpectrumFunction

    try:
        # the default chunks: one solve on CUDA (threads are independent), lock-step chunks
        # sorted by k on the JAX backend (one chunk would run every mode for the slowest one's
        # steps: about twice the warm Jacobian on the 2-core CPU)
        fn = PowerSpectrumFunction(cfg, parameters=names, backend=solver_backend(backend),
                                   sensitivity_error_control=sec)

        def value():
            return jax.block_until_ready(fn())

        def jac():
            return jax.block_until_ready(fn.jacobian())

        t = time.perf_counter()
        value()
        v_first = time.perf_counter() - t
        v_warm, _, _ = _warm_calls(value, v_first, min_total=1.0, max_repeats=3)
        t = time.perf_counter()
        val, jc = jac()
        j_first = time.perf_counter() - t
        j_warm, _, (val, jc) = _warm_calls(jac, j_first, min_total=1.0, max_repeats=3)
        finite = bool(np.all(np.isfinite(np.asarray(jc["P_m"]))))
        row["jacobian_stage_s"] = dict(fn.last_stage_seconds)
        if (device_inputs and getattr(fn, "inputs_on_host", False)
                and not budget.refuse(150.0 + 4 * j_warm)):
            row.update(_device_inputs_side_by_side(fn, value, jac))
        row.update(status="ok", value_first_s=v_first, value_warm_s=v_warm,
                   jacobian_first_s=j_first, jacobian_warm_s=j_warm,
                   ratio=j_warm / v_warm, jacobian_finite=finite)
        launches = _slowest_thread(fn, backend, sec) if backend == "cuda" else None
        if launches:
            row["launches"] = launches
        if batch > 1 and backend == "cuda" and not budget.refuse(6 * j_warm + 120.0):
            row.update(_batch_row(fn, batch, np.asarray(jc["P_m"])))
        row["note"] = "; ".join(
            ([] if finite else ["non-finite Jacobian entries (a mode failed)"])
            + ([launches["text"]] if launches else [])
            + ["Jacobian stages " + ", ".join(f"{k} {v:.2f}" for k, v in
                                              row["jacobian_stage_s"].items()) + " s"]
            + ([f"inputs on the GPU instead: value {row['device_inputs_value_warm_s']:.3f} s, "
                f"Jacobian {row['device_inputs_jacobian_warm_s']:.3f} s"]
               if "device_inputs_value_warm_s" in row else []))
        return np.asarray(jc["P_m"]) / np.asarray(val["P_m"])[..., None]
    except Exception as exc:
        row.update(status="error", note=_unavailable_reason(exc),
                   traceback=traceback.format_exc())
        return None


def _device_inputs_side_by_side(fn, value, jac) -> dict:
    """The same value and Jacobian with the inputs stage (tables, rows, initial states and their
    tangents) on the GPU instead of the host CPU (``PowerSpectrumFunction.inputs_on_host``):
    warm times after one compiling call each."""
    fn.inputs_on_host = False
    try:
        value()
        v_warm, _, _ = _warm_calls(value, 1.0, min_total=1.0, max_repeats=3)
        jac()
        j_warm, _, _ = _warm_calls(jac, 1.0, min_total=1.0, max_repeats=3)
        return {"device_inputs_value_warm_s": v_warm, "device_inputs_jacobian_warm_s": j_warm,
                "device_inputs_jacobian_stage_s": dict(fn.last_stage_seconds)}
    finally:
        fn.inputs_on_host = True


def _batch_row(fn, batch, jac_p_m) -> dict:
    """Value-and-Jacobian of ``batch`` cosmologies in one joint solve (C·K modes × directions
    in one launch, ``boltzmann.gradients_batch``): first call, warm time, cosmologies per second,
    and row 0 (the fiducial) against the single-cosmology Jacobian ``jac_p_m``."""
    from boltzmann.gradients_batch import PowerSpectrumBatch

    pb = PowerSpectrumBatch(fn)
    thetas = fn.theta0[None, :] * (1.0 + 0.01 * jnp.linspace(0.0, 1.0, batch)[:, None])
    t = time.perf_counter()
    pb.value_and_jacobian(thetas)
    first = time.perf_counter() - t
    warm, _, (val, jac) = _warm_calls(lambda: pb.value_and_jacobian(thetas), first,
                                      min_total=0.0, max_repeats=2)
    ref = np.asarray(jac_p_m)
    diff = np.abs(np.asarray(jac["P_m"])[0] - ref).max() / max(np.abs(ref).max(), 1e-300)
    return {"batch": batch, "batch_first_s": first, "batch_warm_s": warm,
            "value_and_jacobian_per_s": batch / warm,
            "batch_stage_s": dict(pb.last_stage_seconds),
            "batch_ok": int(np.sum(val["ok"])),
            "batch_vs_single_max_rel": float(diff)}


def _slowest_thread(fn, backend, sec) -> dict | None:
    """The sensitivity launch of ``fn``'s Jacobian, once more as an explicit joint solve of its
    directions (``fn.solve_directions``): its threads' steps and which (k, parameter) the
    slowest thread integrated (a launch lasts as long as that thread)."""
    from solver import joint_solve

    prob = fn.sensitivity_problem()
    prob.pop("observables")
    kept = fn.solve_directions                   # the directions the Jacobian's solve takes
    prob.update({name: prob[name][kept] for name in ("dy0", "dparams", "dargs")})
    _, _, info = joint_solve(**prob, backend=solver_backend(backend), sensitivity_error_control=sec)
    return launch_note(info, [fn.parameters[i] for i in kept], fn.k)


def launch_note(info: dict, names, k) -> dict | None:
    """Summary of a CUDA joint solve's ``info`` (``solver.joint_solve``): the slowest thread's
    steps, its (k, parameter), the threads and the kernel seconds; None without thread data."""
    steps = info.get("thread_n_accepted")
    if steps is None:
        return None
    steps = np.asarray(steps)                       # (directions, trajectories)
    d, i = np.unravel_index(int(np.argmax(steps)), steps.shape)
    where = (f"k = {k[i]:.3g}/Mpc, {names[d]}" if i < len(k) and d < len(names)
             else f"trajectory {i}, direction {d}")
    kernel = (info.get("launch") or {}).get("kernel_seconds")
    rec = {"steps_max": int(steps.max()), "steps_median": float(np.median(steps)),
           "threads": int(steps.size), "slowest_trajectory": int(i), "slowest_direction": int(d),
           "kernel_seconds": kernel}
    rec["text"] = (f"tangent: max {rec['steps_max']} steps over {rec['threads']} threads"
                   + (f", kernel {kernel:.2f} s" if kernel is not None else "")
                   + f", slowest {where}")
    return rec


def _grad_line(r) -> str:
    if r["status"] != "ok":
        return f"| {r['backend']} | — | — | — | — | — | {_short(r['note'])} |"
    batch = (f"{r['batch_warm_s']:.2f} (B = {r['batch']}, one solve; first "
             f"{r['batch_first_s']:.0f} s; {r['batch_ok']}/{r['batch']} ok; row 0 vs single "
             f"{r['batch_vs_single_max_rel']:.1e})" if "batch_warm_s" in r else "—")
    per_s = f"{r['value_and_jacobian_per_s']:.3g}" if "value_and_jacobian_per_s" in r else "—"
    return (f"| {r['backend']} | {r['value_first_s']:.1f} / {r['value_warm_s']:.3f} | "
            f"{r['jacobian_first_s']:.1f} / {r['jacobian_warm_s']:.3f} | {r['ratio']:.2f} | "
            f"{batch} | {per_s} | {_short(r['note'], 260)} |")
