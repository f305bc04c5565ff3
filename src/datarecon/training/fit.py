"""Full-batch training of a network on in-memory tensors, built on :class:`~datarecon.kernel.run_loop.RunLoop`.

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datarecon.errors import DataReconError
from datarecon.kernel.engine import BaseHook, LoopOptions, LoopState
from datarecon.kernel.losses import LOSSES, accuracy, margins, squared_norm
from datarecon.kernel.checkpoint import Kind
from datarecon.kernel.resume import ModelState, Store
from datarecon.kernel.run_loop import Display, RunLoop
from datarecon.kernel.status import Status
from datarecon.kernel.step import MarginAscent, TrainingRecipe, batch_order, energy
from datarecon.training.kkt_regime import homogeneity_degree, normalised_margin
from datarecon.training.margin import EXP_TAILED, MarginAscentStepper, log_mean_loss
from datarecon.training.optim import OPTIMIZERS, SCHEDULES, USES_PRECOMPUTED_GRAD


@dataclass(frozen=True)
class StopRule:
    """When to stop before ``epochs`` (all off by default).

    Attributes:
        loss_threshold: stop once the mean data loss is ≤ this.
        zero_error: stop once every training sample is classified correctly.
        margin_patience: check every ``margin_patience`` epochs, after zero training error, whether
            the normalised margin changed by less than ``margin_stable_rtol`` (relative) since the previous
            check; stop if so. 0 disables the check.
        margin_stable_rtol: relative change between two checks under which the margin counts as stable.
    """

    loss_threshold: float | None = None
    zero_error: bool = False
    margin_patience: int = 0
    margin_stable_rtol: float = 1e-4


#: what :func:`fit` trains by: the one :class:`~datarecon.kernel.step.TrainingRecipe`, under the
#: training API's name
FitRecipe = TrainingRecipe


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block (batch norm on its running statistics, nothing updated),
    its previous mode restored after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


#: what :func:`ascend_margin` runs: the training recipe's margin-ascent stage
#: (:class:`~datarecon.kernel.step.MarginAscent`), under the training API's name
AscentRecipe = MarginAscent


@dataclass(frozen=True)
class FitResult:
    """Result of :func:`fit` (fixed fields whatever the options).

    Attributes:
        model: the trained network (the same object that was passed in, trained in place).
        status: a :class:`~datarecon.kernel.status.Status`: ``complete`` (ran all epochs),
            ``stopped-early`` (a stop rule fired), ``diverged`` (non-finite energy or gradient; the
            last finite θ is kept) or ``running`` (interrupted before the end).
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
    with torch.no_grad(), eval_mode(model):
        out = model(x)
        params = dict(model.named_parameters())
        return training_metrics(model, out, y, params, loss=loss, weight_decay=weight_decay)


