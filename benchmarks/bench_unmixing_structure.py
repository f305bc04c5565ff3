"""What the weights of a trained MLP say about its training images, measured with ground truth
(issue 24: why the KKT candidates stay mixtures). Evaluation-side analysis: it reads the training
images of the target's data spec and θ_init (rebuilt from the recorded seed).

For a bias-free D-h-h-1 ReLU MLP (the haim2022 targets) it measures:

1. **The KKT objective at the ground truth.** With the n training images as candidates and the best
   non-negative λ (NNLS on the Gram matrix of the per-sample gradients, block by block), the relative
   residual ‖goal − Σ λ_i y_i ∇_θΦ(θ*; x_i)‖² / ‖goal‖², goal = θ* or θ* − θ_init, for all parameters
   and for the first layer alone; beside it the final relative residual of attack runs (``--runs``).
   If the truth fits worse than the attack's candidates, the objective's minima are not the training
   set: no optimiser of that objective can unmix.
2. **The structure of the first layer's change.** W1 − W1_init = A X exactly (relative residual of the
   least-squares A); the sign structure (mass of s_j·y_i·A_ji < 0, s the units' downstream signs); the
   energy of A's columns on units inactive on their image; cos(A_i, a(x_i)) with a(x) = 1[W1x > 0] ⊙
   W2ᵀ(1[W2 h1 > 0] ⊙ w3) the KKT prediction at θ*.
3. **Tests of single candidates built on that structure,** as AUC of training images against held-out
   images projected onto the training span (the candidates an attack produces lie there): the
   smallest singular value of the column basis restricted to the inactive units, and the LP value
   min{mass of a non-negative column on the inactive units}.

    python benchmarks/bench_unmixing_structure.py --model runs/haim-medium-cifar \\
        --runs runs/unmix/cifar/plain-seed0 --out benchmarks/results/unmixing_structure_cifar.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import machine


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    from datarecon.evaluation.privacy import roc_auc

    return float(roc_auc(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]))


def load(model_dir: Path, heldout: int):
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import load_model_dir
    from datarecon.models.spec import build_model

    b = load_model_dir(model_dir, dtype=torch.float64)
    spec = dict(b.data)
    task = load_task(DataSpec(**spec))
    norm = task.normalisation
    xtr = norm.to_model(task.train.x).double().flatten(1)
    xho = norm.to_model(task.heldout.x).double().flatten(1)[:heldout]
    init = build_model(b.arch, generator=torch.Generator().manual_seed(b.meta["seed"]), dtype=torch.float64)
    return b, task, xtr, xho, {k: v.detach() for k, v in init.named_parameters()}


def features(params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    w1, w2, w3 = params[0], params[1], params[2][0]
    z1 = x @ w1.T
    h1 = torch.relu(z1)
    m2 = ((h1 @ w2.T) > 0).double()
    c = m2 * w3
    a = (z1 > 0).double() * (c @ w2)
    return a * y[:, None], c * y[:, None], h1, torch.relu(h1 @ w2.T) * y[:, None]


def ground_truth_residual(params, goal, x, y) -> dict[str, float]:
    """NNLS-optimal λ for the true images: relative residual, all blocks and first layer alone."""
    from scipy.optimize import nnls

    a, c, h1, h2 = features(params, x, y)
    blocks = {"W1": ((a @ a.T) * (x @ x.T), ((a @ goal[0]) * x).sum(1), (goal[0] ** 2).sum()),
              "W2": ((c @ c.T) * (h1 @ h1.T), ((c @ goal[1]) * h1).sum(1), (goal[1] ** 2).sum()),
              "w3": (h2 @ h2.T, h2 @ goal[2][0], (goal[2] ** 2).sum())}
    out = {}
    for name, use in (("all", ("W1", "W2", "w3")), ("first_layer", ("W1",))):
        g = sum(blocks[k][0] for k in use)
        r = sum(blocks[k][1] for k in use)
        t = sum(blocks[k][2] for k in use)
        # NNLS on the Cholesky factor (G = LLᵀ): min ‖Lᵀλ − L⁻¹r‖ ⇔ min λᵀGλ − 2rᵀλ
        ev, vec = torch.linalg.eigh(g)
        ev = ev.clamp_min(ev.max() * 1e-13)
        half = vec * ev.sqrt()
        lam, _ = nnls(half.T.numpy(), (vec.T @ r / ev.sqrt()).numpy(), maxiter=20 * len(r))
        lam = torch.from_numpy(lam)
        out[name] = float((t - 2 * lam @ r + lam @ g @ lam) / t)
    return out


def structure(b, xtr, xho, p0, y) -> dict[str, float]:
    names = list(b.params)
    params = [b.params[k] for k in names]
    w1, w2, w3 = params[0], params[1], params[2][0]
    d1 = w1 - p0[names[0]]
    a_true = d1 @ torch.linalg.pinv(xtr)  # (h, n)
    fit = float((a_true @ xtr - d1).norm() / d1.norm())
    s = torch.sign(w3 @ w2)
    cmat = a_true * y[None, :] * s[:, None]
    negative = float(-cmat.clamp_max(0).sum() / cmat.abs().sum())
    act = (xtr @ w1.T > 0).double().T  # (h, n)
    inactive_energy = ((a_true ** 2) * (1 - act)).sum(0) / (a_true ** 2).sum(0)
    a_pred = features(params, xtr, y)[0].T
    cos = (a_true * a_pred).sum(0) / a_true.norm(dim=0) / a_pred.norm(dim=0)
    # single-candidate tests: training images vs held-out images projected onto the span
    u, sv, vh = torch.linalg.svd(s[:, None] * d1, full_matrices=False)
    n = xtr.shape[0]
    basis, cols = vh[:n].T, u[:, :n]
    proj = (xho @ basis) @ basis.T

    def smin(x: torch.Tensor) -> np.ndarray:
        inactive = (x @ w1.T) <= 0
        return np.array([float(torch.linalg.svdvals(cols[inactive[i]])[-1]) for i in range(x.shape[0])])

    from scipy.optimize import linprog

    rows = (s[:, None] * d1) @ basis
    rows = (rows / rows.norm(dim=1, keepdim=True).mean()).numpy()

    def lp(x: torch.Tensor) -> np.ndarray:
        out = []
        for xi in x:
            inactive = ((w1 @ xi) <= 0).numpy().astype(float)
            res = linprog(inactive @ rows, A_ub=-rows, b_ub=np.zeros(rows.shape[0]), A_eq=rows.sum(0)[None],
                          b_eq=[1.0], bounds=[(None, None)] * rows.shape[1], method="highs")
            out.append(res.fun if res.status == 0 else np.nan)
        return np.array(out)

    k = min(60, n, proj.shape[0])
    return {"least_squares_fit": fit, "sign_violating_mass": negative,
            "units_sign_agreement": float((torch.sign((cmat.sum(1))) == 1).double().mean()),
            "inactive_energy_median": float(inactive_energy.median()),
            "kkt_column_cos_median": float((cos).median()),
            "smin_auc_train_vs_projected_heldout": auc(-smin(xtr[:k]), -smin(proj[:k])),
            "lp_auc_train_vs_projected_heldout": auc(-lp(xtr[:k]), -lp(proj[:k]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--runs", type=Path, nargs="*", default=[], help="attack run directories to compare with")
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, task, xtr, xho, p0 = load(args.model, args.heldout)
    y = task.train.y.double()
    names = list(b.params)
    params = [b.params[k] for k in names]
    init = [p0[k] for k in names]
    result = {"model": str(args.model), "n": int(xtr.shape[0]),
              "ground_truth_residual": {"weights_only": ground_truth_residual(params, params, xtr, y),
                                        "known_init": ground_truth_residual(params,
                                                                            [p - q for p, q in zip(params, init)],
                                                                            xtr, y)},
              "runs": {}, "structure": structure(b, xtr, xho, p0, y), "machine": machine(),
              "date": time.strftime("%Y-%m-%d")}
    for run in args.runs:
        meta = json.loads((run / "run.json").read_text())
        result["runs"][str(run)] = {"relative_residual": meta["selection"]["relative_residual"]["value"],
                                    "knowledge": (meta.get("knowledge") or {}).get("summary"),
                                    "method": meta["method"]}
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
