"""CNN targets: attack gradients against float64 finite differences, the KKT-regime score against a
naive per-sample loop, and a tiny CNN end to end (train -> kkt / decoreco / gradnorm -> evaluate)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from datarecon.attacks import kkt_math
from datarecon.models.spec import ArchSpec, build_model


def _cnn(k: int, *, seed: int = 0, smooth: bool = False) -> nn.Sequential:
    net = build_model(ArchSpec(name="cnn", input_shape=(1, 6, 6), hidden=(3, 2), bias=False, num_outputs=k),
                      generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if smooth:  # softplus: forward and backward agree, so finite differences see the same function
        for i, m in enumerate(net):
            if isinstance(m, nn.ReLU):
                net[i] = nn.Softplus(beta=3.0)
    return net


def _fwd(model: nn.Module):
    return lambda x, p: functional_call(model, dict(p), (x,))


@pytest.mark.parametrize("smooth", [True, False], ids=["softplus", "relu"])
@pytest.mark.parametrize("margin,k", [("binary", 1), ("multiclass", 3)], ids=["binary", "multiclass"])
def test_kkt_objective_gradients_match_finite_differences(margin, k, smooth, kkt_gradcheck):
    """∂L/∂x and ∂L/∂λ of the KKT / DecoReco objective through a CNN, float64 central differences.

    With exact ReLU the objective is piecewise smooth in x (the activation pattern is constant near a
    random point), so finite differences apply there too."""
    model = _cnn(k, seed=3, smooth=smooth)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y, lam = kkt_gradcheck(model, params, input_shape=(1, 6, 6), margin=margin, k=k)
    # the attack's seeded-backward path gives the same gradient (box prior left out there)
    objective = kkt_math.KKTObjective(margin=margin, lambda_min=0.5, lambda_min_weight=5.0, box_weight=1.0)
    terms = kkt_math.kkt_terms(_fwd(model), params, x, y, lam, objective=objective, box=None)
    gx_ref, gl_ref = torch.autograd.grad(terms["loss"], [x, lam])
    _, gx, gl = kkt_math.kkt_residual_and_grads(_fwd(model), params, x, y, lam, objective=objective)
    assert torch.allclose(gx, gx_ref, rtol=1e-10, atol=1e-12) and torch.allclose(gl, gl_ref, rtol=1e-10, atol=1e-12)


def test_gradnorm_objective_gradient_matches_finite_differences():
    model = _cnn(1, seed=4, smooth=True)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randn(3, 1, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, -1, 1]).double()

    def f(x_):
        return kkt_math.gradnorm_terms(_fwd(model), params, x_, y, box=(-0.5, 0.5),
                                       objective=kkt_math.GradNormObjective(loss="logistic", weight_decay=0.0,
                                                                            box_weight=1.0))["loss"]

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_kkt_regime_score_of_a_cnn_matches_a_naive_loop():
    """The generic (jacobian) Gram path on a CNN against per-sample gradients from a Python loop."""
    import numpy as np
    from scipy.optimize import nnls

    from datarecon.training.kkt_regime import homogeneity_degree, kkt_regime_score

    model = _cnn(1, seed=5)
    x = torch.rand(6, 1, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1, -1]).double()
    s = kkt_regime_score(model, x, y)
    rows = []
    for i in range(6):
        model.zero_grad()
        (y[i] * model(x[i:i + 1])[0, 0]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    a = torch.stack(rows).T.numpy()  # P x n
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    lam, res = nnls(a, theta)
    assert s.score == pytest.approx(res ** 2 / float(theta @ theta), rel=1e-6, abs=1e-12)
    assert np.allclose(s.multipliers.numpy(), lam, rtol=1e-5, atol=1e-8)
    assert homogeneity_degree(model) == 3


@pytest.mark.parametrize("method", ["kkt", "decoreco", "gradnorm"])
def test_tiny_cnn_end_to_end(tmp_path_factory, method):
    """datarecon train --arch cnn -> reconstruct (method) -> evaluate, in-process through the CLI."""
    from datarecon.cli.main import main
    from datarecon.utils.io import read_json

    root = tmp_path_factory.getbasetemp() / "tiny-cnn"
    model = root / "model"
    if not (model / "model.json").is_file():
        assert main(["train", "--out", str(model), "--dataset", "digits", "--task", "odd-even", "--n-per-class", "4",
                     "--n-heldout-per-class", "4", "--arch", "cnn", "--channels", "4,4", "--kernel", "3", "--no-bias",
                     "--epochs", "200", "--lr", "0.5", "--kkt-score", "--no-progress", "--quiet"]) == 0
    card = read_json(model / "model.json")
    assert card["arch"]["name"] == "cnn" and card["arch"]["kernel"] == 3 and card["arch"]["hidden"] == [4, 4]
    assert card["training"]["arch"]["kernel"] == 3  # --kernel reaches the training config
    assert card["metrics"]["homogeneity_degree"] == 3
    assert 0.0 <= card["metrics"]["kkt_regime_score"] <= 1.0
    run = root / method
    assert main(["reconstruct", "--model", str(model), "--out", str(run), "--method", method, "--steps", "5",
                 "--lr-x", "0.01", *(["--lr-lambda", "0.001"] if method != "gradnorm" else []), "--no-progress",
                 "--overwrite"]) == 0
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    metrics = read_json(run / "metrics.json")
    assert metrics["n_candidates"] == 16 and metrics["run"]["arch"]["name"] == "cnn"
    head = metrics["headline"]
    assert head["n_train"] == 8 and head["paper"]["heldout"] is not None and head["paper"]["noise"] is not None
