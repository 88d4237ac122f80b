"""pk.png: the linear matter power spectrum per redshift, optionally against a reference file;
cl.png: the CMB spectra (``plot_cl``), optionally against CLASS.

Headless (Agg). With a reference (a pk.csv in the output-contract layout, e.g. the CLASS file
tests/data/class_lcdm_pk.csv), a second panel shows ours/reference - 1 (in units of 1e-3) for every column the two
files share, with the reference interpolated onto our k by a cubic spline of ln P in ln k
(restricted to the overlapping k range), and +-1e-3 guide lines: the level at which
default-precision CLASS and CAMB disagree.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.interpolate import CubicSpline  # noqa: E402

from boltzmann.output import read_pk_csv, z_label  # noqa: E402

__all__ = ["plot_pk", "plot_dpk", "ratio_to_reference"]

GUIDE_LEVEL = 1e-3
RATIO_UNIT = 1e-3  # the ratio panel's y axis is in units of 1e-3 (its line data too)


def ratio_to_reference(k, pk, k_ref, pk_ref):
    """ours/reference - 1 on the part of `k` inside the reference's k range: (k_overlap, ratio)."""
    k = np.asarray(k, dtype=float)
    k_ref = np.asarray(k_ref, dtype=float)
    inside = (k >= k_ref[0]) & (k <= k_ref[-1])
    if not inside.any():
        return k[:0], k[:0]
    spline = CubicSpline(np.log(k_ref), np.log(np.asarray(pk_ref, dtype=float)))
    ref_on_k = np.exp(spline(np.log(k[inside])))
    return k[inside], np.asarray(pk, dtype=float)[inside] / ref_on_k - 1.0


def plot_pk(path, k, pk_m: Mapping[float, np.ndarray], pk_cb: Mapping[float, np.ndarray] | None = None,
            zs: Sequence[float] | None = None, reference=None, title: str | None = None):
    """Write pk.png to `path` and return the matplotlib Figure (closed; for inspection in tests).

    `reference` is a path to a pk.csv-layout file or None. P_cb is drawn dashed when it differs
    from P_m by more than 1e-6 anywhere.
    """
    zs = list(pk_m.keys()) if zs is None else list(zs)
    k = np.asarray(k, dtype=float)
    ours = {f"P_m_z{z_label(z)}_Mpc3": np.asarray(pk_m[z]) for z in zs}
    if pk_cb is not None:
        ours.update({f"P_cb_z{z_label(z)}_Mpc3": np.asarray(pk_cb[z]) for z in zs})

    ref_k = ref_cols = None
    shared: list[str] = []
    if reference is not None:
        ref_k, ref_cols = read_pk_csv(reference)
        shared = [name for name in ours if name in ref_cols]

    if reference is not None:
        fig, (ax, ax_ratio) = plt.subplots(2, 1, figsize=(7.0, 7.0), sharex=True,
                                           gridspec_kw={"height_ratios": [2.2, 1.0], "hspace": 0.06})
    else:
        fig, ax = plt.subplots(figsize=(7.0, 5.0))
        ax_ratio = None

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, z in enumerate(zs):
        color = colors[i % len(colors)]
        ax.loglog(k, pk_m[z], color=color, lw=1.6, label=f"$P_m$, z = {z_label(z)}")
        if pk_cb is not None:
            cb = np.asarray(pk_cb[z])
            if np.max(np.abs(cb / np.asarray(pk_m[z]) - 1)) > 1e-6:
                ax.loglog(k, cb, color=color, lw=1.1, ls="--", label=f"$P_{{cb}}$, z = {z_label(z)}")
        if reference is not None:
            ref_name = f"P_m_z{z_label(z)}_Mpc3"
            if ref_name in ref_cols:
                ax.loglog(ref_k, ref_cols[ref_name], color="k", lw=0.8, ls=":",
                          label="reference" if i == 0 else None)
    ax.set_ylabel(r"$P(k)$  [Mpc$^3$]")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)

    if ax_ratio is not None:
        for i, name in enumerate(shared):
            k_over, ratio = ratio_to_reference(k, ours[name], ref_k, ref_cols[name])
            z_text = name.split("_z")[1].rsplit("_Mpc3", 1)[0]
            species = "m" if name.startswith("P_m_") else "cb"
            ax_ratio.semilogx(k_over, ratio / RATIO_UNIT, lw=1.2, color=colors[zs.index(_z_from_label(z_text, zs)) % len(colors)],
                              ls="-" if species == "m" else "--", label=f"$P_{{{species}}}$, z = {z_text}")
        for level in (GUIDE_LEVEL, -GUIDE_LEVEL):
            ax_ratio.axhline(level / RATIO_UNIT, color="0.5", lw=0.8, ls="--")
        ax_ratio.axhline(0.0, color="0.2", lw=0.6)
        ax_ratio.set_ylabel(r"ours / ref $-$ 1  [$10^{-3}$]")
        ax_ratio.set_xlabel(r"$k$  [1/Mpc]")
        ax_ratio.grid(True, which="major", alpha=0.3)
        if shared:
            ax_ratio.legend(fontsize=7, frameon=False, ncol=2, title=f"vs {Path(reference).name}",
                            title_fontsize=7)
        else:
            ax_ratio.text(0.5, 0.5, f"no shared columns with {Path(reference).name}", ha="center",
                          va="center", transform=ax_ratio.transAxes, fontsize=8)
    else:
        ax.set_xlabel(r"$k$  [1/Mpc]")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return fig


