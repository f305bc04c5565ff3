"""Pool the candidates of finished runs of one model into one run directory (attacker side), then evaluate it.

The runs are taken in the order given and pooled with :func:`datarecon.experiments.pool.write_pool` (the writer of
``reconstruct --runs K`` and ``sweep pool``); ``--merge C`` drops a candidate whose cosine to a kept one exceeds C
(attacker-side deduplication). No run is ranked or dropped by ground truth: every run given is pooled.

A pool has more candidates than the model's held-out set (``datarecon evaluate`` then says its null flatters the
attack); ``--heldout-per-class K`` also evaluates it against K held-out test images per class (the model's data
spec with that many held-out images; the training images the same), as many as the pool's candidates, and writes
that headline to ``OUT/headline-heldout<K>.json``.

    python benchmarks/pool_runs.py --runs RUN_A RUN_B --merge 0.95 --out POOL --threads 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from datarecon.data import DataSpec, load_task
from datarecon.evaluation import evaluation_of
from datarecon.experiments.pool import PoolSpec, write_pool
from datarecon.kernel.outdir import claim_out_dir
from datarecon.models.checkpoint import load_model_dir
from datarecon.utils.io import atomic_write_json, load_tensors, read_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--merge", type=float, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heldout-per-class", type=int, default=None)
    args = ap.parse_args(argv)
    models = {read_json(r / "run.json")["model_dir"] for r in args.runs}
    if len(models) != 1:
        ap.error(f"the runs attacked different models: {sorted(models)}")
    root = Path("/")
    sources = [{"key": r.name, "run_dir": str(r.resolve().relative_to(root)), "score": None, "params": {}}
               for r in args.runs]
    config = {"runs": [str(r) for r in args.runs], "merge": args.merge}
    with claim_out_dir(args.out, kind="run", overwrite=True, resume=False) as claim:
        claim.prepare()
        write_pool(args.out, sources, root=root, model_dir=models.pop(),
                   spec=PoolSpec(config=config, criterion="relative_residual", mode="min", merge=args.merge))
    subprocess.run([sys.executable, "-m", "datarecon.cli.main", "evaluate", str(args.out), "--no-progress",
                    "--threads", str(args.threads)], check=True)
    head = json.loads((args.out / "metrics.json").read_text())["headline"]
    print(json.dumps({k: head.get(k) for k in ("count", "heldout", "noise", "threshold", "n_candidates", "notes")}))
    if args.heldout_per_class:
        big = _larger_null(args.out, args.heldout_per_class)
        print(json.dumps({k: big.get(k) for k in ("count", "heldout", "noise", "threshold", "n_candidates", "notes")}))
    return 0


def _larger_null(pool: Path, per_class: int) -> dict:
    """The pool's headline against ``per_class`` held-out images per class (ground truth: evaluation only)."""
    torch.set_num_threads(1)
    bundle = load_model_dir(read_json(pool / "run.json")["model_dir"])
    task = load_task(DataSpec.model_validate({**bundle.data, "n_heldout_per_class": per_class}))
    if not torch.equal(task.train.indices.long(), bundle.indices["train"].long()):
        raise SystemExit("the larger held-out spec selects other training images")
    x = load_tensors(pool / "candidates.safetensors")["x"]
    ev = evaluation_of(task.normalisation.to_display(x.float()), train=task.train.x, heldout=task.heldout.x,
                  noise=int(x.shape[0]))
    head = {**ev.summary["headline"], "n_heldout_images": int(task.heldout.x.shape[0])}
    atomic_write_json(pool / f"headline-heldout{per_class}.json", head)
    return head


if __name__ == "__main__":
    sys.exit(main())
