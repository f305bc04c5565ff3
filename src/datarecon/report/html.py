"""One self-contained HTML report: inline CSS, PNG figures embedded as base64.

The file has no external resources (no scripts, fonts, stylesheets or
links to fetch), so it can be mailed or archived as is. :func:`write_report`
renders sections you build; :func:`render_report` builds them from evaluated
run directories (``metrics.json`` from :func:`datarecon.evaluation.run_metrics`,
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

from datarecon.attacks.base import convergence_of
from datarecon.attacks.convergence import Convergence, assess_convergence
from datarecon.errors import DataReconError
from datarecon.evaluation import Evaluation
from datarecon.evaluation.membership import EXPECTED_GAIN
from datarecon.evaluation.privacy import NEGATIVE, POSITIVE, signal_verdict
from datarecon.evaluation.records import read_metrics
from datarecon.evaluation.run_records import read_history, read_neighbour_grid, read_run_fields
from datarecon.kernel.files import HISTORY, METRICS_FILE, MODEL_JSON, RUN_JSON, SUBSPACE_FILE
from datarecon.kernel.status import Status
from datarecon.models.checkpoint import read_model_meta
from datarecon.report.figures import (
    SET_TITLES,
    convergence_curve,
    figure_png,
    interpolation_curves,
    landscape_heatmaps,
    neighbour_grid,
    roc_curves,
    scree_plot,
    sorted_ssim_curve,
    ssim_vs_margin,
)
from datarecon.report.style import column_label, series
from datarecon.report.text import count_of, fraction, headline_lead, threshold_text
from datarecon.training.target import ascent_curve_lines
from datarecon.utils.io import atomic_write_text, load_tensors

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
        if not (d / METRICS_FILE).is_file() or not (d / RUN_JSON).is_file():
            continue
        run = read_run_fields(d / RUN_JSON)
        a, b = _finite_float(_find_key(run.get("config"), _L1)), _finite_float(_find_key(run.get("config"), _L2))
        if a is None or b is None:
            continue
        out.setdefault(str(run.get("method") or "run"), {})[(float(a), float(b))] = read_metrics(d)
    return out


def _finite_float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _prod(shape: Sequence[Any]) -> int:
    d = 1
    for v in shape:
        d *= int(v)
    return d


def arch_text(arch: Mapping[str, Any]) -> str:
    """An architecture in words (``MLP 64-200-1, no biases``, ``affine 3072→1, bias``)."""
    name = str(arch.get("name") or "model")
    shape = arch.get("input_shape") or []
    d = _prod(shape) if shape else None
    k = arch.get("num_outputs")
    hidden = [int(h) for h in (arch.get("hidden") or [])]
    bias = "with biases" if arch.get("bias") else "no biases"
    if name == "affine":
        return f"affine {d}→{k}, {'bias' if arch.get('bias') else 'no bias'}"
    if name.startswith("resnet"):
        return f"{name.replace('resnet', 'ResNet-')}, stage widths {'-'.join(map(str, hidden))}, {k} output(s), {bias}"
    if name == "cnn":
        return f"CNN, channels {'-'.join(map(str, hidden))}, kernel {arch.get('kernel') or 3}, {k} output(s), {bias}"
    widths = [v for v in (d, *hidden, k) if v is not None]
    return f"{name.upper() if name == 'mlp' else name} {'-'.join(map(str, widths))}, {bias}"


def _target_card(m: Mapping[str, Any], run_dir: Path) -> Card:
    info = m.get("run") or {}
    sizes = m.get("reference_sizes") or {}
    own = info.get("own_model")
    if own:
        shape = "×".join(str(v) for v in own.get("input_shape") or []) or "n/a"
        lo, hi = (own.get("value_range") or [None, None])[:2]
        rows = [("model", f"your own model ({own.get('factory') or 'built in Python'})"),
                ("input", f"{shape}, values in [{_fmt(lo)}, {_fmt(hi)}]"),
                ("loss", own.get("loss")),
                ("homogeneous (measured)", own.get("homogeneous_measured")),
                ("training images n", sizes.get("train")), ("held-out images", sizes.get("heldout"))]
        return Card("Target (your own model)", [(k, v) for k, v in rows if v is not None])
    if not info:
        rows = [("training images n", sizes.get("train")), ("held-out images", sizes.get("heldout")),
                ("image shape", "×".join(str(v) for v in m.get("image_shape") or []) or None)]
        return Card("Target", [(k, v) for k, v in rows if v is not None],
                    lead="evaluated from tensors: no model record (evaluate a run directory for the model card)")
    model_json = None
    model_dir = info.get("model_dir")
    for cand in ([Path(model_dir), run_dir / str(model_dir)] if model_dir else []):
        if (cand / MODEL_JSON).is_file():
            model_json = read_model_meta(cand)  # checked: model files are untrusted
            break
    meta = model_json or {}
    arch = meta.get("arch") or info.get("arch") or {}
    data = meta.get("data") or info.get("data") or {}
    met = meta.get("metrics") or {}
    kkt = met.get("kkt_regime_score")
    wd = meta.get("weight_decay")
    rows = [("data", f"{data.get('dataset')} / {data.get('task')}" if data else None),
            ("n (training images)", met.get("n_train") or sizes.get("train")),
            ("architecture", arch_text(arch) if arch else None),
            ("parameters", f"{meta['num_parameters']:,}" if isinstance(meta.get("num_parameters"), int) else None),
            ("loss, weight decay", f"{meta.get('loss')}, {wd:g}" if isinstance(wd, (int, float)) else meta.get("loss")),
            ("train / held-out acc", f"{_fmt(_finite_float(met.get('train_accuracy')))} / "
                                     f"{_fmt(_finite_float(met.get('heldout_accuracy')))}" if met else None),
            ("normalised margin", _finite_float(met.get("normalised_margin"))),
            ("margin ascent", _ascent_text(met)),
            ("KKT-regime score", _finite_float(kkt) if kkt is not None else "not computed")]
    ok = _finite_float(met.get("train_accuracy")) == 1.0
    return Card("Target (what was attacked)", [(k, v) for k, v in rows if v is not None],
                status="" if model_json is None else ("ok" if ok else "warn"))


def _ascent_text(met: Mapping[str, Any]) -> str | None:
    """The margin-ascent stage of a model's metrics in one cell: its steps and stop reason, then its curve (the
    points where the identifiability gap was measured); None for a model trained without it."""
    if "margin_ascent_steps" not in met:
        return None
    head = f"{met['margin_ascent_steps']} steps ({met.get('margin_ascent_stop_reason') or met.get('margin_ascent_status')})"
    return "; ".join([head, *(line.strip() for line in ascent_curve_lines(dict(met))[1:])])


def _threat_card(run: Mapping[str, Any], n_true: int | None = None) -> Card:
    """The run's threat model (run.json ``knowledge``) and the first dense layer's subspace (``subspace``);
    with the true n of the evaluation (``n_true``) the estimate is checked against it, and a miss flagged."""
    know = run.get("knowledge")
    sub = run.get("subspace") or {}
    if not know:
        lead = ("the papers' weights-only attacker (weights, architecture, loss, input range, label set); this run "
                "records no threat model" if run else "evaluated from tensors: no attack record, no threat model")
        return Card("Threat model: what the attacker had", [], lead=lead)
    init = know.get("known_init")
    rows: list[tuple[str, Any]] = [
        ("weights θ*, architecture, loss, input range, labels", "known"),
        ("initialisation θ_init", f"known ({init['source']}, sha256 {init['sha256'][:12]})" if init else "not known"),
        ("training-set size n", know.get("n") if know.get("n") is not None else "not known"),
        ("used by this attack", ", ".join(know.get("used") or []) or "weights")]
    missed = False
    if sub:
        rank = sub.get("rank") or {}
        low, high = (list(rank.get("interval") or []) + [None, None])[:2]
        rows += [("first dense layer analysed", f"{sub.get('layer')} ({sub.get('matrix')}, "
                  f"{'×'.join(str(v) for v in sub.get('shape') or [])})"),
                 ("n estimated from it", f"{rank.get('n_hat')} (the spectrum's elbow; n expected in {low}–{high})"
                  + (f"; {rank['above_noise']} values above the initialisation's noise edge"
                     if rank.get("above_noise") is not None else "")),
                 ("training subspace used", f"k = {sub.get('k')} directions: the subspace of the first layer's "
                  "inputs that the subspace signal measures each candidate's distance to")]
        if isinstance(n_true, int) and not isinstance(n_true, bool):
            missed = not (isinstance(low, int) and isinstance(high, int) and low <= n_true <= high)
            rows.append(("true n (from the evaluation, not known to the attacker)",
                         f"{n_true}: " + ("OUTSIDE the estimated range; the estimate missed it" if missed else
                                          f"inside the estimated range, {rank.get('n_hat')} off by "
                                          f"{abs(int(rank.get('n_hat') or 0) - n_true)}")))
    return Card("Threat model: what the attacker had", rows, lead=str(know.get("summary") or ""),
                status="bad" if missed else "warn" if init or know.get("n") is not None else "")


def _selection_value(run: Mapping[str, Any], key: str) -> float | None:
    v = (run.get("selection") or {}).get(key)
    return _finite_float(v.get("value") if isinstance(v, Mapping) else v)


def _attack_card(run: Mapping[str, Any], conv: Convergence, m: Mapping[str, Any]) -> Card:
    if not run:
        return Card("Attack", [("candidates m", m.get("n_candidates"))],
                    lead="evaluated from tensors: no attack record")
    init = run.get("init") or {}
    if isinstance(init, Mapping):
        params = ", ".join(f"{k} {v}" for k, v in (init.get("params") or {}).items())
        init_s = f"{init.get('name', 'n/a')}" + (f" ({params})" if params else "") + \
                 (" — experimenter's choice (uses data)" if init.get("experimenter_choice") else "")
    else:
        init_s = str(init)
    steps = (run.get("config") or {}).get("steps")
    rule = convergence_of(run.get("method"))  # the attack's declaration names its metrics (issue 25: one name each)
    exact = (rule.final_label or None, _selection_value(run, rule.final)) if rule.final else (None, None)
    last = f"{rule.label}, last step" if conv.key else None
    rows = [("method", run.get("method")), ("initialisation", init_s),
            ("steps", f"{run.get('steps_done')}" + (f" of {steps}" if steps else "")),
            ("candidates m", m.get("n_candidates")), ("status", run.get("status")),
            exact, (last, conv.final),
            ("wall time", f"{run['wall_time_s']:.1f} s" if _finite_float(run.get("wall_time_s")) is not None else None)]
    lead = ("converged: " if conv.converged else "NOT converged: ") + conv.reason
    return Card("Attack", [(k, v) for k, v in rows if k is not None and v is not None], lead=lead,
                status="ok" if conv.converged else "bad")


def _headline_card(m: Mapping[str, Any]) -> Card:
    h = m.get("headline") or {}
    n = h.get("n_train")
    if not h:
        counts = (m.get("haim") or {}).get("counts")
        lead = (f"{counts.get('0.4')} of {n or 'n/a'} at SSIM > 0.4 (no null baseline computed)" if counts
                else "not measured (no training set to compare with)")
        return Card("Headline: training images reconstructed", [], lead=lead, status="warn")
    rule = h.get("rule", "standard")
    rows: list[tuple[str, Any]] = []
    if h.get("calibrated"):
        rows += [(f"{series('heldout').label}, {h.get('n_heldout_candidates')} images", count_of(h.get("heldout"), n)),
                 (series("noise").label, count_of(h.get("noise"), n)),
                 ("threshold", threshold_text(h))]
    if rule != "standard":
        rows.append(("rule", h.get("rule_text")))
        init = m.get("init") or {}
        to_train = (m.get("haim") or {}).get("mean_ssim")
        if init.get("mean_ssim_to_init") is not None:
            rows.append(("mean SSIM to its start vs to its training match",
                         f"{init['mean_ssim_to_init']:.2f} vs {_fmt(_finite_float(to_train))}"))
    paper = h.get("paper") or {}
    if paper.get("count") is not None:
        rows.append((f"papers' SSIM > {paper['threshold']:g} alone",
                     f"{paper['count']} of {n} (held-out {_fmt(paper.get('heldout'))}, noise {_fmt(paper.get('noise'))})"))
    ref = h.get("reference_scoring") or {}
    if ref.get("count") is not None:
        rows.append(("as the papers' code scores it", f"{ref['count']} of {n} at SSIM > {ref['threshold']:g} "
                     f"(uniform 3×3 window, matches may repeat; held-out "
                     f"{_fmt(ref.get('heldout')) if ref.get('heldout') is not None else 'not measured'}, noise "
                     f"{_fmt(ref.get('noise'))})"))
    count, null = h.get("count"), h.get("heldout")
    if rule == "retention":
        status = ""
    elif count is None:
        status = "warn"
    else:
        status = "ok" if null is not None and count > null else "warn"
    title = "Headline: retention of the ground-truth start" if rule == "retention" else \
        "Headline: training images reconstructed"
    return Card(title, rows, lead=headline_lead(h), status=status)


def _privacy_card(m: Mapping[str, Any]) -> Card:
    priv = m.get("privacy") or {}
    v = signal_verdict(priv)
    title = "Can the attacker tell which candidates match a training image?"
    rows: list[tuple[str, Any]] = []
    if v.measured:
        rows.append(("measured", v.measured))
    shared = priv.get("largest_shared")
    if priv.get("n_real"):
        rows.append(("training images they match",
                     f"{priv.get('n_real_distinct_train')} distinct" +
                     (f"; {shared['count']} candidates share #{shared['train_index']}"
                      if shared and shared.get("count", 0) > 1 else "")))
    scores = priv.get("scores") or {}
    if v.status == "warn" and scores:  # nothing measured per signal: name them once
        rows.append(("signals recorded", ", ".join(scores)))
    else:
        for name, sc in scores.items():
            rows.append((name, _signal_text(sc, priv.get("fprs") or [])))
    if v.needs:
        rows.append(("needed", v.needs))
    return Card(title, rows, lead=v.lead, status=v.status)


def _identifiability_card(m: Mapping[str, Any]) -> Card | None:
    """Which attack objective the model's training set minimises (the defender's check), or None when not measured."""
    ident = m.get("identifiability")
    if not ident:
        return None
    rows: list[tuple[str, Any]] = []
    found = []
    for name, v in (ident.get("objectives") or {}).items():
        sets = v.get("sets")
        if not sets:
            rows.append((name, v.get("note", "not measured")))
            continue
        truth = (sets.get("training set") or {}).get("relative_residual")
        fakes = {k: r["relative_residual"] for k, r in sets.items() if k != "training set"}
        best = min(fakes, key=fakes.get) if fakes else None
        verdict = "identifies the training set" if v.get("identifies") else "does not identify it"
        if v.get("identifies"):
            found.append(name)
        rows.append((name, f"training set {_fmt(truth)}; best fake {_fmt(fakes.get(best))} ({best}): {verdict}"))
    if ident.get("weight_decay_note"):
        rows.append(("note", ident["weight_decay_note"]))
    measured = sum(1 for v in (ident.get("objectives") or {}).values() if v.get("sets"))
    lead = (f"The training set fits {len(found)} of {measured} objectives better than every fake"
            + (f" ({', '.join(found)})" if found else "") + "; relative residual with optimal multipliers.")
    return Card("Identifiability: which attack objective the training set minimises", rows, lead=lead,
                status="warn" if found else "ok")


def _membership_line(v: Mapping[str, Any]) -> str:
    """``AUC 0.989 [0.98–0.99]; TPR 0.71 @1%, 0.29 @0.1% (20 members, 1480 non-members)`` for one membership signal,
    with the members and non-members it was measured on, or why it was not measured."""
    auc = _finite_float(v.get("auc"))
    if not v.get("applicable") or auc is None:
        return v.get("note") or "not measured"
    ci = v.get("auc_ci")
    tpr = v.get("tpr_at_fpr") or {}
    parts = [f"AUC {auc:.3f}" + (f" [{ci[0]:.3f}–{ci[1]:.3f}]" if isinstance(ci, list) and len(ci) == 2 else "")]
    for f in ("0.01", "0.001"):
        t = _finite_float(tpr.get(f))
        parts.append(f"TPR {t:.2f} @{100 * float(f):g}%" if t is not None else f"TPR @{100 * float(f):g}% not estimable")
    where = f" ({v.get('n_members')} members, {v.get('n_nonmembers')} non-members"
    where += "; the half-in pool)" if v.get("scope") == "the half-in pool" else ")"
    return "; ".join(parts) + where


def _membership_card(m: Mapping[str, Any]) -> Card:
    """Is an image in the model's training set? Every membership signal of the run's model (reference attacks
    included when ``datarecon evaluate --membership DIR`` read a membership folder), the strongest beside the loss
    threshold, and the empirical ε bound."""
    title = "Membership: can the attacker tell its training images from unseen ones"
    mem = m.get("membership")
    if not mem:
        return Card(title, [("measured", "no: datarecon evaluate measures it for runs of a model directory; for "
                                         "your own model run `datarecon membership --model package.module:factory "
                                         "--weights FILE --train FILE --heldout FILE --evaluate --out DIR` and "
                                         "`datarecon report DIR`")],
                    lead="Membership was not measured for this run.", status="warn")
    strongest = mem.get("strongest") or {}
    best = strongest.get("name")
    signals = mem.get("signals") or {}
    rows: list[tuple[str, Any]] = []
    cand = mem.get("candidates") or {}
    non = cand.get("nonmembers") or {}
    rows.append(("members / non-members", f"{(cand.get('members') or {}).get('count')} training images / "
                                          f"{non.get('count')} {non.get('source', '')}"))
    rows.append(("strongest, chosen by", strongest.get("rule", "")))
    if strongest.get("demoted"):
        rows.append(("replaced by the loss threshold", f"{strongest.get('chosen')}: {strongest['demoted']}"))
    kinds = ("black-box", "white-box", "reference")  # weakest attacker first (metrics.json sorts the names)
    for name, v in sorted(signals.items(), key=lambda kv: kinds.index(kv[1].get("kind")) if kv[1].get("kind") in
                          kinds else len(kinds)):
        rows.append((f"{name} ({v.get('kind')})" + (" — strongest" if name == best else ""), _membership_line(v)))
    refs = mem.get("references") or {}
    if refs.get("count"):
        ins = refs.get("in_models") or {}
        rows.append(("reference models", f"{refs['count']}; each half-in candidate IN for {ins.get('mean', 0):.1f} "
                                         "of them on average"))
    else:
        rows.append(("reference attacks", ((refs.get("auto") or {}).get("skipped") or
                                           f"not run with this evaluation; usually the strongest: {EXPECTED_GAIN}. "
                                           "`datarecon membership --model M --evaluate --out DIR` runs them, "
                                           "`datarecon evaluate RUN --membership DIR` shows them here")))
    eps = mem.get("epsilon") or {}
    if eps.get("line"):
        rows.append(("empirical epsilon", eps["line"].split("empirical epsilon ", 1)[-1]))
    lead = (f"Strongest signal: {best}, {_membership_line(signals[best])}; the loss threshold: "
            f"{_membership_line(signals.get('loss') or {})}." if best in signals else "No signal was measured.")
    ci = (signals.get(best) or {}).get("auc_ci")
    leak = isinstance(ci, list) and len(ci) == 2 and ci[0] > 0.5
    return Card(title, rows, lead=lead, status="warn" if leak else "ok")


def _signal_text(sc: Mapping[str, Any], fprs: Sequence[Any]) -> str:
    """``AUC 0.81 [0.70–0.90]; TPR@1% 0.25; TPR@0.1% not estimable`` for one signal."""
    auc, ci = _finite_float(sc.get("auc")), sc.get("auc_ci_95")
    if auc is None:
        return "AUC not measurable"
    text = f"AUC {auc:.2f}" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if isinstance(ci, list) and len(ci) == 2 else "")
    for f in fprs:
        text += f"; TPR@{100 * float(f):g}% " + _tpr_text(sc, f)
    return text


def _tpr_text(sc: Mapping[str, Any], f: Any) -> str:
    est = (sc.get("tpr_estimable") or {}).get(str(f))
    need = (sc.get("negatives_needed") or {}).get(str(f))
    if est is False or (sc.get("measurable") is False):
        return "not estimable" + (f" (< {need} negatives)" if need else "")
    return _fmt(_finite_float((sc.get("tpr_at_fpr") or {}).get(str(f))))


def display_name(run_dir: Path | None, fallback: str) -> str:
    """A run's name for a heading: its folder, or the folder above when the folder is a generic ``run``."""
    if run_dir is None:
        return fallback
    name = run_dir.name
    if name in ("run", "") and run_dir.parent.name:
        name = run_dir.parent.name
    return name


