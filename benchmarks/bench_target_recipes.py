"""Which target-training recipe gives targets that the KKT attack reconstructs? (issue 12)

Trains the Haim et al. (2022) target — bias-free D-w-w-1 ReLU MLP, first layer N(0,1)·1e-4, logistic
loss, float64, full-batch GD — with each recipe through the public API
(:func:`datarecon.training.target.train_target`), records the KKT-regime score, the normalised margin
(and its curve from the training history) and the per-layer share of ‖θ‖², then attacks every target
with the KKT attack at the reference's CIFAR settings (m = 2n, float32, attacker side only) and
counts training images reconstructed at SSIM > 0.4 (Haim protocol) beside the held-out null
(held-out images used as candidates). Recipes (``--recipes``):

* ``constant``: lr 0.01 constant (the reference's schedule; it trains 10⁶ epochs).
* ``loss-normalised``: lr 0.01/L capped at 1e9·lr (the haim2022 preset's recipe).
* ``uncapped``: lr·∇log L in the log domain (Lyu & Li's loss-based step, no cap).
* ``ascent``: ``loss-normalised``, then margin ascent on the sphere (:mod:`datarecon.training.margin`).
* ``ascent-unit``: as ``ascent``, then θ rescaled to ‖θ‖ = 1 before the attack (a global rescaling
  leaves the classifier unchanged; it changes the scale the attack's step sizes meet).

Usage::

    python benchmarks/bench_target_recipes.py --quick                 # seconds, digits-sized
    python benchmarks/bench_target_recipes.py --dataset cifar10 --n-per-side 50 --hidden 1000 \\
        --epochs 6000 --ascent-steps 3000 --attack-steps 3000        # the medium rung (~1 h on 2 cores)

Writes benchmarks/results/target_recipes[_quick].json. Exits non-zero on any error.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from _common import results_path, write_results

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.loop import ATTACK_LOOP

RECIPES = ("constant", "loss-normalised", "uncapped", "ascent", "ascent-unit")
#: the reference's two best CIFAR runs (x0 scale, lr_x, λ_min, α), as in the haim2022 preset
RUNS = ((8.86e-4, 0.555, 0.498, 19.1), (4.47e-3, 0.346, 0.494, 21.7))


def recipe_fields(recipe: str, *, epochs: int, ascent_steps: int) -> dict:
    base = {"lr": 0.01, "epochs": epochs, "schedule": "loss-normalised", "max_lr_factor": 1e9}
    if recipe == "constant":
        return {**base, "schedule": "constant"}
    if recipe == "uncapped":
        return {**base, "max_lr_factor": None}
    if recipe in ("ascent", "ascent-unit"):
        return {**base, "margin_ascent": {"steps": ascent_steps}}
    return base


def layer_shares(model: torch.nn.Module) -> list[float]:
    sq = [float((p.detach().double() ** 2).sum()) for p in model.parameters()]
    return [s / sum(sq) for s in sq]


def attack_and_count(model_dir: Path, *, unit_norm: bool, steps: int, runs: int, data_dir: str | None) -> dict:
    from datarecon.attacks.kkt import KKTAttack, KKTConfig
    from datarecon.attacks.runner import run_attack
    from datarecon.evaluation.protocol import haim_protocol
    from datarecon.experiments.reconstruct import build_run, prepare
    from datarecon.experiments.pipeline.common import load_model_and_task

    _, task, norm = load_model_and_task(model_dir, data_dir=data_dir)
    n = len(task.train)
    cands, per_run = [], []
    for j, (s, lr_x, lam_min, alpha) in enumerate(RUNS[:runs]):
        run = build_run({"model": str(model_dir), "attack": {"method": "kkt", "dtype": "float32"},
                         "init": {"name": "gaussian", "scale": s}, "candidates": 2 * n, "seed": j, "device": "cpu"})
        setup = prepare(run, data_dir=data_dir)
        target = setup.target
        if unit_norm:
            r = math.sqrt(sum(float((p.double() ** 2).sum()) for p in target.params.values()))
            for k in list(target.params):  # new tensors: params may share storage with the module's
                target.params[k] = target.params[k] / r
        cfg = KKTConfig(steps=steps, lr_x=lr_x, lambda_min=lam_min, alpha=alpha, lr_lambda=1e-4, dtype="float32")
        t0 = time.perf_counter()
        rec = run_attack(KKTAttack(cfg), AttackSetup(target, setup.prior, setup.x0, setup.generator),
                         loop=replace(ATTACK_LOOP, progress=False))
        hist = rec.history
        per_run.append({"run": j, "status": rec.status, "wall_s": time.perf_counter() - t0,
                        "rel_residual": [(h.get("step"), h.get("rel_residual")) for h in hist[:: max(1, len(hist) // 8)]]
                        + ([(hist[-1].get("step"), hist[-1].get("rel_residual"))] if hist else [])})
        cands.append(rec.x.detach().cpu())
    train = task.train.x.float()
    real = haim_protocol(norm.to_display(torch.cat(cands).double()).float(), train)
    held = haim_protocol(task.heldout.x.float(), train)  # held-out images as "reconstructions"
    return {"count_ssim_0.4": int(real.counts[0.4]), "heldout_null_0.4": int(held.counts[0.4]),
            "mean_best_ssim": float(torch.nanmean(real.ssim)), "n": n, "runs": per_run}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny run (MNIST, n = 20, D-100-100-1, seconds)")
    ap.add_argument("--dataset", default="cifar10", choices=("mnist", "cifar10"))
    ap.add_argument("--n-per-side", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None, help="GD epochs of every recipe")
    ap.add_argument("--ascent-steps", type=int, default=None)
    ap.add_argument("--attack-steps", type=int, default=None)
    ap.add_argument("--attack-runs", type=int, default=1, choices=(1, 2), help="reference runs per target")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        from datarecon.training.target import build_train_config, train_target

        torch.set_num_threads(args.threads)
        dataset = "mnist" if args.quick else args.dataset
        n_side = args.n_per_side or (10 if args.quick else 50)
        hidden = args.hidden or (100 if args.quick else 1000)
        epochs = args.epochs or (300 if args.quick else 6000)
        ascent = args.ascent_steps or (100 if args.quick else 3000)
        steps = args.attack_steps or (200 if args.quick else 3000)
        recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
        unknown = sorted(set(recipes) - set(RECIPES))
        if unknown:
            raise SystemExit(f"error: unknown recipes {unknown}; valid: {', '.join(RECIPES)}")
        task = {"mnist": "odd-even", "cifar10": "vehicles-animals"}[dataset]
        results: dict = {}
        out = results_path("target_recipes", quick=args.quick, out=args.out)
        setup = {"dataset": dataset, "task": task, "n": 2 * n_side, "hidden": hidden, "epochs": epochs,
                 "ascent_steps": ascent, "attack_steps": steps, "attack_runs": args.attack_runs,
                 "threads": args.threads}
        with tempfile.TemporaryDirectory() as tmp:
            for recipe in recipes:
                fields = {"data": {"dataset": dataset, "task": task, "n_per_class": n_side, "selection": "first",
                                   "normalisation": "unit-minus-mean", "n_partition_per_class": 0,
                                   "n_heldout_per_class": n_side},
                          "arch": {"name": "mlp", "hidden": [hidden, hidden], "bias": False, "init_scale": 1e-4},
                          "loss": "logistic", "dtype": "float64", "kkt_score": True, "checkpoint_every": 0,
                          "log_every": max(1, (epochs + ascent) // 40),
                          **recipe_fields(recipe, epochs=epochs, ascent_steps=ascent)}
                cfg = build_train_config(fields)
                t0 = time.perf_counter()
                res = train_target(cfg, out=Path(tmp) / recipe, data_dir=args.data_dir, progress=False)
                train_s = time.perf_counter() - t0
                m = res.metrics
                row = {"recipe": recipe, "train_s": train_s, "status": m.get("status"),
                       "margin_ascent_status": m.get("margin_ascent_status"),
                       "train_accuracy": m.get("train_accuracy"), "heldout_accuracy": m.get("heldout_accuracy"),
                       "train_loss": m.get("train_loss"), "weight_norm": m.get("weight_norm"),
                       "normalised_margin": m.get("normalised_margin"),
                       "normalised_margin_before_ascent": m.get("normalised_margin_before_ascent"),
                       "kkt_regime_score": m.get("kkt_regime_score"), "layer_shares": layer_shares(res.model),
                       "margin_curve": [(r.get("step"), r.get("normalised_margin"), r.get("stage", "gd"))
                                        for r in res.fit.history] if res.fit else []}
                print(f"[{recipe}] trained in {train_s:.0f} s: status {row['status']}, loss {row['train_loss']:.3g}, "
                      f"norm {row['weight_norm']:.4g}, normalised margin {row['normalised_margin']:.4g}, "
                      f"KKT score {row['kkt_regime_score']:.4f}, layer shares "
                      f"{[round(s, 3) for s in row['layer_shares']]}", flush=True)
                if row["train_accuracy"] == 1.0 and math.isfinite(row["weight_norm"] or math.nan):
                    row["attack"] = attack_and_count(Path(tmp) / recipe, unit_norm=recipe == "ascent-unit",
                                                     steps=steps, runs=args.attack_runs, data_dir=args.data_dir)
                    a = row["attack"]
                    print(f"[{recipe}] attack: {a['count_ssim_0.4']} of {a['n']} at SSIM > 0.4 "
                          f"(held-out null {a['heldout_null_0.4']}), mean best SSIM {a['mean_best_ssim']:.3f}, "
                          f"final rel. residual {a['runs'][-1]['rel_residual'][-1][1]}", flush=True)
                else:
                    print(f"[{recipe}] not attacked: training accuracy {row['train_accuracy']}", flush=True)
                results[recipe] = row
                # written after every recipe: a run stopped later keeps what it measured
                write_results(out, benchmark="bench_target_recipes", quick=args.quick, setup=setup, results=results)
        print(f"wrote {out}")
        return 0
    except Exception as exc:  # noqa: BLE001 — a benchmark reports any failure on one line
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
