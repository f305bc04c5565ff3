"""DP-SGD training (datarecon.training.dp): accounting against Opacus's own accountant, clipping and
noise against a naive per-sample loop, and the one-line errors."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

pytest.importorskip("opacus", reason="the dp extra (pip install 'datarecon[dp]') is installed by make test / CI")

from datarecon.errors import DataReconError  # noqa: E402
from datarecon.training import dp as dpm  # noqa: E402
from datarecon.kernel.engine import LoopOptions  # noqa: E402
from datarecon.training.dp import DPConfig, fit_dp  # noqa: E402
from datarecon.training.fit import FitRecipe, training_store  # noqa: E402
from datarecon.kernel.checkpoint import Kind  # noqa: E402
from checkpoint_problem import as_old_vocabulary  # noqa: E402
from datarecon.kernel.losses import LOSSES  # noqa: E402


def _problem(n: int = 12, d: int = 6, hidden: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, hidden, bias=False, dtype=torch.float64), nn.ReLU(),
                          nn.Linear(hidden, 1, bias=False, dtype=torch.float64))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model, x, y


def _reference_clipped_sgd(model: nn.Module, x, y, *, clip: float, q: float, steps: int, lr: float, seed: int,
                           weight_decay: float = 0.0) -> tuple[list[torch.Tensor], list[float]]:
    """Naive loop: same Poisson batches, per-sample grads one sample at a time, clip, sum, / expected B."""
    gen = torch.Generator().manual_seed(seed)
    params = list(model.parameters())
    expected = max(1, round(q * x.shape[0]))
    norms: list[float] = []
    for _ in range(steps):
        mask = dpm.poisson_mask(x.shape[0], q, gen)
        total = [torch.zeros_like(p) for p in params]
        for i in torch.nonzero(mask).view(-1).tolist():
            li = LOSSES.get("logistic")(model(x[i:i + 1]), y[i:i + 1])
            gi = torch.autograd.grad(li, params)
            nrm = float(torch.sqrt(sum((g * g).sum() for g in gi)))
            norms.append(nrm)
            factor = min(1.0, clip / (nrm + 1e-6))  # Opacus's clip factor C / (‖g‖ + 1e-6), capped at 1
            total = [t + factor * g for t, g in zip(total, gi)]
        with torch.no_grad():
            for p, t in zip(params, total):
                p -= lr * (t / expected + weight_decay * p)
    return [p.detach().clone() for p in params], norms


@pytest.mark.parametrize("clip", [1e6, 0.05], ids=["clip-huge", "clip-active"])
def test_noise_free_dp_sgd_equals_naive_clipped_sgd(clip):
    model, x, y = _problem()
    ref_model, _, _ = _problem()
    steps_epochs, batch, lr, wd = 3, 4, 0.1, 0.01
    res = fit_dp(model, x, y, dp=DPConfig(noise_multiplier=0.0, max_grad_norm=clip, batch_size=batch, delta=1e-3),
                 recipe=FitRecipe(loss="logistic", epochs=steps_epochs, lr=lr, weight_decay=wd, seed=7))
    steps = res.extra["dp"]["steps"]
    assert steps == steps_epochs * round(x.shape[0] / batch)
    ref, norms = _reference_clipped_sgd(ref_model, x, y, clip=clip, q=batch / x.shape[0], steps=steps, lr=lr, seed=7,
                                        weight_decay=wd)
    if clip < 1:
        assert max(norms) > 10 * clip  # clipping really acts in this case
    for p, r in zip(model.parameters(), ref):
        torch.testing.assert_close(p.detach(), r, rtol=1e-9, atol=1e-12)
    assert res.extra["dp"]["epsilon"] == float("inf")  # no noise, no privacy


def test_noise_has_the_dp_sgd_scale():
    """One full-batch step: (DP update − noiseless update)/lr is N(0, (σC/B)²) per coordinate."""
    torch.manual_seed(0)
    model, x, y = _problem(n=8, d=40, hidden=100)
    ref_model, _, _ = _problem(n=8, d=40, hidden=100)
    sigma, clip, lr = 2.0, 0.5, 1.0
    fit_dp(model, x, y, dp=DPConfig(noise_multiplier=sigma, max_grad_norm=clip, batch_size=8, delta=1e-3),
           recipe=FitRecipe(loss="logistic", epochs=1, lr=lr, seed=3))
    ref, _ = _reference_clipped_sgd(ref_model, x, y, clip=clip, q=1.0, steps=1, lr=lr, seed=3)
    diff = torch.cat([(r - p.detach()).reshape(-1) for p, r in zip(model.parameters(), ref)]) / lr
    expected = sigma * clip / 8
    assert diff.numel() > 4000
    assert abs(float(diff.std()) / expected - 1) < 0.05
    assert abs(float(diff.mean())) < 4 * expected / diff.numel() ** 0.5


def test_recorded_epsilon_matches_opacus_accountant(tmp_path):
    from opacus.accountants import RDPAccountant

    from datarecon.models.checkpoint import load_model_dir
    from datarecon.training.target import TrainConfig, model_card, train_target

    cfg = TrainConfig.model_validate({
        "data": {"dataset": "digits", "task": "odd-even", "n_per_class": 10, "n_heldout_per_class": 5},
        "arch": {"name": "mlp", "hidden": [8], "bias": False}, "lr": 0.2, "epochs": 3, "dtype": "float64",
        "dp": {"noise_multiplier": 1.3, "max_grad_norm": 1.0, "batch_size": 5, "delta": 1e-3}})
    train_target(cfg, out=tmp_path / "m", progress=False)
    bundle = load_model_dir(tmp_path / "m")
    m = bundle.meta["metrics"]
    acc = RDPAccountant()
    for _ in range(12):  # 3 epochs x round(20 / 5) steps, one accountant step each as Opacus's hook does
        acc.step(noise_multiplier=1.3, sample_rate=0.25)
    assert m["dp_steps"] == 12 and m["dp_sample_rate"] == 0.25 and m["epochs_done"] == 3
    assert m["dp_epsilon"] == pytest.approx(acc.get_epsilon(delta=1e-3), rel=1e-12)
    assert "epsilon" in model_card(bundle) and "rdp accountant" in model_card(bundle)


def test_target_epsilon_is_reached():
    model, x, y = _problem(n=20)
    res = fit_dp(model, x, y, dp=DPConfig(target_epsilon=4.0, batch_size=5, delta=1e-3),
                 recipe=FitRecipe(loss="logistic", epochs=2, lr=0.1))
    a = res.extra["dp"]
    assert a["epsilon"] <= 4.0 and a["epsilon"] == pytest.approx(4.0, rel=0.02)
    assert a["epsilon"] == pytest.approx(dpm.epsilon_spent(a["noise_multiplier"], q=0.25, steps=8, delta=1e-3))


def test_bad_input_gives_one_line_errors():
    model, x, y = _problem(n=10)
    with pytest.raises(DataReconError, match=r"delta 0.2 is >= 1/n = 0.1"):
        fit_dp(model, x, y, dp=DPConfig(noise_multiplier=1.0, delta=0.2),
               recipe=FitRecipe(loss="logistic", epochs=1, lr=0.1))
    with pytest.raises(DataReconError, match=r"target_epsilon 1e-06 cannot be reached"):
        fit_dp(model, x, y, dp=DPConfig(target_epsilon=1e-6, delta=1e-3),
               recipe=FitRecipe(loss="logistic", epochs=5, lr=0.1))
    bn = nn.Sequential(nn.Linear(6, 4, dtype=torch.float64), nn.BatchNorm1d(4, dtype=torch.float64),
                       nn.Linear(4, 1, dtype=torch.float64))
    with pytest.raises(DataReconError, match=r"Opacus cannot wrap layer '1' \(BatchNorm1d"):
        fit_dp(bn, x, y, dp=DPConfig(noise_multiplier=1.0, delta=1e-3),
               recipe=FitRecipe(loss="logistic", epochs=1, lr=0.1))
    with pytest.raises(DataReconError, match="exactly one of noise_multiplier and target_epsilon"):
        DPConfig(noise_multiplier=1.0, target_epsilon=2.0)


def test_missing_opacus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    with pytest.raises(DataReconError, match=r"pip install 'datarecon\[dp\]'"):
        dpm.import_opacus()


def test_cli_trains_a_dp_target_and_refuses_bad_delta(tmp_path, capsys, data_dir):
    from datarecon.cli.main import main

    base = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--arch", "mlp",
            "--hidden", "8", "--epochs", "2", "--no-progress", "--data-dir", str(data_dir)]
    assert main(base + ["--dp-noise", "1.0", "--dp-batch-size", "5", "--out", str(tmp_path / "m")]) == 0
    assert "privacy     DP-SGD" in capsys.readouterr().out
    assert main(base + ["--dp-noise", "1.0", "--dp-delta", "0.1", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dp delta 0.1 is >= 1/n = 0.1") and "\n" not in err
    assert not (tmp_path / "bad").exists()  # refused before the folder is made


@pytest.mark.parametrize("kill_at, vocabulary", [(9, "schema"), (13, "schema"), (13, "before-the-schema")],
                         ids=["kill-at-checkpoint", "kill-between-checkpoints", "checkpoint-before-the-schema"])
def test_a_killed_dp_run_resumes_bit_identically(tmp_path, hard_kill, kill_at, vocabulary):
    """Noise and momentum on: the resumed run needs the weights, the momentum buffers, the generator of
    batches and noise, the history and the realised batch sizes of the checkpoint, all of them (also from a
    checkpoint in the vocabulary before the one schema)."""
    dp = DPConfig(noise_multiplier=0.8, max_grad_norm=0.5, batch_size=4, delta=1e-3)
    kw = dict(dp=dp, recipe=FitRecipe(loss="logistic", epochs=6, lr=0.1, momentum=0.9, seed=3))
    ck = training_store(tmp_path, tag="t")
    full = fit_dp(*_problem(), loop=LoopOptions(log_every=2), **kw)
    hard_kill(lambda hooks: fit_dp(*_problem(), checkpoint=ck, **kw,
                                   loop=LoopOptions(log_every=2, checkpoint_every=3, hooks=tuple(hooks))), kill_at)
    if vocabulary == "before-the-schema":
        as_old_vocabulary(tmp_path, Kind.TRAIN)
    resume = LoopOptions(log_every=2, checkpoint_every=3, resume=True)
    res = fit_dp(*_problem(), checkpoint=ck, loop=resume, **kw)
    assert res.resumed_from == 9  # 3 epochs of round(12/4) = 3 steps
    for a, b in zip(full.model.parameters(), res.model.parameters()):
        assert torch.equal(a, b)
    assert res.history == full.history and res.extra["dp"] == full.extra["dp"]
    again = fit_dp(*_problem(seed=5), checkpoint=ck, loop=resume, **kw)
    assert all(torch.equal(a, b) for a, b in zip(full.model.parameters(), again.model.parameters()))  # finished


def test_log_every_counts_epochs_as_for_fit():
    """TrainConfig.log_every is in epochs for every trainer: here 2 epochs of round(12/4) = 3 steps."""
    dp = DPConfig(noise_multiplier=0.5, max_grad_norm=1.0, batch_size=4, delta=1e-3)
    res = fit_dp(*_problem(), dp=dp, recipe=FitRecipe(loss="logistic", epochs=6, lr=0.1, seed=0),
                 loop=LoopOptions(log_every=2))
    assert [row["step"] for row in res.history] == [6, 12, 18]
    assert all("train_acc" in row for row in res.history)  # full-batch metrics at every logged epoch
