"""What are the KKT attack's candidates that are not training images? Ground truth enters here, as in evaluation.

For one attack run (or a pool) on a model directory, every candidate is compared with the training images, the
means of two training images of its class, held-out images and partition images (SSIM after the Haim protocol's
min-max rescale, display space), and fitted as a combination of one and of two training images (least squares in
model input space). Each candidate is labelled by what it is most like:

* ``training``: its best training image beats every other reference by SSIM, above ``--threshold``;
* ``duplicate``: the same, but another candidate matches that training image better (the count sees one);
* ``pair-mean``: a mean of two training images fits it better than any single training image (SSIM), above the
  threshold;
* ``held-out-like`` / ``partition-like``: an image the model never saw fits it better than every training image;
* ``unlike-any``: no reference reaches the threshold (noise-like, or a blend of more than two images).

Then the identifiability diagnostic's view (the weights-only KKT objective with optimal multipliers; lower fits
better): the relative residual of the training set, of the candidates, of the candidates labelled ``training``
alone and of the others alone, and of the training set with the others added. If the candidates fit better than
the truth, the attack's minimisers are not the data by the objective itself; if adding the others to the
training set does not lower its residual, they only duplicate what the training images already explain.

The combination fits have a null: held-out images (never trained on) fitted by one and by two training images.

Last, the attacker-side signals the run recorded (λ and the scores of ``candidates.safetensors``): how well each
one separates the ``training`` candidates from the others (AUC), i.e. whether an attacker-side filter can drop
the non-training candidates.

    python benchmarks/candidate_anatomy.py --run RUN --threads 1 --out benchmarks/results/candidate_anatomy.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from _common import RESULTS_DIR, machine

from datarecon.data import DataSpec, load_task
from datarecon.evaluation.identifiability import fit_objective, gradient_features
from datarecon.evaluation.privacy import roc_auc
from datarecon.evaluation.similarity import minmax_rescale, ssim_matrix
from datarecon.models.checkpoint import load_model_dir, read_model_meta
from datarecon.utils.io import load_tensors, read_json

LABELS = ("training", "duplicate", "pair-mean", "held-out-like", "partition-like", "unlike-any")


def _pair_means(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every within-class mean of two training images: (means, label, (i, j) indices)."""
    means, labels, pairs = [], [], []
    for lab in torch.unique(y):
        idx = torch.nonzero(y == lab)[:, 0]
        i, j = torch.triu_indices(idx.numel(), idx.numel(), offset=1)
        means.append(0.5 * (x[idx[i]] + x[idx[j]]))
        labels.append(torch.full((i.numel(),), float(lab)))
        pairs.append(torch.stack([idx[i], idx[j]], 1))
    return torch.cat(means), torch.cat(labels), torch.cat(pairs)


