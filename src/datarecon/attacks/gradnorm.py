"""The gradient-norm attack (Runkel et al. 2024, eq. 3): min_x ‖∇_θ E(x, y; θ*)‖², E the target's training
energy (its loss and weight decay) on the surrogate network, plus the priors the config weighs.

Its objective is all it writes: the interface's step differentiates it in x, adds the priors
(:func:`~datarecon.attacks.priors.add_priors`: the pixel box, the feature statistics of batch-norm targets,
group consistency across ``--runs``) and applies the optimiser.

References:
    Runkel et al. (2024), "Training data reconstruction: privacy due to uncertainty?", eq. 3.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.kkt_target import SurrogateAttack, SurrogateAttackConfig
from datarecon.attacks.selection import SelectionContext, select
from datarecon.errors import DataReconError
from datarecon.kernel.losses import LOSSES

__all__ = ["GradNormAttack", "GradNormConfig"]


class GradNormConfig(SurrogateAttackConfig):
    """Gradient-norm attack (Runkel et al. 2024, eq. 3): min_x ‖∇_θ E(x, y; θ*)‖² + the priors."""


class GradNormAttack(SurrogateAttack):
    """Runkel eq. 3: min_x ‖∇_θ E(x, y; θ*)‖² (+ the priors), E with the target's loss and weight decay."""

    name: ClassVar[str] = "gradnorm"
    config_cls: ClassVar[type[Any]] = GradNormConfig
    divergence_hint: ClassVar[str] = "lower lr_x or the surrogate sharpness alpha"

    def initial_variables(self, target: Target, prior: AttackerPrior, *, x: torch.Tensor,
                          generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x₀ (refused: float labels for a loss of integer classes)."""
        entry = LOSSES.get(target.loss) if isinstance(target.loss, str) else None
        if entry is not None and entry.label_kind == "multiclass" and prior.labels.is_floating_point():
            raise DataReconError(f"loss {target.loss!r} needs integer class labels")
        return {"x": x}

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
                  **variables: torch.Tensor) -> dict[str, Any]:
        """``residual`` = ‖∇_θ E(x, y; θ*)‖² (the ``loss``) and ``rel_residual`` = residual / ‖θ*‖² (a float)."""
        prep = self.prepared(target)
        g = kkt_math.energy_gradient(prep.forward, prep.params, x, self.labels(prior, x.device), loss=target.loss,
                                     weight_decay=target.weight_decay, create_graph=True)
        residual = kkt_math.squared_norm(g)
        return {"loss": residual, "residual": residual,
                "rel_residual": float(residual.detach()) / max(prep.theta_sq, 1e-300)}

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        prep = self.prepared(target)
        x = state["x"]
        ctx = SelectionContext(forward=prep.exact_forward, params=prep.params, x=x,
                               labels=self.labels(prior, x.device), lam=torch.ones(x.shape[0], dtype=x.dtype),
                               formulation=None, loss=target.loss, weight_decay=target.weight_decay,
                               lambda_min=None, dup_threshold=self.config.dup_threshold)
        scores, criteria = select(ctx)
        scores.pop("lambda", None)
        scores.pop("contribution", None)
        return scores, {"formulation": "gradnorm", "notes": [], "selection": criteria}
