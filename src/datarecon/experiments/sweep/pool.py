"""Pooled candidates: the candidates of a sweep's K best runs, as one run directory.

Runs are ranked by an attacker-side criterion (``run.json`` ``selection``; e.g. the relative
stationarity residual), never by ground truth. The pooled directory follows the run contract
(``candidates.safetensors`` + ``run.json`` with method ``"pool"`` and the list of source runs), so
``datarecon evaluate POOLDIR`` evaluates it like any run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from datarecon.errors import DataReconError
from datarecon.experiments.store import Store
from datarecon.experiments.sweep.driver import criterion_mode, score_of
from datarecon.status import EVALUABLE, Status
from datarecon.utils.io import atomic_write_json, config_hash, load_tensors, read_json, save_tensors, versions

CANDIDATES, RUN_JSON = "candidates.safetensors", "run.json"


def rank_runs(store: Store, *, criterion: str, mode: str | None = None, sweep_id: str | None = None,
              statuses: tuple[str, ...] = EVALUABLE) -> list[tuple[float, dict[str, Any]]]:
    """(score, row) of the store's runs with a finite ``criterion``, best first (ties: by key)."""
    direction = criterion_mode(criterion, mode)
    if not store.index_path.is_file():
        store.rebuild()
    ranked = []
    for row in store.rows(sweep_id=sweep_id):
        if row["kind"] != "run" or row["status"] not in statuses:
            continue
        s = score_of(row, criterion)
        if s is not None:
            ranked.append((s, row))
    ranked.sort(key=lambda t: ((t[0] if direction == "min" else -t[0]), t[1]["key"]))
    return ranked


def _same_pool(pool_dir: Path, key: str) -> bool:
    """Whether ``pool_dir`` holds the pool of this very config (rewriting it changes nothing)."""
    try:
        return read_json(pool_dir / RUN_JSON).get("config_hash") == key
    except DataReconError:
        return False


def write_pool(pool_dir: Path, sources: list[dict[str, Any]], *, root: Path, model_dir: str | None,
               config: dict[str, Any], key: str, criterion: str, mode: str,
               record: dict[str, Any] | None = None, merge: float | None = None) -> Path:
    """Write the pooled run directory of ``sources`` (in their order) into ``pool_dir``.

    Args:
        pool_dir: the pooled run directory (claimed by the caller).
        sources: one ``{"key", "run_dir" (relative to ``root``), "score", "params"}`` per run.
        root: the folder the sources' ``run_dir`` are relative to.
        model_dir: the model directory every source attacked.
        config, key: what was pooled and its hash (``run.json`` ``config`` / ``config_hash``).
        criterion, mode: the attacker-side criterion and its direction (``min``/``max``).
        record: further ``run.json`` fields.
        merge: drop a candidate whose cosine to a kept candidate of an earlier source (or an earlier
            one of the same source) exceeds this (:func:`datarecon.attacks.selection.merge_duplicates`);
            None: keep all.

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
    if merge is not None:
        from datarecon.attacks.selection import merge_duplicates

        keep = merge_duplicates(pooled["x"], threshold=merge)
        merged = int((~keep).sum())
        pooled = {k: v[keep] for k, v in pooled.items()}
        offset = int(keep.sum())
    save_tensors(pool_dir / CANDIDATES, pooled)
    scores = [s["score"] for s in sources if s["score"] is not None]
    best = (min(scores) if mode == "min" else max(scores)) if scores else None
    atomic_write_json(pool_dir / RUN_JSON, {
        "model_dir": model_dir, "method": "pool", "config": config, "config_hash": key, "seed": None,
        "versions": versions(), "status": Status.COMPLETE, "steps_done": 0, "wall_time_s": 0.0, "m": offset,
        "final": {}, "selection": {criterion: {"value": best, "better": "lower" if mode == "min" else "higher",
                                               "doc": f"best source run's {criterion}"}},
        "extra": {"sources": sources, "created": time.time(),
                  **({"merged_duplicates": merged} if merge is not None else {})}, **dict(record or {}),
    })
    return pool_dir


def pool_candidates(sweep_dir: str | Path, *, top: int, criterion: str = "relative_residual",
                    mode: str | None = None, sweep_id: str | None = None, out: str | Path | None = None,
                    merge: float | None = None, overwrite: bool = False) -> Path:
    """Gather the candidates of the ``top`` best runs of a store into a pooled run directory.

    Args:
        sweep_dir: the store (sweep ``--out``) directory.
        top: number of runs to pool (K >= 1; fewer if fewer runs finished).
        criterion: an attacker-side :data:`datarecon.attacks.selection.CRITERIA` name.
        mode: ``min``/``max``; default: the criterion's registered direction.
        sweep_id: restrict to one sweep of the store (default: every run in it).
        out: the pooled run directory (default ``<sweep_dir>/pools/<hash of the sources>``). An
            existing ``out`` other than this very pool is refused unless ``overwrite``, which
            replaces only what datarecon wrote there.
        overwrite: replace an existing ``out``.
        merge: drop a candidate whose cosine to a kept candidate of a better-ranked run (or an earlier
            one of the same run) exceeds this (:func:`datarecon.attacks.selection.merge_duplicates`);
            None: keep all.

    Returns:
        The pooled run directory: ``candidates.safetensors`` with ``x``, ``labels``, ``multipliers``,
        the ``score_<name>`` tensors all sources share, and ``source`` (m,) int64 = position of the
        candidate's run in ``run.json`` ``config.sources``.

    Raises:
        DataReconError: K < 1, no finished runs with the criterion, sources from different models, or
            an ``out`` that may not be written.
    """
    if top < 1:
        raise DataReconError(f"--top must be at least 1, got {top}")
    store = Store(sweep_dir)
    if not store.root.is_dir():
        raise DataReconError(f"sweep directory {store.root} not found; run `datarecon sweep --out {store.root}` first")
    direction = criterion_mode(criterion, mode)
    ranked = rank_runs(store, criterion=criterion, mode=direction, sweep_id=sweep_id)[:top]
    if not ranked:
        raise DataReconError(
            f"no finished run in {store.root} has the selection criterion {criterion!r}; "
            "check `datarecon store list` or choose another --criterion"
        )
    models = {row["model_dir"] for _, row in ranked}
    if len(models) > 1:
        raise DataReconError(f"the best runs attack different models ({sorted(models)}); pass --sweep to pool one sweep")
    sources = [{"key": row["key"], "run_dir": row["run_dir"], "score": score, "params": row.get("params") or {}}
               for score, row in ranked]
    config = {"top": top, "criterion": criterion, "mode": direction, "sweep_id": sweep_id,
              "sources": [s["key"] for s in sources]}
    if merge is not None:
        config["merge"] = merge
    key = config_hash(config)
    pool_dir = Path(out) if out is not None else store.pool_dir(key)
    from datarecon.utils.outdir import claim_out_dir

    default = out is None
    with claim_out_dir(pool_dir, kind="run", resume=default or _same_pool(pool_dir, key),
                       overwrite=overwrite and not default) as claim:
        claim.prepare()
        write_pool(pool_dir, sources, root=store.root, model_dir=next(iter(models)), config=config, key=key,
                   criterion=criterion, mode=direction, merge=merge)
    if pool_dir.parent == store.root / "pools":
        from datarecon.experiments.store import row_from_dir

        row = row_from_dir(pool_dir, root=store.root)
        if row is not None:
            store.upsert_runs([row])
    return pool_dir


__all__ = ["pool_candidates", "rank_runs", "write_pool"]
