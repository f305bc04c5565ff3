"""The architecture, early-stop and margin-ascent parts of a training config (:class:`~datarecon.training.target.TrainConfig`).

Each is a frozen pydantic model, one-to-one with its block of a YAML/TOML training file (``arch:``,
``stop:``, ``margin_ascent:``); fields added after model directories were written with them are left
out of their dumps while unset, so those directories' config hashes stay what they were.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AliasChoices, ConfigDict, Field, field_validator, model_validator

from datarecon.config import MAX_STEPS, RecordedConfig
from datarecon.errors import DataReconError
from datarecon.kernel.step import MarginAscent
from datarecon.models.spec import ARCHITECTURES, ArchSpec
from datarecon.registry import registered
from datarecon.training.fit import StopRule

__all__ = ["ArchConfig", "MarginAscentConfig", "StopConfig"]

class ArchConfig(RecordedConfig):
    """The architecture fields a user chooses; input shape and output count come from the data.

    Attributes:
        name: ``ARCHITECTURES`` key.
        hidden: hidden widths, for ``cnn`` the channels of each convolution (None: the architecture's default).
        bias: linear layers with biases (False gives a homogeneous network for the KKT attack).
        init_scale: std of the first layer's N(0,1) weights (Haim: 1e-4); None: PyTorch default.
        kernel: convolution kernel side (``cnn`` only; None: 3).
        batch_norm: a batch norm after every convolution (ResNets only): train mode from scratch, eval
            mode (running statistics frozen, affine weights trained) when fine-tuning from --pretrained.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    added_fields: ClassVar[tuple[str, ...]] = ("batch_norm",)  # off: hashes as before

    name: Annotated[str, registered(ARCHITECTURES)] = "mlp"
    hidden: tuple[int, ...] | None = None
    bias: bool = True
    init_scale: float | None = Field(default=None, gt=0)
    kernel: int | None = Field(default=None, ge=1)
    batch_norm: bool = False


    @field_validator("hidden")
    @classmethod
    def _positive(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and any(h <= 0 for h in v):
            raise ValueError(f"hidden widths must be positive, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _normalised_resnet(self) -> ArchConfig:
        if self.batch_norm and ARCHITECTURES.get(self.name).blocks is None:
            resnets = [n for n in ARCHITECTURES.names() if ARCHITECTURES.get(n).blocks is not None]
            raise DataReconError(f"batch_norm applies to the ResNets ({', '.join(resnets)}), not {self.name!r}; "
                                 "drop --batch-norm")
        return self

    def spec(self, *, input_shape: tuple[int, ...], num_outputs: int) -> ArchSpec:
        """The full :class:`ArchSpec` for data of ``input_shape`` and ``num_outputs`` outputs."""
        return ArchSpec(name=self.name, input_shape=tuple(input_shape), num_outputs=num_outputs,
                        hidden=self.hidden, bias=self.bias, init_scale=self.init_scale, kernel=self.kernel,
                        batch_norm=self.batch_norm)


class StopConfig(RecordedConfig):
    """Early stops of the epochs (see :class:`datarecon.training.fit.StopRule`); all off by default.

    Attributes:
        loss_threshold: stop once the training loss falls below this (None: off).
        zero_error: stop at zero training error.
        margin_patience: stop once the normalised margin has been stable over this many epochs (0: off).
        margin_stable_rtol: the epochs' margin stop (with margin_patience): the normalised margin counts as stable
            when it changed by at most this fraction between two checks margin_patience epochs apart (not the
            margin ascent's convergence tolerance, margin_ascent.rtol; called margin_rtol before)
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    # model directories written before the rename record it as margin_rtol (and keep their hashes)
    renamed_fields: ClassVar[dict[str, str]] = {"margin_stable_rtol": "margin_rtol"}

    loss_threshold: float | None = Field(default=None, gt=0)
    zero_error: bool = False
    margin_patience: int = Field(default=0, ge=0)
    margin_stable_rtol: float = Field(default=1e-4, gt=0,
                                      validation_alias=AliasChoices("margin_stable_rtol", "margin_rtol"))

    def check_applies(self) -> None:
        """Refuse a margin-stop tolerance without the margin stop (``margin_patience`` 0): it would do nothing. Checked
        where a training is asked for (``datarecon train``), not on reading a model directory's record.

        Raises:
            DataReconError: naming the option it needs.
        """
        if not self.margin_patience and self.margin_stable_rtol != type(self).model_fields["margin_stable_rtol"].default:
            raise DataReconError(f"stop margin_stable_rtol {self.margin_stable_rtol:g} (--margin-stable-rtol) is the "
                                 "tolerance of the epochs' margin stop, which is off (margin_patience 0): pass "
                                 "--margin-patience N (N >= 1), or drop --margin-stable-rtol")

    def rule(self) -> StopRule:
        return StopRule(loss_threshold=self.loss_threshold, zero_error=self.zero_error,
                        margin_patience=self.margin_patience, margin_stable_rtol=self.margin_stable_rtol)


class MarginAscentConfig(RecordedConfig):
    """Margin ascent after the GD epochs (:func:`datarecon.training.fit.ascend_margin`); off when ``steps`` is 0.

    Minimises log L on the sphere ‖θ‖ = R (R the norm GD reached): for a homogeneous network on
    separated data it keeps raising the normalised margin towards a KKT point of the max-margin
    problem after the loss has stalled (:mod:`datarecon.training.margin`).

    Attributes:
        steps: number of ascent steps (one forward/backward each); 0 disables the stage.
        step_size: initial angle of a step on the sphere (radians).
        growth: factor on the angle after an accepted step (a rejected step halves it).
        max_step: largest angle.
        min_step: the stage stops once the angle falls below this (converged to that resolution).
        rtol: run the ascent to convergence: stop once the normalised margin rose by less than this fraction of
            its value over the last ``window`` steps (``steps`` is then the budget); None: run ``steps`` steps (not
            the epochs' margin stop, stop.margin_stable_rtol).
        window: steps between the convergence checks and the points of the margin curve the model card
            shows (the identifiability gap is measured at 1, 2, 4, ... windows and at the end).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    added_fields: ClassVar[tuple[str, ...]] = ("rtol", "window")  # a fixed step count with the default window: hashes as before

    steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    step_size: float = Field(default=0.01, gt=0, le=1)
    growth: float = Field(default=1.1, ge=1)
    max_step: float = Field(default=0.1, gt=0, le=1)
    min_step: float = Field(default=1e-6, gt=0)
    rtol: float | None = Field(default=None, gt=0, lt=1)
    window: int = Field(default=500, ge=1, le=MAX_STEPS)

    @model_validator(mode="after")
    def _ordered(self) -> MarginAscentConfig:
        fields = type(self).model_fields
        idle = [f for f in fields if f != "steps" and getattr(self, f) != fields[f].default]
        if not self.steps and idle:
            flag = "--margin-ascent-" + idle[0].replace("_", "-")
            raise DataReconError(f"margin_ascent {idle[0]} {getattr(self, idle[0])} ({flag}) does nothing without "
                                 "ascent steps (margin_ascent.steps is 0): pass --margin-ascent-steps N (N >= 1), or "
                                 f"drop {flag}")
        if self.step_size > self.max_step:
            raise DataReconError(f"margin_ascent step_size {self.step_size} exceeds max_step {self.max_step}; "
                                 "lower step_size or raise max_step")
        if self.rtol is not None and self.steps < self.window:
            raise DataReconError(f"margin_ascent rtol stops at a window of {self.window} steps, but the budget "
                                 f"(steps) is {self.steps}: pass a budget of at least one window, e.g. "
                                 "--margin-ascent-steps 20000")
        if self.min_step >= self.step_size:
            raise DataReconError(f"margin_ascent min_step {self.min_step:g} is not below step_size {self.step_size:g}, "
                                 "so the stage would stop before its first step; lower min_step "
                                 "(--margin-ascent-min-step) below step_size")
        return self

    def recipe(self) -> MarginAscent:
        """The settings of :func:`~datarecon.training.fit.ascend_margin`."""
        return MarginAscent(steps=self.steps, step_size=self.step_size, growth=self.growth, max_step=self.max_step,
                            min_step=self.min_step, rtol=self.rtol, window=self.window)
