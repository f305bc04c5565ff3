"""Subspace membership: is an image in the training set of a model? (``datarecon membership``)

The attacker's score (:func:`datarecon.attacks.subspace.subspace_scores`): minus the relative
distance of the first dense layer's input for the image to the layer's training subspace — the top
k right singular vectors of W (weights only) or of W − a·W_init (known initialisation), k = n (or the
upper end of its estimate) with W_init subtracted and, from the weights alone, every direction down
to the spectrum's floor (:func:`datarecon.attacks.subspace.analyse`). A training image lies in the span
(distance ≈ 0 with a known initialisation); an unseen image of the same distribution does not.

Two uses:

* :func:`score_images`: a user's own images, each with a p-value against a **null the user can see**
  (images known not to be members: by default the model's held-out test images, read through its
  data spec) and a member / non-member call at a chosen false-positive rate, the threshold being
  calibrated on that null;
* :func:`evaluate_membership`: the power of the test on the model's own training images against the
  images its data spec names as non-members (held-out test images and the disjoint partition;
  ground truth: an evaluation), as ROC AUC with a bootstrap interval and TPR at 1 % / 0.1 % FPR
  (:func:`datarecon.evaluation.membership.membership_roc`).

Model directories only (their normalisation maps display images to model inputs); a user's own
``nn.Module`` is scored in Python with :func:`~datarecon.attacks.subspace.subspace_scores` on a
:meth:`~datarecon.attacks.base.Target.from_module` target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.errors import DataReconError

__all__ = ["MembershipSetup", "evaluate_membership", "prepare_membership", "score_images"]


@dataclass(frozen=True)
class MembershipSetup:
    """The model as the attacker sees it, its subspace and its input normalisation.

    Attributes:
        target: the attacker's view (float64).
        analysis: :class:`~datarecon.attacks.subspace.SubspaceAnalysis` of the first dense layer.
        mean: (C, H, W) display → model shift (model input = display − mean).
        meta: model.json.
        threat: the threat-model record (:func:`~datarecon.attacks.knowledge.threat_model`).
    """

    target: Any
    analysis: Any
    mean: torch.Tensor
    meta: dict[str, Any]
    threat: dict[str, Any]

    def scores(self, display: torch.Tensor) -> np.ndarray:
        """Scores (higher = member) of display-space images (N, C, H, W)."""
        from datarecon.attacks.subspace import subspace_scores

        x = display.to(torch.float64) - self.mean.to(torch.float64)
        return subspace_scores(self.target.model, self.target.params, self.analysis, x).numpy()


def prepare_membership(model_dir: str | Path, *, knowledge: KnowledgeSettings | None = None) -> MembershipSetup:
    """Load the model directory, resolve the attacker's knowledge and analyse the first dense layer.

    Raises:
        DataReconError: a bad model directory or known initialisation; no dense layer; a known n
            larger than the layer allows.
    """
    from datarecon.attacks.base import AttackerPrior, Target
    from datarecon.experiments.reconstruct import attacker_knowledge
    from datarecon.models.checkpoint import EXTRAS, read_model_meta
    from datarecon.utils.io import load_tensors

    meta = read_model_meta(model_dir)
    target = Target.from_model_dir(model_dir, dtype=torch.float64)
    mean = load_tensors(Path(model_dir) / EXTRAS)["input_mean"].to(torch.float64)
    prior = AttackerPrior.balanced(m=1, num_outputs=target.num_outputs, input_shape=target.input_shape)
    prior, threat = attacker_knowledge(target, prior, knowledge or KnowledgeSettings(), model_meta=meta)
    if prior.subspace is None:
        raise DataReconError(f"{model_dir}: the model has no dense layer to analyse; membership needs an MLP or a "
                             "CNN with a linear read-out")
    return MembershipSetup(target=target, analysis=prior.subspace, mean=mean, meta=meta, threat=threat)


def _task(meta: dict[str, Any], data_dir: str | Path | None) -> Any:
    from datarecon.data import DataSpec, load_task

    return load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)


def score_images(model_dir: str | Path, images: str | Path, *, null: str | Path | None = None,
                 knowledge: KnowledgeSettings | None = None, fpr: float = 0.01,
                 data_dir: str | Path | None = None) -> dict[str, Any]:
    """Score a user's images against the model, with a threshold calibrated on a visible null.

    Args:
        model_dir: the model directory.
        images: a folder of PNGs, an .npz or a .safetensors file (:func:`datarecon.data.images.load_images`).
        null: images known not to be members, same forms; None: the model's held-out test images.
        knowledge: the attacker's knowledge (known θ_init, n).
        fpr: the false-positive rate of the member call, in (0, 1).
        data_dir: data folder (the default null).

    Returns:
        JSON-ready: ``images`` (name, score, distance, p_value, member), ``threshold``, ``null``
        (source, count, score quantiles), ``subspace`` (the analysis), ``knowledge`` (threat model).

    Raises:
        DataReconError: bad images or null (one line), an fpr outside (0, 1), a model without
            held-out images and no ``null``.
    """
    from datarecon.data.images import load_images
    from datarecon.evaluation.membership import calibrated_threshold

    if not 0.0 < fpr < 1.0:
        raise DataReconError(f"--fpr must lie in (0, 1), got {fpr}; e.g. 0.01")
    t0 = time.perf_counter()
    setup = prepare_membership(model_dir, knowledge=knowledge)
    shape = tuple(setup.target.input_shape)
    x, names = load_images(images, input_shape=shape)
    if null is not None:
        xn, _ = load_images(null, input_shape=shape)
        source = str(null)
    else:
        task = _task(setup.meta, data_dir)
        if len(task.heldout) == 0:
            raise DataReconError(f"{model_dir} has no held-out images to calibrate on; pass --null with images "
                                 "known not to be training images")
        xn, source = task.heldout.x, "the model's held-out test images (its data spec)"
    s, sn = setup.scores(x), setup.scores(xn)
    thr = calibrated_threshold(sn, fpr)
    pvals = (1.0 + (sn[None, :] >= s[:, None]).sum(1)) / (1.0 + sn.size)
    rows = [{"name": nm, "score": float(v), "distance": float(-v), "p_value": float(p), "member": bool(v >= thr)}
            for nm, v, p in zip(names, s, pvals, strict=True)]
    notes = []
    if sn.size < int(np.ceil(1.0 / fpr)):
        notes.append(f"the null has {sn.size} images, fewer than 1/fpr = {int(np.ceil(1 / fpr))}: the false-positive "
                     "rate is not resolved; pass a larger --null")
    return {"model": str(model_dir), "fpr": fpr, "threshold": thr, "threshold_distance": -thr,
            "images": rows, "members": int(sum(r["member"] for r in rows)), "n_images": len(rows),
            "null": {"source": source, "count": int(sn.size),
                     "distance_quantiles": {q: float(np.quantile(-sn, q)) for q in (0.01, 0.5, 0.99)}},
            "subspace": setup.analysis.summary(), "knowledge": setup.threat, "notes": notes,
            "wall_time_s": time.perf_counter() - t0}


def evaluate_membership(model_dir: str | Path, *, knowledge: KnowledgeSettings | None = None,
                        data_dir: str | Path | None = None) -> dict[str, Any]:
    """The test's power on the model's own training images vs its held-out and partition images (ground truth).

    Returns:
        JSON-ready: ``roc`` (:meth:`~datarecon.evaluation.membership.MembershipROC.summary`),
        ``line`` (one line), ``distances`` (median for each class), ``subspace``, ``knowledge``.

    Raises:
        DataReconError: no held-out images in the model's data spec; missing data.
    """
    from datarecon.evaluation.membership import membership_roc

    t0 = time.perf_counter()
    setup = prepare_membership(model_dir, knowledge=knowledge)
    task = _task(setup.meta, data_dir)
    if len(task.heldout) == 0:
        raise DataReconError(f"{model_dir} was trained without held-out images (n_heldout_per_class 0); retrain "
                             "with --n-heldout-per-class, or score images against your own --null")
    outside = torch.cat([task.heldout.x, task.partition.x]) if len(task.partition) else task.heldout.x
    s_in, s_out = setup.scores(task.train.x), setup.scores(outside)
    roc = membership_roc(s_in, s_out, name="subspace")
    return {"model": str(model_dir), "roc": roc.summary(), "line": roc.line(),
            "distances": {"members_median": float(np.median(-s_in)), "nonmembers_median": float(np.median(-s_out))},
            "subspace": setup.analysis.summary(), "knowledge": setup.threat, "wall_time_s": time.perf_counter() - t0}
