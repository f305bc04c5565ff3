"""Reconstruction variants side by side on one target (issue 24, item 4): counts beside their nulls.

Each variant is a ReconstructionRun (or several, pooled) executed through the product's own
``execute`` and scored by ``evaluate`` (ground truth enters only there). The count follows the
headline rule: a training image counts when its Haim-protocol SSIM exceeds max(0.4, t), t the
threshold that at most 5 % of held-out images pass when used as candidates with the same m; the
held-out count at the same threshold is printed beside it.

Run (one variant at a time; results are appended to --results):

    python benchmarks/bench_unmixing.py --model runs/haim-medium-cifar --dataset cifar10 \\
        --variant plain --out runs/unmix --results benchmarks/results/unmixing_medium_cifar.json

``--list`` prints the variants; ``--evaluate-only --results FILE --out DIR`` evaluates the rows' finished
runs again (the rows measured before the held-out null used the attack's m were updated so). Each run's wall time is recorded (attack only, not evaluation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from _common import machine, set_threads

#: The reference's best shipped runs (METHODS §3): x₀ scale, lr_x, λ_min, α.
REFERENCE = {
    "cifar10": {"init_scale": 8.86e-4, "lr_x": 0.555, "lambda_min": 0.498, "alpha": 19.1},
    "mnist": {"init_scale": 1.74e-3, "lr_x": 0.282, "lambda_min": 0.415, "alpha": 19.2},
}

#: variant → (attack overrides, knowledge, candidates factor, runs)
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    # θ_init known without subspace candidates (subspace: false; the default with θ_init is on)
    "known-init": {"attack": {"subspace": False}, "knowledge": True},
    "loo": {"method": "loo", "knowledge": True},
    "subspace": {"attack": {"subspace": True}},
    "subspace-known-init": {"attack": {"subspace": True}, "knowledge": True},
    # results recorded before 2026-11-28 weighed TV as a sum over pixels (1e-4); tv_weight is per pixel since,
    # and the same prior is 1e-4 · m·C·H·W (here 0.3072 · m for CIFAR candidates)
    "tv": {"attack": {"tv_weight": 1e-4}},
    "split": {"attack": {"split_every": 500, "split_fraction": 0.1}},
    "split-known-init": {"attack": {"split_every": 500, "split_fraction": 0.1, "subspace": False}, "knowledge": True},
    "known-init-m1n": {"attack": {"subspace": False}, "factor": 1, "knowledge": True},
    "subspace-known-init-m1n": {"attack": {"subspace": True}, "factor": 1, "knowledge": True},
    "m4n": {"factor": 4},
    "m4n-known-init": {"attack": {"subspace": False}, "factor": 4, "knowledge": True},
    "unmix-init": {"init": {"name": "unmix"}},
    "unmix-init-known-init": {"attack": {"subspace": False}, "init": {"name": "unmix"}, "knowledge": True},
    # attacker-side search: K runs with hyper-parameters drawn around the reference's best shipped
    # runs, the best half by relative residual pooled, near-duplicates (cosine > 0.95) merged
    "search": {"search": {"runs": 8, "top": 4, "merge": 0.95}},
    "search-known-init": {"attack": {"subspace": False}, "search": {"runs": 8, "top": 4, "merge": 0.95},
                          "knowledge": True},
}

#: The ranges of the search variants (narrowed from the reference sweep, examples/sweep-haim-reference.yaml,
#: to where the reference's best shipped runs lie: METHODS §3).
SEARCH_SPACE = {
    "init.scale": {"dist": "log-uniform", "low": 3e-4, "high": 1e-2},
    "attack.lr_x": {"dist": "log-uniform", "low": 0.1, "high": 1.0},
    "attack.lambda_min": {"dist": "uniform", "low": 0.3, "high": 0.5},
    "attack.alpha": {"dist": "uniform", "low": 15.0, "high": 150.0},
}


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    from datarecon.evaluation import run_metrics
    from datarecon.experiments.reconstruct import RunOptions, build_run, execute
    from datarecon.models.checkpoint import read_model_meta

    spec = VARIANTS[args.variant]
    ref = dict(REFERENCE[args.dataset])
    meta = read_model_meta(args.model)
    n = int(meta["data"]["n_per_class"]) * 2
    attack = {"method": spec.get("method", "kkt"), "steps": args.steps, "lr_x": ref["lr_x"],
              "lambda_min": ref["lambda_min"], "alpha": ref["alpha"], "lr_lambda": 1e-4, "dtype": "float32",
              **spec.get("attack", {})}
    init = spec.get("init", {"name": "gaussian", "scale": ref["init_scale"]})
    fields: dict[str, Any] = {"model": str(args.model), "attack": attack, "init": init,
                              "candidates": spec.get("factor", 2) * n, "seed": args.seed,
                              "checkpoint": {"every": 500, "log_every": 50}}
    if spec.get("knowledge"):
        fields["knowledge"] = {"known_init": f"seed:{meta['seed']}"}
    out = Path(args.out) / f"{args.variant}-seed{args.seed}"
    if "search" in spec:
        return run_search(args, spec, fields, out, n)
    run = build_run(fields)
    t0 = time.perf_counter()
    rec = execute(run, out, RunOptions(overwrite=True, progress=False))
    attack_s = time.perf_counter() - t0
    metrics = run_metrics(out, progress=False)
    rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
    record = json.loads((out / "run.json").read_text())
    return {"variant": args.variant, "seed": args.seed, "model": str(args.model), "dataset": args.dataset,
            "n": n, "m": run.candidates, "steps": args.steps, "attack_wall_s": round(attack_s, 1),
            "status": rec.status, "rel_residual": rel, "subspace": record.get("subspace"),
            **headline_row(metrics), "run": run.model_dump(mode="json"), "machine": machine(),
            "date": time.strftime("%Y-%m-%d")}


def headline_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """The count at max(0.4, t) beside its held-out and noise nulls, and the signals among candidates."""
    h = metrics["headline"]
    cal, paper = h.get("calibrated") or {}, h["paper"]
    cr = metrics.get("candidate_roc") or {}
    return {"threshold": h["threshold"], "count": h["count"], "heldout_null": h["heldout"],
            "noise_null": h["noise"], "count_at_0.4": paper["count"], "heldout_at_0.4": paper["heldout"],
            "null_threshold": cal.get("null_threshold"), "rule": h.get("rule"),
            "candidate_auc": {k: v["auc"] for k, v in (cr.get("signals") or {}).items()},
            "candidate_auc_ci": {k: v["auc_ci"] for k, v in (cr.get("signals") or {}).items()}}


def run_search(args: argparse.Namespace, spec: dict[str, Any], fields: dict[str, Any], out: Path,
               n: int) -> dict[str, Any]:
    """The search variants: a sweep (the product's sweep driver and store), then a merged pool."""
    import shutil

    from datarecon.evaluation import run_metrics
    from datarecon.experiments.execution import Execution
    from datarecon.experiments.sweep import SweepConfig, pool_candidates, run_sweep

    search = spec["search"]
    attack = {k: v for k, v in fields["attack"].items() if k not in ("method", "steps", "dtype")}
    config = SweepConfig(model_dir=str(args.model), method=fields["attack"]["method"], attack=attack,
                         init=fields["init"], candidates=fields["candidates"], steps=args.steps, dtype="float32",
                         search={"random": SEARCH_SPACE, "samples": search["runs"]}, seed=args.seed,
                         knowledge=fields.get("knowledge", {}), name=args.variant)
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    result = run_sweep(config, out / "store", execution=Execution(workers=1), progress=False, checkpoint_every=500)
    attack_s = time.perf_counter() - t0
    pool = pool_candidates(out / "store", top=search["top"], merge=search["merge"], out=out / "pool")
    pooled = json.loads((pool / "run.json").read_text())
    metrics = run_metrics(pool, progress=False)
    return {"variant": args.variant, "seed": args.seed, "model": str(args.model), "dataset": args.dataset,
            "n": n, "m": pooled["m"], "steps": args.steps, "runs": search["runs"], "pooled_runs": search["top"],
            "merged_duplicates": pooled["extra"].get("merged_duplicates"), "attack_wall_s": round(attack_s, 1),
            "status": f"{result.total - result.failed} of {result.total} runs finished",
            "rel_residual": pooled["selection"]["relative_residual"]["value"], **headline_row(metrics),
            "sweep": config.model_dump(mode="json"), "machine": machine(), "date": time.strftime("%Y-%m-%d")}


def reevaluate(results: Path, out: Path) -> int:
    """Evaluate again the run directory of every row of ``results`` found under ``out`` (a search
    variant: its pool) and replace the row's headline fields; rows without a run directory stay."""
    from datarecon.evaluation import run_metrics

    rows = json.loads(results.read_text())
    for row in rows:
        run = out / f"{row['variant']}-seed{row['seed']}"
        run = run / "pool" if row["variant"].startswith("search") else run
        if not (run / "run.json").is_file():
            print(f"{run}: no run directory, row kept", file=sys.stderr)
            continue
        metrics = run_metrics(run, progress=False)
        row.update(headline_row(metrics), n_heldout_available=metrics["headline"].get("n_heldout_available"),
                   reevaluated=time.strftime("%Y-%m-%d"))
        print(row["variant"], row["seed"], row["count"], row["heldout_null"], flush=True)
    results.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--dataset", choices=sorted(REFERENCE))
    p.add_argument("--variant", choices=sorted(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("runs/unmixing"))
    p.add_argument("--results", type=Path)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--list", action="store_true")
    p.add_argument("--evaluate-only", action="store_true",
                   help="re-evaluate the finished runs of --results (after a change to the evaluation) and update "
                        "their rows in place; attacks are not rerun")
    args = p.parse_args(argv)
    if args.evaluate_only:
        if args.results is None or not args.results.is_file():
            p.error("--evaluate-only needs --results FILE of earlier rows")
        return reevaluate(args.results, args.out)
    if args.list:
        for name, spec in VARIANTS.items():
            print(f"{name:24s} {json.dumps(spec)}")
        return 0
    if args.model is None or args.dataset is None or args.variant is None:
        p.error("--model, --dataset and --variant are required (or --list)")
    set_threads(args.threads)
    torch.manual_seed(0)
    row = run_variant(args)
    print(json.dumps({k: v for k, v in row.items() if k not in ("run", "sweep", "machine")}))
    if args.results is not None:
        rows = json.loads(args.results.read_text()) if args.results.is_file() else []
        rows.append(row)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
