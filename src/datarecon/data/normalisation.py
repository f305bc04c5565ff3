"""Display space <-> model input space.

Display space is float (N, C, H, W) in [0, 1]. Model input space is display
space minus a per-pixel mean (kind ``"unit-minus-mean"``, the mean of the
training images, as in Haim et al. 2022) or display space itself (``"unit"``,
mean = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from datarecon.errors import DataReconError

NormalisationKind = Literal["unit", "unit-minus-mean"]
NORMALISATION_KINDS: tuple[str, ...] = ("unit", "unit-minus-mean")


@dataclass(frozen=True, eq=False)
class Normalisation:
    """Per-pixel shift between display and model input space.

    Attributes:
        kind: "unit" or "unit-minus-mean".
        mean: float32 (C, H, W); zeros for "unit".
    """

    kind: str
    mean: torch.Tensor

    def __post_init__(self) -> None:
        if self.kind not in NORMALISATION_KINDS:
            raise DataReconError(
                f"unknown normalisation {self.kind!r}; valid: {', '.join(NORMALISATION_KINDS)}"
            )
        if not isinstance(self.mean, torch.Tensor) or self.mean.dim() != 3:
            got = tuple(self.mean.shape) if isinstance(self.mean, torch.Tensor) else type(self.mean)
            raise DataReconError(f"normalisation mean must be a (C, H, W) tensor, got {got}")
        if not torch.isfinite(self.mean).all():
            raise DataReconError("normalisation mean has NaN/inf values; re-create the model")
        if self.kind == "unit" and bool(self.mean.ne(0).any()):
            raise DataReconError("normalisation 'unit' needs a zero mean; use 'unit-minus-mean'")

    @classmethod
    def fit(cls, kind: str, x_train: torch.Tensor) -> Normalisation:
        """Build from training images ``x_train`` (N, C, H, W) in display space.

        "unit-minus-mean" stores their per-pixel mean (computed in float64, stored
        float32); "unit" stores zeros.
        """
        if kind == "unit-minus-mean":
            if x_train.shape[0] == 0:
                raise DataReconError("cannot compute a training mean from zero images")
            mean = x_train.to(torch.float64).mean(dim=0).to(torch.float32)
        else:
            mean = torch.zeros(tuple(x_train.shape[1:]), dtype=torch.float32)
        return cls(kind, mean)

    @classmethod
    def from_mean(cls, kind: str, mean: torch.Tensor) -> Normalisation:
        """Rebuild from a saved mean (e.g. ``extras.safetensors['input_mean']``)."""
        if not isinstance(mean, torch.Tensor):
            mean = torch.as_tensor(mean)
        return cls(kind, mean.detach().to("cpu", torch.float32).clone())

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(self.mean.shape)  # type: ignore[return-value]

    def _mean_like(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-3:]) != self.shape:
            raise DataReconError(
                f"images of shape {tuple(x.shape)} do not match the normalisation's "
                f"(C, H, W) = {self.shape}"
            )
        return self.mean.to(device=x.device, dtype=x.dtype)

    def to_model(self, x: torch.Tensor) -> torch.Tensor:
        """Display space (..., C, H, W) -> model input space (new tensor, differentiable)."""
        return x - self._mean_like(x)

    def to_display(self, x: torch.Tensor) -> torch.Tensor:
        """Model input space (..., C, H, W) -> display space (new tensor, not clamped)."""
        return x + self._mean_like(x)

    def model_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-pixel bounds (lo, hi), each (C, H, W), of model inputs whose display is in [0, 1]."""
        return -self.mean.clone(), 1.0 - self.mean
