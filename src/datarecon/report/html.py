"""One self-contained HTML report: inline CSS, PNG figures embedded as base64.

The file has no external resources (no scripts, fonts, stylesheets or
links to fetch), so it can be mailed or archived as is. :func:`write_report`
renders sections you build; :func:`render_report` builds them from evaluated
run directories (``metrics.json`` from :func:`datarecon.evaluation.evaluate_run`,
``run.json``, ``neighbours.safetensors``).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datarecon.errors import DataReconError
from datarecon.report import figures as F
from datarecon.utils.io import atomic_write_text, load_tensors, read_json

__all__ = ["Table", "FigureItem", "Section", "render_html", "write_report", "render_report", "landscape_results"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #444}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #bbb}
h3{font-size:1.05em}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}caption{caption-side:top;text-align:left;font-weight:600;padding:.2em 0}
figure{display:inline-block;margin:.5em 1em .5em 0;vertical-align:top}figcaption{font-size:.8em;color:#555}
img{max-width:100%;border:1px solid #ddd}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em;max-height:30em}
p.note{color:#7a4b00;background:#fff6e0;padding:.4em .6em;border-left:3px solid #e0a000}
"""


@dataclass(frozen=True)
class Table:
    """A table: caption, header cells, rows of cells (any values, shown with ``str``/``%.4g``)."""

    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class FigureItem:
    """A PNG figure: ``png`` bytes (see :func:`datarecon.report.figures.figure_png`) and a caption."""

    caption: str
    png: bytes


@dataclass(frozen=True)
class Section:
    """A report section.

    Attributes:
        title: Heading.
        text: Paragraphs (plain text; escaped).
        tables, figures: Content.
        code: Preformatted text (e.g. a config as JSON), or "".
        notes: Highlighted caveats.
        level: Heading level (2 = section, 3 = subsection).
    """

    title: str
    text: Sequence[str] = ()
    tables: Sequence[Table] = ()
    figures: Sequence[FigureItem] = ()
    code: str = ""
    notes: Sequence[str] = ()
    level: int = 2
    children: Sequence[Section] = field(default_factory=tuple)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def _png_ok(data: bytes) -> bool:
    return data[:8] == b"\x89PNG\r\n\x1a\n"


