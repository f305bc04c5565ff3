"""A user's own images scored against a model directory, each signal with a p-value against a null the user can
see (by default the model's held-out test images), and a member call at a false-positive rate calibrated on it.

Every signal whose needs the images meet is scored by its registry entry (:func:`~datarecon.attacks.mia.
measure_signals`): the black-box and white-box ones always (the subspace where the first dense layer reads the
images), and against the reference models a membership folder keeps the ones that need no model trained on the
images (LiRA offline, RMIA, a plug-in's): none of those models trained on them, so the online signals are not.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.attacks.mia import SIGNALS, MIASettings, SignalView, measure_signals
from datarecon.attacks.mia.statistics import example_statistics
from datarecon.data.images import load_images, load_labels
from datarecon.errors import DataReconError
from datarecon.evaluation.membership import calibrated_threshold, min_negatives
from datarecon.experiments.membership.case import MembershipSetup, model_task, prepare_membership, training_config
from datarecon.experiments.membership.folder import RESULT_FILE, kept_folder, ready_folder
from datarecon.experiments.membership.reference_store import (POOL_FILE, ReferencePool, done_record,
                                                              kept_references, load_reference_model,
                                                              load_statistics)
from datarecon.experiments.membership.settings import Calibration, Runtime
from datarecon.experiments.membership.trainers import RecipeTrainer
from datarecon.kernel.files import MEMBERSHIP_IMAGES
from datarecon.kernel.outdir import OutDir
from datarecon.utils.io import atomic_write_json, read_json

__all__ = ["IMAGES_FILE", "score_images"]

#: the file of a membership folder that holds the scores of a user's images
IMAGES_FILE = MEMBERSHIP_IMAGES


@dataclass(frozen=True)
class Labelled:
    """Display images with labels (given, or the model's predictions), and where the labels came from."""

    x: torch.Tensor
    y: torch.Tensor
    names: list[str]
    labels: str


def _labelled(setup: MembershipSetup, x: torch.Tensor, y: np.ndarray | None, names: list[str]) -> Labelled:
    """Labels in the model's convention: the given ones (checked), else the model's own predictions."""
    target = setup.target
    binary = target.num_outputs == 1
    if y is None:
        with torch.no_grad():
            out = target.forward(setup.inputs(x))
        pred = torch.where(out[:, 0] >= 0, 1.0, -1.0).double() if binary else out.argmax(1)
        return Labelled(x, pred, names, "the model's predictions (no labels given)")
    if binary:
        if not np.isin(y, (-1, 1)).all():
            raise DataReconError("labels of a one-output model must be -1 or +1")
        return Labelled(x, torch.as_tensor(y, dtype=torch.float64), names, "given")
    if not (np.equal(np.mod(y, 1), 0).all() and y.min() >= 0 and y.max() < target.num_outputs):
        raise DataReconError(f"labels must be class indices 0..{target.num_outputs - 1}")
    return Labelled(x, torch.as_tensor(y, dtype=torch.int64), names, "given")


@dataclass(frozen=True)
class KeptReferences:
    """The reference models a membership folder keeps, as the image signals read them: their statistics on the
    population, the models themselves, the target's loss on the population and the recipe's loss."""

    stats: Any
    models: list[tuple[torch.nn.Module, torch.Tensor]]
    population_loss: torch.Tensor
    loss: Any

    def on(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        """The kept models' statistics on display images ``x`` with labels ``y``; none of them trained on them."""
        ref = [example_statistics(m, (x - mean).to(next(m.parameters()).dtype), y, loss=self.loss)
               for m, mean in self.models]
        conf = torch.stack([r.confidence for r in ref])
        return dataclasses.replace(self.stats, confidence=conf, loss=torch.stack([r.loss for r in ref]),
                                   inside=torch.zeros_like(conf, dtype=torch.bool))


def _kept(setup: MembershipSetup, out: Path, kept: list[int]) -> KeptReferences:
    """The kept reference models of ``out`` (indices ``kept``), checked to be those of its pool."""
    trainer = RecipeTrainer(training_config(setup.meta))
    pool = ReferencePool.load(out / POOL_FILE)
    if any(done_record(out, k).get("pool") != pool.fingerprint() for k in kept):
        raise DataReconError(f"{out / POOL_FILE} is not the pool its reference models were trained on (changed or "
                             f"damaged); rerun the --evaluate call into {out} with --overwrite to train them again")
    stats = load_statistics(out, max(kept) + 1).select(kept)
    target = setup.target
    z = example_statistics(target.model, setup.inputs(pool.z_x), pool.z_y, loss=target.loss, params=target.params)
    return KeptReferences(stats=stats, models=[load_reference_model(out, k, trainer) for k in kept],
                          population_loss=z.loss, loss=trainer.loss)


def _image_signals(setup: MembershipSetup, sets: list[Labelled], out: Path | None,
                   attacks: MIASettings) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """Every signal whose needs the images meet, for each set (against the reference models kept in ``out``); and
    notes."""
    kept = kept_references(out)
    refs = _kept(setup, out, kept) if kept and out is not None else None
    target = setup.target
    results = []
    for s in sets:
        x = setup.inputs(s.x)
        stats = example_statistics(target.model, x, s.y, loss=target.loss, params=target.params)
        view = SignalView(model=target.model, params=target.params, x=x, y=s.y, loss=target.loss, stats=stats,
                          analysis=setup.subspace, refs=None if refs is None else refs.on(s.x, s.y),
                          population_loss=None if refs is None else refs.population_loss, settings=attacks)
        scores, _ = measure_signals(view)
        results.append({k: v.numpy() for k, v in scores.items()})
    notes = []
    if kept:
        notes.append(f"the reference signals use the {len(kept)} reference models kept in {out} (none trained on "
                     "these images); the online signals need models trained on them and are not available")
    return results, notes


def _pick_signal(signal: str, available: list[str], out: Path | None, labels: str) -> tuple[str, str]:
    """The member call's signal: the one asked for, or (``auto``) the strongest of an evaluation kept in ``out``
    when available for images, else the loss with given labels, else the subspace where it applies."""
    if signal != "auto":
        SIGNALS.get(signal)
        if signal not in available:
            raise DataReconError(f"signal {signal!r} is not available for these images (available: "
                                 f"{', '.join(available)}); choose one of them or auto")
        return signal, "chosen with --signal"
    if out is not None and (out / RESULT_FILE).is_file():
        best = (read_json(out / RESULT_FILE).get("strongest") or {}).get("name")
        if best in available:
            return best, f"the strongest signal of the evaluation in {out}"
    if labels == "given" or "subspace" not in available:
        return "loss", "auto: no evaluation in --out to take the strongest signal from; the loss threshold"
    return "subspace", "auto: no evaluation in --out and no labels; the subspace test (needs none)"


def score_images(model_dir: str | Path, images: str | Path, *, calibration: Calibration = Calibration(),
                 knowledge: KnowledgeSettings | None = None, out: str | Path | OutDir | None = None,
                 attacks: MIASettings = MIASettings(), runtime: Runtime = Runtime()) -> dict[str, Any]:
    """Score a user's images against the model, each signal with a p-value against a visible null.

    Args:
        model_dir: the model directory.
        images: a folder of PNGs, an .npz or a .safetensors file (:func:`datarecon.data.images.load_images`);
            labels as array ``y`` of the file (else the model's predictions are taken).
        calibration: the null (images known not to be members, same forms; None: the model's held-out test
            images), the member call's false-positive rate in (0, 1) and its signal (a
            :data:`~datarecon.attacks.mia.SIGNALS` name or ``auto``).
        knowledge: the attacker's knowledge (known θ_init, n) for the subspace signal.
        out: a claimed membership folder (its kept reference models add LiRA offline and RMIA; the result
            goes to ``images.json``); None: nothing is written.
        attacks: the reference attacks' settings.
        runtime: the data folder (the default null).

    Returns:
        JSON-ready: ``images`` (name, score, p_value, member, and every signal's score and p-value),
        ``signal``, ``signal_rule``, ``threshold``, ``null``, ``labels``, ``knowledge``, ``notes``.

    Raises:
        DataReconError: bad images, labels or null (one line), an fpr outside (0, 1), an unknown signal or
            one not available, a model without held-out images and no ``null``.
    """
    null, fpr, signal = calibration.null, calibration.fpr, calibration.signal
    if not 0.0 < fpr < 1.0:
        raise DataReconError(f"--fpr must lie in (0, 1), got {fpr}; e.g. 0.01")
    if signal != "auto":
        SIGNALS.get(signal)
    t0 = time.perf_counter()
    setup = prepare_membership(model_dir, knowledge=knowledge)
    shape = tuple(setup.target.input_shape)
    x, names = load_images(images, input_shape=shape)
    mine = _labelled(setup, x, load_labels(images, count=x.shape[0]), names)
    nul, source = _null(setup, null, model_dir, runtime.data_dir)
    kept = kept_folder(out, model_dir)
    (s_img, s_null), notes = _image_signals(setup, [mine, nul], kept, attacks)
    chosen, rule = _pick_signal(signal, list(s_img), kept, mine.labels)
    thr = calibrated_threshold(s_null[chosen], fpr)
    pvals = {k: (1.0 + (s_null[k][None, :] >= s_img[k][:, None]).sum(1)) / (1.0 + s_null[k].size) for k in s_img}
    rows = [{"name": nm, "score": float(s_img[chosen][i]), "p_value": float(pvals[chosen][i]),
             "member": bool(s_img[chosen][i] >= thr),
             "signals": {k: {"score": float(s_img[k][i]), "p_value": float(pvals[k][i])} for k in s_img}}
            for i, nm in enumerate(mine.names)]
    if s_null[chosen].size < min_negatives(fpr):
        notes.append(f"the null has {s_null[chosen].size} images, fewer than 1/fpr = {min_negatives(fpr)}: the "
                     "false-positive rate is not resolved; pass a larger --null")
    if mine.labels != "given":
        notes.append("no labels were given (array y of the .npz or .safetensors file): the model's own predictions "
                     "are the labels, which makes the loss-based signals weaker")
    result = {"model": str(model_dir), "fpr": fpr, "signal": chosen, "signal_rule": rule, "threshold": thr,
              "images": rows, "members": int(sum(r["member"] for r in rows)), "n_images": len(rows),
              "labels": mine.labels, "null": {"source": source, "count": int(s_null[chosen].size), "labels": nul.labels},
              "knowledge": setup.threat, "notes": notes, "wall_time_s": time.perf_counter() - t0}
    outp = ready_folder(out, model_dir)  # every input accepted: only now is the folder written
    if outp is not None:
        atomic_write_json(outp / IMAGES_FILE, result)
    return result


def _null(setup: MembershipSetup, null: Path | None, model_dir: str | Path,
          data_dir: str | Path | None) -> tuple[Labelled, str]:
    """The null images of a member call (the given ones, else the model's held-out test images) and their source."""
    if null is not None:
        xn, names = load_images(null, input_shape=tuple(setup.target.input_shape))
        return _labelled(setup, xn, load_labels(null, count=xn.shape[0]), names), str(null)
    task = model_task(setup.meta, data_dir)
    if len(task.heldout) == 0:
        raise DataReconError(f"{model_dir} has no held-out images to calibrate on; pass --null with images known not "
                             "to be training images")
    return Labelled(task.heldout.x, task.heldout.y, [], "given"), "the model's held-out test images (its data spec)"
