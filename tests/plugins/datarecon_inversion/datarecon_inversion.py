"""A datarecon plug-in: model inversion as an attack, and the logit margin as a membership signal."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from datarecon.attacks.base import Attack, AttackConfig
from datarecon.attacks.mia import SignalDef


class InversionAttack(Attack):
    """Model inversion: candidates the model classifies confidently as their label."""

    name: ClassVar[str] = "inversion"
    config_cls: ClassVar[type] = AttackConfig

    def objective(self, target, prior, x):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean(), "margin": margin.mean()}


def _margin(view) -> torch.Tensor:
    """The true label's logit minus the largest other one (for one output: y times the output)."""
    with torch.no_grad():
        out = torch.func.functional_call(view.model, dict(view.params), (view.x,)).double()
    if out.shape[1] == 1:
        return view.y.double() * out[:, 0]
    true = out.gather(1, view.y.long()[:, None])[:, 0]
    return true - out.scatter(1, view.y.long()[:, None], float("-inf")).max(1).values


MARGIN = SignalDef("black-box", "the true label's logit minus the largest other logit", score=_margin)
