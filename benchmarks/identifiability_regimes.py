"""The regime study: in which training regimes does the KKT objective identify an MLP's training data, and does the
identifiability diagnostic predict what the attack recovers?

Each row trains the medium-rung target of Haim et al.'s setting (CIFAR-10 vehicles/animals, n = 100, D-1000-1000-1,
first layer N(0,1)·1e-4, float64) with one recipe, runs ``datarecon identifiability`` on it (every objective, with
the training set beside held-out images, means of two training images and partition images), then the attacks:
the KKT attack from the weights alone with the reference's two CIFAR settings (m = 200, 3000 steps each; the
attacker-side pick is the run with the lower relative residual) and the KKT attack knowing θ_init (its defaults,
m = 200, 3000 steps), each evaluated by ``datarecon evaluate`` (the headline count beside its held-out and noise
nulls, and the papers' scoring). Rows are appended to the JSON as they finish; an existing model or run folder
is reused.

    python benchmarks/identifiability_regimes.py --rows lnorm-3000,bias,ascent,wd,const --work runs/regimes \\
        --out benchmarks/results/identifiability_regimes.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS_DIR, machine

BASE = ["--dataset", "cifar10", "--task", "vehicles-animals", "--n-per-class", "50", "--selection", "first",
        "--n-heldout-per-class", "100", "--n-partition-per-class", "50", "--arch", "mlp", "--hidden", "1000,1000",
        "--init-scale", "1e-4", "--loss", "logistic", "--dtype", "float64", "--seed", "0", "--no-progress"]
LNORM = ["--lr", "0.01", "--schedule", "loss-normalised", "--max-lr-factor", "1e9"]

#: row -> (what, train flags); const's epochs come from --const-epochs
ROWS: dict[str, tuple[str, list[str]]] = {
    "lnorm-3000": ("loss-normalised GD, 3000 epochs (the medium target)", [*BASE, "--no-bias", *LNORM,
                                                                          "--epochs", "3000"]),
    "bias": ("the same with biases in every layer (the reference keeps a first-layer bias)",
             [*BASE, "--bias", *LNORM, "--epochs", "3000"]),
    "ascent": ("loss-normalised GD 3000 epochs, then 500 steps of margin ascent",
               [*BASE, "--no-bias", *LNORM, "--epochs", "3000", "--margin-ascent-steps", "500"]),
    "wd": ("weight decay 1e-3, plain GD at lr 0.05 for 20000 epochs (towards the regularised loss's stationary point)",
           [*BASE, "--no-bias", "--weight-decay", "1e-3", "--lr", "0.05", "--epochs", "20000"]),
    "const": ("constant lr 0.01, plain GD (the reference's schedule), as many epochs as --const-epochs",
              [*BASE, "--no-bias", "--lr", "0.01"]),
}

REFERENCE_RUNS = (("kkt-ref-a", ["--init-scale", "8.86e-4", "--lr-x", "0.555", "--lambda-min", "0.498", "--alpha",
                                 "19.1"]),
                  ("kkt-ref-b", ["--init-scale", "4.47e-3", "--lr-x", "0.346", "--lambda-min", "0.494", "--alpha",
                                 "21.7"]))
ATTACK = ["--method", "kkt", "--init", "gaussian", "--candidates", "200", "--steps", "3000", "--lr-lambda", "1e-4",
          "--no-progress"]


def _cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args], check=True)
    return time.perf_counter() - t0


def _headline(run: Path) -> dict:
    m = json.loads((run / "metrics.json").read_text())
    rj = json.loads((run / "run.json").read_text())
    h = m["headline"]
    sel = (rj.get("selection") or {}).get("relative_residual") or {}
    return {"count": h.get("count"), "heldout": h.get("heldout"), "noise": h.get("noise"),
            "threshold": h.get("threshold"), "paper": h.get("paper"), "reference_scoring": h.get("reference_scoring"),
            "relative_residual": sel.get("value") if isinstance(sel, dict) else sel,
            "mean_best_ssim": (m.get("haim") or {}).get("mean_ssim")}


def _attack(model: Path, out: Path, flags: list[str], threads: int) -> dict:
    wall = None
    if not (out / "metrics.json").is_file():
        wall = _cli(["reconstruct", "--model", str(model), *ATTACK, *flags, "--threads", str(threads),
                     "--out", str(out), "--overwrite"])
        _cli(["evaluate", str(out), "--no-progress", "--threads", str(threads)])
    return {"flags": flags, "wall_s": wall, **_headline(out)}


def run_row(name: str, work: Path, *, threads: int, const_epochs: int) -> dict:
    what, flags = ROWS[name]
    if name == "const":
        flags = [*flags, "--epochs", str(const_epochs)]
    mdir = work / name / "model"
    train_s = None
    if not (mdir / "model.json").is_file():
        train_s = _cli(["train", *flags, "--threads", str(threads), "--kkt-score", "--out", str(mdir), "--overwrite"])
    ident_file = work / name / "identifiability.json"
    if not ident_file.is_file():
        _cli(["identifiability", str(mdir), "--objectives", "kkt,kkt-init,loo,path", "--threads", str(threads),
              "--out", str(ident_file)])
    ident = json.loads(ident_file.read_text())
    runs = {label: _attack(mdir, work / name / label, f, threads) for label, f in REFERENCE_RUNS}
    pick = min(runs, key=lambda k: runs[k]["relative_residual"] if runs[k]["relative_residual"] is not None
               else float("inf"))
    init = _attack(mdir, work / name / "kkt-init", ["--known-init", "seed"], threads)
    meta = json.loads((mdir / "model.json").read_text())
    return {"row": name, "recipe": what, "train_command": "datarecon train " + " ".join(flags), "train_wall_s": train_s,
            "train_metrics": {k: meta["metrics"].get(k) for k in ("train_loss", "train_accuracy", "normalised_margin",
                                                                  "kkt_regime_score", "epochs_done")},
            "identifiability": {k: {"sets": {s: r["relative_residual"] for s, r in v.get("sets", {}).items()},
                                    "identifies": v.get("identifies"), "gap": v.get("gap")}
                                for k, v in ident["objectives"].items()},
            "weights_only": {"runs": runs, "attacker_pick": pick, **runs[pick]}, "known_init": init,
            "machine": machine(), "date": time.strftime("%Y-%m-%d")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--work", type=Path, default=Path("runs/regimes"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--const-epochs", type=int, default=30000)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "identifiability_regimes.json")
    args = ap.parse_args(argv)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    for name in args.rows.split(","):
        if name not in ROWS:
            ap.error(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
        row = run_row(name, args.work, threads=args.threads, const_epochs=args.const_epochs)
        w, k = row["weights_only"], row["known_init"]
        print(f"{name}: kkt gap {row['identifiability']['kkt']['gap']:+.3f}, weights only {w['count']} "
              f"(held-out {w['heldout']}), θ_init known {k['count']} (held-out {k['heldout']})", flush=True)
        rows = [r for r in rows if r["row"] != name] + [row]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
