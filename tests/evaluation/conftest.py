"""Fixtures for evaluation tests."""

from __future__ import annotations

import pytest
import torch


def smooth_images(n: int, c: int = 3, h: int = 16, w: int = 16, *, seed: int = 0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Blurred noise min-max scaled to [0, 1] per image (natural-ish structure)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n * c, 1, h, w, generator=g, dtype=torch.float64)
    k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=torch.float64)
    k = k / k.sum()
    x = torch.nn.functional.conv2d(x, (k[:, None] * k[None, :])[None, None], padding=2).reshape(n, c, h, w)
    lo = x.flatten(1).min(1).values.view(-1, 1, 1, 1)
    hi = x.flatten(1).max(1).values.view(-1, 1, 1, 1)
    return ((x - lo) / (hi - lo)).to(dtype)


@pytest.fixture
def smooth():
    """Factory of structured images: ``smooth(n, c, h, w, seed=...)``."""
    return smooth_images
