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

from datarecon.attacks.convergence import RESIDUAL_TOL, Convergence, assess_convergence
from datarecon.errors import DataReconError
from datarecon.report import figures as F
from datarecon.report.style import column_label, series
from datarecon.utils.io import atomic_write_text, load_tensors, read_json

__all__ = ["Table", "FigureItem", "Card", "Section", "render_html", "write_report", "render_report", "landscape_results"]

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
div.scroll{overflow-x:auto;max-width:100%}div.scroll table{margin-top:0}
th{white-space:normal;vertical-align:bottom}td{white-space:nowrap}
div.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(250px,1fr));gap:.8em;margin:.8em 0}
div.card{border:1px solid #ccc;border-top:4px solid #888;border-radius:4px;padding:.5em .8em;background:#fafafa}
div.card.ok{border-top-color:#2ca02c}div.card.warn{border-top-color:#e0a000}div.card.bad{border-top-color:#d62728}
div.card h4{margin:.1em 0 .4em;font-size:1em}div.card dl{margin:0;display:grid;
grid-template-columns:minmax(6em,1fr) minmax(7em,1.3fr);
gap:.15em .8em;font-size:.85em}div.card dt{color:#555}div.card dd{margin:0;font-weight:600;overflow-wrap:anywhere}
div.card p.big{font-size:1.05em;margin:.2em 0 .5em}span.swatch{display:inline-block;width:.8em;height:.8em;
border-radius:2px;margin-right:.3em;vertical-align:baseline}
details{margin:1em 0}summary{cursor:pointer;color:#335;font-weight:600}
"""


@dataclass(frozen=True)
class Table:
    """A table: caption, header cells, rows of cells (any values, shown with ``str``/``%.4g``).

    Attributes:
        transpose: Show rows as columns (one column per row, one row per header cell). None
            (default): transpose when the table is wide and short (more than
            :data:`WIDE_COLUMNS` columns, at most :data:`SHORT_ROWS` rows), so it fits the page.
    """

    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    transpose: bool | None = None


#: A table with more columns than this ...
WIDE_COLUMNS = 8
#: ... and at most this many rows is shown transposed.
SHORT_ROWS = 4


def _oriented(t: Table) -> tuple[list[str], list[list[Any]]]:
    """Header and rows as shown (transposed when :attr:`Table.transpose` says so)."""
    flip = t.transpose if t.transpose is not None else (len(t.header) > WIDE_COLUMNS and 0 < len(t.rows) <= SHORT_ROWS)
    if not flip:
        return [str(h) for h in t.header], [list(r) for r in t.rows]
    header = [column_label(str(t.header[0])), *[_fmt(r[0]) for r in t.rows]]
    rows = [[column_label(str(h)), *[r[i] if i < len(r) else None for r in t.rows]] for i, h in enumerate(t.header) if i]
    return header, rows


@dataclass(frozen=True)
class FigureItem:
    """A PNG figure: ``png`` bytes (see :func:`datarecon.report.figures.figure_png`) and a caption."""

    caption: str
    png: bytes


@dataclass(frozen=True)
class Card:
    """A panel of label/value pairs at the top of a section (target, attack, headline, ...).

    Attributes:
        title: Heading of the panel.
        rows: ``(label, value)`` pairs (values shown with the table formatting).
        lead: One sentence shown large above the pairs, or "".
        status: ``"ok"``, ``"warn"``, ``"bad"`` or "" (colours the panel's top edge).
    """

    title: str
    rows: Sequence[tuple[str, Any]] = ()
    lead: str = ""
    status: str = ""


@dataclass(frozen=True)
class Section:
    """A report section.

    Attributes:
        title: Heading.
        text: Paragraphs (plain text; escaped).
        tables, figures: Content.
        code: Preformatted text (e.g. a config as JSON), or ""; shown collapsed (click to open),
            after the other content of the section.
        notes: Highlighted caveats.
        level: Heading level (2 = section, 3 = subsection).
        cards: Panels shown first (:class:`Card`).
        code_title: Summary line of the collapsed ``code``.
    """

    title: str
    text: Sequence[str] = ()
    tables: Sequence[Table] = ()
    figures: Sequence[FigureItem] = ()
    code: str = ""
    notes: Sequence[str] = ()
    level: int = 2
    children: Sequence[Section] = field(default_factory=tuple)
    cards: Sequence[Card] = ()
    code_title: str = "Configuration"


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def _png_ok(data: bytes) -> bool:
    return data[:8] == b"\x89PNG\r\n\x1a\n"


def _render_card(c: Card, out: list[str]) -> None:
    cls = f"card {c.status}" if c.status in ("ok", "warn", "bad") else "card"
    out.append(f'<div class="{cls}"><h4>{html.escape(c.title)}</h4>')
    if c.lead:
        out.append(f'<p class="big">{html.escape(c.lead)}</p>')
    if c.rows:
        out.append("<dl>" + "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(_fmt(v))}</dd>"
                                    for k, v in c.rows) + "</dl>")
    out.append("</div>")


def _render_section(s: Section, out: list[str]) -> None:
    lvl = min(max(int(s.level), 2), 6)
    out.append(f"<section><h{lvl}>{html.escape(s.title)}</h{lvl}>")
    if s.cards:
        out.append('<div class="cards">')
        for c in s.cards:
            _render_card(c, out)
        out.append("</div>")
    for p in s.text:
        out.append(f"<p>{html.escape(p)}</p>")
    for n in s.notes:
        out.append(f'<p class="note">{html.escape(n)}</p>')
    for t in s.tables:
        out.append(f'<div class="scroll"><table><caption>{html.escape(t.caption)}</caption><thead><tr>')
        header, rows = _oriented(t)
        out.extend(f'<th title="{html.escape(str(h), quote=True)}">{html.escape(column_label(str(h)))}</th>'
                   for h in header)
        out.append("</tr></thead><tbody>")
        for row in rows:
            out.append("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>")
        out.append("</tbody></table></div>")
    for f in s.figures:
        if not _png_ok(f.png):
            raise DataReconError(f"figure {f.caption!r} is not PNG data; use datarecon.report.figures.figure_png")
        b64 = base64.b64encode(f.png).decode("ascii")
        out.append(f'<figure><img alt="{html.escape(f.caption, quote=True)}" src="data:image/png;base64,{b64}">'
                   f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
    for c in s.children:
        _render_section(c, out)
    if s.code:
        out.append(f"<details><summary>{html.escape(s.code_title)}</summary><pre>{html.escape(s.code)}</pre></details>")
    out.append("</section>")


#: the mark of a report datarecon wrote (``report --out`` replaces such a file without --overwrite)
GENERATOR = '<meta name="generator" content="datarecon">'


def is_report(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HTML report datarecon wrote (its head carries :data:`GENERATOR`)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return GENERATOR.encode() in head


def render_html(sections: Sequence[Section], *, title: str = "datarecon report") -> str:
    """The report as one HTML string (inline CSS, base64 PNGs, no external resources)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">', GENERATOR,
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


def _read_history(path: Path) -> list[dict]:
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed run
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _target_card(m: Mapping[str, Any], run_dir: Path) -> Card:
    info = m.get("run") or {}
    model_json = None
    model_dir = info.get("model_dir")
    for cand in ([Path(model_dir), run_dir / str(model_dir)] if model_dir else []):
        if (cand / "model.json").is_file():
            model_json = read_json(cand / "model.json")
            break
    meta = model_json or {}
    arch = meta.get("arch") or info.get("arch") or {}
    data = meta.get("data") or info.get("data") or {}
    met = meta.get("metrics") or {}
    widths = [str(arch.get("hidden"))] if arch else []
    if arch.get("input_shape") and arch.get("hidden") is not None:
        d = 1
        for v in arch["input_shape"]:
            d *= int(v)
        widths = [str(d), *[str(h) for h in arch["hidden"]], str(arch.get("num_outputs", "?"))]
    kkt = met.get("kkt_regime_score")
    rows = [("data", f"{data.get('dataset', '?')} / {data.get('task', '?')}"),
            ("n (training images)", met.get("n_train") or (m.get("reference_sizes") or {}).get("train")),
            ("architecture", f"{arch.get('name', '?')} {'-'.join(widths)}, bias {'yes' if arch.get('bias') else 'no'}"),
            ("parameters", f"{meta['num_parameters']:,}" if isinstance(meta.get("num_parameters"), int) else None),
            ("loss, weight decay", f"{meta.get('loss', '?')}, {meta.get('weight_decay', '?')}"),
            ("train / held-out acc", f"{_fmt(_num(met.get('train_accuracy')))} / {_fmt(_num(met.get('heldout_accuracy')))}"),
            ("normalised margin", _num(met.get("normalised_margin"))),
            ("KKT-regime score", _num(kkt) if kkt is not None else "not computed")]
    ok = _num(met.get("train_accuracy")) == 1.0
    return Card("Target (what was attacked)", rows, status="" if model_json is None else ("ok" if ok else "warn"))


def _attack_card(run: Mapping[str, Any], conv: Convergence, m: Mapping[str, Any]) -> Card:
    init = run.get("init") or {}
    if isinstance(init, Mapping):
        params = ", ".join(f"{k} {v}" for k, v in (init.get("params") or {}).items())
        init_s = f"{init.get('name', '?')}" + (f" ({params})" if params else "") + \
                 (" — experimenter's choice (uses data)" if init.get("experimenter_choice") else "")
    else:
        init_s = str(init)
    steps = (run.get("config") or {}).get("steps")
    rows = [("method", run.get("method")), ("initialisation", init_s),
            ("steps", f"{run.get('steps_done')}" + (f" of {steps}" if steps else "")),
            ("candidates m", m.get("n_candidates")), ("status", run.get("status")),
            (conv.key.replace("_", " ") or "final", conv.final),
            ("wall time", f"{run['wall_time_s']:.1f} s" if _num(run.get("wall_time_s")) is not None else None)]
    lead = ("converged: " if conv.converged else "NOT converged: ") + conv.reason
    return Card("Attack", rows, lead=lead, status="ok" if conv.converged else "bad")


def _headline_card(m: Mapping[str, Any]) -> Card:
    h = m.get("headline") or {}
    n = h.get("n_train")
    cal, paper = h.get("calibrated"), h.get("paper") or {}
    rows: list[tuple[str, Any]] = []
    if cal:
        thr = cal.get("threshold")
        lead = (f"{cal['count']} of {n} training images reconstructed at SSIM > "
                f"{'–' if thr is None else f'{thr:.3f}'}")
        rows += [(f"{series('heldout').label}, {h.get('n_heldout_candidates')} images", f"{cal['heldout']} of {n}"),
                 (series("noise").label, f"{cal.get('noise')} of {n}"),
                 ("threshold", f"lowest SSIM that held-out images pass for ≤ {cal['allowed']} of {n} "
                               f"({100 * cal['rate']:g}%)")]
        status = "ok" if cal["count"] > cal["heldout"] else "warn"
    else:
        lead, status = "not measurable without held-out images (no null baseline)", "warn"
    if paper.get("count") is not None:
        rows.append((f"papers' SSIM > {paper['threshold']:g}",
                     f"{paper['count']} of {n} (held-out {_fmt(paper.get('heldout'))}, noise {_fmt(paper.get('noise'))})"))
    if not h and (m.get("haim") or {}).get("counts"):
        lead, status = f"{m['haim']['counts'].get('0.4')} of {n or '?'} at SSIM > 0.4 (no null baseline computed)", "warn"
    return Card("Headline: training images reconstructed", rows, lead=lead, status=status)


def _privacy_card(m: Mapping[str, Any]) -> Card:
    priv = m.get("privacy") or {}
    if "n_real" not in priv:
        return Card("Real vs fake", lead=str(priv.get("note") or "not measured (no held-out images)"), status="warn")
    n_real, n_fake = priv.get("n_real"), priv.get("n_fake")
    rows: list[tuple[str, Any]] = [("class sizes", f"{n_real} real, {n_fake} fake")]
    if not n_real or not n_fake:
        which = "fakes" if not n_fake else "real candidates"
        return Card("Can the attacker tell real from fake?", rows,
                    lead=f"not measurable: 0 {which} (the AUC needs both classes)", status="warn")
    least = priv.get("min_class_size")
    if least and min(n_real, n_fake) < least:
        return Card("Can the attacker tell real from fake?", rows,
                    lead=f"not measurable: fewer than {least} of a class (an AUC from so few is luck)",
                    status="warn")
    best = None
    for name, v in (priv.get("scores") or {}).items():
        auc, ci = _num(v.get("auc")), v.get("auc_ci_95")
        ci_s = f" [95% CI {ci[0]:.2f}–{ci[1]:.2f}]" if isinstance(ci, list) and len(ci) == 2 else ""
        rows.append((f"AUC {name}", f"{auc:.2f}{ci_s}" if auc is not None else "n/a"))
        if auc is not None and (best is None or auc > best[1]):
            best = (name, auc, ci_s)
    lead = (f"best attacker-side score: {best[0]}, AUC {best[1]:.2f}{best[2]}" if best
            else "no attacker-side scores recorded")
    return Card("Can the attacker tell real from fake?", rows, lead=lead)


def _run_sections(run_dir: Path) -> Section:
    """The section of an evaluated run directory (its files read here, rendered by :func:`_sections`)."""
    if not (run_dir / "metrics.json").is_file():
        raise DataReconError(f"{run_dir} has no metrics.json; run `datarecon evaluate {run_dir}` first")
    m = read_json(run_dir / "metrics.json")
    run = read_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    nb_file = run_dir / "neighbours.safetensors"
    nb = load_tensors(nb_file) if nb_file.is_file() else {}
    return _sections(m, run, _read_history(run_dir / "history.jsonl"), nb, run_name=run_dir.name, where=run_dir)


def _evaluation_section(ev: Any, index: int) -> Section:
    """The section of an in-memory :class:`~datarecon.evaluation.Evaluation` (no run directory)."""
    name = str(ev.summary.get("name") or f"evaluation {index + 1}")
    return _sections(ev.summary, {}, [], dict(ev.grid), run_name=name, where=None)


def _sections(m: Mapping[str, Any], run: Mapping[str, Any], history: list[dict], nb: Mapping[str, Any], *,
              run_name: str, where: Path | None) -> Section:
    """Cards, figures and tables of one evaluation summary ``m`` (``metrics.json``) with its run record."""
    conv = assess_convergence(history, status=str(run.get("status", "complete")))
    cards = [_target_card(m, where or Path(".")), _attack_card(run, conv, m), _headline_card(m), _privacy_card(m)]
    children: list[Section] = []
    window = f"{m.get('window')} {m.get('window_size')}x{m.get('window_size')}"
    haim = m.get("haim")
    cal = (m.get("headline") or {}).get("calibrated") or {}

    # figures: the claim first, then the attack's convergence, then the details
    figs: list[FigureItem] = []
    if haim:
        curves = {"reconstructions": haim.get("sorted_ssim")}
        bc = ((m.get("baselines") or {}).get("haim_ssim") or {}).get("curves") or {}
        for name in ("heldout", "noise"):
            if bc.get(name):
                curves[name] = bc[name]
        figs.append(FigureItem(
            "Best SSIM of each training image's reconstruction, sorted, against held-out images and uniform noise "
            "used as candidates (the nulls); dotted: the papers' 0.4, dash-dotted: the null-calibrated threshold.",
            F.figure_png(F.sorted_ssim_curve(curves, window=window, calibrated=cal.get("threshold")))))
    if conv.steps:
        figs.append(FigureItem(
            f"Attack convergence: {conv.key.replace('_', ' ')} per logged step ({conv.reason}).",
            F.figure_png(F.convergence_curve(conv.steps, conv.values, key=conv.key,
                                             tol=RESIDUAL_TOL if conv.key == "rel_residual" else None,
                                             converged=conv.converged))))
    if nb:
        matches = {k: nb[k] for k in ("train", "partition") if k in nb}
        if matches and nb["candidates"].shape[0]:
            scores = {k: nb[f"{k}_score"].tolist() for k in matches if f"{k}_score" in nb}
            idx = {k: nb[f"{k}_index"].tolist() for k in matches if f"{k}_index" in nb}
            figs.append(FigureItem(
                "Candidates sorted by SSIM to their nearest training image (first of each group), beside their "
                "nearest training" + (" and partition" if "partition" in matches else "") + " image with the SSIM; "
                "#i is the image's index, ×k marks an image that is the nearest of k candidates.",
                F.figure_png(F.neighbour_grid(nb["candidates"], matches, scores=scores, indices=idx))))
    per = (haim or {}).get("per_train") or {}
    if per.get("margin"):
        figs.append(FigureItem("Each training image's best-reconstruction SSIM against its output margin.",
                               F.figure_png(F.ssim_vs_margin(per["ssim"], per["margin"]))))
    priv = m.get("privacy") or {}
    if priv.get("roc") and priv.get("n_real") and priv.get("n_fake"):
        rocs = {k: (v["fpr"], v["tpr"], priv["scores"][k]["auc"]) for k, v in priv["roc"].items()}
        figs.append(FigureItem(f"ROC of each attacker-side score separating real from fake candidates "
                               f"({priv.get('n_real')} real, {priv.get('n_fake')} fake).",
                               F.figure_png(F.roc_curves(rocs))))
    children.append(Section("Figures", figures=figs, level=3))

    # tables
    tables: list[Table] = []
    notes: list[str] = list((m.get("headline") or {}).get("notes") or [])
    if haim:
        thr = list(haim["counts"])
        rows = [[f"reconstructions ({a} matching)", *[c.get(t) for t in thr]]
                for a, c in haim["counts_by_assignment"].items()]
        base = (m.get("baselines") or {}).get("haim_ssim") or {}
        for name in ("heldout", "noise"):
            if name in base:
                rows.append([series(name).label, *[base[name]["counts"].get(t) for t in thr]])
        tables.append(Table(f"Training images with SSIM > threshold (Haim protocol, {window} window)",
                            ["candidates", *[f"> {t}" for t in thr]], rows))
    nearest = m.get("nearest") or {}
    if nearest:
        rows = []
        for s_, d in nearest.items():
            ss, l2 = d.get("ssim", {}), d.get("l2", {})
            rows.append([series(s_).label, ss.get("mean"), ss.get("median"), ss.get("max"), l2.get("mean"), l2.get("min")])
        tables.append(Table("Nearest image of each reference set, per candidate",
                            ["reference set", "SSIM mean", "SSIM median", "SSIM max", "L2 mean", "L2 min"], rows))
    if priv.get("scores"):
        fprs = [str(f) for f in priv.get("fprs", [])]
        rows = []
        for k, v in priv["scores"].items():
            ci = v.get("auc_ci_95")
            rows.append([k, v.get("auc"), f"{ci[0]:.2f}–{ci[1]:.2f}" if isinstance(ci, list) else None,
                         *[(v.get("tpr_at_fpr") or {}).get(f) for f in fprs], v.get("n_real"), v.get("n_fake")])
        tables.append(Table("Attacker-side scores: real vs fake candidates (n/a: undefined, e.g. one class empty)",
                            ["score", "ROC AUC", "95% CI", *[f"TPR @ FPR {f}" for f in fprs], "real", "fake"], rows))
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
    children.append(Section("Tables", tables=tables, notes=notes, level=3))

    cfg = {"method": run.get("method"), "model_dir": run.get("model_dir"), "status": run.get("status"),
           "steps_done": run.get("steps_done"), "seed": run.get("seed"), "config": run.get("config"),
           "init": run.get("init"), "final": run.get("final"), "selection": run.get("selection")}
    title = f"Run {run_name}" + (f" ({run.get('method')})" if run.get("method") else "")
    return Section(title, cards=cards, text=[str(where) if where is not None else "(in memory)"], children=tuple(children),
                   code=json.dumps(cfg, indent=2, sort_keys=True, default=str),
                   code_title="Configuration (run.json: attack config, final loss terms, selection scores)")


def render_report(run_dirs: Sequence[str | os.PathLike | Any], *, out: str | os.PathLike,
                  title: str = "datarecon report") -> Path:
    """Build one HTML report from evaluated run directories.

    Each run gets its configuration, metrics tables (Haim counts with
    baselines, nearest-neighbour summary, privacy AUC/TPR, collapse,
    parameter distance) and figures (sorted SSIM curve with baselines, SSIM
    vs margin, ROC curves, neighbour grid). Runs whose config holds mixture
    weights ``lambda1``/``lambda2`` also feed the landscape heatmaps and
    interpolation curves (one set per method).

    Args:
        run_dirs: Run directories evaluated by :func:`datarecon.evaluation.evaluate_run`, or
            :class:`~datarecon.evaluation.Evaluation` results of :func:`datarecon.evaluation.evaluate`
            (a user's own model: no run directory; its section has no attack record).
        out: Output HTML path.
        title: Report title.

    Returns:
        The output path.

    Raises:
        DataReconError: no run directories, or one without ``metrics.json``.
    """
    from datarecon.evaluation import Evaluation

    items = list(run_dirs)
    if not items:
        raise DataReconError("no run directories given; pass at least one evaluated run")
    sections = [_evaluation_section(d, i) if isinstance(d, Evaluation) else _run_sections(Path(d))
                for i, d in enumerate(items)]
    run_dirs = [Path(d) for d in items if not isinstance(d, Evaluation)]
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
