"""The one writer of pooled runs: the candidates of several finished runs as one run directory.

``reconstruct --runs K`` (its K runs), ``sweep pool`` (a sweep's best runs) and the reproductions
write their pools through :func:`write_pool`; runs are ranked by an attacker-side criterion
(:func:`criterion_mode`, :func:`score_of`), never by ground truth. The pooled directory follows the
run contract (``candidates.safetensors`` + ``run.json`` with method ``"pool"`` and the list of
source runs), so ``datarecon evaluate POOLDIR`` evaluates it like any run.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.selection import CRITERIA, merge_duplicates
from datarecon.errors import DataReconError
from datarecon.kernel.files import CANDIDATES, RUN_JSON
from datarecon.kernel.status import Status
from datarecon.utils.io import (atomic_write_json, config_hash, load_tensors, read_json, save_tensors, strip_timing,
                                to_jsonable, versions)


def criterion_mode(name: str, mode: str | None = None) -> str:
    """``min`` or ``max`` for an attacker-side criterion: ``mode`` if given, else the direction
    registered in :data:`datarecon.attacks.selection.CRITERIA` (``better``: lower | higher).

    Raises:
        DataReconError: unknown criterion (lists the registered ones), or an ``info`` criterion
            without an explicit ``mode``.
    """
    entry = CRITERIA.get(name)
    if mode is not None:
        return mode
    if entry.better == "higher":
        return "max"
    if entry.better == "lower":
        return "min"
    raise DataReconError(f"selection criterion {name!r} is for information only; choose another or set selection.mode")



def score_of(result: dict[str, Any] | None, criterion: str) -> float | None:
    """The criterion's value in a worker result / index row: ``selection[criterion]`` (a number or
    ``{"value": ...}``), else ``final[criterion]``; None when missing or not finite."""
    if not result:
        return None
    for where in ("selection", "final"):
        value = (result.get(where) or {}).get(criterion)
        if isinstance(value, dict):
            value = value.get("value")
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            return value
    return None



def same_pool(pool_dir: Path, key: str) -> bool:
    """Whether ``pool_dir`` holds the pool of this very config (rewriting it changes nothing)."""
    try:
        return read_json(pool_dir / RUN_JSON).get("config_hash") == key
    except DataReconError:
        return False



@dataclass(frozen=True)
class PoolSpec:
    """What a pooled run is: the description of what was pooled, and how its sources were ranked.

    Attributes:
        config: JSON-able description of what was pooled (``run.json`` ``config``); its hash is
            :attr:`key` (``run.json`` ``config_hash``, compared by :func:`same_pool`).
        criterion: the attacker-side criterion the sources were ranked by (a
            :data:`datarecon.attacks.selection.CRITERIA` name).
        mode: its direction, ``min`` | ``max``.
        merge: drop a candidate whose cosine to a kept candidate of an earlier source (or an earlier
            one of the same source) exceeds this, in (-1, 1]
            (:func:`datarecon.attacks.selection.merge_duplicates`); None: keep all.
    """

    config: dict[str, Any]
    criterion: str
    mode: str
    merge: float | None = None

    @property
    def key(self) -> str:
        """The hash of :attr:`config`."""
        return config_hash(self.config)


def write_pool(pool_dir: Path, sources: list[dict[str, Any]], *, root: Path, model_dir: str | None, spec: PoolSpec,
               record: dict[str, Any] | None = None) -> Path:
    """Write the pooled run directory of ``sources`` (in their order) into ``pool_dir``.

    Args:
        pool_dir: the pooled run directory (claimed by the caller).
        sources: one ``{"key", "run_dir" (relative to ``root``), "score", "params"}`` per run.
        root: the folder the sources' ``run_dir`` are relative to.
        model_dir: the model directory every source attacked.
        spec: what was pooled (``run.json`` ``config`` and ``config_hash``), the attacker-side
            criterion and its direction, and the near-duplicate merge (:class:`PoolSpec`).
        record: further ``run.json`` fields.

    Returns:
        ``pool_dir``: ``candidates.safetensors`` with ``x``, ``labels``, ``multipliers``, the
        ``score_<name>`` tensors all sources share, and ``source`` (m,) int64 = position of the
        candidate's run in ``sources``; ``run.json`` with method ``pool``.
    """
    parts: list[dict[str, torch.Tensor]] = []
    offset = 0
    for s in sources:
        tensors = load_tensors(root / s["run_dir"] / CANDIDATES)
        m = int(tensors["x"].shape[0])
        parts.append(tensors)
        s.update({"offset": offset, "count": m})
        offset += m
    shared = set.intersection(*(set(p) for p in parts))
    pooled = {k: torch.cat([p[k] for p in parts]) for k in sorted(shared) if k in ("x", "labels", "multipliers")
              or k.startswith("score_")}
    pooled["source"] = torch.cat([torch.full((p["x"].shape[0],), i, dtype=torch.int64) for i, p in enumerate(parts)])
    merged = 0
    if spec.merge is not None:
        keep = merge_duplicates(pooled["x"], threshold=spec.merge)
        merged = int((~keep).sum())
        pooled = {k: v[keep] for k, v in pooled.items()}
        offset = int(keep.sum())
    scores = [s["score"] for s in sources if s["score"] is not None]
    best = (min(scores) if spec.mode == "min" else max(scores)) if scores else None
    written = {
        "model_dir": model_dir, "method": "pool", "config": spec.config, "config_hash": spec.key, "seed": None,
        "versions": versions(), "status": Status.COMPLETE, "steps_done": 0, "wall_time_s": 0.0, "m": offset,
        "final": {}, "selection": {spec.criterion: {"value": best, "better": "lower" if spec.mode == "min" else "higher",
                                               "doc": f"best source run's {spec.criterion}"}},
        "extra": {"sources": sources, "created": time.time(),
                  **({"merged_duplicates": merged} if spec.merge is not None else {})}, **dict(record or {}),
    }
    if _already_written(pool_dir, pooled, written):  # a resumed pool of runs that had all finished: no byte changes
        return pool_dir
    save_tensors(pool_dir / CANDIDATES, pooled)
    atomic_write_json(pool_dir / RUN_JSON, written)
    return pool_dir


def _already_written(pool_dir: Path, pooled: dict[str, torch.Tensor], record: dict[str, Any]) -> bool:
    """``pool_dir`` holds this pool already: the same tensors, bit for bit, and the same ``run.json`` but for
    when it was created."""
    if not ((pool_dir / RUN_JSON).is_file() and (pool_dir / CANDIDATES).is_file()):
        return False
    try:
        found, tensors = read_json(pool_dir / RUN_JSON), load_tensors(pool_dir / CANDIDATES)
    except DataReconError:
        return False
    same = json.loads(json.dumps(to_jsonable(strip_timing(record)))) == strip_timing(found)
    return same and set(tensors) == set(pooled) and all(_same_bits(tensors[k], pooled[k]) for k in pooled)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    flat = (lambda t: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8))  # noqa: E731
    return bool(torch.equal(flat(a), flat(b)))
