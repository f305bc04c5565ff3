"""DP-SGD training of a target through Opacus (a defence the audit sweeps).

Opacus (the optional extra ``pip install 'datarecon[dp]'``) supplies the three parts where an
own copy would be a liability: per-sample gradients (``GradSampleModule``), clipping and Gaussian
noise (``DPOptimizer``) and the privacy accountant. This module keeps the math as small pure
functions (sample rate, step count, noise for a target ε, ε spent) and one stepper that the
training loop (:class:`~datarecon.kernel.run_loop.RunLoop`) runs, so DP training has the same
history, progress, NaN-stop and checkpoint hooks as plain training.

One engine step is one DP-SGD step (Abadi et al. 2016, Algorithm 1): a Poisson batch (every
training example independently with probability q = batch_size / n), per-sample gradients
g_i = ∇_θ L(Φ(x_i; θ), y_i), clipped to ḡ_i = g_i · min(1, C / ‖g_i‖), summed, noised and
averaged over the *expected* batch size B:

    g̃ = (Σ_i ḡ_i + N(0, σ²C² I)) / B,   θ ← θ − η (g̃ + wd·θ)

(weight decay acts on the noised gradient: data-independent post-processing, no privacy cost).
An epoch is ``round(1/q)`` steps, as in Opacus's ``make_private_with_epsilon``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions
from datarecon.kernel.losses import LOSSES
from datarecon.kernel.resume import ModelState, Store
from datarecon.kernel.run_loop import Display, RunLoop
from datarecon.kernel.step import TrainingRecipe
from datarecon.training.fit import FitResult, evaluate, training_metrics

#: Opacus accountants offered (``opacus.accountants`` names); ``rdp`` is the default (see docs/DESIGN.md).
ACCOUNTANTS = ("rdp", "prv", "gdp")
INSTALL_HINT = "pip install 'datarecon[dp]'"


def import_opacus() -> Any:
    """Import opacus lazily, with the fix in the error message.

    Raises:
        DataReconError: opacus is not installed.
    """
    try:
        import opacus  # optional dependency: the extra datarecon[dp]
    except ImportError:
        raise DataReconError(f"DP-SGD training needs Opacus; {INSTALL_HINT}") from None
    return opacus


class DPConfig(BaseModel):
    """DP-SGD settings of a target (``TrainConfig.dp``); exactly one of ``noise_multiplier`` and
    ``target_epsilon``.

    Attributes:
        noise_multiplier: σ ≥ 0, noise std relative to the clip norm (0: clipping only, ε = ∞).
        target_epsilon: ε > 0 to reach at ``delta`` after all steps; σ is then solved by Opacus
            (``get_noise_multiplier``) for the sample rate and step count.
        max_grad_norm: clip norm C > 0 of every per-sample gradient.
        batch_size: expected batch size B ≥ 1 (Poisson sampling rate q = B / n, at most 1).
        delta: δ in (0, 1/n); None: 1 / (10 n).
        accountant: Opacus accountant (``rdp``, ``prv``, ``gdp``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    noise_multiplier: float | None = Field(default=None, ge=0)
    target_epsilon: float | None = Field(default=None, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    batch_size: int = Field(default=8, ge=1)
    delta: float | None = Field(default=None, gt=0, lt=1)
    accountant: Literal["rdp", "prv", "gdp"] = "rdp"

    @model_validator(mode="after")
    def _one_noise(self) -> DPConfig:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise DataReconError("dp needs exactly one of noise_multiplier and target_epsilon; set one, not both")
        return self


def sample_rate(batch_size: int, n: int) -> float:
    """Poisson sampling rate q = B / n ∈ (0, 1].

    Raises:
        DataReconError: no samples, or an expected batch larger than the n examples (q would exceed 1:
            the accounting would be that of B = n, not of the batch asked for).
    """
    if n <= 0:
        raise DataReconError("no training samples; increase n_per_class")
    if batch_size > n:
        raise DataReconError(f"dp batch_size {batch_size} exceeds the {n} training examples; use a batch size of at "
                             f"most {n} (--dp-batch-size {n} samples every example at every step)")
    return batch_size / n


def steps_for(epochs: int, q: float) -> int:
    """DP-SGD steps of ``epochs`` epochs at sampling rate q: epochs · round(1/q) (Opacus's convention)."""
    return int(epochs) * max(1, round(1.0 / q))


def resolve_delta(delta: float | None, n: int) -> float:
    """δ of the accounting: ``delta`` or 1/(10n); refuses δ ≥ 1/n (a mechanism that publishes one
    training example at random would satisfy it).

    Raises:
        DataReconError: δ ≥ 1/n.
    """
    d = 1.0 / (10 * n) if delta is None else float(delta)
    if d >= 1.0 / n:
        raise DataReconError(f"dp delta {d:g} is >= 1/n = {1.0 / n:g} for n = {n} training examples, which "
                             f"protects nothing; use delta < {1.0 / n:g} (e.g. {1.0 / (10 * n):g})")
    return d


def noise_for_epsilon(epsilon: float, *, delta: float, q: float, steps: int, accountant: str = "rdp") -> float:
    """σ that spends ``epsilon`` at ``delta`` after ``steps`` steps at rate q (Opacus ``get_noise_multiplier``).

    Raises:
        DataReconError: ε cannot be reached at these steps and rate (Opacus searches σ ≤ 10⁶ and stops
        within 0.01 of the target, so targets below 0.01 are met by any ε ≤ 0.01).
    """
    import_opacus()
    from opacus.accountants.utils import get_noise_multiplier  # optional dependency (import_opacus)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q,
                                              steps=steps, accountant=accountant))
    except ValueError:
        raise DataReconError(f"dp target_epsilon {epsilon:g} cannot be reached at delta {delta:g} with {steps} steps "
                             f"at sample rate {q:.3g} (the noise it needs exceeds Opacus's search range, sigma <= 1e6); raise "
                             "target_epsilon, train fewer epochs or use a smaller batch_size") from None


