"""Command-line job: ``python scripts/transfer.py --config configs/lcdm.yaml`` (as one runs CLASS).

It parses, calls ``boltzmann.pipeline.run`` and writes: pk.csv, tk.csv, summary.json with the
derived parameters (``boltzmann.output``, ``boltzmann.derived``), pk.png (``boltzmann.plots``),
background.csv when ``output.z_background`` is set, cl.csv/cl_lensed.csv/cl.png when
``output.cl`` is set and, with ``--gradients``, dpk.csv/dpk.png (and dcl.csv with output.cl).
``--compare`` adds ratio panels: against CLASS run through classy with the run's parameters (``boltzmann.class_reference``; its
numbers are written as class_pk.csv, class_cl.csv, class_cl_lensed.csv), or, for pk.png, against
a reference pk.csv.
P(k), transfer functions and derivatives are written at ``output.z``; the run also solved at the
background redshifts (their σ8), which only background.csv reports.

Exit codes: 0 success; 1 the run failed (pipeline error, failed k modes, sigma8 impossible on the
computed k range — files are still written in that last case); 2 bad usage or input (argparse
errors, config errors, missing files, unavailable feature). Failures print one line
``transfer: error: ...`` to stderr; ``--debug`` re-raises with a traceback.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from boltzmann import runtime

__all__ = ["main", "build_parser", "resolve_config_path", "CliError"]

PROG = "transfer"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = "output"
#: ``--compare`` without a file: run CLASS (classy) for the reference
COMPARE_CLASS = "class"


class CliError(Exception):
    """A failure reported as one line; `exit_code` 1 = run failed, 2 = bad input."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Linear Einstein-Boltzmann solver: transfer functions, P(k) and sigma8.")
    parser.add_argument("--config",
                        help="YAML config: a path, or a bare name looked up in configs/ (e.g. lcdm)")
    parser.add_argument("--out", metavar="DIR", help="output directory (default: the config's output.dir)")
    parser.add_argument("--backend", choices=("auto", "jax", "cuda"), default="auto",
                        help="perturbation solver backend (default: auto)")
    parser.add_argument("--compare", metavar="REF", nargs="?", const=COMPARE_CLASS,
                        help="add ratio panels. Alone (or 'class'): against CLASS run through classy "
                             "with this config's parameters, for pk.png and cl.png (needs classy). A "
                             "reference pk.csv (e.g. tests/data/class_lcdm_pk.csv): pk.png against "
                             "it; cl.png is still compared with CLASS when classy is installed")
    parser.add_argument("--no-plot", action="store_true",
                        help="do not write pk.png, cl.png, dpk.png (nor run CLASS for --compare)")
    parser.add_argument("--quiet", action="store_true", help="no progress, timings or file list")
    parser.add_argument("--gradients", action="store_true", help="also compute parameter derivatives")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    cache = parser.add_argument_group(
        "compilation cache", "compiled programs and kernels are kept between runs, by default in "
        "$XDG_CACHE_HOME/boltzmann-gpu (~/.cache/boltzmann-gpu); BOLTZMANN_CACHE_DIR moves it, "
        "BOLTZMANN_CACHE=0 turns it off")
    cache.add_argument("--cache-dir", metavar="DIR", help="cache folder for this run")
    cache.add_argument("--no-cache", action="store_true", help="compile everything afresh, keep nothing")
    cache.add_argument("--clear-cache", action="store_true",
                       help="delete the cache (then run the config, if one is given)")
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


def _check_failures(result) -> None:
    failed = result.failures()
    if failed:
        ks = sorted({k for _, k, _ in failed})
        shown = ", ".join(f"{x:.4g}" for x in ks[:8]) + (", ..." if len(ks) > 8 else "")
        why = "; ".join(sorted({reason for _, _, reason in failed}))
        raise CliError(f"perturbation solve failed for {len(ks)} of "
                       f"{result.transfers.k.shape[1]} k modes: "
                       f"k = {shown} 1/Mpc ({why})")
    for name, pk in (("P_m", result.spectra.pk_m), ("P_cb", result.spectra.pk_cb)):
        bad = ~np.all(np.isfinite(pk[0]), axis=0)
        if bad.any():
            raise CliError(f"non-finite {name} for {int(bad.sum())} k modes: k = "
                           + ", ".join(f"{x:.4g}" for x in result.k[0][bad][:8]) + " 1/Mpc")


