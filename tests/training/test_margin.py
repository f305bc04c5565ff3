"""Margin ascent and the log-domain loss-normalised step, against independent references."""

from __future__ import annotations

import math
from pathlib import Path

import mpmath
import pytest
from checkpoint_problem import as_old_vocabulary
import torch

from datarecon.errors import DataReconError
from datarecon.models.spec import ArchSpec, build_model
from datarecon.kernel.engine import LoopOptions
from datarecon.kernel.checkpoint import Kind
from datarecon.training import training_store, ascend_margin, fit, kkt_regime_score
from datarecon.training.fit import AscentRecipe, FitRecipe
from datarecon.training.margin import log_mean_loss, log_softplus, negative_margins


def _mp_log_softplus(s: float) -> float:
    mpmath.mp.dps = 60
    return float(mpmath.log(mpmath.log1p(mpmath.exp(mpmath.mpf(s)))))


@pytest.mark.parametrize("s", [-5000.0, -745.0, -700.0, -40.0, -30.5, -29.5, -3.0, 0.0, 2.0, 50.0, 700.0])
def test_log_softplus_matches_60_digit_reference(s: float) -> None:
    got = float(log_softplus(torch.tensor([s], dtype=torch.float64))[0])
    assert got == pytest.approx(_mp_log_softplus(s), rel=1e-13, abs=1e-13)


def test_log_mean_loss_equals_direct_formula_and_stays_finite_when_the_loss_underflows() -> None:
    g = torch.Generator().manual_seed(0)
    out = torch.randn(7, 1, dtype=torch.float64, generator=g)
    y = torch.tensor([1, -1, 1, 1, -1, -1, 1], dtype=torch.float64)
    direct = torch.log(torch.nn.functional.softplus(-y * out[:, 0]).mean())
    assert float(log_mean_loss(out, y, loss="logistic")) == pytest.approx(float(direct), rel=1e-14)
    big = y[:, None] * 1000 + out  # every margin > 997: softplus underflows to 0 in float64
    assert float(torch.nn.functional.softplus(-y * big[:, 0]).mean()) == 0.0
    val = float(log_mean_loss(big, y, loss="logistic"))
    ref = float(mpmath.log(sum(mpmath.log1p(mpmath.exp(-float(y[i] * big[i, 0]))) for i in range(7)) / 7))
    assert val == pytest.approx(ref, rel=1e-12)
    # cross-entropy: s_i = logsumexp_{j != y}(z_j - z_y), so log(1 + e^s) is the usual CE loss
    z = torch.randn(5, 3, dtype=torch.float64, generator=g)
    c = torch.tensor([0, 2, 1, 1, 0])
    ce = torch.nn.functional.cross_entropy(z, c, reduction="none")
    assert torch.allclose(torch.nn.functional.softplus(negative_margins(z, c, loss="cross-entropy")), ce, rtol=1e-13)
    with pytest.raises(DataReconError, match="exponentially tailed"):
        negative_margins(z, c, loss="mse")


