"""Benchmark: exhaustive all-pairs SSIM vs prefilter + top-k nearest neighbours.

1000 candidates vs 500 training images (32x32x3) by default; candidates are
noisy, shifted copies of training images or of unrelated images, so the
top-1 match is meaningful. Prints the time of each path, their ratio and the
agreement of the top-1 index, and writes ``benchmarks/results/evaluation.json``.
Exits non-zero on error or if the prefilter disagrees with the exhaustive
search on more than ``--max-disagree`` of the candidates.

Usage::

    .venv/bin/python benchmarks/bench_evaluation.py            # full size (~30 s on 2 cores)
    .venv/bin/python benchmarks/bench_evaluation.py --quick    # 200 x 100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from datarecon.evaluation import NeighbourSearch, l2_matrix, nearest_neighbours, ncc_matrix, ssim_matrix
from datarecon.utils.io import atomic_write_json, versions


def structured(n: int, *, generator: torch.Generator) -> torch.Tensor:
    """Smoothed noise with a random colour gradient, per-image min-max scaled to [0, 1]."""
    x = torch.rand(n * 3, 1, 32, 32, generator=generator)
    k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
    k = k / k.sum()
    x = torch.nn.functional.conv2d(x, (k[:, None] * k[None, :])[None, None], padding=2).view(n, 3, 32, 32)
    ramp = torch.linspace(0, 1, 32).view(1, 1, 1, 32) * torch.rand(n, 3, 1, 1, generator=generator)
    x = x + ramp
    lo = x.flatten(1).min(1).values.view(-1, 1, 1, 1)
    hi = x.flatten(1).max(1).values.view(-1, 1, 1, 1)
    return (x - lo) / (hi - lo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (200 candidates x 100 training images)")
    ap.add_argument("--candidates", type=int, default=None)
    ap.add_argument("--train", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--prefilter", default="lncc", choices=["lncc", "l2", "ncc"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--min-agreement", type=float, default=0.9,
                    help="fail if the top-1 agreement is lower (weak matches are near-ties)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "evaluation.json"))
    args = ap.parse_args(argv)
    m = args.candidates or (200 if args.quick else 1000)
    n = args.train or (100 if args.quick else 500)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    train = structured(n, generator=g)
    other = structured(m, generator=g)
    src = torch.randint(0, n, (m,), generator=g)
    mix = torch.rand(m, 1, 1, 1, generator=g)  # how much of the training image each candidate holds
    cands = (mix * train[src] + (1 - mix) * other + 0.05 * torch.randn(m, 3, 32, 32, generator=g)).clamp(0, 1)

    t0 = time.perf_counter()
    full = ssim_matrix(cands, train)
    t_exh = time.perf_counter() - t0
    top_exh = full.argmax(1)

    t0 = time.perf_counter()
    nb = nearest_neighbours(cands, train, metric="ssim",
                            search=NeighbourSearch(prefilter=args.prefilter, top_k=args.top_k, exact_up_to=0))
    t_pre = time.perf_counter() - t0

    t0 = time.perf_counter()
    l2_matrix(cands, train)
    t_l2 = time.perf_counter() - t0
    t0 = time.perf_counter()
    ncc_matrix(cands, train)
    t_ncc = time.perf_counter() - t0

    best = full.max(1).values
    hit = nb.index == top_exh
    agree = float(hit.float().mean())
    strong = best > 0.5
    agree_strong = float(hit[strong].float().mean()) if bool(strong.any()) else float("nan")
    regret = (best - nb.score).double()  # exact SSIM lost by the shortlist (>= 0)
    score_err = float(regret.max())
    result = {
        "candidates": m, "train": n, "image_shape": [3, 32, 32], "top_k": args.top_k,
        "prefilter": args.prefilter, "threads": torch.get_num_threads(),
        "time_exhaustive_s": t_exh, "time_prefilter_topk_s": t_pre,
        "speedup": t_exh / t_pre if t_pre > 0 else float("inf"),
        "time_l2_matrix_s": t_l2, "time_ncc_matrix_s": t_ncc,
        "pairs_per_s_exhaustive": m * n / t_exh,
        "top1_agreement": agree, "top1_agreement_best_ssim_gt_0.5": agree_strong,
        "n_best_ssim_gt_0.5": int(strong.sum()), "max_ssim_regret": score_err,
        "mean_ssim_regret": float(regret.mean()),
        "quick": bool(args.quick), "versions": versions(),
    }
    print(f"{m} candidates x {n} training images (32x32x3), {torch.get_num_threads()} threads")
    print(f"  exhaustive all-pairs SSIM : {t_exh:8.3f} s ({m * n / t_exh:,.0f} pairs/s)")
    print(f"  {args.prefilter} prefilter + top-{args.top_k} SSIM: {t_pre:8.3f} s")
    print(f"  speed-up                  : {result['speedup']:8.1f}x")
    print(f"  L2 / NCC matrices         : {t_l2:.3f} s / {t_ncc:.3f} s")
    print(f"  top-1 agreement           : {agree:.4f} (best SSIM > 0.5: {agree_strong:.4f} of {int(strong.sum())})")
    print(f"  SSIM lost by shortlist    : max {score_err:.3g}, mean {float(regret.mean()):.3g}")
    atomic_write_json(args.out, result)
    print(f"  wrote {args.out}")
    if agree < args.min_agreement:
        print(f"error: top-1 agreement {agree:.4f} below {args.min_agreement}; raise --top-k", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # exit non-zero with a one-line message
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
