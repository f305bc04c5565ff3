"""Per-example statistics of a model on labelled examples: what every membership signal is computed from.

An attacker queries the model on an example (x, y) and reads

* the **loss** ℓ(Φ(x), y) (the training loss per example);
* the **true-label probability** p = exp(−ℓ): the softmax probability of the label for cross-entropy,
  σ(y·f) for the logistic loss, and the pseudo-likelihood exp(−ℓ) for a regression loss (mse, huber);
* the **logit-scaled confidence** φ = log(p / (1 − p)), LiRA's statistic, which is close to Gaussian over
  training runs (Carlini et al. 2022, §4.3): φ = Φ_y(x) − logsumexp_{j≠y} Φ_j(x) for cross-entropy and
  y·f for the logistic loss, both computed from the logits so that φ does not saturate where p rounds
  to 1; for other losses from ℓ (φ = −ℓ − log(−expm1(−ℓ)));
* the **gradient norm** ‖∇_θ ℓ(Φ(x; θ), y)‖ per example (white-box), from one vmapped gradient.

Pure functions of a model, its parameters and tensors; no ground truth is read here (a membership
statistic is what the attacker measures on an example whose membership it does not know).

References:
    Carlini, Chien, Nasr, Song, Terzis, Tramèr (2022), "Membership Inference Attacks From First
    Principles", §4.3 (logit scaling); Yeom et al. (2018) (loss threshold); Zarifzadeh, Liu, Shokri
    (2024), "Low-Cost High-Power Membership Inference Attacks" (true-label probability).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from datarecon.errors import DataReconError
from datarecon.kernel.losses import LOSSES, LossFn, resolve_loss

__all__ = ["ExampleStatistics", "confidence", "example_statistics", "gradient_norms", "per_example_loss"]

#: examples per forward pass (bounds the memory of the logits and of the per-example gradients)
BATCH = 256


def per_example_loss(outputs: torch.Tensor, y: torch.Tensor, loss: str | LossFn) -> torch.Tensor:
    """ℓ_i = L(Φ(x_i), y_i) for each example, (N,).

    A registered loss gives its per-example values; a user's callable ``loss(outputs, labels) -> scalar``
    is applied to one example at a time.
    """
    if isinstance(loss, str):
        return LOSSES.get(loss).per_sample(outputs, y)
    return torch.stack([loss(outputs[i:i + 1], y[i:i + 1]).reshape(()) for i in range(outputs.shape[0])])


def confidence(outputs: torch.Tensor, y: torch.Tensor, loss: str | LossFn) -> torch.Tensor:
    """LiRA's logit-scaled confidence φ = log(p / (1 − p)) of the true label, (N,), in float64.

    Args:
        outputs: (N, k) logits (k = 1: one ±1 output).
        y: (N,) labels in the loss's convention (class indices or ±1).
        loss: the training loss (a ``LOSSES`` name or a callable).
    """
    z = outputs.detach().to(torch.float64)
    if loss == "cross-entropy":
        yi = y.long()[:, None]
        true = z.gather(1, yi)[:, 0]
        return true - torch.logsumexp(z.scatter(1, yi, float("-inf")), dim=1)
    if loss == "logistic":
        return y.to(torch.float64) * z.reshape(z.shape[0], -1)[:, 0]
    ell = per_example_loss(z, y.to(torch.float64) if y.dtype.is_floating_point else y, loss).to(torch.float64)
    ell = ell.clamp_min(torch.finfo(torch.float64).tiny)
    return -ell - torch.log(-torch.expm1(-ell))


@dataclass(frozen=True)
class ExampleStatistics:
    """What one model says about N labelled examples (float64, CPU).

    Attributes:
        loss: (N,) per-example loss ℓ.
        probability: (N,) true-label probability exp(−ℓ).
        confidence: (N,) logit-scaled confidence φ (:func:`confidence`).
    """

    loss: torch.Tensor
    probability: torch.Tensor
    confidence: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        """``{"loss", "probability", "confidence"}`` (to save)."""
        return {"loss": self.loss, "probability": self.probability, "confidence": self.confidence}


def _forward(model: nn.Module, params: Mapping[str, torch.Tensor] | None, x: torch.Tensor) -> torch.Tensor:
    return model(x) if params is None else functional_call(model, dict(params), (x,))


def example_statistics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str | LossFn,
                       params: Mapping[str, torch.Tensor] | None = None, batch: int = BATCH) -> ExampleStatistics:
    """Loss, true-label probability and confidence of ``model`` on (x, y), without gradients.

    Args:
        model: the network (eval mode is the caller's choice; BatchNorm in eval mode uses its running
            statistics).
        x: (N, *input_shape) inputs in the model's input space, on the model's device and dtype.
        y: (N,) labels.
        loss: the training loss.
        params: parameters to call the model with (None: its own).
        batch: examples per forward pass.

    Returns:
        :class:`ExampleStatistics` on the CPU.
    """
    if x.shape[0] != y.shape[0]:
        raise DataReconError(f"{x.shape[0]} examples but {y.shape[0]} labels; pass one label per example")
    losses, confs = [], []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            out = _forward(model, params, x[i:i + batch])
            yb = y[i:i + batch].to(out.device)
            losses.append(per_example_loss(out.to(torch.float64), yb.to(torch.float64) if yb.dtype.is_floating_point
                                           else yb, loss).cpu())
            confs.append(confidence(out, yb, loss).cpu())
    ell = torch.cat(losses) if losses else torch.zeros(0, dtype=torch.float64)
    return ExampleStatistics(loss=ell, probability=torch.exp(-ell),
                             confidence=torch.cat(confs) if confs else torch.zeros(0, dtype=torch.float64))


#: memory the per-example gradients of one vmapped batch may take (bytes)
GRADIENT_MEMORY = 256 * 2**20


def gradient_norms(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *,
                   loss: str | LossFn, batch: int | None = None) -> torch.Tensor:
    """‖∇_θ ℓ(Φ(x_i; θ), y_i)‖₂ for each example, (N,) float64 on the CPU (white-box).

    One ``vmap(grad)`` per batch over the parameters ``params`` (the model's buffers, e.g. batch-norm
    running statistics, are used as they are).

    Args:
        model: the architecture; params: θ by name; x: (N, ...) inputs; y: (N,) labels; loss: the loss.
        batch: examples per vmapped gradient (None: as many as fit in :data:`GRADIENT_MEMORY`, since a batch holds
            batch × #parameters gradient entries).
    """
    fn: Callable[..., torch.Tensor] = resolve_loss(loss)
    names = list(params)
    if batch is None:
        size = sum(p.numel() * p.element_size() for p in params.values())
        batch = max(1, min(256, GRADIENT_MEMORY // max(size, 1)))

    def one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return fn(functional_call(model, p, (xi[None],)), yi[None])

    detached = {n: params[n].detach() for n in names}
    norms = []
    for i in range(0, x.shape[0], batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        try:
            g = vmap(grad(one), in_dims=(None, 0, 0))(detached, xb, yb)
        except RuntimeError:  # a forward vmap cannot batch (data-dependent control flow, in-place ops)
            rows = [grad(one)(detached, xb[j], yb[j]) for j in range(xb.shape[0])]
            g = {n: torch.stack([r[n] for r in rows]) for n in names}
        sq = sum(v.reshape(v.shape[0], -1).to(torch.float64).pow(2).sum(1) for v in g.values())
        norms.append(torch.sqrt(sq).cpu())  # type: ignore[arg-type]
    return torch.cat(norms) if norms else torch.zeros(0, dtype=torch.float64)