def _requested_z(config, solved) -> list:
    """The redshifts P(k) files are written at: the config's ``output.z`` (the run also solved
    the background redshifts), or every solved one when the config does not say."""
    asked = getattr(getattr(config, "output", None), "z", None)
    return list(solved) if asked is None else [z for z in solved if z in set(asked)]


def _write_background(config, result, out_dir: Path, comments) -> Path | None:
    """background.csv at ``output.z_background`` (None when the config asks for none)."""
    from boltzmann import derived, output

    zs = list(getattr(getattr(config, "output", None), "z_background", ()) or ())
    if not zs:
        return None
    sigma8 = [derived.sigma8_at(result, z) for z in zs]
    sigma8_cb = [derived.sigma8_at(result, z, name="sigma8_cb") for z in zs]
    columns = derived.background_table(
        result.cosmologies[0], zs, np.array([np.nan if v is None else v for v in sigma8]),
        np.array([np.nan if v is None else v for v in sigma8_cb]))
    return output.write_background_csv(out_dir / output.BACKGROUND_FILE, columns, comments)


def _sigma8(result, name: str, values) -> tuple[dict, list]:
    """{z: σ8 or None} of the run's cosmology and the problems that made a value None."""
    out, problems = {}, []
    for iz, z in enumerate(result.z):
        problem = result.spectra.problem(0, name, z)
        out[z] = None if problem is not None else float(values[0, iz])
        if problem is not None:
            problems.append(f"sigma8 ({name}, z = {z}): {_one_line(problem)}")
    return out, problems


#: what a stage compiles on first use, for the line that says why a first run waits
_FIRST_USE = {"perturbations": "the perturbation solver",
              "gradients": "the derivative programs and the sensitivity solver (minutes)",
              "cmb gradients": "the C_l derivative programs and the sensitivity solver "
                               "(minutes)"}


def _first_use_notes(progress, settings, counter, err_stream, quiet: bool):
    """``progress``, plus one line when a compiling stage starts with a cold cache (something
    had to compile already): the user learns why the first run waits."""
    said = set()

    def report(stage, done, total):
        if stage in _FIRST_USE and done == 0 and stage not in said and not quiet \
                and (settings.cache_root is None or counter.compiled > 0):
            said.add(stage)
            where = (f"cached in {settings.cache_root} for later runs"
                     if settings.cache_root is not None else "the cache is off")
            err_stream.write(f"{PROG}: compiling {_FIRST_USE[stage]} (first use of this "
                             f"model on this machine; {where})\n")
        progress(stage, done, total)
    return report


def _compilation(counter, settings, backend) -> dict:
    """What this run compiled and what it loaded from the persistent cache."""
    out = {**counter.as_dict(),
           "cache_dir": None if settings.cache_root is None else str(settings.cache_root)}
    kernels = getattr(backend, "kernel_cache", None)
    if kernels is not None:
        out["cuda_kernel_cache"] = dict(kernels.stats)
    return out


def _write_cl(result, out_dir: Path, comments) -> list:
    """cl.csv (and cl_lensed.csv) when the run computed CMB spectra (output.cl), else nothing."""
    from boltzmann import output

    cl = getattr(result, "cl", None)
    if cl is None:
        return []
    written = [output.write_cl_csv(out_dir / output.CL_FILE, cl, comments=comments)]
    if cl.lensed is not None:
        written.append(output.write_cl_lensed_csv(out_dir / output.CL_LENSED_FILE, cl,
                                                  comments=comments))
    return written


