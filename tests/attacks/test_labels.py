"""Label restoration from the read-out's change, on planted updates and on a real training step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from datarecon.attacks.labels import label_accuracy, readout_weight, restore_from_change, restore_labels
from datarecon.errors import DataReconError
from datarecon.kernel.step import TrainingRecipe, train_step


def _planted(counts: list[int], *, steps: int = 1) -> tuple[nn.Module, dict, dict]:
    """A read-out with zero weights (uniform predictions) trained ``steps`` full-batch steps on one
    non-negative feature vector per image, the same for all: ΔW_c = (η/b)·(k_c − b/C)·h exactly in the
    first step. Returns (model, θ*, θ_init)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, len(counts), bias=False)).double()
    init = {"1.weight": torch.zeros(len(counts), 6, dtype=torch.float64, requires_grad=True)}
    y = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    h = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.25, 1.5], dtype=torch.float64)
    x = h.expand(int(y.numel()), 6).clone()
    params = dict(init)
    for _ in range(steps):
        params, _ = train_step(model, params, (x, y), TrainingRecipe(loss="cross-entropy"), lr=0.1)
    return model, {k: v.detach() for k, v in params.items()}, init


@pytest.mark.parametrize("counts", [[3, 0, 1, 4, 2], [0, 5, 0, 5, 0], [1, 0, 0, 0, 9]],
                         ids=["uneven", "two-classes", "one-dominant"])
def test_restored_labels_of_a_planted_step_are_the_batch_labels(counts) -> None:
    """Where a class is absent its row is the baseline and the masses are the counts times one scale:
    the multiset is restored exactly."""
    model, params, init = _planted(counts)
    restored = restore_labels(model, params, init, sum(counts))
    assert restored.counts.tolist() == counts
    truth = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    assert label_accuracy(restored.labels, truth, len(counts)) == 1.0
    mean_share = sum(counts) / len(counts)  # a row gains where its class has more than the mean share b/C
    assert restored.present.tolist() == [c > mean_share for c in counts]


def test_rows_that_do_not_differ_share_the_images_evenly() -> None:
    assert restore_from_change(torch.zeros(5, 3), 10).counts.tolist() == [2] * 5


def test_the_lowest_row_is_taken_as_a_class_without_images() -> None:
    """The estimator's stated bias: with every class present, the least frequent one reads as absent."""
    model, params, init = _planted([3, 1, 2, 3, 1])
    assert restore_labels(model, params, init, 10).counts.tolist() == [4, 0, 2, 4, 0]


def test_restoration_shares_out_exactly_n_labels_by_largest_remainders() -> None:
    delta = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0]])  # masses above the per-feature minimum: 1, 0, 3
    restored = restore_from_change(delta, 5)
    assert restored.counts.tolist() == [1, 0, 4] and int(restored.counts.sum()) == 5
    assert restored.labels.tolist() == [0, 2, 2, 2, 2]


def test_label_accuracy_is_the_shared_multiset() -> None:
    assert label_accuracy(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 2]), 3) == 0.75
    assert label_accuracy(torch.tensor([2, 1, 0]), torch.tensor([0, 1, 2]), 3) == 1.0


def test_a_model_without_a_linear_read_out_is_refused_in_one_line() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(DataReconError, match="no linear layer"):
        readout_weight(model, dict(model.named_parameters()))
    with pytest.raises(DataReconError, match="n >= 1"):
        restore_from_change(torch.zeros(2, 3), 0)