def epsilon_spent(noise_multiplier: float, *, q: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε at ``delta`` of ``steps`` DP-SGD steps with noise σ at rate q (a fresh Opacus accountant).

    Returns:
        ε ≥ 0; ``inf`` for σ = 0 (no noise: no privacy) and 0 for no steps.
    """
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import_opacus()
    from opacus.accountants import create_accountant  # optional dependency (import_opacus)

    acc = create_accountant(accountant)
    acc.history = [(float(noise_multiplier), float(q), int(steps))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the RDP-to-(ε, δ) conversion can return a slightly negative ε for huge σ: that is ε = 0
        return max(0.0, float(acc.get_epsilon(delta=delta)))


def check_wrappable(model: nn.Module) -> None:
    """Refuse a model whose per-sample gradients Opacus cannot compute, naming the layer.

    Raises:
        DataReconError: a layer Opacus's ``ModuleValidator`` rejects (e.g. BatchNorm: it mixes samples).
    """
    import_opacus()
    from opacus.validators import ModuleValidator  # optional dependency (import_opacus)

    for name, module in model.named_modules():
        errs = ModuleValidator.validate(module, strict=False) if not list(module.children()) else []
        if errs:
            why = str(errs[0]).split(".")[0]
            raise DataReconError(f"Opacus cannot wrap layer {name or '(root)'!r} ({type(module).__name__}: {why}); "
                                 "use an architecture without it or train without dp")


def resolve(dp: DPConfig, *, n: int, epochs: int) -> tuple[float, float, int, float]:
    """The numbers a DP-SGD run of ``epochs`` epochs on n examples uses: (q, δ, steps, σ).

    Raises:
        DataReconError: opacus missing, δ ≥ 1/n, or a target ε that cannot be reached.
    """
    import_opacus()
    q = sample_rate(dp.batch_size, n)
    delta = resolve_delta(dp.delta, n)
    total = steps_for(epochs, q)
    sigma = (dp.noise_multiplier if dp.noise_multiplier is not None
             else noise_for_epsilon(dp.target_epsilon, delta=delta, q=q, steps=total, accountant=dp.accountant))
    return q, delta, total, float(sigma)


@dataclass(frozen=True)
class DPMechanism:
    """The resolved numbers of one DP-SGD step (Abadi et al. 2016, Algorithm 1), as :func:`resolve` finds them.

    Attributes:
        noise_multiplier: σ ≥ 0, the noise std relative to the clip norm (0: clipping only).
        max_grad_norm: clip norm C > 0 of every per-sample gradient.
        sample_rate: Poisson sampling rate q = B / n ∈ (0, 1].
    """

    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float


def poisson_mask(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """(n,) bool: each example in the batch independently with probability q (Poisson sampling)."""
    return torch.rand(n, generator=generator, dtype=torch.float64) < q


class DPStepper:
    """One DP-SGD step per call (Opacus ``GradSampleModule`` + ``DPOptimizer`` over ``torch.optim.SGD``).

    Args:
        model: the network (trained in place; the wrapper shares its parameters).
        x: (n, *input_shape) inputs in model input space; y: (n,) labels.
        recipe: ``loss`` (a ``LOSSES`` key, a mean over the batch), and SGD's ``lr``, ``momentum`` and
            ``weight_decay`` (:class:`~datarecon.kernel.step.TrainingRecipe`; its other fields are not used here).
        mechanism: σ, the clip norm C and the sampling rate q (:class:`DPMechanism`).
        generator: draws the batches and the noise (same seed, same run).
        log_every: full-batch metrics every this many steps (others report the batch loss only).

    ``in_update`` is True from the batch draw to the end of the optimiser step: a checkpoint taken
    then would not be a state the run passes through, so none is written.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, recipe: TrainingRecipe,
                 mechanism: DPMechanism, generator: torch.Generator, log_every: int) -> None:
        import_opacus()
        from opacus import GradSampleModule  # optional dependency (import_opacus)
        from opacus.optimizers import DPOptimizer

        q, weight_decay = mechanism.sample_rate, recipe.weight_decay
        self.model, self.x, self.y, self.loss, self.q = model, x, y, recipe.loss, q
        self.loss_fn = LOSSES.get(recipe.loss)
        self.weight_decay, self.log_every, self.generator = weight_decay, log_every, generator
        self.wrapped = GradSampleModule(model, loss_reduction="mean")
        expected = max(1, round(q * x.shape[0]))
        sgd = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum, weight_decay=weight_decay)
        self.opt = DPOptimizer(sgd, noise_multiplier=mechanism.noise_multiplier, max_grad_norm=mechanism.max_grad_norm,
                               expected_batch_size=expected, loss_reduction="mean", generator=generator)
        self.batch_sizes: list[int] = []
        self.in_update = False

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimiser's momentum buffers (``momentum.<i>``, by parameter index) and the generator state."""
        tensors = {"generator": self.generator.get_state()}
        for i, p in enumerate(self.model.parameters()):
            buf = self.opt.original_optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                tensors[f"momentum.{i}"] = buf
        return tensors

    def state_record(self) -> dict[str, Any]:
        """The realised batch sizes so far (the accounting's mean batch size)."""
        return {"batch_sizes": self.batch_sizes}

    def load_state(self, tensors: dict[str, torch.Tensor], record: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_tensors` and :meth:`state_record` saved."""
        self.generator.set_state(tensors["generator"])
        for i, p in enumerate(self.model.parameters()):
            if f"momentum.{i}" in tensors:
                self.opt.original_optimizer.state[p]["momentum_buffer"] = tensors[f"momentum.{i}"].to(p)
        self.batch_sizes = list(record.get("batch_sizes") or [])

    def __call__(self, step: int) -> dict[str, float]:
        self.in_update = True
        mask = poisson_mask(self.x.shape[0], self.q, self.generator)
        xb, yb = self.x[mask], self.y[mask]
        self.opt.zero_grad(set_to_none=True)
        out = self.wrapped(xb)
        batch_loss = self.loss_fn(out, yb) if xb.shape[0] else out.sum() * 0.0
        with warnings.catch_warnings():  # inputs need no gradient; Opacus's full backward hooks say so
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            batch_loss.backward()
        self.opt.step()
        self.batch_sizes.append(int(xb.shape[0]))
        self.in_update = False
        metrics = {"batch_loss": float(batch_loss.detach()) if xb.shape[0] else 0.0, "batch_size": float(xb.shape[0])}
        if (step + 1) % self.log_every == 0:
            with torch.no_grad():
                full, _ = training_metrics(self.model, self.model(self.x), self.y, dict(self.model.named_parameters()),
                                           loss=self.loss, weight_decay=self.weight_decay)
            metrics.update(full)
        return metrics

    def unwrap(self) -> None:
        """Remove Opacus's hooks from the model (it is saved and attacked as a plain network)."""
        self.wrapped._close()


def _check_sgd(recipe: TrainingRecipe) -> None:
    """Refuse a recipe that DP-SGD does not run (it steps plain SGD on Poisson batches).

    Raises:
        DataReconError: an optimiser other than ``gd``, a schedule other than ``constant`` or mini-batches.
    """
    if recipe.optimizer != "gd" or recipe.schedule != "constant" or recipe.batch_size is not None:
        raise DataReconError("DP-SGD steps SGD on Poisson batches: its recipe needs optimizer gd, schedule constant "
                             f"and no batch_size; got optimizer {recipe.optimizer}, schedule {recipe.schedule}, "
                             f"batch_size {recipe.batch_size}")


def _accounting(dp: DPConfig, mechanism: DPMechanism, *, delta: float, steps: int,
                batch_sizes: Sequence[int]) -> dict[str, Any]:
    """The privacy record of ``steps`` DP-SGD steps (``FitResult.extra["dp"]`` of :func:`fit_dp`)."""
    sigma, q = mechanism.noise_multiplier, mechanism.sample_rate
    return {"epsilon": epsilon_spent(sigma, q=q, steps=steps, delta=delta, accountant=dp.accountant),
            "delta": delta, "noise_multiplier": sigma, "sample_rate": q, "steps": steps,
            "max_grad_norm": dp.max_grad_norm, "batch_size": dp.batch_size, "accountant": dp.accountant,
            "opacus": import_opacus().__version__,
            "mean_batch_size": sum(batch_sizes) / max(1, len(batch_sizes))}


def fit_dp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, recipe: TrainingRecipe, dp: DPConfig,
           loop: LoopOptions = LoopOptions(), checkpoint: Store | None = None) -> FitResult:
    """Train ``model`` with DP-SGD for ``recipe.epochs`` epochs and account the privacy spent.

    Args:
        model: the network (trained in place; float32 or float64, same device as ``x``).
        x: (n, *input_shape) model-input-space training inputs; y: (n,) labels (±1 floats or classes).
        recipe: ``loss`` (a ``LOSSES`` key), ``epochs`` (of round(1/q) steps each), SGD's ``lr``,
            ``momentum`` and ``weight_decay`` (on the noised gradient), and ``seed``, the seed of the
            generator of batches and noise (:class:`~datarecon.kernel.step.TrainingRecipe`; optimizer
            ``gd``, schedule ``constant``, no ``batch_size``).
        dp: the DP-SGD settings.
        loop: ``log_every``: full-batch history rows every this many epochs (of round(1/q) steps each), as
            :func:`~datarecon.training.fit.fit` and ``TrainConfig.log_every`` count them; ``progress``:
            progress bar/lines; ``checkpoint_every``: checkpoint period in epochs (0: only at the end of
            the run); ``resume``: continue from ``checkpoint`` if it exists; ``hooks``: extra engine hooks
            (e.g. stops on ``loss`` / ``train_acc``, computed at logged steps)
            (:class:`~datarecon.kernel.engine.LoopOptions`).
        checkpoint: training checkpoints and their configuration tag (None: none;
            :class:`~datarecon.kernel.resume.Store` of kind ``train``), in the one format of
            :mod:`datarecon.kernel.checkpoint`: weights, momentum buffers, the batch/noise generator's state,
            history and realised batch sizes, so a resumed run is bit-identical to an uninterrupted one.

    Returns:
        :class:`~datarecon.training.fit.FitResult`; ``extra["dp"]`` holds the accounting: ``epsilon``
        (at ``delta``, for the steps actually taken), ``delta``, ``noise_multiplier``, ``sample_rate``,
        ``steps``, ``max_grad_norm``, ``batch_size``, ``accountant``, ``opacus`` (version) and
        ``mean_batch_size`` (realised). ``epochs_done`` counts whole epochs; ``steps`` the DP-SGD steps.

    Raises:
        DataReconError: opacus missing, δ ≥ 1/n, an unreachable target ε, a layer Opacus cannot wrap, a
            recipe that is not plain SGD; CheckpointError: an unusable checkpoint on resume.

    References:
        Abadi et al. 2016, Algorithm 1 (DP-SGD); Mironov 2017 (RDP accountant).
    """
    _check_sgd(recipe)
    import_opacus()
    q, delta, total, sigma = resolve(dp, n=int(x.shape[0]), epochs=recipe.epochs)
    check_wrappable(model)
    gen = torch.Generator(device=x.device).manual_seed(recipe.seed)
    model.train()
    per_epoch = total // max(1, recipe.epochs)
    log_steps = max(1, loop.log_every) * per_epoch  # log_every counts epochs, as for fit(); the loop counts steps
    mechanism = DPMechanism(noise_multiplier=sigma, max_grad_norm=dp.max_grad_norm, sample_rate=q)
    stepper = DPStepper(model, x, y, recipe=recipe, mechanism=mechanism, generator=gen, log_every=log_steps)
    run = RunLoop(stepper, display=Display("dp-sgd", keys=("batch_loss", "train_acc"), every=log_steps),
                  options=loop, watch=("batch_loss", "energy"), log_every=log_steps)
    saved = ModelState(model, stepper)
    start = run.resume(checkpoint, saved, enabled=loop.resume)
    try:
        state = run.run_resumed(start, checkpoint, saved, total=total,
                                every=(loop.checkpoint_every or recipe.epochs) * per_epoch, updating=stepper)
    finally:
        stepper.unwrap()
    final, m = evaluate(model, x, y, loss=recipe.loss, weight_decay=recipe.weight_decay)
    accounting = _accounting(dp, mechanism, delta=delta, steps=state.step, batch_sizes=stepper.batch_sizes)
    return FitResult(model=model, status=run.status(state), stop_reason=state.stop_reason,
                     epochs_done=state.step // per_epoch, history=run.history.rows, metrics=final,
                     margins=m.detach().cpu(), wall_time_s=state.wall_time_s, resumed_from=start.step,
                     extra={"dp": accounting})