def _planar(n: int = 12):
    """Separable 2-D points (+ a constant-free linear classifier through the origin)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 1, 1, 2, dtype=torch.float64, generator=g)
    w_true = torch.tensor([1.0, -0.6], dtype=torch.float64)
    s = x.flatten(1) @ w_true
    y = torch.where(s > 0, 1.0, -1.0).to(torch.float64)
    x = x + 0.3 * y[:, None, None, None] * w_true.view(1, 1, 1, 2) / w_true.norm()  # widen the gap
    return x, y


def test_margin_ascent_on_a_linear_model_finds_the_brute_force_minimiser_on_the_circle() -> None:
    """On ‖w‖ = R a linear model's log L depends on one angle: a 400 001-point grid is the reference."""
    x, y = _planar()
    model = build_model(ArchSpec(name="affine", input_shape=(1, 1, 2), bias=False),
                        generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (weight,) = list(model.parameters())
    with torch.no_grad():
        weight.copy_(torch.tensor([[4.0, 1.0]], dtype=torch.float64).view_as(weight))  # separates, off-optimum
    radius = float(weight.detach().norm())
    res = ascend_margin(model, x, y, loss="logistic", ascent=AscentRecipe(steps=400, step_size=0.01, min_step=1e-10))
    w = weight.detach().reshape(-1)
    assert float(w.norm()) == pytest.approx(radius, rel=1e-12)  # stays on the sphere
    phi = torch.linspace(-math.pi, math.pi, 400_001, dtype=torch.float64)
    grid = radius * torch.stack([phi.cos(), phi.sin()], dim=1)  # (G, 2)
    vals = torch.logsumexp(log_softplus(-(grid @ x.flatten(1).T) * y), dim=1)
    best = grid[int(vals.argmin())]
    assert float(torch.dot(w, best) / radius ** 2) > 1 - 1e-9
    assert res.status in ("stopped-early", "complete")
    # the smoothed objective decreased monotonically over the accepted steps
    energies = [r["energy"] for r in res.history]
    assert all(b <= a for a, b in zip(energies, energies[1:]))


def _mlp(seed: int = 0) -> torch.nn.Module:
    spec = ArchSpec(name="mlp", input_shape=(1, 4, 4), hidden=(16, 16), bias=False, init_scale=0.1)
    return build_model(spec, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _toy(n: int = 24):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 4, 4, dtype=torch.float64, generator=g)
    flat = x.flatten(1)
    y = torch.where(flat[:, 0] - flat[:, 5] + 0.3 * flat[:, 9] > 0, 1.0, -1.0).to(torch.float64)
    return x, y


def test_margin_ascent_drives_a_stalled_mlp_into_the_kkt_regime() -> None:
    """After GD separates the data, ascent raises the normalised margin and lowers the KKT-regime score."""
    x, y = _toy()
    model = _mlp()
    gd = fit(model, x, y, recipe=FitRecipe(loss="logistic", lr=1.0, epochs=1500, schedule="loss-normalised",
                                           max_lr_factor=1e4))
    before = kkt_regime_score(model, x, y)
    res = ascend_margin(model, x, y, loss="logistic", ascent=AscentRecipe(steps=600), loop=LoopOptions(log_every=50))
    after = kkt_regime_score(model, x, y)
    nm = [r["normalised_margin"] for r in res.history]
    assert nm[-1] > 10 * gd.metrics["normalised_margin"] > 0  # measured: 0.0014 -> 0.061
    assert nm == sorted(nm)
    assert after.score < 0.5 * before.score and after.score < 0.2  # measured: 0.64 -> 0.11


def test_margin_ascent_refuses_unseparated_data_and_other_losses() -> None:
    x, y = _toy()
    with pytest.raises(DataReconError, match="zero training error"):
        ascend_margin(_mlp(), x, y, loss="logistic", ascent=AscentRecipe(steps=3))
    with pytest.raises(DataReconError, match="exponentially tailed"):
        ascend_margin(_mlp(), x, y, loss="mse", ascent=AscentRecipe(steps=3))


def test_margin_ascent_kill_and_resume_is_bit_identical(kill_after, tmp_path: Path) -> None:
    x, y, fresh = _separated_mlp()
    ascent = AscentRecipe(steps=40)
    full = ascend_margin(fresh(), x, y, loss="logistic", ascent=ascent, loop=LoopOptions(log_every=3))
    ck = training_store(tmp_path / "ck", tag="t")
    with pytest.raises(KeyboardInterrupt):
        ascend_margin(fresh(), x, y, loss="logistic", ascent=ascent, checkpoint=ck,
                      loop=LoopOptions(log_every=3, checkpoint_every=5, hooks=(kill_after(17),)))
    res = ascend_margin(_mlp(seed=4), x, y, loss="logistic", ascent=ascent, checkpoint=ck,
                        loop=LoopOptions(log_every=3, checkpoint_every=5, resume=True))
    assert res.resumed_from == 17
    for a, b in zip(full.model.state_dict().values(), res.model.state_dict().values()):
        assert torch.equal(a, b)
    assert res.history == full.history


def test_log_domain_loss_normalised_step_equals_the_capped_step_while_the_cap_does_not_bind() -> None:
    """lr·∇log L (log domain) and (lr/L)·∇L (the schedule) are the same update: compare 110 epochs (the loss falls from 0.7 to 1e-3)."""
    x, y = _toy()
    a, b = _mlp(), _mlp()
    kw = dict(loss="logistic", lr=0.05, epochs=110, schedule="loss-normalised")
    ra = fit(a, x, y, recipe=FitRecipe(max_lr_factor=None, **kw), loop=LoopOptions(log_every=10))  # log domain
    rb = fit(b, x, y, recipe=FitRecipe(max_lr_factor=1e12, **kw), loop=LoopOptions(log_every=10))  # direct (cap far)
    assert all(r["lr"] < 1e12 * 0.1 for r in rb.history)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, rtol=1e-9, atol=1e-12)
    assert [r["loss"] for r in ra.history] == pytest.approx([r["loss"] for r in rb.history], rel=1e-9)