def training_metrics(model: nn.Module, out: torch.Tensor, y: torch.Tensor, params: dict[str, torch.Tensor], *,
                     loss: str, weight_decay: float,
                     data_loss: torch.Tensor | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """The training metrics of ``model`` from its outputs ``out`` on (x, y), without gradients.

    Args:
        model: the network (its homogeneity degree L scales the normalised margin).
        out: (n, ...) outputs of ``model`` on the training inputs; y: (n,) labels.
        params: the parameters whose squared norm enters the energy and ``weight_norm``.
        loss: a name in :data:`datarecon.kernel.losses.LOSSES`; weight_decay: wd ≥ 0 of (wd/2)‖θ‖².
        data_loss: the mean data loss when already computed (None: computed from ``out``).

    Returns:
        (metrics dict: loss, energy, train_acc, min_margin, mean_margin, weight_norm,
        normalised_margin; per-sample margins (n,)).
    """
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

    def state_dict(self) -> dict[str, Any]:
        return {"last_margin": self.last_margin}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_margin = state.get("last_margin")

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
            if prev is not None and abs(nm - prev) <= r.margin_stable_rtol * abs(prev):
                state.stop_reason = (f"normalised margin stabilised ({prev:.6g} -> {nm:.6g} over "
                                     f"{r.margin_patience} epochs)")
                return True
        return False


class _Stepper:
    """One full-batch epoch; remembers whether an update is in progress (for safe checkpoints)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: FitRecipe) -> None:
        self.model, self.x, self.y = model, x, y
        # (batch size, seed of the order): mini-batch SGD; None: full batch
        self.batches = None if recipe.batch_size is None else (int(recipe.batch_size), int(recipe.seed))
        loss, weight_decay, optimizer, schedule = recipe.loss, recipe.weight_decay, recipe.optimizer, recipe.schedule
        self.loss, self.weight_decay = loss, weight_decay
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.optimizer_name = optimizer
        self.opt = OPTIMIZERS.get(optimizer)(self.params, lr=recipe.lr, momentum=recipe.momentum)
        self.precomputed = optimizer in USES_PRECOMPUTED_GRAD
        self.schedule = SCHEDULES.get(schedule)
        self.lr, self.max_lr_factor = recipe.lr, recipe.max_lr_factor
        self.in_update = False
        self.loss_fn = LOSSES.get(loss)
        # loss-normalised GD on an exp-tailed loss without weight decay: step lr·∇log L (= (lr/L)·∇L),
        # computed in the log domain so that neither L nor ∇L underflows once the margins are large
        self.log_domain = (schedule == "loss-normalised" and loss in EXP_TAILED and not weight_decay
                           and optimizer == "gd")

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimiser's tensors (its moments); with the weights, what a checkpoint holds (:class:`ModelState`)."""
        return self.opt.state_tensors()[0]

    def state_record(self) -> dict[str, Any]:
        return {"opt_scalars": self.opt.state_tensors()[1]}

    def load_state(self, tensors: dict[str, torch.Tensor], record: Mapping[str, Any]) -> None:
        self.opt.load_state(tensors, dict(record.get("opt_scalars") or {}))

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
        with torch.no_grad(), eval_mode(self.model):
            out, dl, e = self.energy_terms()
        metrics, _ = training_metrics(self.model, out, self.y, dict(self.named), loss=self.loss,
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
        metrics, _ = training_metrics(self.model, out, self.y, dict(self.named), loss=self.loss,
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
        if not (abs(lr_t) <= torch.finfo(self.params[0].dtype).max):  # NaN, inf, or beyond the dtype's range
            metrics["lr_step"] = math.inf  # a step the parameters cannot take: NaNStop ends the loop
        if not (math.isfinite(metrics["energy"]) and math.isfinite(grad_norm) and "lr_step" not in metrics):
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


class _AscentConverged(BaseHook):
    """Adds the normalised margin (min margin / R^L) to the ascent's metrics; stops once the step
    angle of ``stepper`` fell below ``min_step``."""

    def __init__(self, stepper: MarginAscentStepper, *, degree: int, min_step: float) -> None:
        self.stepper, self.degree, self.min_step = stepper, degree, min_step

    def after_step(self, state: LoopState) -> bool:
        m = state.metrics
        m["normalised_margin"] = normalised_margin(torch.tensor([m["min_margin"]]), self.stepper.radius, self.degree)
        if self.stepper.converged():
            state.stop_reason = f"converged (step size {self.stepper.step_size:.2g} < {self.min_step:g})"
            return True
        return False


#: what the margin curve measures besides the margin (e.g. the identifiability gap): called with the model at a
#: curve point, returns scalars; the training side defines the slot, a caller that holds more fills it
CurveProbe = Callable[[nn.Module], dict[str, float]]


class _AscentStop(BaseHook):
    """Stops margin ascent at convergence: at every ``window``-th step, once the normalised margin rose by less
    than ``rtol`` times its value ``window`` steps before (a fall counts as no rise). ``last``, the margin at
    the previous check (or at the start), is checkpointed."""

    def __init__(self, *, rtol: float, window: int, start: float) -> None:
        self.rtol, self.window, self.last = rtol, window, start

    def state_dict(self) -> dict[str, Any]:
        return {"last_margin": self.last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("last_margin") is not None:
            self.last = float(state["last_margin"])

    def after_step(self, state: LoopState) -> bool:
        if state.step % self.window:
            return False
        now = state.metrics.get("normalised_margin", math.nan)
        prev, self.last = self.last, now
        if not (math.isfinite(now) and math.isfinite(prev) and prev > 0):
            return False
        gain = (now - prev) / prev
        if gain >= self.rtol:
            return False
        state.stop_reason = (f"converged: normalised margin {prev:.6g} -> {now:.6g} over the last {self.window} "
                             f"steps (relative gain {gain:.2g} < {self.rtol:g})")
        return True


class _AscentCurve(BaseHook):
    """The margin curve of an ascent: a point every ``window`` steps and at the end (step, normalised margin),
    with ``probe``'s measurements at the start, at 1, 2, 4, ... windows and at the end. ``points`` is
    checkpointed; the probe only reads the model, so the weights are the same with or without it."""

    def __init__(self, model: nn.Module, *, window: int, probe: CurveProbe | None) -> None:
        self.model, self.window, self.probe = model, window, probe
        self.points: list[dict[str, float]] = []

    def point(self, step: int, margin: float, *, end: bool = False) -> dict[str, float]:
        """The curve's point at ``step`` (``end``: the ascent's last step, always probed)."""
        row = {"step": step, "normalised_margin": margin}
        k = step // self.window
        if self.probe is not None and (end or k & (k - 1) == 0):  # the start, powers of two and the end
            with eval_mode(self.model):  # the probe may differentiate (per-example gradients): no no_grad here
                row.update(self.probe(self.model))
        return row

    def after_step(self, state: LoopState) -> bool:
        if state.step % self.window == 0:
            self.points.append(self.point(state.step, state.metrics.get("normalised_margin", math.nan)))
        return False

    def after_run(self, state: LoopState) -> None:
        if state.stop_reason == "":  # interrupted: the end point comes when the resumed run ends
            return
        if self.points and self.points[-1]["step"] == state.step:
            if self.probe is None or len(self.points[-1]) > 2:
                return
            self.points.pop()  # a window's point that is also the end: probed as the end
        self.points.append(self.point(state.step, state.metrics.get("normalised_margin", math.nan), end=True))


def training_store(folder: str | Path, *, tag: str) -> Store:
    """The training checkpoint in ``folder`` (:func:`fit`, :func:`ascend_margin`, DP-SGD), resumed only under the
    configuration ``tag`` (a resume with another tag is refused)."""
    return Store(Path(folder), key=tag, kind=Kind.TRAIN)


class _AscentState:
    """What an ascent's checkpoint holds besides the weights: the stepper's state and the curve's points."""

    def __init__(self, stepper: MarginAscentStepper, curve: _AscentCurve) -> None:
        self.stepper, self.curve = stepper, curve

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_record(self) -> dict[str, Any]:
        return {"ascent": self.stepper.state(), "curve": self.curve.points}

    def load_state(self, tensors: dict[str, torch.Tensor], record: Mapping[str, Any]) -> None:
        self.stepper.load_state(record["ascent"])
        self.curve.points = list(record.get("curve") or [])


def _check_fit(recipe: FitRecipe, x: torch.Tensor, y: torch.Tensor) -> None:
    """Refuse a training problem :func:`fit` cannot run (the checks in the order :func:`fit` documents).

    Raises:
        DataReconError: mismatched or empty data, a recipe value out of range, or labels that do not fit the loss.
    """
    r = recipe
    if x.shape[0] != y.shape[0]:
        raise DataReconError(f"x has {x.shape[0]} samples but y has {y.shape[0]}; pass matching tensors")
    if x.shape[0] == 0:
        raise DataReconError("no training samples; increase n_per_class")
    if r.lr is None or not (r.lr > 0 and math.isfinite(r.lr)):
        raise DataReconError(f"learning rate must be positive, got {r.lr}; pass --lr > 0")
    if r.epochs < 0:
        raise DataReconError(f"epochs must be >= 0, got {r.epochs}")
    if r.weight_decay < 0:
        raise DataReconError(f"weight decay must be >= 0, got {r.weight_decay}")
    if not 0.0 <= r.momentum < 1.0:
        raise DataReconError(f"momentum must lie in [0, 1), got {r.momentum}")
    if r.optimizer != "gd" and r.schedule != "constant":
        raise DataReconError(f"schedule {r.schedule!r} applies to --optimizer gd only; use --schedule constant")
    entry = LOSSES.get(r.loss)
    if entry.label_kind == "multiclass" and y.dtype.is_floating_point:
        raise DataReconError(f"loss {r.loss!r} needs class-index labels (a multiclass task)")
    if entry.label_kind == "binary" and not y.dtype.is_floating_point:
        raise DataReconError(f"loss {r.loss!r} needs +-1 labels (a binary task); use --loss cross-entropy "
                             "for multiclass tasks")
    if r.batch_size is not None and not 1 <= r.batch_size <= x.shape[0]:
        raise DataReconError(f"batch size {r.batch_size} is not between 1 and the {x.shape[0]} training images; "
                             f"pass --batch-size between 1 and {x.shape[0]}")
    if r.batch_size is not None and (r.optimizer != "gd" or r.schedule != "constant"):
        raise DataReconError("mini-batches (--batch-size) need --optimizer gd and --schedule constant")


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, recipe: FitRecipe, stop: StopRule | None = None,
        loop: LoopOptions = LoopOptions(), checkpoint: Store | None = None) -> FitResult:
    """Train ``model`` on (x, y) by minimising E(θ) = mean L + (wd/2)‖θ‖², full batch or by mini-batch SGD.

    Args:
        model: the network, trained in place (its dtype/device must match ``x``).
        x: (n, *input_shape) inputs in model input space.
        y: (n,) labels: float ±1 (binary/regression losses) or int64 classes (cross-entropy).
        recipe: the loss, weight decay, optimiser, learning rate and schedule, epochs, and the
            mini-batches (:class:`FitRecipe`; ``recipe.seed`` orders the mini-batches).
        stop: early-stop rules (:class:`StopRule`); default none.
        loop: history period (epochs), progress display, checkpoint period (epochs; 0: only at the end
            of the run), resume (continue from ``checkpoint`` if it exists) and extra engine hooks, run
            after the built-in ones (:class:`~datarecon.kernel.engine.LoopOptions`).
        checkpoint: where training checkpoints go and the configuration tag a resume must match
            (:class:`~datarecon.kernel.resume.Store` of kind ``train``); None: no checkpoints.

    Returns:
        :class:`FitResult`.

    Raises:
        DataReconError: bad arguments; CheckpointError: unusable checkpoint on resume.

    References:
        Runkel et al. 2024 eq. 2 (lower level); Haim et al. 2022 §5 (full-batch GD on logistic loss).
    """
    _check_fit(recipe, x, y)
    stop = stop or StopRule()
    model.train(recipe.norm_mode == "train")
    stepper = _Stepper(model, x, y, recipe)
    stop_hook = StopHook(stop)
    run = RunLoop(stepper, display=Display("train", keys=("loss", "train_acc", "normalised_margin"), unit="epoch",
                                           every=max(1, loop.log_every)),
                  options=loop, watch=("energy", "grad_norm", "lr_step"), stops=(stop_hook,))
    saved = ModelState(model, stepper)
    start = run.resume(checkpoint, saved, enabled=loop.resume)
    state = run.run_resumed(start, checkpoint, saved, total=recipe.epochs,
                            every=loop.checkpoint_every or max(recipe.epochs, 1), updating=stepper)
    final, m = evaluate(model, x, y, loss=recipe.loss, weight_decay=recipe.weight_decay)
    return FitResult(model=model, status=run.status(state), stop_reason=state.stop_reason, epochs_done=state.step,
                     history=run.history.rows, metrics=final, margins=m.detach().cpu(),
                     wall_time_s=state.wall_time_s, resumed_from=start.step)


def _check_separated(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Refuse a margin ascent from weights that misclassify a training sample.

    Raises:
        DataReconError: some training sample has a margin ≤ 0.
    """
    with torch.no_grad():
        separated = bool((margins(model(x), y) > 0).all())
    if not separated:
        raise DataReconError("margin ascent needs zero training error, but some training samples are "
                             "misclassified; train longer (more --epochs) before the ascent")


def ascend_margin(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str, ascent: AscentRecipe,
                  loop: LoopOptions = LoopOptions(), checkpoint: Store | None = None,
                  probe: CurveProbe | None = None) -> FitResult:
    """Margin ascent (:mod:`datarecon.training.margin`): minimise log L on the sphere ‖θ‖ = ‖θ₀‖.

    For a homogeneous network on separated data this keeps raising the normalised margin after the
    training loss has stalled, towards a KKT point of the max-margin problem (θ* ∝ Σ λ_i y_i ∇Φ_i).
    It runs ``ascent.steps`` steps, or with ``ascent.rtol`` until the normalised margin rose by less
    than that fraction over the last ``ascent.window`` steps (``steps`` then the budget), and records
    the margin curve (:class:`_AscentCurve`).

    Args:
        model: the trained network (modified in place); its training data must be separated.
        x: (n, *input_shape) inputs in model input space; y: (n,) labels (±1 or classes).
        loss: ``logistic`` or ``cross-entropy`` (exponentially tailed).
        ascent: the number of steps, the step-angle schedule and the stop rule (:class:`AscentRecipe`).
        loop, checkpoint: as in :func:`fit` (periods count ascent steps).
        probe: measured at the curve's points besides the margin (:data:`CurveProbe`); None: the margin only.

    Returns:
        :class:`FitResult` (``epochs_done`` counts ascent steps; history rows carry ``step_size``,
        ``accepted``, ``log_loss``, ``normalised_margin``; ``extra`` holds the stepper's state under
        ``ascent`` and the curve's points under ``curve``).

    Raises:
        DataReconError: a loss that is not exponentially tailed, weights all zero, or training data
        that are not separated (margin ascent needs zero training error).

    References:
        Lyu & Li 2020 §4 (smoothed normalised margin); Haim et al. 2022 eq. 3–4.
    """
    a = ascent
    if a.steps < 0:
        raise DataReconError(f"margin ascent steps must be >= 0, got {a.steps}")
    if not (0 < a.step_size <= a.max_step and 0 < a.min_step and a.growth >= 1.0 and a.window >= 1):
        raise DataReconError("margin ascent needs 0 < step_size <= max_step, min_step > 0, growth >= 1 and window >= 1; "
                             f"got step_size {a.step_size}, max_step {a.max_step}, min_step {a.min_step}, "
                             f"growth {a.growth}, window {a.window}")
    degree = homogeneity_degree(model)
    stepper = MarginAscentStepper(model, x, y, loss=loss, step_size=a.step_size, growth=a.growth,
                                  max_step=a.max_step, min_step=a.min_step)
    converged = _AscentConverged(stepper, degree=degree, min_step=a.min_step)
    curve = _AscentCurve(model, window=a.window, probe=probe)
    stop = _AscentStop(rtol=a.rtol, window=a.window, start=math.nan) if a.rtol is not None else None
    run = RunLoop(stepper, display=Display("margin ascent", keys=("normalised_margin", "step_size"),
                                           every=max(1, loop.log_every)),
                  options=loop, watch=("log_loss",), prepare=(converged, curve), stops=(stop,) if stop else ())
    saved = ModelState(model, _AscentState(stepper, curve))
    start = run.resume(checkpoint, saved, enabled=loop.resume)
    if start.progress is None:
        _check_separated(model, x, y)
        first = evaluate(model, x, y, loss=loss)[0]["normalised_margin"]
        curve.points.append(curve.point(0, first))
        if stop is not None:
            stop.last = first
    state = run.run_resumed(start, checkpoint, saved, total=a.steps, every=loop.checkpoint_every or max(a.steps, 1),
                            updating=stepper)
    final, m = evaluate(model, x, y, loss=loss)
    return FitResult(model=model, status=run.status(state), stop_reason=state.stop_reason,
                     epochs_done=state.step, history=run.history.rows, metrics=final, margins=m.detach().cpu(),
                     wall_time_s=state.wall_time_s, resumed_from=start.step,
                     extra={"ascent": stepper.state(), "curve": list(curve.points)})