def _run_sections(run_dir: Path) -> Section:
    """The section of an evaluated run directory (its files read here, rendered by :func:`_sections`)."""
    if not (run_dir / METRICS_FILE).is_file():
        raise DataReconError(f"{run_dir} has no metrics.json; run `datarecon evaluate {run_dir}` first")
    m = read_metrics(run_dir)
    run = read_run_fields(run_dir / RUN_JSON) if (run_dir / RUN_JSON).is_file() else {}
    return _sections(m, run, read_history(run_dir / HISTORY), read_neighbour_grid(run_dir),
                     run_name=display_name(run_dir, run_dir.name), where=run_dir)


def evaluation_section(metrics: Mapping[str, Any], *, run: Mapping[str, Any], history: list[dict], grid: Mapping[str, Any],
                       name: str, where: Path | None) -> Section:
    """The section ``datarecon report`` shows for an evaluated run (cards, the sorted-SSIM curve against its nulls,
    the neighbour grid, tables), for a caller that holds its parts elsewhere: an evaluation summary ``metrics``
    (checked, :func:`~datarecon.evaluation.records.read_metrics`), the run record ``run`` and its ``history``
    (checked, :mod:`~datarecon.evaluation.run_records`: the attack card judges its convergence) and the grid of
    best-matched candidates ``grid`` (:func:`~datarecon.evaluation.run_records.read_neighbour_grid`); ``where``:
    the run folder shown, or None."""
    return _sections(metrics, run, history, grid, run_name=name, where=where)


