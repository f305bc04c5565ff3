"""Training losses and the training energy E(x, y; θ).

Labels: binary tasks use y ∈ {−1, +1} with one output f; multiclass tasks use
class indices with k outputs. The energy is the target's own training
objective (Runkel et al. 2024, the lower level of eq. 2):

    E(x, y; θ) = (1/n) Σ_i L(Φ(x_i; θ), y_i) + (wd / 2) · ‖θ‖²

The factor 1/2 makes ``wd`` the same number as PyTorch's SGD ``weight_decay``
(gradient term wd·θ).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from datarecon.registry import Registry

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossEntry:
    """A loss: its per-sample function and the label kind it expects."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, label_kind: str,
                 doc: str) -> None:
        self.per_sample = fn
        self.label_kind = label_kind  # "binary" | "multiclass" | "any"
        self.doc = doc

    def __call__(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch (scalar)."""
        return self.per_sample(outputs, y).mean()


def _binary_out(outputs: torch.Tensor) -> torch.Tensor:
    return outputs.reshape(outputs.shape[0], -1)[:, 0]


def _logistic(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """softplus(−y·f) = BCE-with-logits with targets (y+1)/2, y ∈ {−1, +1}."""
    return F.softplus(-y.to(outputs.dtype) * _binary_out(outputs))


def _mse(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(f − y)²; y real (regression on ±1 labels as in DecoReco)."""
    return (_binary_out(outputs) - y.to(outputs.dtype)) ** 2


def _huber(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Huber loss with δ = 1."""
    return F.huber_loss(_binary_out(outputs), y.to(outputs.dtype), reduction="none", delta=1.0)


def _cross_entropy(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy, y class indices."""
    return F.cross_entropy(outputs, y.long(), reduction="none")


LOSSES: Registry[LossEntry] = Registry("loss")
LOSSES.register("logistic", LossEntry(_logistic, label_kind="binary", doc="BCE with logits, y in {-1,+1}"))
LOSSES.register("mse", LossEntry(_mse, label_kind="binary", doc="squared error on +-1 targets"))
LOSSES.register("huber", LossEntry(_huber, label_kind="binary", doc="Huber (delta 1) on +-1 targets"))
LOSSES.register("cross-entropy", LossEntry(_cross_entropy, label_kind="multiclass", doc="softmax CE"))


def weight_penalty(params: Mapping[str, torch.Tensor], weight_decay: float) -> torch.Tensor:
    """(wd / 2) · Σ_p ‖θ_p‖² (scalar)."""
    total = sum((p * p).sum() for p in params.values())
    return 0.5 * weight_decay * total  # type: ignore[return-value]


def resolve_loss(loss: str | LossFn) -> LossFn:
    """The mean-loss function of a ``LOSSES`` name, or ``loss`` itself when it is a callable
    ``loss(outputs, labels) -> scalar`` (a user's own, :meth:`datarecon.attacks.base.Target.from_module`)."""
    return LOSSES.get(loss) if isinstance(loss, str) else loss


def loss_name(loss: str | LossFn) -> str:
    """A name to record: the ``LOSSES`` key, or ``callable:module.qualname`` for a user's callable."""
    if isinstance(loss, str):
        return loss
    return f"callable:{getattr(loss, '__module__', '?')}.{getattr(loss, '__qualname__', type(loss).__name__)}"


def energy_terms(outputs: torch.Tensor, y: torch.Tensor, params: Mapping[str, torch.Tensor], *,
                 loss: str | LossFn, weight_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(data loss, training energy E = data loss + (wd/2)‖θ‖²): the one definition of the training
    energy (Runkel eq. 2, lower level), used by training, the bilevel attack and the gradient-norm
    attack; ``loss`` see :func:`resolve_loss`."""
    data_loss = resolve_loss(loss)(outputs, y)
    if weight_decay:
        return data_loss, data_loss + weight_penalty(params, weight_decay)
    return data_loss, data_loss


def energy(outputs: torch.Tensor, y: torch.Tensor, params: Mapping[str, torch.Tensor], *,
           loss: str | LossFn, weight_decay: float) -> torch.Tensor:
    """Training energy E = mean loss + (wd/2)‖θ‖² (:func:`energy_terms`)."""
    return energy_terms(outputs, y, params, loss=loss, weight_decay=weight_decay)[1]


def margins(outputs: torch.Tensor, y: torch.Tensor, *, multiclass: bool | None = None) -> torch.Tensor:
    """Per-sample output margin, the one place it is computed (training, KKT regime, attacks, evaluation).

    * binary (one output, y ∈ {−1, +1} or real):  margin_i = y_i · Φ(x_i)
    * multiclass (k outputs, y class indices):    margin_i = Φ_{y_i}(x_i) − max_{j≠y_i} Φ_j(x_i)

    Differentiable in ``outputs`` (and, binary, in ``y``); pure (inputs are not modified).

    Args:
        outputs: Φ(x), (N, 1) or (N,) for binary, (N, k) with k ≥ 2 for multiclass.
        y: (N,) labels: floats for binary, integer class indices in [0, k) for multiclass.
        multiclass: which formula; None infers it from ``y`` (floating point: binary, integer:
            multiclass).

    Returns:
        (N,) margins in ``outputs``' dtype; positive iff sample i is classified correctly.

    References:
        Haim et al. (2022), eq. 3 (binary); Buzaglo et al. (2023), §3 (multiclass).
    """
    if multiclass is None:
        multiclass = not y.dtype.is_floating_point
    if not multiclass:
        return y.to(outputs.dtype) * _binary_out(outputs)
    true = outputs.gather(1, y.long()[:, None])[:, 0]
    other = outputs.scatter(1, y.long()[:, None], float("-inf")).amax(dim=1)
    return true - other


def accuracy(outputs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of correct predictions (binary: sign of f equals y)."""
    return float((margins(outputs, y) > 0).to(torch.float64).mean())


def squared_norm(t: torch.Tensor) -> torch.Tensor:
    """‖t‖² accumulated in float64 as one dot product (no squared copy of t; float64 tensors not cast)."""
    v = t.reshape(-1)
    if v.dtype != torch.float64:
        v = v.double()
    return torch.dot(v, v)