def test_train_target_skips_the_ascent_with_a_warning_when_the_data_are_not_separated(tmp_path: Path) -> None:
    from datarecon.training.target import build_train_config, train_target

    cfg = build_train_config({"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 8},
                              "arch": {"name": "mlp", "hidden": [4], "bias": False}, "lr": 1e-4, "epochs": 3,
                              "margin_ascent": {"steps": 5}})
    with pytest.warns(UserWarning, match="margin ascent skipped"):
        res = train_target(cfg, out=tmp_path / "m", progress=False)
    assert res.metrics["margin_ascent_status"] == "skipped" and res.metrics["epochs_done"] == 3


def _separated_mlp():
    """The toy MLP after GD has separated its data (the start of every ascent test below)."""
    x, y = _toy()
    base = _mlp()
    fit(base, x, y, recipe=FitRecipe(loss="logistic", lr=1.0, epochs=800, schedule="loss-normalised",
                                     max_lr_factor=1e4))
    state = {k: v.clone() for k, v in base.state_dict().items()}

    def fresh() -> torch.nn.Module:
        m = _mlp(seed=9)
        m.load_state_dict(state)
        return m

    return x, y, fresh


def test_margin_ascent_to_convergence_stops_at_the_first_window_whose_relative_gain_is_below_rtol() -> None:
    """The stop rule against a naive replay of the same trajectory: a fixed-step ascent's history, read every
    ``window`` steps, gives the first window whose gain falls below rtol; the converged run stops exactly there
    with the same weights bit for bit."""
    x, y, fresh = _separated_mlp()
    window, rtol = 20, 0.02
    fixed = ascend_margin(fresh(), x, y, loss="logistic", ascent=AscentRecipe(steps=600))
    nm = [r["normalised_margin"] for r in fixed.history]  # log_every 1: row k is step k + 1
    start = float(fixed.extra["curve"][0]["normalised_margin"])
    checks = [start] + [nm[k - 1] for k in range(window, 601, window)]
    expected = next(window * (j + 1) for j in range(len(checks) - 1)
                    if (checks[j + 1] - checks[j]) / checks[j] < rtol)
    assert window < expected < 600  # the rule fires inside the budget, after the first window
    conv = ascend_margin(fresh(), x, y, loss="logistic", ascent=AscentRecipe(steps=600, rtol=rtol, window=window))
    assert conv.epochs_done == expected and conv.status == "stopped-early"
    assert conv.stop_reason.startswith("converged: normalised margin")
    stopped = ascend_margin(fresh(), x, y, loss="logistic", ascent=AscentRecipe(steps=expected))
    for a, b in zip(conv.model.state_dict().values(), stopped.model.state_dict().values()):
        assert torch.equal(a, b)
    curve = conv.extra["curve"]
    assert [p["step"] for p in curve] == list(range(0, expected + 1, window))
    assert [p["normalised_margin"] for p in curve[1:]] == [nm[k - 1] for k in range(window, expected + 1, window)]


