"""Full-batch training of a network on in-memory tensors, built on :class:`~datarecon.kernel.engine.Engine`.

:func:`fit` minimises the training energy (Runkel et al. 2024, lower level of eq. 2)

    E(θ) = (1/n) Σ_i L(Φ(x_i; θ), y_i) + (wd/2)·‖θ‖²

with one full-batch update per epoch. Hooks give the progress bar, the history, the NaN stop,
the stop conditions (loss threshold, zero training error, margin stabilisation) and periodic
training checkpoints (:mod:`datarecon.kernel.checkpoint`, written atomically) from which a killed run resumes
bit-identically (same device, same dtype).

Every epoch's metrics describe θ_t *before* that epoch's update: ``loss`` (mean data loss),
``energy``, ``train_acc``, ``min_margin``, ``weight_norm``, ``normalised_margin``
(min margin / ‖θ‖^L, L = number of linear layers), ``grad_norm`` and ``lr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datarecon.kernel import checkpoint
from datarecon.errors import CheckpointError, DataReconError
from datarecon.kernel.status import Status
from datarecon.kernel.step import batch_order, energy
from datarecon.kernel.engine import BaseHook, Checkpoint, Engine, History, Hook, LoopState, NaNStop, ProgressBar
from datarecon.training.kkt_regime import homogeneity_degree, normalised_margin
from datarecon.kernel.losses import LOSSES, accuracy, margins, squared_norm
from datarecon.training.margin import EXP_TAILED, MarginAscentStepper, log_mean_loss
from datarecon.training.optim import OPTIMIZERS, SCHEDULES, USES_PRECOMPUTED_GRAD

@dataclass(frozen=True)
class StopRule:
    """When to stop before ``epochs`` (all off by default).

    Attributes:
        loss_threshold: stop once the mean data loss is ≤ this.
        zero_error: stop once every training sample is classified correctly.
        margin_patience: check every ``margin_patience`` epochs, after zero training error, whether
            the normalised margin changed by less than ``margin_rtol`` (relative) since the previous
            check; stop if so. 0 disables the check.
        margin_rtol: relative tolerance of the margin-stabilisation check.
    """

    loss_threshold: float | None = None
    zero_error: bool = False
    margin_patience: int = 0
    margin_rtol: float = 1e-4


@dataclass(frozen=True)
class FitResult:
    """Result of :func:`fit` (fixed fields whatever the options).

    Attributes:
        model: the trained network (the same object that was passed in, trained in place).
        status: a :class:`~datarecon.kernel.status.Status`: ``complete`` (ran all epochs),
            ``stopped-early`` (a stop rule fired), ``diverged`` (non-finite energy or gradient; the
            last finite θ is kept) or ``running`` (interrupted before the end). Versions before the
            shared vocabulary wrote ``completed``, ``stopped``, ``interrupted`` (``Status.parse``
            reads them).
        stop_reason: human-readable reason.
        epochs_done: number of completed epochs (including those before a resume).
        history: one row per logged epoch ``{"step": t, **metrics}``.
        metrics: final metrics at the returned θ (same keys as the per-epoch metrics, minus lr).
        margins: (n,) per-sample output margins at the returned θ.
        wall_time_s: training wall time (including time before a resume).
        resumed_from: epoch the run resumed from (0 for a fresh run).
    """

    model: nn.Module
    status: Status
    stop_reason: str
    epochs_done: int
    history: list[dict[str, float]]
    metrics: dict[str, float]
    margins: torch.Tensor
    wall_time_s: float
    resumed_from: int = 0
    extra: dict[str, Any] = field(default_factory=dict)



def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str,
             weight_decay: float = 0.0) -> tuple[dict[str, float], torch.Tensor]:
    """Metrics of ``model`` on (x, y) without gradients.

    Returns:
        (metrics dict: loss, energy, train_acc, min_margin, mean_margin, weight_norm,
        normalised_margin; per-sample margins (n,)).
    """
    with torch.no_grad():
        out = model(x)
        params = dict(model.named_parameters())
        return _metrics(model, out, y, params, loss=loss, weight_decay=weight_decay)


def _metrics(model: nn.Module, out: torch.Tensor, y: torch.Tensor, params: dict[str, torch.Tensor], *,
             loss: str, weight_decay: float,
             data_loss: torch.Tensor | None = None) -> tuple[dict[str, float], torch.Tensor]:
    with torch.no_grad():
        out = out.detach()
        dl = LOSSES.get(loss)(out, y) if data_loss is None else data_loss.detach()
        sq = sum(squared_norm(p.detach()) for p in params.values())
        norm = float(torch.sqrt(torch.as_tensor(sq)))
        m = margins(out, y)
        metrics = {
            "loss": float(dl),
            "energy": float(dl) + 0.5 * weight_decay * norm * norm,
            "train_acc": accuracy(out, y),
            "min_margin": float(m.min()) if m.numel() else float("nan"),
            "mean_margin": float(m.mean()) if m.numel() else float("nan"),
            "weight_norm": norm,
            "normalised_margin": normalised_margin(m, norm, homogeneity_degree(model)),
        }
    return metrics, m


class StopHook(BaseHook):
    """Applies a :class:`StopRule`; its only state (``last_margin``) is checkpointed."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.last_margin: float | None = None

    def after_step(self, state: LoopState) -> bool:
        m, r = state.metrics, self.rule
        if r.loss_threshold is not None and m.get("loss", math.inf) <= r.loss_threshold:
            state.stop_reason = f"loss {m['loss']:.3g} <= threshold {r.loss_threshold:g}"
            return True
        separated = m.get("train_acc", 0.0) >= 1.0
        if r.zero_error and separated:
            state.stop_reason = "zero training error"
            return True
        if r.margin_patience and state.step % r.margin_patience == 0:
            nm = m.get("normalised_margin", float("nan"))
            if not separated or not math.isfinite(nm):
                self.last_margin = None
                return False
            prev, self.last_margin = self.last_margin, nm
            if prev is not None and abs(nm - prev) <= r.margin_rtol * abs(prev):
                state.stop_reason = (f"normalised margin stabilised ({prev:.6g} -> {nm:.6g} over "
                                     f"{r.margin_patience} epochs)")
                return True
        return False


