"""The CLI's plots and their references: pk.png and cl.png, with ``--compare`` ratio panels.

``--compare`` alone (``class``) runs CLASS through classy with the run's parameters
(``boltzmann.class_reference``) and compares both plots with it; ``--compare FILE`` compares
pk.png with that pk.csv-layout file, and cl.png — when the run computed C_ℓ — still with CLASS if
classy is installed (a C_ℓ reference file would have to match the run's ℓ range and lensing;
CLASS run with the same parameters always does). CLASS's numbers are written beside ours
(class_pk.csv, class_cl.csv, class_cl_lensed.csv, in the same layouts) so that the ratio panels
can be reproduced from the files. When CLASS cannot run (classy missing, CLASS's own error), the
plots are written without its panel and a note on stderr and in cl.png says why.
"""
from __future__ import annotations

from pathlib import Path

from . import class_reference, output, plots

__all__ = ["plot_results", "CLASS_PK_FILE", "CLASS_CL_FILE", "CLASS_CL_LENSED_FILE"]

CLASS_PK_FILE = "class_pk.csv"
CLASS_CL_FILE = "class_cl.csv"
CLASS_CL_LENSED_FILE = "class_cl_lensed.csv"
COMPARE_CLASS = "class"


def _class_run(config, k, zs, want_pk: bool, out_dir: Path, comments):
    """(ClassReference or None, files written, note or None)."""
    try:
        ref = class_reference.run_class(config, k=k if want_pk else None,
                                        zs=zs if want_pk else None)
    except class_reference.ClassUnavailable as exc:
        return None, [], f"no CLASS comparison: {exc}"
    except Exception as exc:  # noqa: BLE001 - CLASS's own errors: the plots go on without it
        text = " ".join(str(exc).split()) or type(exc).__name__
        return None, [], f"no CLASS comparison: CLASS failed ({type(exc).__name__}: {text[:300]})"
    notes = [f"reference: CLASS {ref.version} through classy at its default precision, with "
             f"RECFAST (boltzmann.class_reference); CLASS input: {ref.parameters}", *comments]
    written = []
    if ref.pk_m is not None:
        written.append(output.write_pk_csv(out_dir / CLASS_PK_FILE, k, ref.pk_m, ref.pk_cb, zs,
                                           comments=notes))
    if ref.cl is not None:
        written.append(output.write_cl_csv(out_dir / CLASS_CL_FILE, ref.cl, comments=notes))
        if ref.cl.lensed is not None:
            written.append(output.write_cl_lensed_csv(out_dir / CLASS_CL_LENSED_FILE, ref.cl,
                                                      comments=notes))
    return ref, written, None


def plot_results(config, result, out_dir: Path, k, pk_m, pk_cb, zs, compare, name: str,
                 comments, err_stream) -> list:
    """Write pk.png (and cl.png when ``result.cl`` is set), with the references ``compare``
    asks for (module docstring); returns the files written, CLASS's tables included."""
    out_dir = Path(out_dir)
    cl = getattr(result, "cl", None)
    compare_class = compare == COMPARE_CLASS
    pk_reference = None if compare is None or compare_class else compare
    ref, written, note = None, [], None
    if compare is not None and (compare_class or cl is not None):
        ref, written, note = _class_run(config, k, zs, compare_class, out_dir, comments)
        if note:
            err_stream.write(f"transfer: note: {note}\n")
        elif ref.pk_m is not None:
            pk_reference = out_dir / CLASS_PK_FILE
    written.append(out_dir / "pk.png")
    plots.plot_pk(written[-1], k, pk_m, pk_cb, zs, reference=pk_reference, title=f"{name}")
    if cl is not None:
        written.append(out_dir / "cl.png")
        plots.plot_cl(written[-1], cl, reference=None if ref is None else ref.cl,
                      reference_label="CLASS" if ref is None else f"CLASS {ref.version}",
                      title=f"{name}: CMB spectra", note=note)
    return written