def _evaluation_section(ev: Any, index: int) -> Section:
    """The section of an in-memory :class:`~datarecon.evaluation.Evaluation` (no run directory)."""
    name = str(ev.summary.get("name") or f"evaluation {index + 1}")
    return _sections(ev.summary, {}, [], dict(ev.grid), run_name=name, where=None)


def _sections(m: Mapping[str, Any], run: Mapping[str, Any], history: list[dict], nb: Mapping[str, Any], *,
              run_name: str, where: Path | None) -> Section:
    """Cards, figures and tables of one evaluation summary ``m`` (``metrics.json``) with its run record."""
    rule = convergence_of(run.get("method"))
    conv = assess_convergence(history, rule, status=str(run.get("status", Status.COMPLETE)), record=run)
    cards = [_threat_card(run, (m.get("headline") or {}).get("n_train")), _target_card(m, where or Path(".")),
             _attack_card(run, conv, m), _headline_card(m), _privacy_card(m), _membership_card(m)]
    ident = _identifiability_card(m)
    if ident is not None:
        cards.append(ident)
    children: list[Section] = []
    window = f"{m.get('window')} {m.get('window_size')}x{m.get('window_size')}"
    haim = m.get("haim")
    head = m.get("headline") or {}

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
            "used as candidates (the nulls); dotted: the papers' 0.4, dash-dotted: the headline threshold "
            "max(0.4, t).", figure_png(sorted_ssim_curve(curves, window=window, calibrated=head.get("threshold")))))
    if conv.steps and conv.key:
        what = rule.caption or f"{rule.label} per logged step"
        figs.append(FigureItem(
            f"Attack convergence: {what} ({conv.reason}).",
            figure_png(convergence_curve(conv.steps, conv.values, key=conv.key, label=rule.label, tol=rule.tol,
                                         converged=conv.converged))))
    if nb:
        matches = {k: nb[k] for k in ("train", "partition", "init") if k in nb}
        if matches and nb["candidates"].shape[0]:
            scores = {k: nb[f"{k}_score"].tolist() for k in matches if f"{k}_score" in nb}
            idx = {k: nb[f"{k}_index"].tolist() for k in matches if f"{k}_index" in nb}
            total = int(nb["n_candidates"][0]) if "n_candidates" in nb else m.get("n_candidates")
            shown = min(int(nb["candidates"].shape[0]), 24)
            beside = " and ".join(f"nearest {SET_TITLES.get(k, k)} image" if k != "init" else "own starting image"
                                  for k in matches)
            figs.append(FigureItem(
                f"{shown} of {total} candidates, sorted by SSIM to their nearest training image (first of each "
                f"group), beside their {beside}, each with its SSIM; #i is the image's index, ×k marks an image "
                "that is the nearest of k candidates.",
                figure_png(neighbour_grid(nb["candidates"], matches, scores=scores, indices=idx, total=total,
                                          sorted_by="SSIM to their nearest training image"))))
    per = (haim or {}).get("per_train") or {}
    if per.get("margin"):
        figs.append(FigureItem("Each training image's best-reconstruction SSIM against its output margin.",
                               figure_png(ssim_vs_margin(per["ssim"], per["margin"]))))
    priv = m.get("privacy") or {}
    if priv.get("roc") and priv.get("n_real") and priv.get("n_fake"):
        rocs = {k: (v["fpr"], v["tpr"], priv["scores"][k]["auc"]) for k, v in priv["roc"].items()}
        figs.append(FigureItem(f"ROC of each attacker-side score: {priv.get('n_real')} candidates {POSITIVE} "
                               f"(positives) against {priv.get('n_fake')} {NEGATIVE}.",
                               figure_png(roc_curves(rocs))))
    sub = run.get("subspace") or {}
    if sub and where is not None and (where / SUBSPACE_FILE).is_file():
        values = load_tensors(where / SUBSPACE_FILE).get("values")
        rank = sub.get("rank") or {}
        if values is not None and values.numel():
            figs.append(FigureItem(
                f"Singular values of the first dense layer ({sub.get('matrix')}), the attacker's estimate of n "
                "(profile-likelihood elbow and the range n is expected in) and the dimension k of the training subspace used for "
                "the subspace signal.",
                figure_png(scree_plot(values.tolist(), n_hat=rank.get("n_hat"), interval=rank.get("interval"),
                                      k=sub.get("k"), n_known=sub.get("n_known")))))
    children.append(Section("Figures", figures=figs, level=3))

    # tables
    tables: list[Table] = []
    notes: list[str] = [n for n in head.get("notes") or [] if n]
    if haim:
        thr = list(haim["counts"])
        rows = [[f"reconstructions ({a} matching)", *[c.get(t) for t in thr]]
                for a, c in haim["counts_by_assignment"].items()]
        base = (m.get("baselines") or {}).get("haim_ssim") or {}
        for name in ("heldout", "noise"):
            if name in base:
                rows.append([series(name).label, *[base[name]["counts"].get(t) for t in thr]])
        tables.append(Table(f"Training images with SSIM > threshold (Haim protocol, {window} window; "
                            "no init rule applied)", ["candidates", *[f"> {t}" for t in thr]], rows))
    nearest = m.get("nearest") or {}
    if nearest:
        rows = []
        for s_, d in nearest.items():
            ss, l2 = d.get("ssim", {}), d.get("l2", {})
            rows.append([series(s_).label, ss.get("mean"), ss.get("median"), ss.get("max"), l2.get("mean"), l2.get("min")])
        init = m.get("init") or {}
        if init.get("mean_ssim_to_init") is not None:
            rows.append(["its own starting image", init["mean_ssim_to_init"], None, None, None, None])
        tables.append(Table("Nearest image of each reference set, per candidate",
                            ["reference set", "SSIM mean", "SSIM median", "SSIM max", "L2 mean", "L2 min"], rows))
    if priv.get("scores"):
        fprs = [str(f) for f in priv.get("fprs", [])]
        rows = []
        for k, v in priv["scores"].items():
            ci = v.get("auc_ci_95")
            rows.append([k, v.get("auc"), f"{ci[0]:.2f}–{ci[1]:.2f}" if isinstance(ci, list) else None,
                         *[_tpr_text(v, f) for f in fprs], v.get("n_real"), v.get("n_fake")])
        tables.append(Table("Attacker-side signals: candidates closer to a training image than to any held-out image "
                            "(positives) against the others (n/a: not measurable)",
                            ["signal", "ROC AUC", "95% CI", *[f"TPR @ {100 * float(f):g}% FPR" for f in fprs],
                             "closer", "not closer"], rows))
    cr = m.get("candidate_roc") or {}
    if cr.get("signals"):
        rows = []
        for k, v in cr["signals"].items():
            ci = v.get("auc_ci")
            rows.append([k, v.get("auc"), f"{ci[0]:.2f}–{ci[1]:.2f}" if ci else None])
        best = cr.get("best")
        tables.append(Table(f"Candidates that reconstruct, told apart by attacker-side signals: {cr.get('positives')} "
                            "candidates with SSIM to their nearest "
                            f"training image above the headline threshold {_fmt(cr.get('threshold'))} against "
                            f"{cr.get('negatives')} others; "
                            + (cr["note"] if cr.get("note") else (f"best separating signal: {best}" if best
                                                                   else "no signal's 95% CI lies above 0.5")),
                            ["signal", "ROC AUC", "95% CI"], rows))
    if "rule" in priv:
        notes.append(f"Rule: {priv['rule']} (floor {_fmt(priv.get('floor'))}, {priv.get('floor_source')}); "
                     f"{priv.get('n_real')} {POSITIVE}, {priv.get('n_fake')} {NEGATIVE}.")
    elif "note" in priv:
        notes.append(priv["note"])
    other: list[list[Any]] = [["candidates", m.get("n_candidates")],
                              ["parameter distance ‖θ*−θ‖²", m.get("param_distance")]]
    col = m.get("collapse") or {}
    if col:
        n_cand = col.get("n_candidates") or m.get("n_candidates")
        other.append([f"near-duplicate pairs ({col.get('metric')} threshold {_fmt(col.get('threshold'))})",
                      fraction(col.get("n_close"), col.get("n_pairs"))])
        with_dup = col.get("n_with_duplicate")
        if with_dup is None and col.get("fraction_candidates") is not None and n_cand:
            with_dup = round(col["fraction_candidates"] * n_cand)
        other.append(["candidates with a near-duplicate", fraction(with_dup, n_cand)])
        if col.get("clusters"):
            other.append(["collapse clusters (sizes)", ", ".join(map(str, col["clusters"]))])
        if col.get("median_nearest_other") is not None:
            other.append([f"median {col.get('metric')} to the nearest other candidate", col["median_nearest_other"]])
    tables.append(Table("Summary", ["quantity", "value"], other))
    children.append(Section("Tables", tables=tables, notes=notes, level=3))

    cfg = {"method": run.get("method"), "model_dir": run.get("model_dir"), "status": run.get("status"),
           "steps_done": run.get("steps_done"), "seed": run.get("seed"), "config": run.get("config"),
           "init": run.get("init"), "final": run.get("final"), "selection": run.get("selection")}
    method = run.get("method")
    title = f"{run_name}: {method} attack" if method else run_name
    body = [str(where)] if where is not None else ["evaluated in memory (no run directory)"]
    return Section(title, cards=cards, text=body, children=tuple(children),
                   code=json.dumps(cfg, indent=2, sort_keys=True, default=str) if run else "",
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
        run_dirs: Run directories evaluated by :func:`datarecon.evaluation.run_metrics`,
            :class:`~datarecon.evaluation.Evaluation` results of :func:`datarecon.evaluation.evaluation_of`
            (a user's own model: no run directory; its section has no attack record), or sections built
            elsewhere (a membership folder's: :func:`datarecon.report.membership.membership_sections`).
        out: Output HTML path.
        title: Report title.

    Returns:
        The output path.

    Raises:
        DataReconError: no run directories, or one without ``metrics.json``.
    """
    items = list(run_dirs)
    if not items:
        raise DataReconError("no run directories given; pass at least one evaluated run")
    sections = [d if isinstance(d, Section) else _evaluation_section(d, i) if isinstance(d, Evaluation)
                else _run_sections(Path(d)) for i, d in enumerate(items)]
    run_dirs = [Path(d) for d in items if not isinstance(d, (Evaluation, Section))]
    land = landscape_results(run_dirs)
    if land:
        figs = []
        for method, res in land.items():
            if len(res) >= 2:
                figs.append(FigureItem(f"Landscape ({method}): mean L2 to the nearest image",
                                       figure_png(landscape_heatmaps(res, title=method))))
        if figs:
            figs.append(FigureItem("Interpolation curves", figure_png(interpolation_curves(land))))
            sections.insert(0, Section(
                "Landscape over mixture initialisations",
                text=["x_init = λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd (Runkel et al. 2024, Fig. 10-12)."],
                figures=figs))
    return write_report(sections, out=out, title=title)
