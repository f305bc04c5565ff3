"""Where dynamics matching's objective puts the training set among look-alikes (a diagnosis; it reads the truth).

For a fine-tuned model directory, the cosine between the replayed and the real parameter change
(1 − the attack's loss) of candidate sets planted around the training images, each in the label
order the attacker's balanced prior uses:

* the training images (1 by construction: the replay is the training), with Gaussian noise of
  std 0.02 and 0.05 (clamped to [0, 1]), and blurred (3×3 box filter);
* their projections on the top-k principal components of the public images the start was pretrained
  on (k = 64 … 1024; the share of the public images' variance kept, and SimuDy's mean best SSIM of
  the projection against the truth, beside each);
* held-out images of the same labels, and uniform noise.

A set of look-alikes that scores near 1 is one the attack cannot tell from the truth; images that
score high while looking like nothing are where a search from noise ends. Ground truth enters
here on purpose: this measures the objective, it is not an attack.

    python benchmarks/dynamics_landscape.py WORK/resnet8-ft1/model --pretrained WORK/pre-resnet8 \\
        --out benchmarks/results/dynamics_landscape.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

import torch

from bench_dynamics import greedy_best_ssims
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.experiments.reconstruct import build_run, make_attack, prepare
from datarecon.models.checkpoint import load_model_dir

PCA_KS = (64, 128, 256, 512, 1024)
NOISE = (0.02, 0.05)


def planted_sets(train: torch.Tensor, heldout: torch.Tensor, held_y: torch.Tensor, labels: torch.Tensor,
                 public: torch.Tensor, *, seed: int = 0) -> dict[str, tuple[torch.Tensor, dict]]:
    """name → (images in [0, 1] (n, C, H, W), extra record) of every planted set."""
    g = torch.Generator().manual_seed(seed)
    sets = {"training images": (train, {})}
    for s in NOISE:
        noisy = (train + s * torch.randn(train.shape, generator=g)).clamp(0, 1)
        sets[f"training images + noise {s}"] = (noisy, {})
    blurred = torch.nn.functional.avg_pool2d(train, 3, 1, 1, count_include_pad=False)
    sets["training images blurred (3x3)"] = (blurred, {})
    flat = public.reshape(public.shape[0], -1)
    mean = flat.mean(0)
    _, sv, vh = torch.linalg.svd(flat - mean, full_matrices=False)
    for k in PCA_KS:
        basis = vh[:k].T
        proj = (mean + ((train.reshape(train.shape[0], -1) - mean) @ basis) @ basis.T).reshape(train.shape)
        kept = float((sv[:k] ** 2).sum() / (sv ** 2).sum())
        ssim = float(greedy_best_ssims(proj.clamp(0, 1), train).mean())
        sets[f"projection on {k} public components"] = (proj, {"variance_kept": kept, "mean_best_ssim": ssim})
    idx = torch.cat([torch.nonzero(held_y == c).reshape(-1)[:int((labels == c).sum())] for c in labels.unique()])
    sets["held-out images, same labels"] = (heldout[idx], {})
    sets["uniform noise"] = (torch.rand(train.shape, generator=g), {})
    return sets


def landscape(model_dir: Path, pretrained: Path, *, epochs: int | None = None) -> list[dict]:
    attack_fields = {"method": "dynamics", "steps": 1, **({"epochs": epochs} if epochs else {})}
    run = build_run({"model": str(model_dir), "candidates": None, "init": {"name": "uniform"},
                     "knowledge": {"known_init": "pretrained", "recipe": {"source": "model"}},
                     "attack": attack_fields})
    bundle = load_model_dir(model_dir)
    task = load_task(DataSpec.model_validate(bundle.data))
    run = run.model_copy(update={"candidates": len(task.train)})
    setup = prepare(run)
    attack = make_attack("dynamics", run.attack)
    state = attack.init_state(setup.target, setup.prior, x0=setup.x0, generator=setup.generator)
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    order = torch.argsort(task.train.y, stable=True)  # the balanced prior's label order
    labels = setup.prior.labels
    if not torch.equal(task.train.y[order].to(labels.dtype), labels):
        raise SystemExit("error: the training labels are not the balanced prior's; this diagnosis plants the truth in "
                         "the prior's label order")
    public = load_task(DataSpec.model_validate(load_model_dir(pretrained).data)).train.x
    rows = []
    for name, (images, extra) in planted_sets(task.train.x[order], task.heldout.x, task.heldout.y, labels,
                                              public).items():
        terms = attack.matching_terms(setup.target, setup.prior, norm.to_model(images).float(),
                                      float(setup.prior.recipe.lr), int(state["order_seed"]), differentiable=False)
        row = {"set": name, "cosine": float(terms["cosine"]), "update_norm_ratio": float(terms["update_norm_ratio"]),
               **extra}
        print(f"{name:40s} cosine {row['cosine']:+.4f}" + "".join(f"  {k} {v:.3f}" for k, v in extra.items()),
              flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--pretrained", type=Path, required=True, help="the public pretrained model directory")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, help="simulate only this many epochs (a truncated replay, matched by "
                    "direction)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = landscape(args.model, args.pretrained, epochs=args.epochs)
    if args.out:
        args.out.write_text(json.dumps({"date": str(date.today()), "machine": platform.platform(),
                                        "torch": torch.__version__, "model": str(args.model),
                                        "simulated_epochs": args.epochs,
                                        "command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
