"""Paper reproductions: one typed config each, scales as YAML presets, resumable pieces.

``reproduce(name, scale=..., out=...)`` builds the reproduction's config from the preset
``experiments/presets/<name>-<scale>.yaml`` (overrides over the config's defaults, which are
the published scale), runs its pieces (:mod:`.pieces`: each in its own folder with an atomic
``DONE.json`` written last; finished pieces are skipped on a rerun) and writes
``OUT/report.html``. Registered reproductions: :data:`REPRODUCTIONS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from datarecon.config import build_config, merge, read_config_mapping
from datarecon.errors import DataReconError
from datarecon.experiments.reproduce import haim2022, runkel2024
from datarecon.experiments.pipeline.pieces import (
    PRESETS_DIR,
    Context,
    Runtime,
    claim_reproduction,
    dry_run,
    entries,
    execute,
)
from datarecon.kernel.files import REPORT_HTML, REPRODUCTION_JSON, TIMINGS_JSON
from datarecon.registry import Registry
from datarecon.report.html import write_report
from datarecon.utils.io import atomic_write_json, config_hash, versions

#: The scale ladder, smallest first. ``paper`` is each config's defaults (its preset file only
#: documents that); a reproduction offers the other rungs for which it ships a preset file.
SCALES = ("smoke", "small", "medium", "paper")


@dataclass(frozen=True)
class Reproduction:
    """A registered reproduction.

    Attributes:
        config_cls: its frozen pydantic config (defaults = the published scale).
        plan: ``config -> [Piece]``.
        sections: ``(ctx, config, *, scale, timings) -> [report Section]``.
        title: report title.
    """

    config_cls: type[BaseModel]
    plan: Callable[[Any], list]
    sections: Callable[..., list]
    title: str


REPRODUCTIONS: Registry[Reproduction] = Registry("reproduction")


def _register() -> None:
    REPRODUCTIONS.register("runkel2024", Reproduction(
        runkel2024.RunkelConfig, runkel2024.plan, runkel2024.report_sections,
        "Runkel et al. (2024): Training data reconstruction — privacy due to uncertainty? (reproduction)"))
    REPRODUCTIONS.register("haim2022", Reproduction(
        haim2022.HaimConfig, haim2022.plan, haim2022.report_sections,
        "Haim et al. (2022): Reconstructing training data from trained neural networks (reproduction)"))


def preset_path(name: str, scale: str) -> Path:
    """The preset file of ``name`` at ``scale``."""
    return PRESETS_DIR / f"{name}-{scale}.yaml"


def available_scales(name: str) -> tuple[str, ...]:
    """The rungs of :data:`SCALES` that reproduction ``name`` has a preset for (``paper`` always)."""
    REPRODUCTIONS.get(name)
    return tuple(s for s in SCALES if s == "paper" or preset_path(name, s).is_file())


def load_config(name: str, *, scale: str = "paper", overrides: dict[str, Any] | None = None) -> BaseModel:
    """The config of reproduction ``name``: defaults, then the scale preset, then ``overrides``.

    Nested mappings merge field by field, so a preset names only what differs from the defaults
    (lists, e.g. hidden widths or attack runs, are replaced whole).

    Raises:
        DataReconError: unknown reproduction or scale, or invalid fields (one line).
    """
    entry = REPRODUCTIONS.get(name)
    valid = available_scales(name)
    if scale not in valid:
        raise DataReconError(f"unknown scale {scale!r} for {name}; valid scales: {', '.join(valid)}")
    path = preset_path(name, scale)
    preset = read_config_mapping(path) if path.is_file() else {}
    base = entry.config_cls().model_dump(mode="json")  # presets override only what differs
    return build_config(entry.config_cls, merge(merge(base, preset), overrides or {}), where=f"{name} {scale} config")


def plan_reproduction(name: str, *, out: str | Path, scale: str = "smoke", data_dir: str | Path | None = None,
                      device: str = "cpu", overrides: dict[str, Any] | None = None) -> list:
    """Dry run of :func:`reproduce`: its pieces, which are finished in ``out``, and their estimated
    wall times on ``device`` (:class:`~.pieces.PlannedPiece`); nothing is run or written."""
    entry = REPRODUCTIONS.get(name)
    cfg = load_config(name, scale=scale, overrides=overrides)
    return dry_run(entry.plan(cfg), Context(out=Path(out), data_dir=data_dir, device=device))


def reproduce(name: str, *, out: str | Path, scale: str = "smoke", runtime: Runtime = Runtime(),
              overwrite: bool = False, overrides: dict[str, Any] | None = None,
              log: Callable[[str], None] = print) -> Path:
    """Run reproduction ``name`` into ``out`` and write ``out/report.html``.

    Args:
        name: a key of :data:`REPRODUCTIONS` (``runkel2024``, ``haim2022``).
        out: output folder; rerunning into the same folder skips finished pieces.
        scale: ``smoke`` (CI, minutes on 2 CPU cores), ``small`` (CPU, < 1 h), ``paper`` (GPU).
        runtime: the data folder, the device (``cpu`` or ``cuda[:N]``), whether an unfinished piece
            continues an attack from its checkpoint, and progress inside long pieces (:class:`Runtime`).
        overwrite: replace an output folder holding another reproduction/configuration.
        overrides: config fields over the preset (nested mapping).
        log: progress sink (one line per piece).

    Returns:
        Path of ``report.html``.
    """
    entry = REPRODUCTIONS.get(name)
    cfg = load_config(name, scale=scale, overrides=overrides)
    chash = config_hash(cfg.model_dump(mode="json"))
    out = Path(out)
    pieces = entry.plan(cfg)
    with claim_reproduction(out, name=name, config_hash_=chash, overwrite=overwrite,
                            resume=runtime.resume) as claim:
        claim.prepare()
        return _reproduce(entry, cfg, pieces, name=name, ctx=runtime.context(out), scale=scale, chash=chash,
                          log=log)


def _reproduce(entry: Reproduction, cfg: BaseModel, pieces: list, *, name: str, ctx: Context, scale: str, chash: str,
               log: Callable[[str], None]) -> Path:
    """The body of :func:`reproduce` once ``ctx.out`` is claimed and prepared."""
    out = ctx.out
    atomic_write_json(out / REPRODUCTION_JSON, {"name": name, "scale": scale, "config_hash": chash,
                                       "config": cfg.model_dump(mode="json"), "versions": versions(),
                                       "entries": entries(pieces)})
    log(f"{name} ({scale}): {len(pieces)} pieces -> {out}")
    t0 = time.perf_counter()
    records = execute(pieces, ctx, log=log)
    timings: dict[str, float] = {}
    kinds = {p.key: p.kind for p in pieces}
    for r in records:
        timings[kinds[r.key]] = timings.get(kinds[r.key], 0.0) + r.wall_time_s
    timings["total (this invocation)"] = time.perf_counter() - t0
    report = write_report(entry.sections(ctx, cfg, scale=scale, timings=timings), out=out / REPORT_HTML,
                          title=entry.title)
    atomic_write_json(out / TIMINGS_JSON, {"pieces": {r.key: {"status": r.status, "wall_time_s": r.wall_time_s}
                                                        for r in records}, "totals": timings})
    log(f"wrote {report} ({timings['total (this invocation)']:.1f} s)")
    return report


_register()

__all__ = ["PRESETS_DIR", "REPRODUCTIONS", "SCALES", "Reproduction", "Runtime", "available_scales", "load_config",
           "plan_reproduction", "preset_path", "reproduce"]
