"""The regime study: in which training regimes does the KKT objective identify an MLP's training data, and does the
identifiability diagnostic predict what the attack recovers?

Each row trains the medium-rung target of Haim et al.'s setting (CIFAR-10 vehicles/animals, n = 100, D-1000-1000-1,
first layer N(0,1)·1e-4, float64) with one recipe (loss-normalised GD, then 0 / 500 / 2000 / 4000 steps of margin
ascent or margin ascent to convergence; weight decay; a constant learning rate; biases), runs ``datarecon
identifiability`` on it (every objective, with the training set beside held-out images, means of two training
images and partition images), then the attacks: the KKT attack from the weights alone and the KKT attack knowing
θ_init, each at the reference's CIFAR settings (``--weights-settings``, ``--init-settings``; m = 200, 3000 steps,
the step-size probe and ``--retry-diverged 2``), each evaluated by ``datarecon evaluate`` (the headline count
beside its held-out and noise nulls, and the papers' scoring). Per attacker the row records every setting's count,
the attacker-side pick (the finished run with the lower relative residual) and the pool of all its runs
(``benchmarks/pool_runs.py``: no selection). Rows are appended to the JSON as they finish; every model, diagnosis and
run folder is reused, and a row can be split over calls of at most ~30 min (an empty settings list trains and
diagnoses only; a training or an attack killed in between resumes from its checkpoint).

    python benchmarks/identifiability_regimes.py --rows converged --work runs/regimes --weights-settings '' \
        --init-settings '' --threads 1                                   # train and diagnose
    python benchmarks/identifiability_regimes.py --rows converged --work runs/regimes --threads 1 \
        --out benchmarks/results/identifiability_regimes.json          # the attacks, pools and the row
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
    "ascent-500": ("loss-normalised GD 3000 epochs, then 500 steps of margin ascent",
                   [*BASE, "--no-bias", *LNORM, "--epochs", "3000", "--margin-ascent-steps", "500"]),
    "ascent-2000": ("loss-normalised GD 3000 epochs, then 2000 steps of margin ascent",
                    [*BASE, "--no-bias", *LNORM, "--epochs", "3000", "--margin-ascent-steps", "2000"]),
    "ascent-4000": ("loss-normalised GD 3000 epochs, then 4000 steps of margin ascent",
                    [*BASE, "--no-bias", *LNORM, "--epochs", "3000", "--margin-ascent-steps", "4000"]),
    "converged": ("loss-normalised GD 3000 epochs, then margin ascent until the normalised margin rose by less than "
                  "1 % over 500 steps (budget 20000)",
                  [*BASE, "--no-bias", *LNORM, "--epochs", "3000", "--margin-ascent-steps", "20000",
                   "--margin-ascent-rtol", "0.01", "--margin-ascent-window", "500"]),
    "wd": ("weight decay 1e-3, plain GD at lr 0.05, as many epochs as --wd-epochs (towards the regularised loss's stationary point)",
           [*BASE, "--no-bias", "--weight-decay", "1e-3", "--lr", "0.05"]),
    "const": ("constant lr 0.01, plain GD (the reference's schedule), as many epochs as --const-epochs",
              [*BASE, "--no-bias", "--lr", "0.01"]),
}

REFERENCE_RUNS = (("kkt-ref-a", ["--init-scale", "8.86e-4", "--lr-x", "0.555", "--lambda-min", "0.498", "--alpha",
                                 "19.1"]),
                  ("kkt-ref-b", ["--init-scale", "4.47e-3", "--lr-x", "0.346", "--lambda-min", "0.494", "--alpha",
                                 "21.7"]))
ATTACK = ["--method", "kkt", "--init", "gaussian", "--candidates", "200", "--steps", "3000", "--lr-lambda", "1e-4",
          "--retry-diverged", "2", "--no-progress"]


def _cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args], check=True)
    return time.perf_counter() - t0


def _headline(run: Path) -> dict:
    m = json.loads((run / "metrics.json").read_text())
    rj = json.loads((run / "run.json").read_text())
    h = m["headline"]
    sel = (rj.get("selection") or {}).get("relative_residual") or {}
    return {"status": rj.get("status"), "step_probe": rj.get("step_probe"), "retry_diverged": rj.get("retry_diverged"),
            "wall_s": rj.get("wall_time_s"), "count": h.get("count"), "heldout": h.get("heldout"),
            "noise": h.get("noise"), "threshold": h.get("threshold"), "paper": h.get("paper"), "reference_scoring": h.get("reference_scoring"),
            "relative_residual": sel.get("value") if isinstance(sel, dict) else sel,
            "mean_best_ssim": (m.get("haim") or {}).get("mean_ssim")}


def _again(folder: Path) -> str:
    """``--resume`` where an earlier call left a checkpoint (a row split over several calls), else ``--overwrite``."""
    return "--resume" if (folder / "checkpoint").is_dir() else "--overwrite"


def _attack(model: Path, out: Path, flags: list[str], threads: int) -> dict:
    if not (out / "metrics.json").is_file():
        _cli(["reconstruct", "--model", str(model), *ATTACK, *flags, "--threads", str(threads),
              "--out", str(out), _again(out)])
        _cli(["evaluate", str(out), "--no-progress", "--threads", str(threads)])
    return {"flags": flags, **_headline(out)}


def _pool(row: Path, runs: dict[str, dict], name: str, threads: int, *, folder=lambda s: s) -> dict | None:
    """Every finished run of one attacker pooled (no selection: the attacker keeps all its candidates) and
    evaluated (``benchmarks/pool_runs.py``); None with fewer than two runs."""
    done = [row / folder(k) for k, r in runs.items() if r.get("status") in ("complete", "stopped-early")]
    if len(done) < 2:
        return None
    out = row / name
    per_class = 100 * len(done)  # a held-out null as large as the pool (2 classes, m = 200 per run)
    big = out / f"headline-heldout{per_class}.json"
    if not big.is_file():
        subprocess.run([sys.executable, str(Path(__file__).parent / "pool_runs.py"), "--runs", *map(str, done),
                        "--heldout-per-class", str(per_class), "--out", str(out), "--threads", str(threads)],
                       check=True)
    h = json.loads((out / "metrics.json").read_text())["headline"]
    b = json.loads(big.read_text())
    return {"runs": [p.name for p in done], "count": h.get("count"), "heldout": h.get("heldout"),
            "noise": h.get("noise"), "threshold": h.get("threshold"), "notes": h.get("notes"),
            "reference_scoring": h.get("reference_scoring"),
            "with_a_null_as_large": {k: b.get(k) for k in ("count", "heldout", "noise", "threshold",
                                                           "n_heldout_images")}}


def _attacker_pick(runs: dict[str, dict]) -> str:
    """The run an attacker keeps: the finished one with the lowest relative residual (attacker-side)."""
    def key(k: str) -> float:
        r = runs[k]
        ok = r.get("status") in (None, "complete", "stopped-early") and r["relative_residual"] is not None
        return r["relative_residual"] if ok else float("inf")
    return min(runs, key=key)


def run_row(name: str, work: Path, *, threads: int, const_epochs: int, wd_epochs: int,
            settings: tuple[tuple[str, ...], tuple[str, ...]]) -> dict | None:
    """Train, diagnose and attack one row (``settings``: the weights-only and the θ_init-known reference
    settings to run); None when ``settings`` asks for no attack (a call that only trains and diagnoses)."""
    what, train_flags = ROWS[name]
    if name == "const":
        train_flags = [*train_flags, "--epochs", str(const_epochs)]
    if name == "wd":
        train_flags = [*train_flags, "--epochs", str(wd_epochs)]
    mdir = work / name / "model"
    if not (mdir / "model.json").is_file():
        _cli(["train", *train_flags, "--threads", str(threads), "--kkt-score", "--out", str(mdir), _again(mdir)])
    ident_file = work / name / "identifiability.json"
    if not ident_file.is_file():
        _cli(["identifiability", str(mdir), "--objectives", "kkt,kkt-init,loo,path", "--threads", str(threads),
              "--out", str(ident_file)])
    ident = json.loads(ident_file.read_text())
    weights_settings, init_settings = settings
    runs = {label: _attack(mdir, work / name / label, f, threads) for label, f in REFERENCE_RUNS
            if label in weights_settings}
    init_runs = {}
    for setting in init_settings:
        flags = ["--known-init", "seed"] + dict(REFERENCE_RUNS).get(setting, [])
        init_runs[setting] = _attack(mdir, work / name / ("kkt-init" if setting == "default" else f"kkt-init-{setting}"),
                                     flags, threads)
    if not runs or not init_runs:
        return None  # a call that trains and diagnoses only, or runs some attacks of a row split over calls
    pick, init_pick = _attacker_pick(runs), _attacker_pick(init_runs)
    pools = {"weights_only": _pool(work / name, runs, "pool-weights-only", threads),
             "known_init": _pool(work / name, init_runs, "pool-known-init", threads,
                                 folder=lambda s: "kkt-init" if s == "default" else f"kkt-init-{s}")}
    init = {"runs": init_runs, "attacker_pick": init_pick, **init_runs[init_pick]}
    meta = json.loads((mdir / "model.json").read_text())
    metrics = meta["metrics"]
    return {"row": name, "recipe": what, "train_command": "datarecon train " + " ".join(train_flags),
            "train_wall_s": metrics.get("wall_time_s"),
            "train_metrics": {k: metrics.get(k) for k in ("train_loss", "train_accuracy", "normalised_margin",
                                                          "kkt_regime_score", "epochs_done", "margin_ascent_steps",
                                                          "margin_ascent_stop_reason",
                                                          "normalised_margin_before_ascent")},
            "ascent_curve": metrics.get("margin_ascent_curve"),
            "identifiability": {k: {"sets": {s: r["relative_residual"] for s, r in v.get("sets", {}).items()},
                                    "identifies": v.get("identifies"), "gap": v.get("gap")}
                                for k, v in ident["objectives"].items()},
            "weights_only": {"runs": runs, "attacker_pick": pick, **runs[pick]}, "known_init": init, "pools": pools,
            "machine": machine(), "date": time.strftime("%Y-%m-%d")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--work", type=Path, default=Path("runs/regimes"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--const-epochs", type=int, default=30000)
    ap.add_argument("--wd-epochs", type=int, default=20000)
    ap.add_argument("--weights-settings", default="kkt-ref-a,kkt-ref-b",
                    help="weights-only runs: reference setting names ('' with --init-settings '': train and "
                         "diagnose only)")
    ap.add_argument("--init-settings", default="kkt-ref-a,kkt-ref-b",
                    help="θ_init-known runs: 'default' (the attack's defaults) and/or reference setting names")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "identifiability_regimes.json")
    args = ap.parse_args(argv)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    for name in args.rows.split(","):
        if name not in ROWS:
            ap.error(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
        settings = (tuple(v for v in args.weights_settings.split(",") if v),
                    tuple(v for v in args.init_settings.split(",") if v))
        row = run_row(name, args.work, threads=args.threads, const_epochs=args.const_epochs, wd_epochs=args.wd_epochs,
                      settings=settings)
        if row is None:
            print(f"{name}: trained and diagnosed", flush=True)
            continue
        w, k = row["weights_only"], row["known_init"]
        print(f"{name}: kkt gap {row['identifiability']['kkt']['gap']:+.3f}, weights only {w['count']} "
              f"(held-out {w['heldout']}), θ_init known {k['count']} (held-out {k['heldout']})", flush=True)
        rows = [r for r in rows if r["row"] != name] + [row]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
