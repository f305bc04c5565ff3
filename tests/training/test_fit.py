"""Full-batch ``fit``: convergence, stop rules, divergence, kill-and-resume bit-identity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from datarecon.data import DataSpec, load_task
from datarecon.errors import CheckpointError, DataReconError
from datarecon.models.spec import ArchSpec, build_model
from datarecon.kernel.engine import LoopOptions
from datarecon.training import OPTIMIZERS, SCHEDULES, StopRule, training_store, fit
from datarecon.training.fit import FitRecipe


def _toy(dtype=torch.float64, n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 4, 4, dtype=dtype, generator=g)
    flat = x.flatten(1)
    y = torch.where(flat[:, 0] + 0.5 * flat[:, 3] > 0, 1.0, -1.0).to(dtype)
    return x, y


def _model(dtype=torch.float64, hidden=(12,), bias=False, seed=0):
    spec = ArchSpec(name="mlp", input_shape=(1, 4, 4), hidden=hidden, bias=bias)
    return build_model(spec, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_digits_odd_even_reaches_zero_training_error() -> None:
    data = load_task(DataSpec(dataset="digits", task="odd-even", n_per_class=25))
    x = data.normalisation.to_model(data.train.x)
    model = build_model(ArchSpec(name="mlp", input_shape=data.input_shape, hidden=(32,), bias=False),
                        generator=torch.Generator().manual_seed(0))
    res = fit(model, x, data.train.y, recipe=FitRecipe(loss="logistic", lr=0.5, epochs=2000),
              stop=StopRule(zero_error=True))
    assert res.status == "stopped-early" and res.stop_reason == "zero training error"
    assert res.metrics["train_acc"] == 1.0
    assert float(res.margins.min()) > 0 and res.margins.shape == (50,)
    assert res.metrics["normalised_margin"] == pytest.approx(
        float(res.margins.min()) / res.metrics["weight_norm"] ** 2, rel=1e-5)


def test_gd_matches_torch_sgd_with_momentum_and_weight_decay() -> None:
    x, y = _toy()
    a, b = _model(), _model()
    fit(a, x, y, recipe=FitRecipe(loss="logistic", lr=0.3, momentum=0.9, weight_decay=1e-2, epochs=25))
    opt = torch.optim.SGD(b.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-2)
    for _ in range(25):
        opt.zero_grad()
        torch.nn.functional.softplus(-y * b(x)[:, 0]).mean().backward()
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-10, atol=1e-12)


def test_history_and_metrics_describe_theta_before_each_step() -> None:
    x, y = _toy()
    model = _model()
    res = fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=0.1, lr=0.1, epochs=10),
              loop=LoopOptions(log_every=3))
    assert [r["step"] for r in res.history] == [3, 6, 9, 10]
    row = res.history[-1]
    assert row["energy"] == pytest.approx(row["loss"] + 0.05 * row["weight_norm"] ** 2, rel=1e-10)
    assert res.epochs_done == 10 and res.status == "complete"
    assert res.metrics["energy"] < res.history[0]["energy"]


def test_loss_threshold_and_margin_stabilisation_stop() -> None:
    x, y = _toy()
    res = fit(_model(), x, y, recipe=FitRecipe(loss="logistic", lr=0.5, epochs=5000),
              stop=StopRule(loss_threshold=0.05))
    assert res.status == "stopped-early" and "threshold" in res.stop_reason
    assert res.history[-1]["loss"] <= 0.05 and res.epochs_done < 5000
    res = fit(_model(), x, y, recipe=FitRecipe(loss="logistic", lr=0.02, epochs=5000, schedule="loss-normalised"),
              stop=StopRule(margin_patience=200, margin_stable_rtol=1e-3))
    assert res.status == "stopped-early" and "stabilised" in res.stop_reason and res.metrics["train_acc"] == 1.0


def test_loss_normalised_schedule_grows_normalised_margin_faster() -> None:
    x, y = _toy()
    const = fit(_model(), x, y, recipe=FitRecipe(loss="logistic", lr=0.2, epochs=1500))
    norm = fit(_model(), x, y, recipe=FitRecipe(loss="logistic", lr=0.02, epochs=1500, schedule="loss-normalised"))
    assert norm.metrics["train_acc"] == 1.0
    assert norm.metrics["normalised_margin"] > const.metrics["normalised_margin"]
    assert norm.metrics["loss"] < const.metrics["loss"]


def test_schedules_values() -> None:
    assert SCHEDULES.get("constant")(0.1, 5, 0.3) == 0.1
    assert SCHEDULES.get("loss-normalised")(0.1, 5, 0.5) == pytest.approx(0.2)
    assert SCHEDULES.get("loss-normalised")(0.1, 5, 0.0, max_lr_factor=10.0) == pytest.approx(1.0)
    assert SCHEDULES.get("increasing")(0.1, 3000, 1.0) == pytest.approx(0.2)


def test_lbfgs_solves_convex_affine_problem_with_weight_decay() -> None:
    x, y = _toy()
    spec = ArchSpec(name="affine", input_shape=(1, 4, 4))
    model = build_model(spec, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    res = fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=1e-2, optimizer="lbfgs", lr=1.0, epochs=60))
    params = list(model.parameters())
    energy = torch.nn.functional.softplus(-y * model(x)[:, 0]).mean() + 0.005 * sum((p * p).sum() for p in params)
    grads = torch.autograd.grad(energy, params)
    assert math.sqrt(sum(float((g * g).sum()) for g in grads)) < 1e-8
    assert res.status == "complete"


def test_divergence_keeps_last_finite_state() -> None:
    x, y = _toy()
    model = _model()
    res = fit(model, x, y, recipe=FitRecipe(loss="mse", lr=1e6, epochs=50))
    assert res.status == "diverged"
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert not math.isfinite(res.history[-1]["energy"]) or not math.isfinite(res.history[-1]["grad_norm"])


def test_argument_errors() -> None:
    x, y = _toy()
    with pytest.raises(DataReconError, match="learning rate must be positive"):
        fit(_model(), x, y, recipe=FitRecipe(loss="logistic", lr=0.0))
    with pytest.raises(DataReconError, match="needs class-index labels"):
        fit(_model(), x, y, recipe=FitRecipe(loss="cross-entropy"))
    with pytest.raises(DataReconError, match="momentum applies to --optimizer gd only"):
        fit(_model(), x, y, recipe=FitRecipe(loss="logistic", optimizer="lbfgs", momentum=0.5))
    with pytest.raises(DataReconError, match="unknown optimizer 'adam'; valid names: gd, lbfgs"):
        fit(_model(), x, y, recipe=FitRecipe(loss="logistic", optimizer="adam"))
    assert OPTIMIZERS.names() == ["gd", "lbfgs"]


@pytest.mark.parametrize(("optimizer", "momentum", "schedule"), [
    ("gd", 0.9, "constant"), ("gd", 0.0, "loss-normalised"), ("lbfgs", 0.0, "constant")],
    ids=["gd-momentum", "gd-loss-normalised", "lbfgs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_kill_and_resume_is_bit_identical(kill_after, tmp_path: Path, optimizer, momentum, schedule, dtype) -> None:
    x, y = _toy(dtype)
    recipe = FitRecipe(loss="logistic", weight_decay=1e-3, optimizer=optimizer, lr=0.5 if optimizer == "gd" else 1.0,
                       momentum=momentum, schedule=schedule, epochs=60)
    kw = dict(recipe=recipe, stop=StopRule(margin_patience=10, margin_stable_rtol=1e-12))
    full = fit(_model(dtype), x, y, loop=LoopOptions(log_every=4), **kw)
    ck = training_store(tmp_path / "ck", tag="t")
    with pytest.raises(KeyboardInterrupt):
        fit(_model(dtype), x, y, loop=LoopOptions(log_every=4, checkpoint_every=7, hooks=(kill_after(23),)),
            checkpoint=ck, **kw)
    res = fit(_model(dtype, seed=5), x, y, loop=LoopOptions(log_every=4, checkpoint_every=7, resume=True),
              checkpoint=ck, **kw)
    assert res.resumed_from == 23  # final save at the interruption
    for a, b in zip(full.model.state_dict().values(), res.model.state_dict().values()):
        assert torch.equal(a, b)
    assert res.history == full.history and res.epochs_done == full.epochs_done


def test_resume_from_periodic_checkpoint_after_hard_kill(tmp_path: Path, hard_kill) -> None:
    """A hard kill skips the final save: resume from the last periodic checkpoint."""
    x, y = _toy()
    recipe = FitRecipe(loss="logistic", lr=0.5, momentum=0.5, epochs=40)
    full = fit(_model(), x, y, recipe=recipe)
    ck = training_store(tmp_path / "ck", tag="t")
    hard_kill(lambda hooks: fit(_model(), x, y, recipe=recipe, loop=LoopOptions(checkpoint_every=5, hooks=tuple(hooks)),
                                checkpoint=ck), 17)
    res = fit(_model(), x, y, recipe=recipe, loop=LoopOptions(checkpoint_every=5, resume=True), checkpoint=ck)
    assert res.resumed_from == 15
    for a, b in zip(full.model.state_dict().values(), res.model.state_dict().values()):
        assert torch.equal(a, b)


def test_resume_with_other_config_is_refused(tmp_path: Path) -> None:
    x, y = _toy()
    recipe = FitRecipe(loss="logistic", epochs=5)
    fit(_model(), x, y, recipe=recipe, checkpoint=training_store(tmp_path, tag="aaa"))
    with pytest.raises(CheckpointError, match=r"another configuration \(hash aaa != bbb\)"):
        fit(_model(), x, y, recipe=recipe, loop=LoopOptions(resume=True),
            checkpoint=training_store(tmp_path, tag="bbb"))


def test_resume_of_finished_run_does_not_train_further(tmp_path: Path) -> None:
    x, y = _toy()
    kw = dict(recipe=FitRecipe(loss="logistic", lr=0.5, epochs=500), stop=StopRule(zero_error=True),
              checkpoint=training_store(tmp_path, tag="t"))
    first = fit(_model(), x, y, **kw)
    again = fit(_model(seed=3), x, y, loop=LoopOptions(resume=True), **kw)
    assert again.epochs_done == first.epochs_done and again.status == "stopped-early"
    for a, b in zip(first.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)


def test_tampered_training_checkpoint_is_refused(tmp_path: Path) -> None:
    x, y = _toy()
    kw = dict(recipe=FitRecipe(loss="logistic", epochs=5), checkpoint=training_store(tmp_path, tag="t"))
    fit(_model(), x, y, **kw)
    tensors = tmp_path / "state.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        fit(_model(), x, y, loop=LoopOptions(resume=True), **kw)


def test_a_checkpoint_with_the_old_status_words_still_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the shared Status vocabulary said ``stopped`` (now ``stopped-early``)."""
    from datarecon.kernel import checkpoint

    x, y = _toy()
    kw = dict(recipe=FitRecipe(loss="logistic", lr=0.5, epochs=500), stop=StopRule(zero_error=True),
              checkpoint=training_store(tmp_path, tag="t"))
    first = fit(_model(), x, y, **kw)
    tensors, info = checkpoint.load(tmp_path, kind=checkpoint.Kind.TRAIN)
    assert info["status"] == "stopped-early"
    checkpoint.save(tmp_path, tensors, {**info, "status": "stopped"}, kind=checkpoint.Kind.TRAIN)
    again = fit(_model(seed=3), x, y, loop=LoopOptions(resume=True), **kw)
    assert again.status == "stopped-early" and again.epochs_done == first.epochs_done