def _combination_fits(c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative L2 residual of the best least-squares fit of each candidate by one training image (a·x_i) and by
    two (a·x_i + b·x_j), over all images and pairs (model input space)."""
    cf, xf = c.reshape(c.shape[0], -1).double(), x.reshape(x.shape[0], -1).double()
    cc = (cf * cf).sum(1)
    g = xf @ xf.T
    p = cf @ xf.T  # (m, n)
    d = torch.diag(g)
    one = 1 - (p.clamp_min(0) ** 2 / d).max(1).values / cc
    n = xf.shape[0]
    i, j = torch.triu_indices(n, n, offset=1)
    det = d[i] * d[j] - g[i, j] ** 2
    best = torch.full((cf.shape[0],), float("inf"), dtype=torch.float64)
    for lo in range(0, i.numel(), 2048):
        a, b = i[lo:lo + 2048], j[lo:lo + 2048]
        pa, pb = p[:, a], p[:, b]
        # explained energy of the 2-D projection: [pa pb] G⁻¹ [pa pb]ᵀ
        expl = (d[b] * pa ** 2 - 2 * g[a, b] * pa * pb + d[a] * pb ** 2) / det[lo:lo + 2048].clamp_min(1e-300)
        best = torch.minimum(best, (1 - expl / cc[:, None]).min(1).values)
    return one, best


def _kkt_residual(bundle, x: torch.Tensor, y: torch.Tensor) -> float:
    """The weights-only KKT objective's relative residual of the set (x, y) with its optimal multipliers."""
    star = {k: v.detach().double() for k, v in bundle.params.items()}
    feats = gradient_features(bundle.model, star, x.double(), y.double(), formulation="binary")
    return fit_objective([feats], star).relative_residual


def _labels(s: dict[str, torch.Tensor], threshold: float) -> list[str]:
    """Each candidate's label (module docstring) from its best SSIM to each reference set."""
    best_train, which = s["training"].max(1)
    out = []
    for k in range(best_train.numel()):
        refs = {"training": float(best_train[k]), "pair-mean": float(s["pair-mean"][k].max()),
                "held-out-like": float(s["held-out"][k].max()), "partition-like": float(s["partition"][k].max())}
        top = max(refs, key=refs.get)
        if refs[top] <= threshold:
            out.append("unlike-any")
        elif top == "training":
            rivals = torch.nonzero(which == which[k])[:, 0]
            better = [int(r) for r in rivals if float(best_train[r]) > float(best_train[k])]
            out.append("duplicate" if better else "training")
        else:
            out.append(top)
    return out


def anatomy(run: Path, *, threshold: float) -> dict:
    cands = load_tensors(run / "candidates.safetensors")
    rj = read_json(run / "run.json")
    model_dir = Path(rj["model_dir"]) if Path(rj["model_dir"]).is_absolute() else run / rj["model_dir"]
    meta = read_model_meta(model_dir)
    bundle = load_model_dir(model_dir, dtype=torch.float64)
    task = load_task(DataSpec.model_validate(meta["data"]))
    norm = task.normalisation
    c_model = cands["x"].double()
    c_disp = minmax_rescale(norm.to_display(c_model).float())
    train, heldout, part = task.train.x, task.heldout.x, task.partition.x
    means, _, pairs = _pair_means(train, task.train.y)
    t0 = time.perf_counter()
    s = {"training": ssim_matrix(c_disp, train), "pair-mean": ssim_matrix(c_disp, means),
         "held-out": ssim_matrix(c_disp, heldout), "partition": ssim_matrix(c_disp, part)}
    ssim_s = time.perf_counter() - t0
    labels = _labels(s, threshold)
    one, two = _combination_fits(c_model, norm.to_model(train).double())
    lab_y = cands["labels"].double()
    is_train = torch.tensor([lab == "training" for lab in labels])
    per_label = {}
    for lab in LABELS:
        sel = torch.tensor([v == lab for v in labels])
        if not bool(sel.any()):
            per_label[lab] = {"count": 0}
            continue
        per_label[lab] = {
            "count": int(sel.sum()),
            "mean_best_ssim": {k: float(v[sel].max(1).values.mean()) for k, v in s.items()},
            "mean_fit_one_image": float(one[sel].mean()), "mean_fit_two_images": float(two[sel].mean()),
            "mean_multiplier": float(cands["multipliers"].double()[sel].mean()),
            "mean_norm": float(c_model[sel].flatten(1).norm(dim=1).mean())}
    xt = norm.to_model(train).double()
    yt = task.train.y.double()
    diag = {"training set": _kkt_residual(bundle, xt, yt), "candidates": _kkt_residual(bundle, c_model, lab_y),
            "candidates labelled training": _kkt_residual(bundle, c_model[is_train], lab_y[is_train])
            if bool(is_train.any()) else None,
            "the other candidates": _kkt_residual(bundle, c_model[~is_train], lab_y[~is_train])
            if bool((~is_train).any()) else None,
            "training set + the other candidates": _kkt_residual(
                bundle, torch.cat([xt, c_model[~is_train]]), torch.cat([yt, lab_y[~is_train]]))}
    signals = {}
    for name, v in cands.items():
        if name == "multipliers" or name.startswith("score_"):
            vals = v.double().reshape(-1)
            if vals.numel() == is_train.numel() and 0 < int(is_train.sum()) < is_train.numel():
                signals[name] = float(roc_auc(is_train.numpy().astype(int), vals.numpy()))
    covered = torch.unique(s["training"].max(1).indices[is_train]).numel()
    # the null of the combination fits: held-out images (never trained on) fitted by one and by two training images
    h_one, h_two = _combination_fits(norm.to_model(heldout).double(), norm.to_model(train).double())
    return {"run": str(run), "model_dir": str(model_dir), "m": int(c_model.shape[0]), "threshold": threshold,
            "labels": {lab: labels.count(lab) for lab in LABELS}, "per_label": per_label,
            "distinct_training_images_matched": int(covered),
            "null_heldout_fits": {"mean_fit_one_image": float(h_one.mean()), "mean_fit_two_images": float(h_two.mean())}, "diagnostic_relative_residual": diag,
            "attacker_signals_auc_training_vs_rest": signals, "ssim_wall_s": ssim_s,
            "pairs": int(pairs.shape[0])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, action="append", required=True, help="run or pool directory (repeatable)")
    ap.add_argument("--threshold", type=float, default=0.4, help="SSIM a reference must exceed to name a candidate")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "candidate_anatomy.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [anatomy(r, threshold=args.threshold) for r in args.run]
    for row in rows:
        print(f"{row['run']}: {row['labels']}; distinct training images {row['distinct_training_images_matched']}; "
              f"diagnostic {json.dumps({k: (round(v, 4) if v is not None else None) for k, v in row['diagnostic_relative_residual'].items()})}",
              flush=True)
    args.out.write_text(json.dumps({"rows": rows, "command": " ".join(sys.argv), "machine": machine(),
                                    "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