def test_margin_ascent_curve_probes_the_start_powers_of_two_windows_and_the_end_without_changing_the_weights() -> None:
    x, y, fresh = _separated_mlp()
    calls = []

    def probe(model: torch.nn.Module) -> dict[str, float]:
        calls.append(float(sum(p.detach().abs().sum() for p in model.parameters())))
        return {"probe": float(len(calls))}

    plain = ascend_margin(fresh(), x, y, loss="logistic", ascent=AscentRecipe(steps=110, window=10))
    probed = ascend_margin(fresh(), x, y, loss="logistic", ascent=AscentRecipe(steps=110, window=10), probe=probe)
    for a, b in zip(plain.model.state_dict().values(), probed.model.state_dict().values()):
        assert torch.equal(a, b)
    curve = probed.extra["curve"]
    assert [p["step"] for p in curve] == list(range(0, 111, 10))
    assert [p["step"] for p in curve if "probe" in p] == [0, 10, 20, 40, 80, 110]
    assert len(calls) == 6 and len(set(calls)) == 6  # each at another θ


@pytest.mark.parametrize("vocabulary", ["schema", "before-the-schema"])
def test_margin_ascent_to_convergence_kill_and_resume_is_bit_identical(kill_after, tmp_path: Path,
                                                                        vocabulary: str) -> None:
    """Killed between two convergence checks and resumed: the same stop step, weights, history and curve (also
    from a checkpoint in the vocabulary before the one schema: its ``last_margin`` is the stop rule's memory)."""
    x, y, fresh = _separated_mlp()
    ascent = AscentRecipe(steps=600, rtol=0.02, window=20)

    def probe(model: torch.nn.Module) -> dict[str, float]:
        return {"w0": float(next(model.parameters()).detach().reshape(-1)[0])}

    full = ascend_margin(fresh(), x, y, loss="logistic", ascent=ascent, loop=LoopOptions(log_every=7), probe=probe)
    ck = training_store(tmp_path / "ck", tag="t")
    kill_at = full.epochs_done - 13  # after the last check but one, before the stop
    with pytest.raises(KeyboardInterrupt):
        ascend_margin(fresh(), x, y, loss="logistic", ascent=ascent, checkpoint=ck, probe=probe,
                      loop=LoopOptions(log_every=7, checkpoint_every=30, hooks=(kill_after(kill_at),)))
    if vocabulary == "before-the-schema":
        as_old_vocabulary(tmp_path / "ck", Kind.TRAIN)
    res = ascend_margin(_mlp(seed=4), x, y, loss="logistic", ascent=ascent, checkpoint=ck, probe=probe,
                        loop=LoopOptions(log_every=7, checkpoint_every=30, resume=True))
    assert res.resumed_from == kill_at and res.epochs_done == full.epochs_done
    assert res.stop_reason == full.stop_reason
    for a, b in zip(full.model.state_dict().values(), res.model.state_dict().values()):
        assert torch.equal(a, b)
    assert res.history == full.history
    assert res.extra["curve"] == full.extra["curve"]


def test_margin_ascent_rtol_needs_a_budget_of_a_window_and_leaves_hashes_of_fixed_step_configs_alone() -> None:
    from datarecon.training.target import build_train_config

    base = {"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 8},
            "arch": {"name": "mlp", "hidden": [4], "bias": False}, "epochs": 3}
    with pytest.raises(DataReconError, match="budget"):
        build_train_config({**base, "margin_ascent": {"steps": 100, "rtol": 1e-3, "window": 500}})
    fixed = build_train_config({**base, "margin_ascent": {"steps": 100}})
    assert "rtol" not in fixed.model_dump()["margin_ascent"] and "window" not in fixed.model_dump()["margin_ascent"]
    # without the stop rule the window only places curve points: same weights, same hash
    assert build_train_config({**base, "margin_ascent": {"steps": 100, "window": 7}}).hash() == fixed.hash()
    conv = build_train_config({**base, "margin_ascent": {"steps": 1000, "rtol": 1e-3}})
    assert conv.hash() != build_train_config({**base, "margin_ascent": {"steps": 1000}}).hash()
    assert conv.hash() != build_train_config({**base, "margin_ascent": {"steps": 1000, "rtol": 1e-3,
                                                                          "window": 100}}).hash()
