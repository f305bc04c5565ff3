"""Attacker-side selection: criteria and per-candidate scores against naive references."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from datarecon.attacks import kkt_math
from datarecon.attacks.selection import (
    CRITERIA,
    SelectionContext,
    candidate_scores,
    evaluate_criteria,
)

SHAPE = (1, 4, 4)


def _ctx(target, x, labels, lam, formulation="binary", lambda_min=0.5):
    fwd = lambda xx, p: functional_call(target.model, dict(p), (xx,))  # noqa: E731
    return SelectionContext(forward=fwd, params=target.params, x=x, labels=labels, lam=lam, formulation=formulation,
                            loss=target.loss, weight_decay=target.weight_decay, lambda_min=lambda_min)


def test_contribution_equals_leave_one_out_first_order(make_target):
    target = make_target(bias=True, k=3, loss="cross-entropy")
    g = torch.Generator().manual_seed(0)
    m = 5
    x = torch.randn(m, *SHAPE, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    lam = torch.rand(m, generator=g, dtype=torch.float64) + 0.5
    ctx = _ctx(target, x, y, lam, formulation="multiclass")
    score = candidate_scores(ctx)["contribution"]
    fwd = ctx.forward
    full_g = kkt_math.combination_gradient(fwd, target.params, x, y, lam, margin="multiclass", create_graph=False)
    r_full = kkt_math.stationarity_residual(target.params, full_g)
    for i in range(m):  # exact change when candidate i's term leaves g (1/m kept): 2<r, c_i> + ||c_i||^2
        gi = kkt_math.combination_gradient(fwd, target.params, x[i:i + 1], y[i:i + 1], lam[i:i + 1],
                                           margin="multiclass", create_graph=False)
        c_i = {k: v / m for k, v in gi.items()}
        g_wo = {k: full_g[k] - c_i[k] for k in full_g}
        exact = kkt_math.stationarity_residual(target.params, g_wo) - r_full
        assert (score[i] + kkt_math.squared_norm(c_i)).item() == pytest.approx(exact.item(), rel=1e-9, abs=1e-12)


def test_duplicates_and_diversity(make_target):
    target = make_target()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, *SHAPE, generator=g, dtype=torch.float64)
    x[1] = 2 * x[0]  # same direction: cosine 1
    ctx = _ctx(target, x, torch.tensor([1.0, 1, -1, -1]).double(), torch.tensor([0.5, 1.0, 2.0, 0.5]).double())
    crit = evaluate_criteria(ctx)
    assert set(crit) == set(CRITERIA.names())
    assert crit["duplicate_fraction"]["value"] == pytest.approx(2 / 12)
    assert crit["lambda_at_min"]["value"] == pytest.approx(0.5)
    scores = candidate_scores(ctx)
    assert scores["uniqueness"][0].item() == pytest.approx(0.0, abs=1e-12)
    assert scores["uniqueness"][2].item() > 0


def test_relative_residual_zero_at_planted():
    from torch import nn

    from datarecon.attacks.base import Target

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, *SHAPE, generator=g, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1]).double()
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 1, bias=False)).double()
    w = (y[:, None] * x.reshape(4, -1)).sum(0, keepdim=True) / 4
    t = Target(model=model, params={"1.weight": w}, loss="logistic", weight_decay=0.0, input_shape=SHAPE,
               num_outputs=1, homogeneous=True)
    ctx = _ctx(t, x, y, torch.ones(4, dtype=torch.float64))
    assert evaluate_criteria(ctx, ["relative_residual"])["relative_residual"]["value"] < 1e-28
