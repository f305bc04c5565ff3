"""Pooled candidates: the candidates of a sweep's K best runs, as one run directory.

Runs are ranked by an attacker-side criterion (``run.json`` ``selection``; e.g. the relative
stationarity residual), never by ground truth. The pooled directory follows the run contract
(``candidates.safetensors`` + ``run.json`` with method ``"pool"`` and the list of source runs), so
``datarecon evaluate POOLDIR`` evaluates it like any run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datarecon.attacks.selection import DEFAULT_CRITERION
from datarecon.errors import DataReconError
from datarecon.experiments.pool import PoolSpec, criterion_mode, same_pool, score_of, write_pool
from datarecon.experiments.store import Store, check_store, row_from_dir
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.status import EVALUABLE


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


def pool_candidates(sweep_dir: str | Path, *, top: int, criterion: str = DEFAULT_CRITERION,
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
    check_store(store.root)
    direction = criterion_mode(criterion, mode)
    ranked = rank_runs(store, criterion=criterion, mode=direction, sweep_id=sweep_id)[:top]
    if not ranked:
        raise DataReconError(
            f"no finished run in {store.root} has the selection criterion {criterion!r} (none finished, or all "
            f"failed); see `datarecon store list {store.root}`"
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
    spec = PoolSpec(config=config, criterion=criterion, mode=direction, merge=merge)
    key = spec.key
    pool_dir = Path(out) if out is not None else store.pool_dir(key)

    default = out is None
    with claim_out_dir(pool_dir, kind="run", resume=default or same_pool(pool_dir, key),
                       overwrite=overwrite and not default, nested=default) as claim:
        claim.prepare()
        write_pool(pool_dir, sources, root=store.root, model_dir=next(iter(models)), spec=spec)
    if pool_dir.parent == store.root / "pools":
        row = row_from_dir(pool_dir, root=store.root)
        if row is not None:
            store.upsert_runs([row])
    return pool_dir


__all__ = ["pool_candidates", "rank_runs", "write_pool"]