class _Stepper:
    """One full-batch epoch; remembers whether an update is in progress (for safe checkpoints)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str, weight_decay: float,
                 optimizer: str, lr: float, momentum: float, schedule: str, max_lr_factor: float | None,
                 batches: tuple[int, int] | None = None) -> None:
        self.model, self.x, self.y = model, x, y
        self.batches = batches  # (batch size, seed of the order): mini-batch SGD; None: full batch
        self.loss, self.weight_decay = loss, weight_decay
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.optimizer_name = optimizer
        self.opt = OPTIMIZERS.get(optimizer)(self.params, lr=lr, momentum=momentum)
        self.precomputed = optimizer in USES_PRECOMPUTED_GRAD
        self.schedule = SCHEDULES.get(schedule)
        self.lr, self.max_lr_factor = lr, max_lr_factor
        self.in_update = False
        self.loss_fn = LOSSES.get(loss)
        # loss-normalised GD on an exp-tailed loss without weight decay: step lr·∇log L (= (lr/L)·∇L),
        # computed in the log domain so that neither L nor ∇L underflows once the margins are large
        self.log_domain = (schedule == "loss-normalised" and loss in EXP_TAILED and not weight_decay
                           and optimizer == "gd")

    def energy_terms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(outputs, data loss, energy) at the current parameters: the pure step's :func:`~datarecon.kernel.step.energy`."""
        return energy(self.model, dict(self.named), self.x, self.y, loss=self.loss, weight_decay=self.weight_decay)

    def _log_domain_terms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.model(self.x)
        log_l = log_mean_loss(out, self.y, loss=self.loss)
        return out, log_l, log_l

    def _minibatch_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch of SGD: a step per mini-batch of :func:`datarecon.kernel.step.batch_order`, each the
        pure step's energy and update; the metrics are those of the full training set after the epoch."""
        size, seed = self.batches  # type: ignore[misc]
        backup = [p.detach().clone() for p in self.params]
        self.in_update = True
        for idx in batch_order(self.x.shape[0], size, seed=seed, epoch=epoch):
            for p in self.params:
                p.grad = None
            _, _, e = energy(self.model, dict(self.named), self.x[idx], self.y[idx], loss=self.loss,
                             weight_decay=self.weight_decay)
            e.backward()
            self.opt.step(True, self.lr, lambda: e)
        with torch.no_grad():
            out, dl, e = self.energy_terms()
        metrics, _ = _metrics(self.model, out, self.y, dict(self.named), loss=self.loss,
                              weight_decay=self.weight_decay, data_loss=dl)
        metrics.update({"energy": float(e), "lr": self.lr})
        if not math.isfinite(metrics["energy"]):
            self._restore(backup, metrics)
        else:
            self._keep_finite(backup, metrics)
        self.in_update = False
        return metrics

    def __call__(self, epoch: int) -> dict[str, float]:
        if self.batches is not None:
            return self._minibatch_epoch(epoch)
        for p in self.params:
            p.grad = None
        if self.log_domain:
            out, log_l, e = self._log_domain_terms()
            dl = log_l.detach().exp()
        else:
            out, dl, e = self.energy_terms()
        e.backward()
        with torch.no_grad():
            gsq = sum(squared_norm(p.grad) for p in self.params if p.grad is not None)
            grad_norm = float(torch.sqrt(torch.as_tensor(gsq)))
        metrics, _ = _metrics(self.model, out, self.y, dict(self.named), loss=self.loss,
                              weight_decay=self.weight_decay, data_loss=dl)
        if self.log_domain:
            log_loss = float(e.detach())
            metrics["log_loss"] = log_loss
            # the step on ∇log L is lr·min(1, cap·L); on ∇L that is min(lr/L, lr·cap) (reported as "lr")
            log_cap = math.inf if self.max_lr_factor is None else math.log(self.max_lr_factor)
            lr_t = self.lr * math.exp(min(0.0, log_cap + log_loss))
            metrics["lr"] = self.lr * math.exp(min(-log_loss, log_cap)) if -log_loss < 700 else math.inf
            metrics["grad_norm"] = grad_norm * math.exp(log_loss)  # ‖∇L‖ = L·‖∇log L‖
            metrics["energy"] = metrics["loss"]
            grad_norm = metrics["grad_norm"] if math.isfinite(log_loss) else math.nan
        else:
            metrics["energy"] = float(e.detach())
            metrics["grad_norm"] = grad_norm
            lr_t = float(self.schedule(self.lr, epoch, metrics["loss"],
                                       max_lr_factor=math.inf if self.max_lr_factor is None else self.max_lr_factor))
            metrics["lr"] = lr_t
        if not (math.isfinite(metrics["energy"]) and math.isfinite(grad_norm) and math.isfinite(lr_t)):
            return metrics  # keep θ_t (last finite state); NaNStop ends the loop
        self.in_update = True
        backup = None if self.precomputed else [p.detach().clone() for p in self.params]
        self.opt.step(True, lr_t, lambda: self.energy_terms()[2])
        if backup is not None:
            self._keep_finite(backup, metrics)
        self.in_update = False
        return metrics

    def _keep_finite(self, backup: list[torch.Tensor], metrics: dict[str, float]) -> None:
        """Put the parameters back to ``backup`` (and mark the energy NaN) when an update left them non-finite."""
        if not all(bool(torch.isfinite(p).all()) for p in self.params):
            self._restore(backup, metrics)

    def _restore(self, backup: list[torch.Tensor], metrics: dict[str, float]) -> None:
        with torch.no_grad():
            for p, b in zip(self.params, backup):
                p.copy_(b)
        metrics["energy"] = float("nan")


