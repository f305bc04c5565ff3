"""Target training: losses/energy, the shared optimisation loop, full-batch ``fit``,
``train_target`` (config -> model directory) and the KKT-regime diagnostics."""

from datarecon.kernel.losses import LOSSES, accuracy, energy, margins, weight_penalty
from datarecon.kernel.step import MarginAscent, TrainingRecipe
from datarecon.training.fit import (
    AscentRecipe,
    training_store,
    FitRecipe,
    FitResult,
    StopRule,
    ascend_margin,
    evaluate,
    fit,
)
from datarecon.training.kkt_regime import (
    KKTRegimeScore,
    homogeneity_degree,
    kkt_regime_score,
    normalised_margin,
    per_sample_gradients,
)
from datarecon.training.optim import OPTIMIZERS, SCHEDULES
from datarecon.training.target import (
    ArchConfig,
    MarginAscentConfig,
    StopConfig,
    TrainConfig,
    TrainResult,
    build_train_config,
    model_card,
    train_target,
)

__all__ = [
    "LOSSES", "OPTIMIZERS", "SCHEDULES", "ArchConfig", "AscentRecipe", "FitRecipe", "FitResult", "KKTRegimeScore",
    "MarginAscent", "TrainingRecipe",
    "MarginAscentConfig", "StopConfig", "StopRule", "TrainConfig", "TrainResult", "accuracy",
    "ascend_margin", "build_train_config", "energy", "evaluate", "fit", "homogeneity_degree", "kkt_regime_score",
    "margins", "model_card", "normalised_margin", "per_sample_gradients", "train_target", "training_store", "weight_penalty",
]
