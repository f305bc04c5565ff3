"""The report parts the reproductions draw from their pieces: table rows from evaluation pieces' summaries (the
nearest-image distances, the attacker-side privacy scores, the headline counts), a CSV file as a report table, a
neighbour grid of an evaluation piece as a figure, and the piece that draws figures."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


from datarecon.errors import DataReconError
from datarecon.experiments.pipeline.common import by_fpr, finite, ordered_items
from datarecon.experiments.pipeline.pieces import Context, Piece
from datarecon.report.figures import neighbour_grid, save_figure
from datarecon.report.html import Table
from datarecon.utils.io import load_tensors

def table_cell(text: str) -> Any:
    """A CSV cell as a report table cell: an int or a float where it reads as one, None where it is
    empty or not finite (the report shows n/a), else the text."""
    if text.strip().lower() in ("", "nan", "inf", "-inf"):
        return None
    try:
        return float(text) if any(ch in text for ch in ".eE") else int(text)
    except ValueError:
        return text


def csv_table(path: Path, caption: str) -> Table:
    """The CSV file ``path`` as a report table (its first row the header, each cell :func:`table_cell`)."""
    with open(path, encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return Table(caption=caption, header=rows[0], rows=[[table_cell(c) for c in r] for r in rows[1:]])


# ---------------------------------------------------------------------------------------------
# figures


#: What each grid file of :func:`evaluate_piece` is sorted by (said in the figure's title).
GRID_ORDERS = {"candidate": "candidate index (the attack's own order)",
               "train-similarity": "SSIM to their nearest training image",
               "score": "the attacker-side score, highest first"}


def grid_figure(grid_path: Path, *, sets: Sequence[str] = ("train",), max_items: int = 20, title: str,
                png: Path, annotate_rank: Mapping[int, int] | None = None) -> None:
    """A neighbour grid (candidate | nearest image of each set) from ``grid.safetensors``."""
    g = load_tensors(grid_path)
    matches = {s: g[s] for s in sets if s in g}
    scores = {s: g[f"{s}_score"].tolist() for s in sets if f"{s}_score" in g}
    indices = {s: g[f"{s}_index"].tolist() for s in sets if f"{s}_index" in g}  # repeated images marked xk
    order = GRID_ORDERS.get(Path(grid_path).stem.removeprefix("grid-"))
    total = int(g["n_candidates"][0]) if "n_candidates" in g else None
    fig = neighbour_grid(g["candidates"], matches, scores=scores, max_items=max_items, title=title, indices=indices,
                         total=total, sorted_by=order)
    save_figure(fig, png)


def figure_piece(key: str, *, deps: Sequence[str], draw: Callable[[Context, Path], list[str]],
                 spec: Mapping[str, Any] | None = None) -> Piece:
    """A piece that draws PNG files into its directory; ``draw`` returns the file names written."""

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        files = draw(ctx, d)
        missing = [f for f in files if not (d / f).is_file()]
        if missing:
            raise DataReconError(f"figure piece {key} did not write {missing}")
        return {"files": list(files)}

    return Piece(key=key, run=run, spec=dict(spec or {}), deps=tuple(deps), kind="figure")


# ---------------------------------------------------------------------------------------------
# table rows of evaluation pieces


def nearest_rows(ctx: Context, keys: list[str]) -> list[dict[str, Any]]:
    """Mean L2 / SSIM of each setting's reconstructions to the nearest image of each set."""
    rows = []
    for key in keys:
        s = ctx.summary(key)
        row: dict[str, Any] = {"setting": key.removeprefix("eval/")}
        for k, v in ordered_items(s.get("mean_l2_to_nearest") or {}):
            row[f"mean_l2_{k}"] = finite(v)
        for k, v in ordered_items(s.get("mean_ssim_to_nearest") or {}):
            row[f"mean_ssim_{k}"] = finite(v)
        row["param_distance"] = finite(s.get("param_distance"))
        rows.append(row)
    return rows


def privacy_rows(ctx: Context, keys: list[str]) -> list[dict[str, Any]]:
    """Per setting and attacker-side score: class sizes, ROC AUC with its bootstrap 95% CI, TPR at 1%
    (and 0.1%) FPR (empty where not estimable: fewer than 100 (1000) negatives)."""
    rows = []
    for key in keys:
        p = ctx.summary(key).get("privacy") or {}
        for score, v in sorted((p.get("scores") or {}).items()):  # stable row order
            tpr = v.get("tpr_at_fpr") or {}
            ci = v.get("auc_ci_95") or [None, None]
            rows.append({"setting": key.removeprefix("eval/"), "score": score, "n_real": p.get("n_real"),
                         "n_fake": p.get("n_fake"), "auc": finite(v.get("auc")), "auc_ci_low": finite(ci[0]),
                         "auc_ci_high": finite(ci[1]),
                         **{f"tpr_at_fpr_{f}": finite(t) for f, t in by_fpr(tpr)}, "note": v.get("note", "")})
    return rows


def headline_rows(ctx: Context, keys: list[str]) -> list[dict[str, Any]]:
    """Per setting, the headline of every report (:func:`datarecon.evaluation.reports.headline`): the count
    at max(0.4, t) beside its held-out and noise nulls, the rule that applied (a partition or mixture
    start counts only matches that moved away from it; a ground-truth start reports retention), and the
    mean SSIM of the candidates to their start beside the mean SSIM of each training image's match."""
    rows = []
    for key in keys:
        s = ctx.summary(key)
        h = s.get("headline") or {}
        ret = h.get("retention") or {}
        rows.append({"setting": key.removeprefix("eval/"), "rule": h.get("rule"), "n_train": h.get("n_train"),
                     "count": h.get("count"), "count_heldout": h.get("heldout"), "count_noise": h.get("noise"),
                     "threshold": finite(h.get("threshold")), "null_threshold": finite(h.get("null_threshold")),
                     "excluded_by_init_rule": h.get("excluded"), "retained": ret.get("count"),
                     "mean_ssim_to_start": finite((s.get("init") or {}).get("mean_ssim_to_init")),
                     "mean_ssim_to_train_match": finite(s.get("mean_haim_ssim"))})
    return rows
