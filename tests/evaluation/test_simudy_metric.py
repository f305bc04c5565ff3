"""SimuDy's mean best SSIM (benchmarks/bench_dynamics.py) against a plain loop over scikit-image's SSIM."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_dynamics import greedy_mean_best_ssim  # noqa: E402

skm = pytest.importorskip("skimage.metrics")


def _reference(cands: torch.Tensor, train: torch.Tensor) -> float:
    sim = np.array([[skm.structural_similarity(c.numpy(), t.numpy(), gaussian_weights=True, sigma=1.5,
                                               use_sample_covariance=False, data_range=1, channel_axis=0)
                     for t in train.double()] for c in cands.double()])
    total, used_c, used_t = 0.0, set(), set()
    for flat in np.argsort(-sim, axis=None, kind="stable"):
        i, j = divmod(int(flat), sim.shape[1])
        if i in used_c or j in used_t:
            continue
        total += sim[i, j]
        used_c.add(i)
        used_t.add(j)
    return total / train.shape[0]


@pytest.mark.parametrize("m", [3, 5, 8])
def test_greedy_one_to_one_mean_best_ssim_matches_a_scikit_image_loop(m: int) -> None:
    g = torch.Generator().manual_seed(m)
    train = torch.rand(5, 3, 16, 16, generator=g)
    cands = torch.cat([train[:2] + 0.05 * torch.randn(2, 3, 16, 16, generator=g),
                       torch.rand(m - 2, 3, 16, 16, generator=g)]).clamp(0, 1)
    assert greedy_mean_best_ssim(cands, train) == pytest.approx(_reference(cands, train), abs=1e-5)


def test_the_bootstrap_interval_is_a_seeded_percentile_interval_of_resampled_means() -> None:
    from bench_dynamics import BOOTSTRAP, bootstrap_ci

    values = torch.tensor([0.1, 0.5, 0.2, 0.9, 0.4, 0.3])
    lo, hi = bootstrap_ci(values)
    assert (lo, hi) == bootstrap_ci(values)  # seeded
    assert lo < float(values.mean()) < hi
    # against a plain numpy loop over the same draws
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 6, (BOOTSTRAP, 6), generator=g).numpy()
    means = np.sort(values.double().numpy()[idx].mean(axis=1))
    assert lo == pytest.approx(np.quantile(means, 0.025), abs=1e-12)
    assert hi == pytest.approx(np.quantile(means, 0.975), abs=1e-12)
    assert bootstrap_ci(torch.full((4,), 0.3)) == pytest.approx((0.3, 0.3))
