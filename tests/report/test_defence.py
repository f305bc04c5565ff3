"""The defence-audit figure: the baseline sits where it belongs on each axis; the figure draws."""

from __future__ import annotations

import math

from datarecon.report.defence import axis_positions, defence_figure


def _row(setting, axis, **kw):
    base = {"setting": setting, "axis": axis, "seed": 0, "n_train": 10, "count": 3, "count_heldout": 1,
            "count_noise": 0, "mean_best_ssim": 0.5, "mean_best_ssim_heldout": 0.4, "heldout_accuracy": 0.8,
            "weight_decay": 0.0, "epochs": 100, "dp_epsilon": None, "bound_count": None}
    return {**base, **kw}


def test_baseline_position_on_each_axis():
    rows = [_row("baseline", "baseline"), _row("dp-eps10", "dp", dp_epsilon=9.99, bound_count=6.0),
            _row("dp-eps1", "dp", dp_epsilon=1.0, bound_count=2.0),
            _row("dp-sigma0", "dp", dp_epsilon=math.inf)]
    assert [s for s, _, _ in axis_positions(rows, axis="dp")] == ["dp-eps1", "dp-eps10", "dp-sigma0", "baseline"]
    rows = [_row("wd0.01", "weight_decay", weight_decay=0.01), _row("baseline", "baseline")]
    assert [lab for _, lab, _ in axis_positions(rows, axis="weight_decay")] == ["0", "0.01"]
    rows = [_row("epochs1000", "epochs", epochs=1000), _row("baseline", "baseline"), _row("epochs10", "epochs", epochs=10)]
    assert [s for s, _, _ in axis_positions(rows, axis="epochs")] == ["epochs10", "baseline", "epochs1000"]


def test_figure_draws_bound_and_nulls():
    rows = [_row("baseline", "baseline"), _row("dp-eps1", "dp", dp_epsilon=1.0, bound_count=2.0, count=0)]
    fig = defence_figure(rows, axis="dp", xlabel="eps")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "DP-SGD bound n·κ₊" in labels and any("held-out" in t for t in labels)
