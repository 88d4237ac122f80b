"""Command-line job: ``python scripts/transfer.py --config configs/lcdm.yaml`` (as one runs CLASS).

config -> `boltzmann.pipeline.run` -> P(k), sigma8 (`boltzmann.spectra`) -> pk.csv, tk.csv,
summary.json (`boltzmann.output`) -> pk.png (`boltzmann.plots`).

Exit codes: 0 success; 1 the run failed (pipeline error, failed k modes, non-finite transfers,
sigma8 impossible on the computed k range — files are still written in that last case);
2 bad usage or input (argparse errors, config errors, missing files, unavailable feature).
Failures print one line ``transfer: error: ...`` to stderr; ``--debug`` re-raises with a traceback.

What the CLI expects of `pipeline.run(config, *, backend, progress)`'s result (duck-typed):
``k`` (1/Mpc), ``z`` (list), ``transfers`` {z: {CLASS name: array over k}} with at least
``d_m`` and either ``d_cb`` or ``d_cdm`` and ``d_b``; ``cosmology`` (resolved dict with ``h``,
``A_s``, ``n_s``, ``k_pivot`` and, for d_cb, ``omega_b``, ``omega_cdm``) or ``primordial``
({A_s, n_s, k_pivot[, alpha_s]}) for the primordial amplitude; ``backend``; ``solver_stats`` (dict;
a non-empty ``failed_k`` list of wavenumbers, optionally with ``failure_reasons``, marks failed
modes); ``timings`` {stage: seconds}. ``--gradients`` is passed on as ``gradients=True`` only if
`run` accepts a ``gradients`` keyword; the result's ``gradients`` (if any) goes into summary.json,
and its ``gradient_tables`` (``boltzmann.gradients.PowerSpectrumFunction.dlnpk()``) into dpk.csv and
dpk.png.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = ["main", "build_parser", "resolve_config_path", "CliError"]

PROG = "transfer"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = "output"


class CliError(Exception):
    """A failure reported as one line; `exit_code` 1 = run failed, 2 = bad input."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Linear Einstein-Boltzmann solver: transfer functions, P(k) and sigma8.")
    parser.add_argument("--config", required=True,
                        help="YAML config: a path, or a bare name looked up in configs/ (e.g. lcdm)")
    parser.add_argument("--out", metavar="DIR", help="output directory (default: the config's output.dir)")
    parser.add_argument("--backend", choices=("auto", "jax", "cuda"), default="auto",
                        help="perturbation solver backend (default: auto)")
    parser.add_argument("--compare", metavar="FILE",
                        help="reference pk.csv (same layout, e.g. tests/data/class_lcdm_pk.csv): adds a ratio panel")
    parser.add_argument("--no-plot", action="store_true", help="do not write pk.png")
    parser.add_argument("--quiet", action="store_true", help="no progress, timings or file list")
    parser.add_argument("--gradients", action="store_true", help="also compute parameter derivatives")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    return parser


def resolve_config_path(name: str) -> Path:
    """A config path as given, or ``<name>[.yaml|.yml]`` in ./configs or the repository's configs/."""
    given = Path(name)
    if given.is_file():
        return given
    tried = [given]
    if given.parent == Path("."):
        for folder in (Path.cwd() / "configs", REPO_ROOT / "configs"):
            for candidate in (folder / name, folder / f"{name}.yaml", folder / f"{name}.yml"):
                if candidate.is_file():
                    return candidate
                tried.append(candidate)
    raise CliError(f"config '{name}' not found (tried: {', '.join(str(p) for p in dict.fromkeys(tried))})", 2)


def _load_config(path: Path):
    try:
        from boltzmann.params import ConfigError, load_config
    except ImportError as exc:  # pragma: no cover - only before params.py exists
        raise CliError(f"cannot load configs: boltzmann.params is unavailable ({exc})", 2) from exc
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CliError(f"invalid config {path}: {_one_line(exc)}", 2) from exc


def _default_run() -> Callable:
    try:
        from boltzmann.pipeline import run
    except ImportError as exc:  # pragma: no cover - only before pipeline.py exists
        raise CliError(f"the pipeline is unavailable: {exc}", 1) from exc
    return run


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _config_out_dir(config) -> str | None:
    output = getattr(config, "output", None)
    for attr in ("dir", "directory", "out_dir"):
        value = getattr(output, attr, None) if output is not None else None
        if value:
            return str(value)
    return None