def _run(args, settings, counter, run: Callable | None, out_stream, err_stream) -> int:
    t_start = time.perf_counter()
    config_path = resolve_config_path(args.config)
    compare_class = args.compare == COMPARE_CLASS
    if args.compare is not None and not compare_class and not Path(args.compare).is_file():
        raise CliError(f"--compare file not found: {args.compare}", 2)
    if compare_class and not args.no_plot:
        from boltzmann import class_reference

        if not class_reference.available():
            raise CliError("--compare without a file compares with CLASS, run through classy, "
                           "which is not installed: pip install classy==3.4.1.0 (the 'reference' "
                           "extra), or give a reference file (--compare pk.csv)", 2)
    config = _load_config(config_path)
    run = _default_run() if run is None else run

    from boltzmann import output
    from boltzmann.progress import ProgressReporter, format_timings

    out_dir = Path(args.out or _config_out_dir(config) or DEFAULT_OUT_DIR)
    progress = ProgressReporter(stream=err_stream, enabled=not args.quiet)
    try:
        backend = runtime.backend_for(args.backend, settings)
        report = _first_use_notes(progress, settings, counter, err_stream, args.quiet)
        result = run(config, backend=backend, progress=report, gradients=args.gradients,
                     release_compiled=True)
    finally:
        progress.close()
    _check_failures(result)

    timings = {str(s): float(t) for s, t in result.timings.items() if s != "total"}
    k = np.asarray(result.k[0], dtype=float)
    solved = list(result.z)
    zs = _requested_z(config, solved)
    iz_of = {z: solved.index(z) for z in zs}
    spec = result.spectra
    pk_m = {z: spec.pk_m[0, iz_of[z]] for z in zs}
    pk_cb = {z: spec.pk_cb[0, iz_of[z]] for z in zs}
    s8, problems = _sigma8(result, "d_m", spec.sigma8)
    s8_cb, problems_cb = _sigma8(result, "d_cb", spec.sigma8_cb)
    problems += problems_cb
    # on the transfers' own wavenumbers: the solved modes (fewer than P(k)'s with
    # precision.k_solve_stride > 1, whose other modes are splined in P alone)
    k_transfers = np.asarray(result.transfers.k[0], dtype=float)
    transfers = {z: {name: v[0, iz_of[z]] for name, v in result.transfers.fields.items()}
                 for z in zs}

    t0 = time.perf_counter()
    name = getattr(config, "name", None) or config_path.stem
    comments = [f"config: {config_path} ({name}); backend: {result.backend}"]
    written = [output.write_pk_csv(out_dir / output.PK_FILE, k, pk_m, pk_cb, zs, comments=comments),
               output.write_tk_csv(out_dir / output.TK_FILE, k_transfers, transfers, zs,
                                         comments=comments)]
    background = _write_background(config, result, out_dir, comments)
    if background is not None:
        written.append(background)
    written += _write_cl(result, out_dir, comments)
    timings["write"] = time.perf_counter() - t0

    tables = result.gradients
    if tables is not None:
        sel = [iz_of[z] for z in zs]
        dlnp_m, dlnp_cb = np.asarray(tables["dlnP_m"])[sel], np.asarray(tables["dlnP_cb"])[sel]
        written.append(output.write_dpk_csv(out_dir / output.DPK_FILE, k, dlnp_m, dlnp_cb, zs,
                                            tables["parameters"], comments=comments))
        if not args.no_plot:
            from boltzmann import plots  # matplotlib: imported only when plotting

            written.append(out_dir / "dpk.png")
            plots.plot_dpk(written[-1], k, dlnp_m, zs, tables["parameters"],
                           title=f"{name}: exact derivatives")

    if result.cl_gradients is not None:
        from boltzmann.cmb.gradients import LOG_SPECTRA

        written.append(output.write_dcl_csv(out_dir / output.DCL_FILE, result.cl_gradients,
                                            LOG_SPECTRA, comments=comments))

    if not args.no_plot:
        from boltzmann.cli_compare import plot_results

        t0 = time.perf_counter()
        written += plot_results(config, result, out_dir, k, pk_m, pk_cb, zs, args.compare,
                                name, comments, err_stream)
        timings["plot"] = time.perf_counter() - t0

    from boltzmann.derived import result_derived

    extra = {"name": name, "config": str(config_path), "derived": result_derived(result),
             "compilation": _compilation(counter, settings, backend)}
    if background is not None:
        extra["files"] = {"pk": output.PK_FILE, "tk": output.TK_FILE,
                          "background": output.BACKGROUND_FILE}
    if problems:
        extra["sigma8_problems"] = problems
    if tables is not None:
        extra["gradients"] = tables["summary"]
    if result.cl_gradients is not None:
        extra["cl_gradients"] = result.cl_gradients["summary"]
    timings["total_wall"] = time.perf_counter() - t_start
    written.append(output.write_summary_json(
        out_dir / output.SUMMARY_FILE, zs=zs, sigma8=s8, sigma8_cb=s8_cb,
        parameters=result.cosmologies[0].resolved(), backend=result.backend,
        solver_stats=result.solver_stats(), timings=timings, k=k, extra=extra))

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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is None and not args.clear_cache:
        parser.error("the following arguments are required: --config")
    try:
        settings = runtime.Settings.from_environment(cache_root=args.cache_dir,
                                                     no_cache=args.no_cache)
        if args.clear_cache:
            removed = runtime.clear_cache(settings)
            if not args.quiet:
                err_stream.write(f"{PROG}: cleared {', '.join(map(str, removed)) or 'nothing'}\n")
            if args.config is None:
                return 0
        counter = runtime.configure(settings)
        return _run(args, settings, counter, run, out_stream, err_stream)
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
