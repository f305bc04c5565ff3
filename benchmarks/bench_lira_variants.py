"""LiRA's choices, measured on the reference models a membership folder keeps: the raw likelihood ratio against
its non-decreasing envelope (the product's online score), the variance (per candidate, shrunk, pooled) and the
number of reference models.

Reads ``OUT/scores.safetensors`` (the target's confidence φ on every candidate, and who is a member) and the
statistics of the first K reference models of ``OUT/references`` (``datarecon membership --evaluate --references
K --out OUT``); trains nothing.

    python benchmarks/bench_lira_variants.py runs/membership-family/cnn100/membership-references-512-workers-2 \\
        --counts 64,128,256,512 --out benchmarks/results/lira_variants_cnn100.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from _common import machine


def raw_online(target: torch.Tensor, stats: torch.Tensor, inside: torch.Tensor, prior: float) -> torch.Tensor:
    """log N(φ; μ_in, σ_in) − log N(φ; μ_out, σ_out) without the envelope (LiRA as written)."""
    from datarecon.attacks.mia.reference import fit_gaussians

    fin = fit_gaussians(stats, inside, variance_prior=prior)
    fout = fit_gaussians(stats, ~inside, variance_prior=prior)

    def logn(s, m, sd):
        return -0.5 * ((s - m) / sd) ** 2 - torch.log(sd)

    return logn(target, fin.mean, fin.std) - logn(target, fout.mean, fout.std)


def main(argv: list[str] | None = None) -> int:
    from datarecon.attacks.mia.reference import lira_offline, lira_online
    from datarecon.evaluation.membership import membership_roc
    from datarecon.experiments.membership.reference_store import load_statistics
    from datarecon.utils.io import load_tensors

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a membership folder with reference models")
    ap.add_argument("--counts", default="64,128,256,512", help="numbers of reference models (the first K)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    scores = load_tensors(args.folder / "scores.safetensors")
    target, member = scores["score.confidence"].double(), scores["is_member"].bool().numpy()
    rows = []
    for k in (int(c) for c in args.counts.split(",")):
        refs = load_statistics(args.folder, k)
        variants = {
            "online, raw ratio (prior 4)": raw_online(target, refs.confidence, refs.inside, 4.0),
            "online, envelope (prior 4; the product)": lira_online(target, refs.confidence, refs.inside),
            "online, envelope, per-candidate variance (prior 0)": lira_online(target, refs.confidence, refs.inside,
                                                                              variance_prior=0.0),
            "online, envelope, pooled variance": lira_online(target, refs.confidence, refs.inside,
                                                             variance_prior=1e12),
            "offline (prior 4; the product)": lira_offline(target, refs.confidence, refs.inside),
            "offline, pooled variance": lira_offline(target, refs.confidence, refs.inside, variance_prior=1e12),
        }
        for name, s in variants.items():
            roc = membership_roc(s.numpy()[member], s.numpy()[~member], name=name, n_boot=200)
            rows.append({"references": k, "variant": name, "auc": roc.auc, "auc_ci": roc.auc_ci,
                         "tpr_at_fpr": {str(f): t for f, t in roc.tpr_at.items()},
                         "mean_models_per_candidate": float(refs.inside.double().sum(0).mean())})
            print(f"K {k:4d}  {name:52s} AUC {roc.auc:.4f}  TPR@1% {roc.tpr_at[0.01]}  TPR@0.1% {roc.tpr_at[0.001]}")
    if args.out is not None:
        args.out.write_text(json.dumps({"folder": str(args.folder), "command": " ".join(sys.argv), "rows": rows,
                                        "machine": machine(), "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