def _primordial(result) -> dict:
    source = getattr(result, "primordial", None) or {}
    cosmo = getattr(result, "cosmology", None) or {}
    params = {}
    for key, default in (("A_s", None), ("n_s", None), ("k_pivot", 0.05), ("alpha_s", 0.0)):
        value = source.get(key, cosmo.get(key, getattr(result, key, default)))
        if value is None:
            raise CliError(f"pipeline result lacks the primordial parameter '{key}'")
        params[key] = float(value)
    return params


def _transfers_at(result, z) -> dict:
    transfers = result.transfers
    for key in (z, float(z)):
        if key in transfers:
            return transfers[key]
    from boltzmann.output import z_label
    for key, value in transfers.items():
        if z_label(key) == z_label(z):
            return value
    raise CliError(f"pipeline result has no transfer functions for z = {z}")


def _check_solver_stats(result, k: np.ndarray) -> None:
    stats = getattr(result, "solver_stats", None) or {}
    failed = stats.get("failed_k")
    if failed is not None and len(failed) > 0:
        failed = [float(x) for x in np.atleast_1d(np.asarray(failed, dtype=float))]
        shown = ", ".join(f"{x:.4g}" for x in failed[:8]) + (", ..." if len(failed) > 8 else "")
        reasons = stats.get("failure_reasons")
        why = ""
        if reasons:
            reasons = list(reasons) if not isinstance(reasons, str) else [reasons]
            why = f" ({'; '.join(sorted(set(map(str, reasons))))})"
        raise CliError(f"perturbation solve failed for {len(failed)} of {k.size} k modes: "
                       f"k = {shown} 1/Mpc{why}")


def _cb_transfer(transfers: dict, cosmology: dict, z):
    from boltzmann.spectra import cb_transfer
    if "d_cb" in transfers:
        return np.asarray(transfers["d_cb"])
    try:
        omega_b, omega_cdm = float(cosmology["omega_b"]), float(cosmology["omega_cdm"])
        return np.asarray(cb_transfer(transfers["d_cdm"], transfers["d_b"], omega_cdm, omega_b))
    except KeyError as exc:
        raise CliError(f"cannot form d_cb at z = {z}: pipeline result lacks {exc}") from exc


def _compute_spectra(result, zs, k):
    from boltzmann import spectra
    prim = _primordial(result)
    cosmology = dict(getattr(result, "cosmology", None) or {})
    if "h" not in cosmology:
        raise CliError("pipeline result's cosmology lacks 'h' (needed for sigma8 at R = 8 Mpc/h)")
    h = float(cosmology["h"])
    pk_m, pk_cb, s8, s8_cb, problems = {}, {}, {}, {}, []
    for z in zs:
        transfers = _transfers_at(result, z)
        if "d_m" not in transfers:
            raise CliError(f"pipeline result lacks d_m at z = {z}")
        for name, transfer in (("d_m", np.asarray(transfers["d_m"])), ("d_cb", _cb_transfer(transfers, cosmology, z))):
            bad = ~np.isfinite(transfer)
            if bad.any():
                raise CliError(f"non-finite {name} at z = {z} for {int(bad.sum())} k modes: "
                               f"k = {', '.join(f'{x:.4g}' for x in k[bad][:8])} 1/Mpc")
            pk = np.asarray(spectra.power_from_transfer(k, transfer, prim["A_s"], prim["n_s"], prim["k_pivot"],
                                                        prim["alpha_s"]))
            (pk_m if name == "d_m" else pk_cb)[z] = pk
            try:
                sigma = float(spectra.sigma8(k, pk, h))
            except spectra.KRangeError as exc:
                sigma = None
                problems.append(f"sigma8 ({name}, z = {z}): {_one_line(exc)}")
            (s8 if name == "d_m" else s8_cb)[z] = sigma
    return pk_m, pk_cb, s8, s8_cb, problems


