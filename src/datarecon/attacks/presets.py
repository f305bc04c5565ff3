"""Attack-setting presets: a published recipe's settings under one name, defined once.

A preset is a mapping of run fields (``attack``, ``init``, ``knowledge``; :class:`~datarecon.experiments.
reconstruct.ReconstructionRun`'s names) that ``datarecon reconstruct --preset NAME`` (and ``RunLayers(preset=...)``,
the leakage map's setting axis) lays under the run file, the flags and ``--set``: anything given explicitly wins, and
the run records the resolved fields (a preset changes no run key: a run with the preset and the same run with its
fields spelled out are one run).

* ``gradient-inversion``: the fine-tuning rows' settings after Geiping et al. (2020), "Inverting Gradients": Adam at
  0.1 on the gradient's sign, the step ÷ 10 at 3/8, 5/8 and 7/8 of the steps, total variation 0.8 per pixel in
  [0, 1] pixels (breaching's 0.2 in normalised pixels), the cosine objective, a uniform start (docs/DESIGN.md).
* ``simudy``: SimuDy's reference schedule (Tian et al., ICLR 2025; BlueBlood6/SimuDy ``recons.py``): Adam at 0.01 with
  β = (0.8, 0.9) under torch's ``CosineAnnealingLR`` with T_max 100 stepped every outer step (period 200 steps), the
  cosine objective plus total variation 1e-3 (its 0.1 · 0.01 · (mean |dx| + mean |dy|)) and no pixel-box term
  (``box_weight`` 0: the reference has none), a Gaussian start of scale 0.5 and balanced labels. Not carried over: the reference's clipping of the simulated gradient's norm to 5 when it
  exceeds 20 in its first 5 of 20 epochs of 1 500 steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from datarecon.registry import Registry

__all__ = ["PRESETS", "Preset"]


@dataclass(frozen=True)
class Preset:
    """A named set of run fields.

    Attributes:
        fields: nested run fields (``attack`` with its ``method``, ``init`` with its ``name``, ``knowledge``).
        description: one line for help and docs.
        reference: where the numbers come from.
    """

    fields: Mapping[str, Any]
    description: str
    reference: str = ""

    @property
    def method(self) -> str:
        """The attack method the preset's fields belong to."""
        return str(self.fields["attack"]["method"])

    def run_fields(self) -> dict[str, Any]:
        """The fields as a plain nested mapping (a copy)."""
        return {k: dict(v) for k, v in self.fields.items()}


PRESETS: Registry[Preset] = Registry("preset")
PRESETS.register("gradient-inversion", Preset(
    MappingProxyType({"attack": {"method": "dynamics", "lr_x": 0.1, "signed": True, "lr_schedule": "step",
                                 "tv_weight": 0.8, "objective": "cosine"},
                      "init": {"name": "uniform"}}),
    "signed Adam 0.1, step decay at 3/8, 5/8, 7/8, TV 0.8, cosine objective, uniform start",
    "Geiping et al. (2020), Inverting Gradients (the fine-tuning rows of docs/RESULTS.md)"))
PRESETS.register("simudy", Preset(
    MappingProxyType({"attack": {"method": "dynamics", "optimizer": "adam", "lr_x": 0.01, "adam_beta1": 0.8,
                                 "adam_beta2": 0.9, "lr_schedule": "cosine", "cosine_t_max": 100, "signed": False,
                                 "tv_weight": 1e-3, "box_weight": 0.0, "objective": "cosine"},
                      "init": {"name": "gaussian", "scale": 0.5},
                      "knowledge": {"labels": "balanced"}}),
    "Adam 0.01, betas 0.8/0.9, cosine-annealed (T_max 100), TV 1e-3, no box term, cosine objective, Gaussian "
    "start 0.5, balanced labels",
    "Tian et al. (2025), SimuDy, ICLR; BlueBlood6/SimuDy recons.py"))