class TrainingCheckpoint:
    """The training checkpoint of a folder, in the one format of :mod:`datarecon.kernel.checkpoint`.

    Tensors are ``model.<name>`` (the state dict) and ``opt.<name>`` (optimiser moments); the
    metadata holds ``tag``, ``epoch`` and the loop's own fields (history, status, stop rule state).
    Checkpoints written by older versions (``state.json`` + ``state-<epoch>.safetensors``) still load.

    Args:
        folder: the checkpoint folder (created on save).
        tag: identifies the run's configuration; a resume with another tag is refused.
    """

    def __init__(self, folder: str | Path, *, tag: str) -> None:
        self.folder = Path(folder)
        self.tag = tag

    def exists(self) -> bool:
        return checkpoint.exists(self.folder)

    def save(self, *, epoch: int, model: nn.Module, opt_tensors: dict[str, torch.Tensor],
             info: dict[str, Any]) -> None:
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        tensors.update({f"opt.{k}": v for k, v in opt_tensors.items()})
        checkpoint.save(self.folder, tensors, {"tag": self.tag, "epoch": epoch, **info}, kind=checkpoint.Kind.TRAIN)

    def load(self) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Returns (info, model state dict, optimiser tensors).

        Raises:
            CheckpointError: missing/corrupt checkpoint or a different configuration.
        """
        found = checkpoint.load(self.folder, kind=checkpoint.Kind.TRAIN)
        if found is None:
            raise CheckpointError(f"no training checkpoint in {self.folder}; train without --resume")
        tensors, info = found
        if info.get("tag") != self.tag:
            raise CheckpointError(
                f"the checkpoint in {self.folder} was written with another configuration "
                f"(hash {info.get('tag')} != {self.tag}); rerun with the original settings or use --overwrite"
            )
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        opt = {k[len("opt."):]: v for k, v in tensors.items() if k.startswith("opt.")}
        return info, model_sd, opt


class _CheckpointHook(Checkpoint):
    """:class:`Checkpoint` that skips the final save when the loop was interrupted mid-update."""

    def __init__(self, save: Callable[[LoopState], None], *, every: int, stepper: _Stepper) -> None:
        super().__init__(save, every=every)
        self.stepper = stepper

    def after_run(self, state: LoopState) -> None:
        if not self.stepper.in_update:
            self.save(state)



def _restore_model(ckpt: TrainingCheckpoint, model: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Load ``ckpt`` into ``model``; returns (info, optimiser tensors).

    Raises:
        CheckpointError: the checkpoint's weights do not fit ``model``.
    """
    info, model_sd, opt_tensors = ckpt.load()
    try:
        model.load_state_dict(model_sd)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint in {ckpt.folder} does not fit the model "
                              f"({str(exc).splitlines()[0]}); use --overwrite") from None
    return info, opt_tensors


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str, weight_decay: float = 0.0,
        optimizer: str = "gd", lr: float = 0.01, momentum: float = 0.0, epochs: int = 1000,
        schedule: str = "constant", max_lr_factor: float | None = 1e6, stop: StopRule | None = None,
        log_every: int = 1, progress: bool = False, checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 0, resume: bool = False, tag: str = "",
        hooks: Sequence[Hook] = (), batch_size: int | None = None, batch_seed: int = 0) -> FitResult:
    """Train ``model`` on (x, y) by minimising E(θ) = mean L + (wd/2)‖θ‖², full batch or by mini-batch SGD.

    Args:
        model: the network, trained in place (its dtype/device must match ``x``).
        x: (n, *input_shape) inputs in model input space.
        y: (n,) labels: float ±1 (binary/regression losses) or int64 classes (cross-entropy).
        loss: a name in :data:`datarecon.kernel.losses.LOSSES`.
        weight_decay: wd ≥ 0 of the energy term (wd/2)‖θ‖².
        optimizer: a name in :data:`datarecon.training.optim.OPTIMIZERS` (``gd``, ``lbfgs``).
        lr: base learning rate η > 0 (initial step for ``lbfgs``).
        momentum: heavy-ball momentum μ ∈ [0, 1) (``gd`` only).
        epochs: maximum number of epochs (full-batch updates).
        schedule: a name in :data:`datarecon.training.optim.SCHEDULES`.
        max_lr_factor: cap of the learning rate relative to ``lr`` for growing schedules (None: no cap).
            ``loss-normalised`` on an exp-tailed loss without weight decay steps lr·min(1, cap·L)·∇log L,
            computed in the log domain: (lr/L)·∇L without underflow, however small L gets.
        stop: early-stop rules (:class:`StopRule`); default none.
        log_every: history row every ``log_every`` epochs (and the last).
        progress: show a tqdm bar.
        checkpoint_dir: folder for training checkpoints (None: no checkpoints).
        checkpoint_every: checkpoint period in epochs (0: only at the end of the run).
        resume: continue from the checkpoint in ``checkpoint_dir`` if there is one.
        tag: configuration identifier stored in checkpoints; a resume with another tag is refused.
        hooks: extra engine hooks, run after the built-in ones.
        batch_size: mini-batch SGD with batches of this size (``gd`` with a constant schedule; an
            epoch is ⌈n/b⌉ steps over :func:`datarecon.kernel.step.batch_order`); None: full batch.
        batch_seed: the seed of the batch order (the training seed).

    Returns:
        :class:`FitResult`.

    Raises:
        DataReconError: bad arguments; CheckpointError: unusable checkpoint on resume.

    References:
        Runkel et al. 2024 eq. 2 (lower level); Haim et al. 2022 §5 (full-batch GD on logistic loss).
    """
    if x.shape[0] != y.shape[0]:
        raise DataReconError(f"x has {x.shape[0]} samples but y has {y.shape[0]}; pass matching tensors")
    if x.shape[0] == 0:
        raise DataReconError("no training samples; increase n_per_class")
    if not (lr > 0 and math.isfinite(lr)):
        raise DataReconError(f"learning rate must be positive, got {lr}; pass --lr > 0")
    if epochs < 0:
        raise DataReconError(f"epochs must be >= 0, got {epochs}")
    if weight_decay < 0:
        raise DataReconError(f"weight decay must be >= 0, got {weight_decay}")
    if not 0.0 <= momentum < 1.0:
        raise DataReconError(f"momentum must lie in [0, 1), got {momentum}")
    if optimizer != "gd" and schedule != "constant":
        raise DataReconError(f"schedule {schedule!r} applies to --optimizer gd only; use --schedule constant")
    entry = LOSSES.get(loss)
    if entry.label_kind == "multiclass" and y.dtype.is_floating_point:
        raise DataReconError(f"loss {loss!r} needs class-index labels (a multiclass task)")
    if entry.label_kind == "binary" and not y.dtype.is_floating_point:
        raise DataReconError(f"loss {loss!r} needs +-1 labels (a binary task); use --loss cross-entropy "
                             "for multiclass tasks")
    if batch_size is not None and not 1 <= batch_size <= x.shape[0]:
        raise DataReconError(f"batch size {batch_size} is not between 1 and the {x.shape[0]} training images; "
                             f"pass --batch-size between 1 and {x.shape[0]}")
    if batch_size is not None and (optimizer != "gd" or schedule != "constant"):
        raise DataReconError("mini-batches (--batch-size) need --optimizer gd and --schedule constant")
    stop = stop or StopRule()
    model.train()
    stepper = _Stepper(model, x, y, loss=loss, weight_decay=weight_decay, optimizer=optimizer, lr=lr,
                       momentum=momentum, schedule=schedule, max_lr_factor=max_lr_factor,
                       batches=None if batch_size is None else (int(batch_size), int(batch_seed)))
    history = History(every=log_every)
    stop_hook = StopHook(stop)
    nan_stop = NaNStop(keys=["energy", "grad_norm"])

    start, elapsed, status, reason, finished = 0, 0.0, "", "", False
    ckpt = TrainingCheckpoint(checkpoint_dir, tag=tag) if checkpoint_dir is not None else None
    if ckpt is not None and resume and ckpt.exists():
        info, opt_tensors = _restore_model(ckpt, model)
        stepper.opt.load_state(opt_tensors, info.get("opt_scalars", {}))
        start, elapsed = int(info["epoch"]), float(info.get("wall_time_s", 0.0))
        history.rows = list(info.get("history", []))
        stop_hook.last_margin = info.get("last_margin")
        status = Status.parse(info["status"]) if info.get("status") else ""  # older checkpoints: "completed", ...
        reason, finished = info.get("stop_reason", ""), bool(info.get("finished"))
    resumed_from = start

    def _save(state: LoopState) -> None:
        if ckpt is None:
            return
        opt_tensors, opt_scalars = stepper.opt.state_tensors()
        done = state.stop_reason != "" or state.step >= state.total
        ckpt.save(epoch=state.step, model=model, opt_tensors=opt_tensors, info={
            "wall_time_s": state.wall_time_s, "history": history.rows, "last_margin": stop_hook.last_margin,
            "opt_scalars": opt_scalars, "finished": done and not nan_stop.tripped,
            "status": _status(state, nan_stop), "stop_reason": state.stop_reason,
        })

    if finished:
        state = LoopState(step=start, total=epochs, stop_reason=reason, wall_time_s=elapsed)
    else:
        all_hooks: list[Hook] = [nan_stop, history, stop_hook,
                                 ProgressBar(keys=["loss", "train_acc", "normalised_margin"],
                                             desc="train", unit="epoch", mode=progress,
                                             every=max(1, log_every))]
        if ckpt is not None:
            all_hooks.append(_CheckpointHook(_save, every=checkpoint_every or max(epochs, 1), stepper=stepper))
        all_hooks.extend(hooks)
        engine = Engine(stepper, hooks=all_hooks)
        state = engine.run(start=start, total=epochs, elapsed_s=elapsed)
        status = _status(state, nan_stop)
    final, m = evaluate(model, x, y, loss=loss, weight_decay=weight_decay)
    return FitResult(model=model, status=status, stop_reason=state.stop_reason, epochs_done=state.step,
                     history=history.rows, metrics=final, margins=m.detach().cpu(),
                     wall_time_s=state.wall_time_s, resumed_from=resumed_from)


