"""Target training: losses/energy, the shared optimisation loop, full-batch ``fit``,
``train_target`` (config -> model directory) and the KKT-regime diagnostics."""

from datarecon.training.fit import (
    AscentRecipe,
    FitRecipe,
    FitResult,
    StopRule,
    TrainingCheckpoint,
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
from datarecon.kernel.losses import LOSSES, accuracy, energy, margins, weight_penalty
from datarecon.training.optim import OPTIMIZERS, SCHEDULES

__all__ = [
    "LOSSES", "OPTIMIZERS", "SCHEDULES", "AscentRecipe", "FitRecipe", "FitResult", "KKTRegimeScore", "StopRule", "TrainingCheckpoint",
    "accuracy", "ascend_margin", "energy", "evaluate", "fit", "homogeneity_degree", "kkt_regime_score", "margins",
    "normalised_margin", "per_sample_gradients", "weight_penalty",
]


def __getattr__(name: str):  # lazy: train_target pulls in datarecon.data
    if name in ("TrainConfig", "ArchConfig", "StopConfig", "TrainResult", "train_target", "model_card",
                "build_train_config", "MarginAscentConfig"):
        from datarecon.training import target

        return getattr(target, name)
    raise AttributeError(name)
