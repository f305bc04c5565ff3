"""The fields every attack's config has (:class:`AttackConfig`), and how a config is recorded.

Every attack's config subclasses :class:`AttackConfig` (the built-in ones and plug-ins: checked when an
attack is registered), so generic code (the run loop, the probe, the priors, the run record) reads the
same fields of every attack: ``steps``, ``lr_x``, the optimiser and its constants, the priors' weights
and ``dtype``. A method adds its own fields and may change a default (dynamics matching: Adam).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from datarecon.attacks.optim import OPTIMIZERS, OptimizerSettings
from datarecon.config import MAX_STEPS, RecordedConfig
from datarecon.errors import DataReconError
from datarecon.registry import registered
from datarecon.utils.io import to_jsonable

__all__ = ["AttackConfig", "OPTIMIZER_FIELDS", "config_dict"]

#: the AttackConfig field of each optimiser constant (:class:`~datarecon.attacks.optim.OptimizerSettings` name)
OPTIMIZER_FIELDS = {"momentum": "momentum", "nesterov": "nesterov", "adam_beta1": "beta1", "adam_beta2": "beta2",
                    "adam_eps": "eps"}


class AttackConfig(RecordedConfig):
    """The fields every attack has: steps, the candidates' step size and optimiser, the priors' weights and
    the precision. An attack's own config subclasses it (and may change a default).

    Attributes:
        steps: optimisation steps, in [0, MAX_STEPS].
        lr_x: step size of the candidates x, > 0.
        optimizer: a key of :data:`datarecon.attacks.optim.OPTIMIZERS`.
        momentum, nesterov: SGD's momentum in [0, 1) and Nesterov flag.
        adam_beta1, adam_beta2, adam_eps: Adam's constants.
        box_weight: weight of the pixel-box prior (:data:`datarecon.attacks.priors.PRIORS` ``box``), >= 0.
        feature_stats_weight: weight of the feature-statistics prior of batch-norm targets (``feature_stats``), >= 0.
        group_weight: weight of group consistency across runs stepped together (``group``), >= 0.
        pca_weight: weight of the public-data prior (``pca``: the residual outside the public images' principal
            subspace, :mod:`datarecon.attacks.public`), >= 0.
        pca_components: k of that subspace (None: min(1 024, d/3)); set only with ``pca_weight``.
        dtype: the attack's precision.

    An optimiser constant set away from its default for an optimiser that does not read it (``momentum``
    with Adam), and Nesterov without momentum, are refused: they would change nothing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    #: the priors added after runs were recorded: left out of dumps at their default 0 (config hashes kept)
    added_fields: ClassVar[tuple[str, ...]] = ("feature_stats_weight", "group_weight", "pca_weight", "pca_components")

    steps: int = Field(default=1000, ge=0, le=MAX_STEPS, description="optimisation steps")
    lr_x: float = Field(default=0.1, gt=0, description="learning rate of the candidates x")
    optimizer: Annotated[str, registered(OPTIMIZERS)] = Field(default="sgd", description="key of attacks.optim.OPTIMIZERS")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum")
    nesterov: bool = Field(default=False, description="Nesterov momentum (optimizer sgd)")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam's β1 (optimizer adam)")
    adam_beta2: float = Field(default=0.999, ge=0, lt=1, description="Adam's β2 (optimizer adam)")
    adam_eps: float = Field(default=1e-8, gt=0, description="Adam's ε (optimizer adam)")
    box_weight: float = Field(default=1.0, ge=0, description="weight of the pixel-box prior")
    feature_stats_weight: float = Field(default=0.0, ge=0, description="weight of the feature-statistics prior "
                                        "(batch-norm targets)")
    group_weight: float = Field(default=0.0, ge=0, description="weight of group consistency across --runs")
    pca_weight: float = Field(default=0.0, ge=0, description="weight of the public-data prior (residual outside the "
                              "public images' principal subspace)")
    pca_components: int | None = Field(default=None, ge=1, description="principal components of the public-data "
                                       "prior (default min(1024, d/3))")
    dtype: Literal["float32", "float64"] = Field(default="float32", description="float32 | float64")

    @model_validator(mode="after")
    def _constants_of_the_optimiser(self) -> AttackConfig:
        """Refuse a constant of an optimiser the config does not use (it would change nothing)."""
        fields = type(self).model_fields
        if self.optimizer not in OPTIMIZERS:
            return self  # the optimizer field's own error names the valid ones
        read = OPTIMIZERS.get(self.optimizer).settings
        for name, setting in OPTIMIZER_FIELDS.items():
            if setting not in read and getattr(self, name) != fields[name].default:
                owner = next((o for o in OPTIMIZERS.ordered() if setting in OPTIMIZERS.get(o).settings), "another")
                raise DataReconError(f"{name} {getattr(self, name)} is a constant of optimizer {owner!r}, which this "
                                     f"run does not use (optimizer {self.optimizer!r}): pass --optimizer {owner}, or "
                                     f"drop {name}")
        if self.pca_components is not None and not self.pca_weight:
            raise DataReconError(f"pca_components {self.pca_components} does nothing without the public-data prior: "
                                 "pass --pca-weight W (W > 0) with it, or drop pca_components")
        if self.nesterov and not self.momentum and "nesterov" in read:
            raise DataReconError("nesterov without momentum is plain gradient descent (it changes nothing): pass "
                                 "--momentum above 0 with --nesterov, or drop --nesterov")
        return self

    def optimizer_settings(self) -> OptimizerSettings:
        """The optimiser's constants (:class:`~datarecon.attacks.optim.OptimizerSettings`)."""
        return OptimizerSettings(momentum=self.momentum, nesterov=self.nesterov, beta1=self.adam_beta1,
                                 beta2=self.adam_beta2, eps=self.adam_eps)


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a JSON-able mapping (pydantic models, dataclasses or mappings)."""
    if config is None:
        return {}
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if isinstance(config, dict):
        return to_jsonable(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return to_jsonable(dataclasses.asdict(config))
    raise TypeError(f"cannot serialise attack config of type {type(config).__name__}")