def _run(args, run: Callable | None, out_stream, err_stream) -> int:
    t_start = time.perf_counter()
    config_path = resolve_config_path(args.config)
    if args.compare is not None and not Path(args.compare).is_file():
        raise CliError(f"--compare file not found: {args.compare}", 2)
    config = _load_config(config_path)
    run = _default_run() if run is None else run

    kwargs = {}
    if args.gradients:
        if "gradients" not in inspect.signature(run).parameters:
            raise CliError("--gradients is not yet available: the pipeline does not compute parameter "
                           "derivatives yet", 2)
        kwargs["gradients"] = True

    from boltzmann import output, plots
    from boltzmann.progress import ProgressReporter, format_timings

    out_dir = Path(args.out or _config_out_dir(config) or DEFAULT_OUT_DIR)
    progress = ProgressReporter(stream=err_stream, enabled=not args.quiet)
    try:
        result = run(config, backend=args.backend, progress=progress, **kwargs)
    finally:
        progress.close()

    timings = {str(s): float(t) for s, t in (getattr(result, "timings", None) or {}).items()}
    k = np.asarray(result.k, dtype=float)
    zs = list(result.z)
    _check_solver_stats(result, k)

    t0 = time.perf_counter()
    pk_m, pk_cb, s8, s8_cb, problems = _compute_spectra(result, zs, k)
    timings["spectra"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    name = getattr(config, "name", None) or config_path.stem
    comments = [f"config: {config_path} ({name}); backend: {getattr(result, 'backend', args.backend)}"]
    written = [output.write_pk_csv(out_dir / output.PK_FILE, k, pk_m, pk_cb, zs, comments=comments),
               output.write_tk_csv(out_dir / output.TK_FILE, k, {z: _transfers_at(result, z) for z in zs}, zs,
                                   comments=comments)]
    timings["write"] = time.perf_counter() - t0

    tables = getattr(result, "gradient_tables", None)
    if tables is not None:
        written.append(output.write_dpk_csv(out_dir / output.DPK_FILE, k, tables["dlnP_m"],
                                            tables["dlnP_cb"], zs, tables["parameters"],
                                            comments=comments))
        if not args.no_plot:
            written.append(out_dir / "dpk.png")
            plots.plot_dpk(written[-1], k, tables["dlnP_m"], zs, tables["parameters"],
                           title=f"{name}: exact derivatives")

    if not args.no_plot:
        t0 = time.perf_counter()
        written.append(out_dir / "pk.png")
        plots.plot_pk(written[-1], k, pk_m, pk_cb, zs, reference=args.compare, title=f"{name}")
        timings["plot"] = time.perf_counter() - t0

    extra = {"name": name, "config": str(config_path)}
    if problems:
        extra["sigma8_problems"] = problems
    gradients = getattr(result, "gradients", None)
    if gradients is not None:
        extra["gradients"] = gradients
    timings["total_wall"] = time.perf_counter() - t_start
    written.append(output.write_summary_json(
        out_dir / output.SUMMARY_FILE, zs=zs, sigma8=s8, sigma8_cb=s8_cb,
        parameters=dict(getattr(result, "cosmology", None) or {}), backend=getattr(result, "backend", args.backend),
        solver_stats=dict(getattr(result, "solver_stats", None) or {}), timings=timings, k=k, extra=extra))

    if not args.quiet:
        stage_times = {s: t for s, t in timings.items() if s != "total_wall"}
        err_stream.write("timings:\n" + format_timings(stage_times) + "\n")
        for z in zs:
            s8_text = "n/a" if s8[z] is None else f"{s8[z]:.6f}"
            cb_text = "n/a" if s8_cb[z] is None else f"{s8_cb[z]:.6f}"
            out_stream.write(f"z = {output.z_label(z)}: sigma8 = {s8_text}, sigma8_cb = {cb_text}\n")
        out_stream.write("wrote " + ", ".join(str(p) for p in written) + "\n")
    if problems:
        raise CliError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return 0


def main(argv: Sequence[str] | None = None, *, run: Callable | None = None,
         stdout=None, stderr=None) -> int:
    """Run the job; returns the exit code. `run` replaces `boltzmann.pipeline.run` (tests)."""
    out_stream = sys.stdout if stdout is None else stdout
    err_stream = sys.stderr if stderr is None else stderr
    args = build_parser().parse_args(argv)
    try:
        return _run(args, run, out_stream, err_stream)
    except CliError as exc:
        if args.debug:
            raise
        err_stream.write(f"{PROG}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        err_stream.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for users; --debug shows the traceback
        if args.debug:
            raise
        err_stream.write(f"{PROG}: error: {type(exc).__name__}: {_one_line(exc)}\n")
        return 1
