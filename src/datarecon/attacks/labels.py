"""The training batch's labels restored from the last layer's weight change (attacker-side).

With cross-entropy and non-negative features h_i (after a ReLU, or their global average), the
gradient of the read-out's class row is ∂E/∂W_c = (1/b) Σ_i (p_ic − [y_i = c]) h_iᵀ, so a training
step changes it by ΔW_c = (η/b) Σ_i ([y_i = c] − p_ic) h_iᵀ. A class absent from the batch only loses
(every entry of ΔW_c ≤ 0); a class present gains on the features of its own images, the more the
more of its images the batch holds. Over several steps the changes add up and the rule holds for
their sum. From θ* − θ_init of the read-out the attacker estimates which classes the training set
held and how many of each: each row's mass above the lowest row, feature by feature, shared out in
proportion (:func:`restore_from_change`).

References:
    Zhao et al. (2020) iDLG (a single image's label from the sign of the last layer's gradient);
    Yin et al. (2021) "See through Gradients", §3.2 (the labels of a batch from the last layer);
    Wainakh et al. (2022) "User-level label leakage from gradients" (label counts from the magnitude).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from datarecon.errors import DataReconError

__all__ = ["RestoredLabels", "label_accuracy", "readout_weight", "restore_labels", "restore_from_change"]


@dataclass(frozen=True)
class RestoredLabels:
    """The restored label multiset.

    Attributes:
        labels: (n,) int64 classes, sorted (candidate i gets labels[i]).
        counts: (C,) images per class.
        present: (C,) bool, classes whose row gained somewhere (max_d ΔW_cd > 0).
        mass: (C,) each row's mass above the lowest row, Σ_d (ΔW_cd − min_c' ΔW_c'd) (what the counts are
            shared by).
    """

    labels: torch.Tensor
    counts: torch.Tensor
    present: torch.Tensor
    mass: torch.Tensor

    def summary(self) -> dict[str, object]:
        """A JSON-able record: counts and present classes."""
        return {"source": "restored", "counts": [int(c) for c in self.counts],
                "present": [int(c) for c in torch.nonzero(self.present).reshape(-1)]}


def readout_weight(model: nn.Module, params: Mapping[str, torch.Tensor]) -> str:
    """The parameter name of the last ``nn.Linear``'s weight (the read-out, (C, d)).

    Raises:
        DataReconError: the model has no linear layer.
    """
    names = [f"{name}.weight" for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    names = [n for n in names if n in params]
    if not names:
        raise DataReconError("restoring labels reads the last linear layer's weight change and this model has no "
                             "linear layer; leave knowledge.labels at balanced")
    return names[-1]


def restore_from_change(delta: torch.Tensor, n: int) -> RestoredLabels:
    """The label multiset of n training images from the read-out's change ΔW = W* − W_init (C, d).

    Every row loses the same p-weighted feature sum Σ_i p_ic h_i up to the class's share of the
    predictions; the row of a class the batch (nearly) lacks is that loss alone, the lowest of all.
    So the per-feature minimum over classes, min_c ΔW_cd, is the baseline a class without images
    would show, and each row's mass above it, Σ_d (ΔW_cd − min_c' ΔW_c'd), grows with the class's
    images (Wainakh et al.'s offset and impact, with the offset read from the weights). The n images
    are shared out in proportion to the masses (largest remainders, ties to the lower class). A
    class is ``present`` where its row gains somewhere (max_d ΔW_cd > 0, iDLG's sign).

    Args:
        delta: (C, d) float; n: the training-set size, ≥ 1.

    Returns:
        :class:`RestoredLabels`.
    """
    if n < 1:
        raise DataReconError(f"restoring labels needs the training-set size n >= 1, got {n}")
    delta = delta.detach().double().reshape(delta.shape[0], -1)
    mass = (delta - delta.min(dim=0).values).sum(dim=1)
    present = delta.max(dim=1).values > 0
    if float(mass.max()) <= 0:  # no row above another: nothing to tell the classes apart by
        mass = torch.ones_like(mass)
    share = mass / mass.sum() * n
    counts = torch.floor(share).long()
    remainder = share - counts
    for c in sorted(range(delta.shape[0]), key=lambda c: (-float(remainder[c]), c))[:n - int(counts.sum())]:
        counts[c] += 1
    labels = torch.repeat_interleave(torch.arange(delta.shape[0]), counts)
    return RestoredLabels(labels=labels, counts=counts, present=present, mass=mass)


def restore_labels(model: nn.Module, params: Mapping[str, torch.Tensor], init: Mapping[str, torch.Tensor],
                   n: int) -> RestoredLabels:
    """:func:`restore_from_change` on the read-out of ``model``: θ* (``params``) against the known θ_init.

    Args:
        model: the architecture; params: θ* by name; init: θ_init by name; n: the training-set size.
    """
    name = readout_weight(model, params)
    return restore_from_change(params[name].detach() - init[name].detach().to(params[name].dtype), n)


def label_accuracy(restored: torch.Tensor, truth: torch.Tensor, num_classes: int) -> float:
    """The share of the true label multiset the restored one holds: Σ_c min(k̂_c, k_c) / n (1: the same
    multiset; candidates are unordered, so a multiset is what can be right).

    Args:
        restored: (m,) int classes; truth: (n,) int classes; num_classes: C.
    """
    k_hat = torch.bincount(restored.long().reshape(-1), minlength=num_classes)
    k = torch.bincount(truth.long().reshape(-1), minlength=num_classes)
    return float(torch.minimum(k_hat, k).sum()) / max(int(truth.numel()), 1)
