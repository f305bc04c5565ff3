"""float32 vs float64 KKT attack on a small real target: reconstructions, residual and time per step.

Trains one target (default: the demo's target — scikit-learn 8x8 digits odd/even, 20 per side,
bias-free 64-200-1 ReLU MLP, logistic loss, float64 GD), then runs the KKT attack twice from the
same x₀ and λ₀ (same seeds, same settings), once with ``dtype=float32`` and once with
``dtype=float64``, and reports for each

* the number of training images reconstructed with SSIM > 0.4 (``datarecon.evaluation.haim_protocol``
  on display-space images, greedy assignment; also > 0.3 / 0.5 where the protocol reports them),
* the relative stationarity residual ‖θ* − g‖²/‖θ*‖² reached,
* wall time of the whole attack, and the time of one attack step measured *interleaved*
  (float32 step, float64 step, float32 step, ...; median) so that machine noise hits both alike.

Usage::

    python benchmarks/bench_dtype.py            # → benchmarks/results/dtype.json
    python benchmarks/bench_dtype.py --quick    # → benchmarks/results/dtype_quick.json

Exits non-zero on any error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from _common import results_path, write_results

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.loop import ATTACK_LOOP


def train(args, out: Path):
    from datarecon.data import DataSpec
    from datarecon.training.target import (
        ArchConfig,
        StopConfig,
        TrainConfig,
        train_target,
    )

    data = DataSpec(dataset=args.dataset, task="odd-even", n_per_class=args.n_per_side, seed=args.seed)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    cfg = TrainConfig(data=data, arch=ArchConfig(name="mlp", hidden=hidden, bias=False, init_scale=1e-3),
                      loss="logistic", optimizer="gd", lr=args.train_lr, epochs=args.train_epochs, dtype="float64",
                      seed=args.seed, stop=StopConfig(), log_every=max(1, args.train_epochs))
    return train_target(cfg, data_dir=args.data_dir, out=out, overwrite=True, progress=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dataset", default="digits", choices=("digits", "mnist"))
    ap.add_argument("--n-per-side", type=int, default=20)
    ap.add_argument("--hidden", default="200", help="comma-separated hidden widths (bias-free MLP)")
    ap.add_argument("--train-epochs", type=int, default=3000)
    ap.add_argument("--train-lr", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=None, help="attack steps (default 2000, quick 200)")
    ap.add_argument("--lr-x", type=float, default=0.01)
    ap.add_argument("--lr-lambda", type=float, default=0.01)
    ap.add_argument("--lambda-min", type=float, default=0.2)
    ap.add_argument("--alpha", type=float, default=20.0)
    ap.add_argument("--init-scale", type=float, default=0.05)
    ap.add_argument("--timing-repeats", type=int, default=30, help="interleaved timed steps per dtype")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        torch.set_num_threads(args.threads)
        steps = args.steps or (200 if args.quick else 2000)
        if args.quick:
            args.train_epochs = min(args.train_epochs, 1000)
        out = results_path("dtype", quick=args.quick, out=args.out)
        from datarecon.attacks.base import AttackerPrior, Target
        from datarecon.attacks.init import CandidateSpec, make_init
        from datarecon.attacks.kkt import KKTAttack, KKTConfig
        from datarecon.attacks.runner import run_attack
        from datarecon.data.selection import load_task
        from datarecon.evaluation.protocol import haim_protocol
        from datarecon.models.checkpoint import load_model_dir

        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            tr = train(args, Path(tmp) / "model")
            train_s = time.perf_counter() - t0
            bundle = load_model_dir(Path(tmp) / "model")
            target = Target.from_model_dir(Path(tmp) / "model")
        from datarecon.data import DataSpec

        data = load_task(DataSpec(**bundle.data), data_dir=args.data_dir)
        norm = data.normalisation
        if not torch.allclose(norm.mean.double(), bundle.input_mean.double()):
            raise RuntimeError("training mean differs from the model directory's input_mean")
        train_display = data.train.x.double()
        n = train_display.shape[0]
        m = 2 * n
        lo, hi = norm.model_range()
        prior = AttackerPrior.balanced(m=m, num_outputs=1, input_shape=tuple(target.input_shape), lower=lo, upper=hi)
        x0 = make_init("gaussian", CandidateSpec(m=m, input_shape=tuple(target.input_shape), mean=norm.mean.double(),
                                                 dtype=torch.float64, device=torch.device("cpu")),
                       generator=torch.Generator().manual_seed(args.seed), scale=args.init_scale)
        print(f"target: {args.dataset} odd-even n={n}, hidden {args.hidden}, train acc "
              f"{tr.metrics.get('train_accuracy', tr.metrics.get('train_acc'))}, trained in {train_s:.1f} s; "
              f"attack m={m}, {steps} steps", flush=True)

        def make(dtype: str) -> KKTAttack:
            return KKTAttack(KKTConfig(steps=steps, dtype=dtype, lr_x=args.lr_x, lr_lambda=args.lr_lambda,
                                       lambda_min=args.lambda_min, alpha=args.alpha))

        results = {}
        for dtype in ("float32", "float64"):
            attack = make(dtype)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rec = run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(args.seed)),
                                 loop=replace(ATTACK_LOOP, log_every=max(1, steps // 20), progress=False))
            wall = time.perf_counter() - t0
            cand_display = norm.to_display(rec.x.double())
            haim = haim_protocol(cand_display, train_display)
            final = rec.history[-1] if rec.history else {}
            results[dtype] = {
                "status": rec.status, "steps_done": rec.steps_done, "wall_s": wall,
                "good_ssim_gt_0.4": int(haim.counts.get(0.4, -1)),
                "counts": {str(k): int(v) for k, v in haim.counts.items()},
                "median_ssim": float(torch.nanmedian(haim.ssim)),
                "rel_residual_final": final.get("rel_residual"),
                "rel_residual_curve": [(r.get("step"), r.get("rel_residual")) for r in rec.history],
            }
            print(f"{dtype}: {rec.status}, {rec.steps_done} steps in {wall:.1f} s; SSIM>0.4: "
                  f"{results[dtype]['good_ssim_gt_0.4']}/{n} (counts {results[dtype]['counts']}); "
                  f"rel. residual {final.get('rel_residual')}", flush=True)

        # interleaved per-step timing from the same x0 (states advance; the cost does not depend on them)
        attacks = {d: make(d) for d in ("float32", "float64")}
        states = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for d, a in attacks.items():
                states[d] = a.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(args.seed))
                a.step(target, prior, states[d], 0)  # warm-up
        times: dict[str, list[float]] = {d: [] for d in attacks}
        for i in range(args.timing_repeats):
            for d, a in attacks.items():
                t0 = time.perf_counter()
                a.step(target, prior, states[d], i + 1)
                times[d].append(time.perf_counter() - t0)
        timing = {d: {"median_s": statistics.median(t), "min_s": min(t), "repeats": len(t)} for d, t in times.items()}
        ratio = timing["float64"]["median_s"] / timing["float32"]["median_s"]
        print(f"step time (interleaved, median of {args.timing_repeats}): float32 {timing['float32']['median_s']*1e3:.2f} ms,"
              f" float64 {timing['float64']['median_s']*1e3:.2f} ms, float64/float32 = {ratio:.2f}x")
        write_results(out, benchmark="dtype", quick=args.quick,
                      target={"dataset": args.dataset, "task": "odd-even", "n": n, "hidden": args.hidden,
                              "train_epochs": args.train_epochs, "train_lr": args.train_lr,
                              "train_metrics": {k: v for k, v in tr.metrics.items() if isinstance(v, (int, float))}},
                      attack={"m": m, "steps": steps, "lr_x": args.lr_x, "lr_lambda": args.lr_lambda,
                              "lambda_min": args.lambda_min, "alpha": args.alpha,
                              "init": "gaussian", "init_scale": args.init_scale, "seed": args.seed},
                      results=results, step_timing=timing, float64_over_float32=ratio)
    except Exception as exc:  # noqa: BLE001 - one-line reason, non-zero exit
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