def _z_from_label(label: str, zs: Sequence[float]) -> float:
    for z in zs:
        if z_label(z) == label:
            return z
    raise KeyError(label)


def plot_dpk(path, k, dlnpk, zs: Sequence[float], parameters: Sequence[str], title: str | None = None):
    """dpk.png: ∂ln P_m/∂θ against k, one panel per parameter, one line per z.

    ``dlnpk`` has shape (n_z, n_k, n_θ). Returns the (closed) Figure.
    """
    k = np.asarray(k, dtype=float)
    d = np.asarray(dlnpk, dtype=float)
    n = len(parameters)
    ncol = min(n, 5)
    nrow = (n + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.6 * nrow), squeeze=False,
                             sharex=True)
    for ip, name in enumerate(parameters):
        ax = axes[ip // ncol][ip % ncol]
        for iz, z in enumerate(zs):
            ax.semilogx(k, d[iz, :, ip], label=f"z = {z_label(z)}")
        ax.axhline(0.0, color="0.7", lw=0.5)
        ax.set_title(f"dlnP_m/d{name}", fontsize=9)
        ax.tick_params(labelsize=7)
    for ip in range(n, nrow * ncol):
        axes[ip // ncol][ip % ncol].axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("k [1/Mpc]", fontsize=8)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


# ----------------------------------------------------------------------------- CMB spectra
#: cl.png's panels, in this order when computed
CL_PANELS = ("TT", "EE", "TE", "BB", "PP")
_CL_LABELS = {"TT": r"$D_\ell^{TT}$  [$\mu$K$^2$]", "EE": r"$D_\ell^{EE}$  [$\mu$K$^2$]",
              "TE": r"$D_\ell^{TE}$  [$\mu$K$^2$]", "BB": r"$D_\ell^{BB}$  [$\mu$K$^2$]",
              "PP": r"$[\ell(\ell+1)]^2 C_\ell^{\phi\phi}/2\pi$"}


def cl_ratio(ours: dict, ref: dict, name: str, ell, ell_ref):
    """(ℓ shared with the reference, ours/ref - 1) of one spectrum of two {name: D_ℓ} dicts; TE,
    which crosses zero, as ΔD^TE/√(D^TT D^EE) of the reference (as the accuracy targets say)."""
    ell, ell_ref = np.asarray(ell), np.asarray(ell_ref)
    common, i, j = np.intersect1d(ell, ell_ref, return_indices=True)
    if name == "TE":
        if not {"TT", "EE"} <= set(ref):
            return common[:0], common[:0].astype(float)
        scale = np.sqrt(np.abs(ref["TT"][j] * ref["EE"][j]))
        return common, (ours[name][i] - ref[name][j]) / scale
    return common, ours[name][i] / ref[name][j] - 1.0


def _cl_curves(spectra) -> tuple[dict, dict | None]:
    """(the D_ℓ drawn: lensed where computed, PP always unlensed; the unlensed ones drawn thin
    beside them, or None)."""
    unlensed = spectra.d_ell()
    if spectra.lensed is None:
        return unlensed, None
    shown = spectra.d_ell(lensed=True)
    if "PP" in unlensed:
        shown["PP"] = unlensed["PP"]
    return shown, unlensed


def plot_cl(path, spectra, reference=None, reference_label: str = "CLASS",
            title: str | None = None, note: str | None = None):
    """Write cl.png: one panel per computed spectrum (D_ℓ of TT, EE, TE, BB [μK²] and
    [ℓ(ℓ+1)]² C_ℓ^φφ/2π), lensed where computed (the unlensed thin and dashed beside), and — with
    a ``reference`` (a ClSpectra, e.g. CLASS's from boltzmann.class_reference) — a ratio row:
    ours/reference - 1 in units of 1e-3 (TE: ΔD/√(D^TT D^EE)), lensed against lensed, with the
    ±1e-3 guides of the accuracy targets. ``note`` replaces the ratio row by a line of text (why
    no reference). Returns the (closed) Figure."""
    shown, thin = _cl_curves(spectra)
    names = [n for n in CL_PANELS if n in shown]
    ell = np.asarray(spectra.ell, dtype=float)
    ref_shown = None
    if reference is not None:
        ref_shown, _ = _cl_curves(reference)
    rows = 2 if reference is not None else 1
    fig, axes = plt.subplots(rows, len(names), figsize=(3.3 * len(names), 3.2 + 1.8 * (rows - 1)),
                             squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [2.2, 1.0][:rows], "hspace": 0.06})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lensed_text = "lensed" if spectra.lensed is not None else "unlensed"
    for i, name in enumerate(names):
        ax = axes[0][i]
        kind = "unlensed" if name == "PP" else lensed_text
        ax.plot(ell, shown[name], color=colors[i % len(colors)], lw=1.3, label=f"ours, {kind}")
        if thin is not None and name in thin and name != "PP":
            ax.plot(ell, thin[name], color=colors[i % len(colors)], lw=0.7, ls="--",
                    label="ours, unlensed")
        if ref_shown is not None and name in ref_shown:
            ax.plot(np.asarray(reference.ell), ref_shown[name], color="k", lw=0.7, ls=":",
                    label=reference_label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # crowded for small ℓ
        if name != "TE" and np.all(shown[name] > 0):
            ax.set_yscale("log")
        ax.set_title(_CL_LABELS[name], fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(which="both", labelsize=7)
        if i == 0:
            ax.legend(fontsize=7, frameon=False)
        if rows == 1:
            ax.set_xlabel(r"$\ell$")
    if reference is not None:
        for i, name in enumerate(names):
            ax = axes[1][i]
            if name in ref_shown:
                common, ratio = cl_ratio(shown, ref_shown, name, spectra.ell, reference.ell)
                ax.semilogx(common, ratio / RATIO_UNIT, lw=1.0, color=colors[i % len(colors)])
            else:
                ax.text(0.5, 0.5, f"no {name} in the reference", ha="center", va="center",
                        transform=ax.transAxes, fontsize=7)
            for level in (GUIDE_LEVEL, -GUIDE_LEVEL):
                ax.axhline(level / RATIO_UNIT, color="0.5", lw=0.8, ls="--")
            ax.axhline(0.0, color="0.2", lw=0.6)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel(r"$\ell$")
            ax.grid(True, which="major", alpha=0.3)
            ax.tick_params(which="both", labelsize=7)
        what = r"$\Delta D/\sqrt{D^{TT}D^{EE}}$ for TE"
        axes[1][0].set_ylabel(f"ours / {reference_label} $-$ 1  [$10^{{-3}}$]\n({what})",
                              fontsize=7)
    elif note:
        fig.text(0.01, -0.04, note, ha="left", va="top", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return fig


__all__ += ["plot_cl", "cl_ratio", "CL_PANELS"]
