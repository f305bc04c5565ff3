"""Figures render from results (PNG bytes) without computing anything."""

from __future__ import annotations

import io

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.report import (
    figure_png,
    interpolation_curves,
    landscape_heatmaps,
    neighbour_grid,
    roc_curves,
    save_figure,
    sorted_ssim_curve,
    ssim_vs_margin,
)


def _valid_png(data: bytes) -> tuple[int, ...]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return mpimg.imread(io.BytesIO(data), format="png").shape


def _landscape():
    vals = (0.0, 0.5, 1.0)
    return {(a, b): {"mean_l2_to_nearest": {"train": 10 * (1 - a * b), "partition": 5 + a, "noise": 20 - b}}
            for a in vals for b in vals}


@pytest.mark.parametrize("channels", [1, 3], ids=["gray", "rgb"])
def test_neighbour_grid(channels):
    c = torch.rand(10, channels, 8, 8)
    fig = neighbour_grid(c, {"train": c.flip(0), "partition": c}, scores={"train": torch.rand(10).tolist()},
                         max_items=7, groups_per_row=3)
    h, w, _ = _valid_png(figure_png(fig))
    assert h > 50 and w > 100
    with pytest.raises(DataReconError, match="no candidates"):
        neighbour_grid(c[:0], {"train": c[:0]})


def test_curves_and_scatter(tmp_path):
    _valid_png(figure_png(sorted_ssim_curve({"real": [0.9, None, 0.2], "heldout": [0.3, 0.1], "noise": []},
                                            window="gaussian 11x11")))
    _valid_png(figure_png(ssim_vs_margin([0.5, None, 0.2], [1.0, 2.0, 3.0])))
    with pytest.raises(DataReconError, match="different lengths"):
        ssim_vs_margin([0.1], [1.0, 2.0])
    fig = roc_curves({"lambda": ([0, 0.5, 1], [0, 0.8, 1], 0.65), "none": ([float("nan")], [0.0], float("nan"))})
    save_figure(fig, tmp_path / "roc.png")
    _valid_png((tmp_path / "roc.png").read_bytes())


def test_landscape():
    res = _landscape()
    _valid_png(figure_png(landscape_heatmaps(res)))
    _valid_png(figure_png(interpolation_curves(res)))
    _valid_png(figure_png(interpolation_curves({"bilevel": res, "decoreco": res})))
    partial = {k: v for k, v in res.items() if k != (0.5, 0.5)}
    _valid_png(figure_png(landscape_heatmaps(partial, sets=("train",))))
    with pytest.raises(DataReconError, match="no results"):
        landscape_heatmaps({})
    np.testing.assert_equal(len(res), 9)