def ascend_margin(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str, steps: int,
                  step_size: float = 0.01, growth: float = 1.1, max_step: float = 0.1, min_step: float = 1e-6,
                  log_every: int = 1, progress: bool = False, checkpoint_dir: str | Path | None = None,
                  checkpoint_every: int = 0, resume: bool = False, tag: str = "",
                  hooks: Sequence[Hook] = ()) -> FitResult:
    """Margin ascent (:mod:`datarecon.training.margin`): minimise log L on the sphere ‖θ‖ = ‖θ₀‖.

    For a homogeneous network on separated data this keeps raising the normalised margin after the
    training loss has stalled, towards a KKT point of the max-margin problem (θ* ∝ Σ λ_i y_i ∇Φ_i).

    Args:
        model: the trained network (modified in place); its training data must be separated.
        x: (n, *input_shape) inputs in model input space; y: (n,) labels (±1 or classes).
        loss: ``logistic`` or ``cross-entropy`` (exponentially tailed).
        steps: number of steps (each one forward + backward).
        step_size: initial angle η₀ of a step on the sphere (radians).
        growth: η ← growth·η after an accepted step (η ← η/2 after a rejected one).
        max_step: upper bound of η.
        min_step: stop once η < min_step (no step of that size lowers log L any more).
        log_every, progress, checkpoint_dir, checkpoint_every, resume, tag, hooks: as in :func:`fit`.

    Returns:
        :class:`FitResult` (``epochs_done`` counts ascent steps; history rows carry ``step_size``,
        ``accepted``, ``log_loss``, ``normalised_margin``).

    Raises:
        DataReconError: a loss that is not exponentially tailed, weights all zero, or training data
        that are not separated (margin ascent needs zero training error).

    References:
        Lyu & Li 2020 §4 (smoothed normalised margin); Haim et al. 2022 eq. 3–4.
    """
    if steps < 0:
        raise DataReconError(f"margin ascent steps must be >= 0, got {steps}")
    if not (0 < step_size <= max_step and 0 < min_step and growth >= 1.0):
        raise DataReconError("margin ascent needs 0 < step_size <= max_step, min_step > 0 and growth >= 1; "
                             f"got step_size {step_size}, max_step {max_step}, min_step {min_step}, growth {growth}")
    degree = homogeneity_degree(model)
    stepper = MarginAscentStepper(model, x, y, loss=loss, step_size=step_size, growth=growth,
                                  max_step=max_step, min_step=min_step)
    history = History(every=log_every)
    nan_stop = NaNStop(keys=["log_loss"])

    class _Converged(BaseHook):
        def after_step(self, state: LoopState) -> bool:
            m = state.metrics
            m["normalised_margin"] = normalised_margin(torch.tensor([m["min_margin"]]), stepper.radius, degree)
            if stepper.converged():
                state.stop_reason = f"converged (step size {stepper.step_size:.2g} < {min_step:g})"
                return True
            return False

    start, elapsed, reason, finished = 0, 0.0, "", False
    ckpt = TrainingCheckpoint(checkpoint_dir, tag=tag) if checkpoint_dir is not None else None
    if ckpt is not None and resume and ckpt.exists():
        info, _ = _restore_model(ckpt, model)
        stepper.load_state(info["ascent"])
        start, elapsed = int(info["epoch"]), float(info.get("wall_time_s", 0.0))
        history.rows = list(info.get("history", []))
        reason, finished = info.get("stop_reason", ""), bool(info.get("finished"))
    else:
        with torch.no_grad():
            separated = bool((margins(model(x), y) > 0).all())
        if not separated:
            raise DataReconError("margin ascent needs zero training error, but some training samples are "
                                 "misclassified; train longer (more --epochs) before the ascent")
    resumed_from = start

    def _save(state: LoopState) -> None:
        if ckpt is None:
            return
        done = state.stop_reason != "" or state.step >= state.total
        ckpt.save(epoch=state.step, model=model, opt_tensors={}, info={
            "wall_time_s": state.wall_time_s, "history": history.rows, "ascent": stepper.state(),
            "finished": done and not nan_stop.tripped, "status": _status(state, nan_stop),
            "stop_reason": state.stop_reason})

    class _AscentCheckpoint(Checkpoint):
        def after_run(self, state: LoopState) -> None:
            if not stepper.in_update:
                self.save(state)

    if finished:
        state = LoopState(step=start, total=steps, stop_reason=reason, wall_time_s=elapsed)
    else:
        all_hooks: list[Hook] = [_Converged(), nan_stop, history,
                                 ProgressBar(keys=["normalised_margin", "step_size"], desc="margin ascent",
                                             mode=progress, every=max(1, log_every))]
        if ckpt is not None:
            all_hooks.append(_AscentCheckpoint(_save, every=checkpoint_every or max(steps, 1)))
        all_hooks.extend(hooks)
        state = Engine(stepper, hooks=all_hooks).run(start=start, total=steps, elapsed_s=elapsed)
    final, m = evaluate(model, x, y, loss=loss)
    return FitResult(model=model, status=_status(state, nan_stop), stop_reason=state.stop_reason,
                     epochs_done=state.step, history=history.rows, metrics=final, margins=m.detach().cpu(),
                     wall_time_s=state.wall_time_s, resumed_from=resumed_from,
                     extra={"ascent": stepper.state()})


def _status(state: LoopState, nan_stop: NaNStop) -> Status:
    """The loop's :class:`~datarecon.kernel.status.Status` (the one vocabulary of training and attacks)."""
    if nan_stop.tripped:
        return Status.DIVERGED
    if state.stop_reason == "completed" or (not state.stop_reason and state.step >= state.total):
        return Status.COMPLETE
    if state.stop_reason:
        return Status.STOPPED_EARLY
    return Status.RUNNING
