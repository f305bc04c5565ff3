"""Membership signals: statistics against direct computations, the Gaussian fits against scipy, LiRA's ratio and
its envelope, RMIA's ratio against a direct double loop, and planted cases whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from torch import nn

from datarecon.attacks.mia import SIGNALS, MIASettings, SignalView, measure_signals
from datarecon.attacks.mia.reference import fit_gaussians, lira_offline, lira_online, rmia
from datarecon.attacks.mia.statistics import confidence, example_statistics, gradient_norms
from datarecon.errors import DataReconError


def test_confidence_is_logit_scaled_probability_and_does_not_saturate():
    torch.manual_seed(0)
    z = torch.randn(7, 4, dtype=torch.float64) * 3
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    p = torch.softmax(z, 1)[torch.arange(7), y]
    assert torch.allclose(confidence(z, y, "cross-entropy"), torch.log(p / (1 - p)), rtol=1e-10)
    f = torch.randn(5, 1, dtype=torch.float64)
    yb = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    pb = torch.sigmoid(yb * f[:, 0])
    assert torch.allclose(confidence(f, yb, "logistic"), torch.log(pb / (1 - pb)), rtol=1e-10)
    # float32 logits whose softmax rounds to exactly 1: φ still orders them
    big = torch.tensor([[40.0, 0.0], [60.0, 0.0]])
    c = confidence(big, torch.tensor([0, 0]), "cross-entropy")
    assert c[0] == pytest.approx(40.0) and c[1] == pytest.approx(60.0)
    # mse: from the loss, φ = log(e^-l / (1 - e^-l))
    out = torch.tensor([[0.5], [0.9]], dtype=torch.float64)
    ell = (out[:, 0] - 1.0) ** 2
    assert torch.allclose(confidence(out, torch.tensor([1.0, 1.0]), "mse"),
                          torch.log(torch.exp(-ell) / (1 - torch.exp(-ell))))


def test_example_statistics_and_gradient_norms_match_a_loop():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    x = torch.randn(9, 1, 3, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    st = example_statistics(net, x, y, loss="cross-entropy", batch=4)
    params = {k: v.detach() for k, v in net.named_parameters()}
    g = gradient_norms(net, params, x, y, loss="cross-entropy", batch=4)
    for i in range(9):
        net.zero_grad()
        ell = nn.functional.cross_entropy(net(x[i:i + 1]), y[i:i + 1])
        ell.backward()
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in net.parameters()))
        assert float(st.loss[i]) == pytest.approx(float(ell.detach()), rel=1e-12)
        assert float(st.probability[i]) == pytest.approx(math.exp(-float(ell.detach())), rel=1e-12)
        assert float(g[i]) == pytest.approx(norm, rel=1e-10)


def test_gradient_norms_fall_back_to_a_loop_when_vmap_cannot_batch():
    class Branchy(nn.Module):  # data-dependent control flow: vmap refuses it
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x) * 2 if float(x.sum()) > 0 else self.lin(x)

    torch.manual_seed(2)
    net = Branchy().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    y = torch.randint(0, 2, (5,))
    g = gradient_norms(net, {k: v.detach() for k, v in net.named_parameters()}, x, y, loss="cross-entropy")
    net.zero_grad()
    nn.functional.cross_entropy(net(x[:1]), y[:1]).backward()
    assert float(g[0]) == pytest.approx(math.sqrt(sum(float((p.grad ** 2).sum()) for p in net.parameters())))


def test_gaussian_fits_against_scipy_and_the_shrinkage_formula():
    rng = np.random.default_rng(0)
    stats = torch.tensor(rng.normal(size=(40, 6)) * np.arange(1, 7) + np.arange(6))
    use = torch.tensor(rng.random((40, 6)) < 0.5)
    per = fit_gaussians(stats, use, variance_prior=0.0)
    for i in range(6):
        v = stats[use[:, i], i].numpy()
        assert float(per.mean[i]) == pytest.approx(v.mean())
        assert float(per.std[i]) == pytest.approx(scipy.stats.tstd(v), rel=1e-10)  # unbiased, as LiRA fits
        assert int(per.count[i]) == v.size
    dof = per.count.double() - 1
    pooled = float((dof * per.std ** 2).sum() / dof.sum())
    nu = 4.0
    shrunk = fit_gaussians(stats, use, variance_prior=nu)
    expect = torch.sqrt((dof * per.std ** 2 + nu * pooled) / (dof + nu))
    assert torch.allclose(shrunk.std, expect)
    huge = fit_gaussians(stats, use, variance_prior=1e12)
    assert torch.allclose(huge.std, torch.full_like(huge.std, math.sqrt(pooled)), rtol=1e-6)


def test_a_candidate_without_models_gets_the_pooled_fit_and_too_few_models_are_refused():
    stats = torch.tensor([[1.0, 2.0], [3.0, 5.0], [2.0, 9.0]], dtype=torch.float64)
    use = torch.tensor([[True, False], [True, False], [True, False]])
    fit = fit_gaussians(stats, use, variance_prior=0)
    assert float(fit.mean[1]) == pytest.approx(2.0) and int(fit.count[1]) == 0
    assert float(fit.std[1]) == pytest.approx(float(fit.std[0]))
    with pytest.raises(DataReconError, match="too few reference models"):
        fit_gaussians(stats, torch.tensor([[True, False], [False, True], [False, False]]), variance_prior=0)
    with pytest.raises(DataReconError, match="not finite"):
        fit_gaussians(stats.clone().fill_(float("nan")), use)


def test_lira_is_the_gaussian_likelihood_ratio_where_it_rises_and_never_falls():
    rng = np.random.default_rng(3)
    k, n = 60, 5
    inside = torch.tensor(rng.random((k, n)) < 0.5)
    stats = torch.tensor(np.where(inside.numpy(), rng.normal(4.0, 1.0, (k, n)), rng.normal(-1.0, 3.0, (k, n))))
    fin = fit_gaussians(stats, inside, variance_prior=0)
    fout = fit_gaussians(stats, ~inside, variance_prior=0)
    # below the turning point the score is scipy's log-likelihood ratio
    t = fin.mean - 0.5 * fin.std
    direct = scipy.stats.norm.logpdf(t, fin.mean, fin.std) - scipy.stats.norm.logpdf(t, fout.mean, fout.std)
    assert np.allclose(lira_online(t, stats, inside, variance_prior=0).numpy(), direct, rtol=1e-10)
    # offline: the one-sided standardised distance
    assert np.allclose(lira_offline(t, stats, inside, variance_prior=0).numpy(),
                       ((t - fout.mean) / fout.std).numpy())
    # a target more confident than any IN model never scores lower than a less confident one
    grid = torch.linspace(-20, 40, 601, dtype=torch.float64)
    for i in range(n):
        scores = torch.stack([lira_online(torch.full((n,), float(g), dtype=torch.float64), stats, inside,
                                          variance_prior=0)[i] for g in grid])
        assert bool((scores[1:] >= scores[:-1]).all())


def _rmia_direct(px, refs, inside, pz, refs_z, a, gamma, online):
    """RMIA as written in the paper, with probabilities (a double loop over candidates and population samples)."""
    out = []
    zbar = [((1 + a) * refs_z[:, j].mean() + (1 - a)) / 2 for j in range(pz.size)]
    for i in range(px.size):
        outside = refs[~inside[:, i], i]
        pbar = ((1 + a) * outside.mean() + (1 - a)) / 2
        if online and inside[:, i].any() and outside.size:
            pbar = (refs[inside[:, i], i].mean() + outside.mean()) / 2
        beaten = sum((px[i] / pbar) / (pz[j] / zbar[j]) >= gamma for j in range(pz.size))
        out.append(beaten / pz.size)
    return np.array(out)


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_rmia_matches_the_papers_ratio_computed_directly(online):
    rng = np.random.default_rng(4)
    k, n, m = 12, 9, 30
    refs = rng.uniform(0.05, 1.0, (k, n))
    inside = rng.random((k, n)) < 0.4
    px, pz, refs_z = rng.uniform(0.05, 1, n), rng.uniform(0.05, 1, m), rng.uniform(0.05, 1, (k, m))
    for a, gamma in ((0.3, 1.0), (1.0, 2.0), (0.0, 0.5)):
        got = rmia(torch.tensor(np.log(px)), torch.tensor(np.log(refs)), torch.tensor(inside),
                   torch.tensor(np.log(pz)), torch.tensor(np.log(refs_z)), a=a, gamma=gamma, online=online)
        assert np.allclose(got.numpy(), _rmia_direct(px, refs, inside, pz, refs_z, a, gamma, online))


def test_rmia_refuses_bad_input():
    lp = torch.log(torch.full((3,), 0.5, dtype=torch.float64))
    refs = torch.log(torch.full((2, 3), 0.5, dtype=torch.float64))
    inside = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(DataReconError, match="a in \\[0, 1\\]"):
        rmia(lp, refs, inside, lp, refs, a=2.0)
    with pytest.raises(DataReconError, match="<= 0"):
        rmia(-lp, refs, inside, lp, refs)
    with pytest.raises(DataReconError, match="M >= 1"):
        rmia(lp, refs, inside, lp[:0], refs[:, :0])


def _train(x, y, seed, epochs=300):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 2)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval()


def test_planted_membership_a_mislabelled_example_is_found_only_when_it_trained_the_model():
    """Planted: one training example carries a label no other example's features suggest. A model trained with it
    memorises it, a model trained without it does not; every reference signal must say so."""
    gen = torch.Generator().manual_seed(5)
    n, d = 40, 10
    x = torch.randn(n + 1, d, generator=gen, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    y[n] = 1 - y[n]  # the planted example, mislabelled
    k = 24
    inside = torch.zeros(k, n + 1, dtype=torch.bool)
    stats = []
    for r in range(k):
        use = torch.randperm(n + 1, generator=gen)[: (n + 1) // 2]
        inside[r, use] = True
        stats.append(example_statistics(_train(x[use], y[use], 100 + r), x, y, loss="cross-entropy"))
    pop = torch.randn(30, d, generator=gen, dtype=torch.float64)
    pop_y = (pop[:, 0] > 0).long()

    class Refs:
        confidence = torch.stack([s.confidence for s in stats])
        loss = torch.stack([s.loss for s in stats])
        population_loss = torch.stack([example_statistics(_train(x[inside[r]], y[inside[r]], 100 + r), pop, pop_y,
                                                          loss="cross-entropy").loss for r in range(k)])

    Refs.inside = inside
    for trained_on_it, seed in ((True, 7), (False, 8)):
        idx = torch.arange(n + 1) if trained_on_it else torch.arange(n)
        target = _train(x[idx], y[idx], seed)
        st = example_statistics(target, x, y, loss="cross-entropy")
        zl = example_statistics(target, pop, pop_y, loss="cross-entropy").loss
        view = SignalView(model=target, params=dict(target.named_parameters()), x=x, y=y, loss="cross-entropy",
                          stats=st, refs=Refs, population_loss=zl, settings=MIASettings())
        scores, missing = measure_signals(view, only=[k for k in SIGNALS.names() if SIGNALS.get(k).kind == "reference"])
        assert set(scores) == {"lira-offline", "lira-online", "rmia", "rmia-online"} and not missing
        for name, s in scores.items():
            rank = float((s[:n] < s[n]).double().mean())  # the planted example against the ordinary ones
            if trained_on_it:
                assert float(s[n]) >= float(s[:n].max()) or rank > 0.9, name
            else:
                assert rank < 0.9, name


def test_signal_registry_names_every_kind():
    assert {SIGNALS.get(n).kind for n in SIGNALS.names()} == {"black-box", "white-box", "reference"}
    assert SIGNALS.ordered()[0] == "loss" and "rmia" in SIGNALS.names()
    with pytest.raises(DataReconError, match="lira-online"):
        SIGNALS.get("lira")
