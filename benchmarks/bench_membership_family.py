"""The membership power table: every signal of ``datarecon membership --evaluate`` on the networks people train.

Each row trains its target with ``datarecon train`` (the command is recorded; an existing model directory
is reused) and runs ``datarecon membership --evaluate`` through the command line with the row's flags
(reference models included), timing both; the row keeps every signal's ROC on the same members and
non-members, the strongest signal and how it was chosen, and where the images came from.

    python benchmarks/bench_membership_family.py --rows cnn100 --work runs/membership-family
    python benchmarks/bench_membership_family.py --rows cnn100 --references 64   # fewer reference models, a trial
    python benchmarks/bench_membership_family.py --rows cifar-med --model-dir targets/cifar-med  # an existing target

Rows (CIFAR-10 unless named):
* ``cnn100``: the issue's CNN: all ten classes, 10 per class (n = 100), a bias-free CNN (32, 64 channels),
  SGD lr 0.1, batches of 10, 30 epochs; 512 reference models on two workers.
* ``resnet8-100``: ResNet-8 (16-32-64, no batch norm) on the same 100 images, SGD lr 0.03, momentum 0.9,
  batches of 10, 150 epochs (training accuracy 1); 32 reference models.
* ``mnist-mlp20``: the README's MNIST MLP (odd/even, n = 20, width 100, bias-free, GD lr 0.5, 2 000 epochs,
  float64); 256 reference models.
* ``cifar-med`` / ``mnist-med``: Haim et al.'s D-1000-1000-1 medium targets (vehicles/animals, odd/even, n =
  100, loss-normalised GD, 3 000 epochs); no reference models (each would train for minutes), weights only and
  with θ_init known.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS_DIR, machine

CIFAR100 = ["--dataset", "cifar10", "--task", "all", "--n-per-class", "10", "--n-heldout-per-class", "50",
            "--no-bias", "--loss", "cross-entropy"]
HAIM = ["--n-per-class", "50", "--selection", "first", "--normalisation", "unit-minus-mean", "--arch", "mlp",
        "--hidden", "1000,1000", "--no-bias", "--init-scale", "1e-4", "--loss", "logistic", "--lr", "0.01",
        "--schedule", "loss-normalised", "--max-lr-factor", "1e9", "--epochs", "3000", "--dtype", "float64",
        "--seed", "0"]

#: row -> (train flags, [membership flags per measurement])
ROWS: dict[str, tuple[list[str], list[list[str]]]] = {
    "cnn100": ([*CIFAR100, "--arch", "cnn", "--channels", "32,64", "--lr", "0.1", "--batch-size", "10",
                "--epochs", "30"], [["--references", "512", "--workers", "2"]]),
    "resnet8-100": ([*CIFAR100, "--arch", "resnet8", "--lr", "0.03", "--momentum", "0.9", "--batch-size", "10",
                     "--epochs", "150"], [["--references", "32", "--workers", "2"]]),
    "mnist-mlp20": (["--dataset", "mnist", "--task", "odd-even", "--n-per-class", "10", "--arch", "mlp", "--hidden",
                     "100", "--no-bias", "--init-scale", "1e-3", "--loss", "logistic", "--lr", "0.5", "--epochs", "2000",
                     "--dtype", "float64"], [["--references", "256", "--workers", "2"]]),
    "cifar-med": (["--dataset", "cifar10", "--task", "vehicles-animals", "--n-heldout-per-class", "400", *HAIM],
                  [["--references", "0"], ["--known-init", "seed", "--references", "0"]]),
    "mnist-med": (["--dataset", "mnist", "--task", "odd-even", "--n-heldout-per-class", "1000", *HAIM],
                  [["--references", "0"], ["--known-init", "seed", "--references", "0"]]),
}


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "datarecon.cli.main", *cmd], check=True)
    return time.perf_counter() - t0


def _summary(folder: Path) -> dict:
    res = json.loads((folder / "membership.json").read_text())
    signals = {}
    for name, v in res["signals"].items():
        rep = v.get("report") or {}
        signals[name] = {"applicable": v["applicable"], "note": v.get("note"), "auc": rep.get("auc"),
                         "auc_ci": rep.get("auc_ci"), "tpr_at_fpr": rep.get("tpr_at_fpr"),
                         "n_members": rep.get("n_members"), "n_nonmembers": rep.get("n_nonmembers"),
                         "chosen_on": v.get("chosen_on")}
    refs = res.get("references") or {}
    return {"signals": signals, "strongest": res["strongest"], "candidates": res["candidates"], "split": res["split"],
            "references": {k: refs.get(k) for k in ("count", "trained", "reused", "wall_time_s",
                                                    "in_models", "auto")} if refs else None,
            "knowledge": res["knowledge"]["summary"], "wall_time_s": res["wall_time_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="cnn100", help=f"comma-separated rows: {', '.join(ROWS)}")
    ap.add_argument("--work", type=Path, default=Path("runs/membership-family"))
    ap.add_argument("--model-dir", type=Path, default=None, help="an existing target for the (single) row")
    ap.add_argument("--references", type=int, default=None, help="override the rows' reference-model count")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training and of each worker")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "membership_family.json")
    args = ap.parse_args(argv)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    for name in args.rows.split(","):
        if name not in ROWS:
            ap.error(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
        train, measurements = ROWS[name]
        mdir = args.model_dir or args.work / name / "model"
        train_cmd = ["train", *train, "--no-progress", "--threads", str(args.threads), "--out", str(mdir)]
        train_s = None if (mdir / "model.json").is_file() else _run(train_cmd)
        meta = json.loads((mdir / "model.json").read_text())
        for flags in measurements:
            if args.references is not None and "--references" in flags:
                flags = [*flags[:flags.index("--references") + 1], str(args.references),
                         *flags[flags.index("--references") + 2:]]
            folder = args.work / name / ("membership-" + ("-".join(f.strip("-") for f in flags) or "plain"))
            cmd = ["membership", "--model", str(mdir), "--evaluate", "--threads", str(args.threads), *flags,
                   "--out", str(folder)]
            wall = _run(cmd)
            row = {"row": name, "flags": flags, "train_command": "datarecon " + " ".join(train_cmd),
                   "train_wall_s": train_s, "membership_command": "datarecon " + " ".join(cmd),
                   "membership_wall_s": wall, "train_accuracy": meta["metrics"].get("train_accuracy"),
                   "heldout_accuracy": meta["metrics"].get("heldout_accuracy"), **_summary(folder),
                   "machine": machine(), "date": time.strftime("%Y-%m-%d")}
            best = row["strongest"]
            print(f"{name} {' '.join(flags)}: strongest {best['line']} ({wall:.0f} s)", flush=True)
            rows = [r for r in rows if (r["row"], r["flags"]) != (name, flags)] + [row]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
