"""Where a fine-tuned model sits on the leakage map (``datarecon audit --model DIR``).

The leakage map (benchmarks/leakage_map.py, docs/RESULTS.md) measures reconstruction from fine-tuned networks cell
by cell: architecture and width, fine-tuning steps, the private batch size n, the attack's budget and setting.
``benchmarks/leakage_map.py table`` writes its results JSON (``cells``: one record per measured cell). For a model
directory, :func:`placement_lines` reads the model's coordinates (:func:`model_coordinates`: its architecture and
widths, n = ``metrics.n_train``, the fine-tuning's SGD steps = epochs · ⌈n / batch size⌉) and lists the nearest
measured cells of the same architecture family by

    d = |log2(n / n_cell)| + |log2(steps / steps_cell)| + |log2(width / width_cell)|,

width being the first layer's channels; each cell with its count above the calibrated threshold, its mean best SSIM
with its 95 % interval and its held-out null. Where no results file is available, or the model is not a fine-tuned
network of a family the map measured, one line says so. Nothing here runs an attack: the map's cells are
measurements of other models of the same shape, not of this one.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datarecon.models.spec import ArchSpec

__all__ = ["DEFAULT_RESULTS", "NEAREST", "default_results", "model_coordinates", "nearest_cells", "placement_lines"]

#: the results JSON of the repository's map, when datarecon runs from a checkout
DEFAULT_RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "leakage_map.json"
#: the cells listed
NEAREST = 3


def default_results() -> Path:
    """``DATARECON_LEAKAGE_MAP`` when set, else the checkout's ``benchmarks/results/leakage_map.json``."""
    return Path(os.environ.get("DATARECON_LEAKAGE_MAP") or DEFAULT_RESULTS)


def model_coordinates(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A model directory's coordinates on the map: ``family`` (cnn or resnet8, else the architecture's name),
    ``widths``, ``batch_norm``, ``n``, ``steps`` (SGD steps of its training), ``fine_tuned``."""
    arch = ArchSpec.model_validate(meta["arch"])
    training = meta.get("training") or {}
    n = (meta.get("metrics") or {}).get("n_train")
    batch = training.get("batch_size") or n
    epochs = training.get("epochs")
    steps = epochs * math.ceil(n / batch) if isinstance(n, int) and batch and isinstance(epochs, int) else None
    return {"family": arch.name, "widths": list(arch.resolved_hidden()), "batch_norm": bool(arch.batch_norm),
            "n": n, "steps": steps, "fine_tuned": isinstance(meta.get("pretrained"), Mapping)}


def _cell_widths(record: Mapping[str, Any]) -> list[int]:
    """A cell's widths from its label (``ResNet-8 64-128-256, batch norm`` → [64, 128, 256])."""
    found = re.search(r"\b(\d+(?:-\d+)+)\b", str(record.get("arch_label", "")))
    return [int(w) for w in found.group(1).split("-")] if found else []


def _family(record: Mapping[str, Any]) -> str:
    return "resnet8" if str(record.get("arch", "")).startswith("resnet8") else str(record.get("arch", ""))


def _log_gap(a: float | None, b: float | None) -> float:
    return abs(math.log2(a / b)) if a and b else 10.0


def nearest_cells(coords: Mapping[str, Any], cells: list[Mapping[str, Any]], *,
                  count: int = NEAREST) -> list[tuple[float, Mapping[str, Any]]]:
    """The ``count`` measured cells of the model's family nearest to it (distance in the module docstring), nearest
    first, ties by the cell's name."""
    mine = [c for c in cells if _family(c) == coords["family"]]
    width = (coords.get("widths") or [None])[0]
    scored = [(_log_gap(coords["n"], c.get("n")) + _log_gap(coords["steps"], c.get("finetune_steps"))
               + _log_gap(width, (_cell_widths(c) or [None])[0]), c) for c in mine]
    return sorted(scored, key=lambda t: (t[0], str(t[1].get("cell"))))[:count]


def _cell_line(distance: float, c: Mapping[str, Any]) -> str:
    s, h = c.get("simudy") or {}, c.get("headline") or {}
    lo, hi = (s.get("mean_best_ssim_ci95") or [float("nan")] * 2)[:2]
    same = "same n, steps and width" if distance == 0 else f"distance {distance:.1f}"
    return (f"  {c.get('cell')} ({c.get('arch_label')}, {c.get('finetune_steps')} step(s), n = {c.get('n')}): "
            f"{h.get('count')} of {c.get('n')} above the threshold (held-out {h.get('heldout')}), mean best SSIM "
            f"{s.get('mean_best_ssim', float('nan')):.3f} [{lo:.3f}, {hi:.3f}] vs held-out null "
            f"{s.get('mean_best_ssim_heldout_null', float('nan')):.3f}; {same}")


def placement_lines(meta: Mapping[str, Any], results: str | os.PathLike | None = None) -> list[str]:
    """The lines ``audit --model`` prints: the model's coordinates beside the nearest measured cells, or one line
    saying why it is not placed (no results file, not fine-tuned, a family the map has not measured)."""
    path = Path(results) if results is not None else default_results()
    if not path.is_file():
        return [f"leakage map: no results file at {path} (benchmarks/leakage_map.py table writes one; "
                "--leakage-map JSON names another); this model is not placed on the map"]
    try:
        cells = list(json.loads(path.read_text()).get("cells") or [])
    except (ValueError, AttributeError):
        return [f"leakage map: {path} is not a results file of benchmarks/leakage_map.py table (unreadable JSON or "
                "no cells); this model is not placed on the map"]
    coords = model_coordinates(meta)
    if not coords["fine_tuned"]:
        return ["leakage map: this model was not fine-tuned from a pretrained model, and the map measures fine-tuned "
                "networks; it is not placed on the map"]
    near = nearest_cells(coords, cells)
    if not near:
        families = sorted({_family(c) for c in cells})
        return [f"leakage map: no measured cell of a {coords['family']} network ({path} has "
                f"{', '.join(families) or 'no cells'}); this model is not placed on the map"]
    widths = "-".join(map(str, coords["widths"]))
    head = (f"leakage map ({path}, {len(cells)} cells measured): this model is {coords['family']} {widths}"
            f"{' with batch norm' if coords['batch_norm'] else ''}, fine-tuned {coords['steps']} SGD step(s) on "
            f"n = {coords['n']} private images; the nearest measured cells (other models of that shape, not this "
            "one):")
    return [head, *(_cell_line(d, c) for d, c in near)]