def _render_section(s: Section, out: list[str]) -> None:
    lvl = min(max(int(s.level), 2), 6)
    out.append(f"<section><h{lvl}>{html.escape(s.title)}</h{lvl}>")
    for p in s.text:
        out.append(f"<p>{html.escape(p)}</p>")
    for n in s.notes:
        out.append(f'<p class="note">{html.escape(n)}</p>')
    for t in s.tables:
        out.append(f"<table><caption>{html.escape(t.caption)}</caption><thead><tr>")
        out.extend(f"<th>{html.escape(str(h))}</th>" for h in t.header)
        out.append("</tr></thead><tbody>")
        for row in t.rows:
            out.append("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>")
        out.append("</tbody></table>")
    for f in s.figures:
        if not _png_ok(f.png):
            raise DataReconError(f"figure {f.caption!r} is not PNG data; use datarecon.report.figures.figure_png")
        b64 = base64.b64encode(f.png).decode("ascii")
        out.append(f'<figure><img alt="{html.escape(f.caption, quote=True)}" src="data:image/png;base64,{b64}">'
                   f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
    if s.code:
        out.append(f"<pre>{html.escape(s.code)}</pre>")
    for c in s.children:
        _render_section(c, out)
    out.append("</section>")


def render_html(sections: Sequence[Section], *, title: str = "datarecon report") -> str:
    """The report as one HTML string (inline CSS, base64 PNGs, no external resources)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        _render_section(s, out)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(sections: Sequence[Section], *, out: str | os.PathLike,
                 title: str = "datarecon report") -> Path:
    """Write the sections as one self-contained HTML file (atomic write).

    Returns:
        The output path.
    """
    out = Path(out)
    atomic_write_text(out, render_html(sections, title=title))
    return out


# ---------------------------------------------------------------------------
# building sections from evaluated run directories


def _find_key(obj: Any, names: Sequence[str]) -> Any:
    """First value of any key in ``names`` found depth-first in nested dicts."""
    if isinstance(obj, Mapping):
        for n in names:
            if n in obj and not isinstance(obj[n], Mapping):
                return obj[n]
        for v in obj.values():
            r = _find_key(v, names)
            if r is not None:
                return r
    return None


_L1 = ("lambda1", "lambda_1", "lam1")
_L2 = ("lambda2", "lambda_2", "lam2")


def landscape_results(run_dirs: Sequence[str | os.PathLike]) -> dict[str, dict[tuple[float, float], dict]]:
    """Group evaluated runs by method and mixture weights ``(λ₁, λ₂)``.

    A run takes part if its ``run.json`` config holds keys ``lambda1`` and
    ``lambda2`` (or ``lambda_1``/``lam1`` ...) anywhere in its nesting.

    Returns:
        ``{method: {(λ₁, λ₂): metrics summary}}``.
    """
    out: dict[str, dict[tuple[float, float], dict]] = {}
    for d in run_dirs:
        d = Path(d)
        if not (d / "metrics.json").is_file() or not (d / "run.json").is_file():
            continue
        run = read_json(d / "run.json")
        a, b = _find_key(run.get("config"), _L1), _find_key(run.get("config"), _L2)
        if a is None or b is None:
            continue
        out.setdefault(str(run.get("method") or "run"), {})[(float(a), float(b))] = read_json(d / "metrics.json")
    return out


def _run_sections(run_dir: Path) -> Section:
    if not (run_dir / "metrics.json").is_file():
        raise DataReconError(f"{run_dir} has no metrics.json; run `datarecon evaluate {run_dir}` first")
    m = read_json(run_dir / "metrics.json")
    run = read_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    children: list[Section] = []
    window = f"{m.get('window')} {m.get('window_size')}x{m.get('window_size')}"

    # configuration
    cfg = {"method": run.get("method"), "model_dir": run.get("model_dir"), "status": run.get("status"),
           "steps_done": run.get("steps_done"), "seed": run.get("seed"), "config": run.get("config"),
           "final": run.get("final"), "selection": run.get("selection")}
    children.append(Section("Configuration", code=json.dumps(cfg, indent=2, sort_keys=True, default=str), level=3))

    # metrics tables
    tables: list[Table] = []
    notes: list[str] = []
    haim = m.get("haim")
    if haim:
        thr = list(haim["counts"])
        rows = [[f"candidates ({a})", *[c.get(t) for t in thr]] for a, c in haim["counts_by_assignment"].items()]
        base = (m.get("baselines") or {}).get("haim_ssim") or {}
        for name in ("heldout", "noise"):
            if name in base:
                rows.append([f"{name} images as candidates", *[base[name]["counts"].get(t) for t in thr]])
        tables.append(Table(f"Training images with SSIM > threshold (Haim protocol, {window} window)",
                            ["matching", *thr], rows))
    nearest = m.get("nearest") or {}
    if nearest:
        rows = []
        for s, d in nearest.items():
            ss, l2 = d.get("ssim", {}), d.get("l2", {})
            rows.append([s, ss.get("mean"), ss.get("median"), ss.get("max"), l2.get("mean"), l2.get("min")])
        tables.append(Table("Nearest image of each reference set (per candidate)",
                            ["set", "SSIM mean", "SSIM median", "SSIM max", "L2 mean", "L2 min"], rows))
    priv = m.get("privacy") or {}
    if priv.get("scores"):
        fprs = [str(f) for f in priv.get("fprs", [])]
        rows = [[k, v["auc"], *[v["tpr_at_fpr"].get(f) for f in fprs], v["n_real"], v["n_fake"]]
                for k, v in priv["scores"].items()]
        tables.append(Table("Attacker-side scores: real vs fake candidates",
                            ["score", "ROC AUC", *[f"TPR @ FPR {f}" for f in fprs], "real", "fake"], rows))
        notes += [f"{k}: {v['note']}" for k, v in priv["scores"].items() if v.get("note")]
    if "rule" in priv:
        notes.append(f"Real/fake rule: {priv['rule']} (floor {_fmt(priv.get('floor'))}, "
                     f"{priv.get('floor_source')}); {priv.get('n_real')} real, {priv.get('n_fake')} fake.")
    elif "note" in priv:
        notes.append(priv["note"])
    other = [["candidates", m.get("n_candidates")], ["parameter distance ‖θ*−θ‖²", m.get("param_distance")]]
    col = m.get("collapse") or {}
    if col:
        other.append([f"near-duplicate pairs ({col.get('metric')} threshold {_fmt(col.get('threshold'))})",
                      col.get("fraction_pairs")])
        other.append(["candidates with a near-duplicate", col.get("fraction_candidates")])
    tables.append(Table("Summary", ["quantity", "value"], other))
    children.append(Section("Metrics", tables=tables, notes=notes, level=3))

    # figures
    figs: list[FigureItem] = []
    if haim:
        curves = {"real": haim.get("sorted_ssim")}
        bc = ((m.get("baselines") or {}).get("haim_ssim") or {}).get("curves") or {}
        for name in ("heldout", "noise"):
            if bc.get(name):
                curves[name] = bc[name]
        figs.append(FigureItem("Sorted SSIM curve with held-out and noise baselines",
                               F.figure_png(F.sorted_ssim_curve(curves, window=window))))
        per = haim.get("per_train") or {}
        if per.get("margin"):
            figs.append(FigureItem("SSIM of each training image's best reconstruction vs its margin",
                                   F.figure_png(F.ssim_vs_margin(per["ssim"], per["margin"]))))
    if priv.get("roc"):
        rocs = {k: (v["fpr"], v["tpr"], priv["scores"][k]["auc"]) for k, v in priv["roc"].items()}
        figs.append(FigureItem("ROC curves of attacker-side scores", F.figure_png(F.roc_curves(rocs))))
    nb_file = run_dir / "neighbours.safetensors"
    if nb_file.is_file():
        nb = load_tensors(nb_file)
        matches = {k: nb[k] for k in ("train", "partition") if k in nb}
        if matches and nb["candidates"].shape[0]:
            scores = {k: nb[f"{k}_score"].tolist() for k in matches if f"{k}_score" in nb}
            figs.append(FigureItem(
                "Candidates (sorted by similarity to the training set) beside their nearest training "
                "and partition images", F.figure_png(F.neighbour_grid(nb["candidates"], matches, scores=scores))))
    children.append(Section("Figures", figures=figs, level=3))
    title = f"Run {run_dir.name}" + (f" ({run.get('method')})" if run.get("method") else "")
    return Section(title, text=[str(run_dir)], children=tuple(children))


def render_report(run_dirs: Sequence[str | os.PathLike], *, out: str | os.PathLike,
                  title: str = "datarecon report") -> Path:
    """Build one HTML report from evaluated run directories.

    Each run gets its configuration, metrics tables (Haim counts with
    baselines, nearest-neighbour summary, privacy AUC/TPR, collapse,
    parameter distance) and figures (sorted SSIM curve with baselines, SSIM
    vs margin, ROC curves, neighbour grid). Runs whose config holds mixture
    weights ``lambda1``/``lambda2`` also feed the landscape heatmaps and
    interpolation curves (one set per method).

    Args:
        run_dirs: Run directories evaluated by :func:`datarecon.evaluation.evaluate_run`.
        out: Output HTML path.
        title: Report title.

    Returns:
        The output path.

    Raises:
        DataReconError: no run directories, or one without ``metrics.json``.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise DataReconError("no run directories given; pass at least one evaluated run")
    sections = [_run_sections(d) for d in run_dirs]
    land = landscape_results(run_dirs)
    if land:
        figs = []
        for method, res in land.items():
            if len(res) >= 2:
                figs.append(FigureItem(f"Landscape ({method}): mean L2 to the nearest image",
                                       F.figure_png(F.landscape_heatmaps(res, title=method))))
        if figs:
            figs.append(FigureItem("Interpolation curves", F.figure_png(F.interpolation_curves(land))))
            sections.insert(0, Section(
                "Landscape over mixture initialisations",
                text=["x_init = λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd (Runkel et al. 2024, Fig. 10-12)."],
                figures=figs))
    return write_report(sections, out=out, title=title)
