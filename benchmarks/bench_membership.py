"""Power of subspace membership across targets (issue 24, item 3): where it works and where it fails.

Each row trains a target with ``datarecon train`` (its command is recorded) and measures
``datarecon membership --evaluate`` on it, from the weights alone and with the initialisation known
(``--known-init seed:<seed>``): the subspace signal's ROC AUC (bootstrap 95 % interval) and TPR at 1 % / 0.1 %
FPR of the training images against non-members drawn from the unused part of the training split (the reported part
of the calibration split; every signal of the product: ``bench_membership_family.py``).

    python benchmarks/bench_membership.py --out benchmarks/results/membership_power.json
    python benchmarks/bench_membership.py --rows affine,cnn        # a subset
    python benchmarks/bench_membership.py --model-dir targets/cifar-med --name haim-medium-cifar

Targets (CIFAR-10 vehicles/animals unless named; n = 100 unless named):
* ``haim-mlp``: Haim et al.'s D-1000-1000-1, bias-free, first layer N(0,1)·1e-4, loss-normalised GD,
  3 000 epochs (``haim-mlp-e<N>``: other training lengths).
* ``affine``: Runkel's affine classifier with weight decay 1e-2 (its first layer has rank 1).
* ``one-hidden``: Runkel's one-hidden-layer classifier, width 1024, weight decay 1e-2, L-BFGS.
* ``standard-init``: a bias-free D-1000-1000-1 with PyTorch's default initialisation, GD 300 epochs.
* ``weight-decay``: as ``haim-mlp`` with weight decay 1e-3 and plain GD (the initialisation shrinks).
* ``multiclass``: D-1000-1000-10 cross-entropy on all ten classes (10 per class).
* ``cnn``: a bias-free CNN (channels 32, 64) read out by one linear layer; analysed at that layer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import machine

BASE = ["--dataset", "cifar10", "--task", "vehicles-animals", "--n-per-class", "50", "--selection", "first",
        "--n-heldout-per-class", "400", "--n-partition-per-class", "300", "--dtype", "float64", "--seed", "0",
        "--no-progress"]
HAIM = ["--arch", "mlp", "--hidden", "1000,1000", "--no-bias", "--init-scale", "1e-4", "--loss", "logistic",
        "--lr", "0.01", "--schedule", "loss-normalised", "--max-lr-factor", "1e9"]

ROWS: dict[str, list[str]] = {
    "haim-mlp": [*BASE, *HAIM, "--epochs", "3000"],
    "haim-mlp-e300": [*BASE, *HAIM, "--epochs", "300"],
    "haim-mlp-e1000": [*BASE, *HAIM, "--epochs", "1000"],
    "haim-mlp-e10000": [*BASE, *HAIM, "--epochs", "10000"],
    "affine": [*BASE, "--arch", "affine", "--loss", "logistic", "--weight-decay", "1e-2", "--optimizer", "lbfgs",
               "--lr", "1", "--epochs", "100"],
    "one-hidden": [*BASE, "--arch", "one-hidden", "--hidden", "1024", "--loss", "logistic", "--weight-decay", "1e-2",
                   "--optimizer", "lbfgs", "--lr", "1", "--epochs", "300"],
    "standard-init": [*BASE, "--arch", "mlp", "--hidden", "1000,1000", "--no-bias", "--loss", "logistic",
                      "--lr", "0.01", "--epochs", "300"],
    "weight-decay": [*BASE, "--arch", "mlp", "--hidden", "1000,1000", "--no-bias", "--init-scale", "1e-4",
                     "--loss", "logistic", "--weight-decay", "1e-3", "--lr", "0.05", "--epochs", "3000"],
    "multiclass": ["--dataset", "cifar10", "--task", "all", "--n-per-class", "10", "--selection", "first",
                   "--n-heldout-per-class", "80", "--n-partition-per-class", "30", "--dtype", "float64", "--seed", "0",
                   "--no-progress", "--arch", "mlp", "--hidden", "1000,1000", "--no-bias", "--init-scale", "1e-4",
                   "--loss", "cross-entropy", "--lr", "0.5", "--epochs", "1000"],
    "cnn": [*BASE, "--arch", "cnn", "--channels", "32,64", "--no-bias", "--loss", "logistic", "--lr", "0.05",
            "--epochs", "1000"],
}


def measure(model_dir: Path, *, known: bool, seed: int) -> dict:
    from datarecon.attacks.knowledge import KnowledgeSettings
    from datarecon.experiments.membership.evaluate import evaluate_membership
    from datarecon.experiments.membership.settings import MembershipSettings

    knowledge = KnowledgeSettings(known_init=f"seed:{seed}" if known else None)
    res = evaluate_membership(model_dir, knowledge=knowledge, settings=MembershipSettings().without_references())
    sub = res["signals"]["subspace"]
    roc = sub.get("report") or {}
    return {"auc": roc.get("auc"), "auc_ci": roc.get("auc_ci"), "tpr_at_fpr": roc.get("tpr_at_fpr"),
            "tpr_ci": roc.get("tpr_ci"), "n_members": roc.get("n_members"), "n_nonmembers": roc.get("n_nonmembers"),
            "line": sub.get("line") or sub["note"], "strongest": res["strongest"]["line"],
            "subspace": {k: res["subspace"][k] for k in ("matrix", "k", "rank", "shape", "on_input")},
            "wall_time_s": res["wall_time_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    ap.add_argument("--model-dir", type=Path, help="measure an existing model directory instead (with --name)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--work", type=Path, default=Path("runs/membership-power"))
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "membership_power.json")
    args = ap.parse_args(argv)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    todo: list[tuple[str, Path, list[str] | None]] = []
    if args.model_dir is not None:
        todo.append((args.name or args.model_dir.name, args.model_dir, None))
    else:
        for name in args.rows.split(","):
            if name not in ROWS:
                ap.error(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
            todo.append((name, args.work / name, ROWS[name]))
    for name, mdir, cmd in todo:
        train_s = None
        if cmd is not None and not (mdir / "model.json").is_file():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "datarecon.cli.main", "train", *cmd, "--out", str(mdir)], check=True,
                           stdout=subprocess.DEVNULL)
            train_s = time.perf_counter() - t0
        meta = json.loads((mdir / "model.json").read_text())
        row = {"row": name, "model_dir": str(mdir), "train_command": None if cmd is None else
               "datarecon train " + " ".join(cmd) + f" --out {mdir}", "train_wall_s": train_s,
               "train_accuracy": meta["metrics"].get("train_accuracy"),
               "heldout_accuracy": meta["metrics"].get("heldout_accuracy"),
               "weights_only": measure(mdir, known=False, seed=meta["seed"]),
               "known_init": measure(mdir, known=True, seed=meta["seed"]),
               "machine": machine(), "date": time.strftime("%Y-%m-%d")}
        print(f"{name}: weights only: {row['weights_only']['line']}\n{' ' * len(name)}  θ_init known: "
              f"{row['known_init']['line']}", flush=True)
        rows = [r for r in rows if r["row"] != name] + [row]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
