"""The KKT objective's variants (subspace candidates, TV prior, sample splitting, unmix starts) against
independent references, and bit-identical resume of every new attack and option."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch
from torch import nn

from datarecon.attacks import kkt_math, kkt_split, priors
from datarecon.attacks.base import AttackSetup
from datarecon.attacks.kkt import KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import run_attack
from datarecon.attacks.subspace import DenseLayer, RankEstimate, Spectrum, SubspaceAnalysis, analyse

SHAPE = (1, 4, 4)


def _identity_analysis(d: int = 16) -> SubspaceAnalysis:
    eye = torch.eye(d, dtype=torch.float64)
    return SubspaceAnalysis(layer=DenseLayer("1", "1.weight", d, 20, True),
                            spectrum=Spectrum(torch.ones(d, dtype=torch.float64), eye, (20, d), "full"),
                            rank=RankEstimate(d, d, d, None, d), k=d, known_init=False, coefficient=None, n_known=None)


def _run(target, prior, config, *, steps=12, x0=None):
    x0 = x0 if x0 is not None else torch.randn(prior.m, *SHAPE, generator=torch.Generator().manual_seed(1),
                                               dtype=torch.float64) * 0.3
    return run_attack(KKTAttack(config), AttackSetup(target, prior, x0, torch.Generator().manual_seed(0)), steps=steps,
                      loop=replace(ATTACK_LOOP, progress=False))


def test_subspace_with_the_identity_basis_is_the_plain_attack_bit_for_bit(target, prior):
    base = dict(steps=12, lr_x=0.3, lr_lambda=0.01, dtype="float64")
    plain = _run(target, prior, KKTConfig(**base))
    ident = _run(target, dataclasses.replace(prior, subspace=_identity_analysis()), KKTConfig(**base, subspace=True))
    assert torch.equal(plain.x, ident.x) and torch.equal(plain.multipliers, ident.multipliers)


def test_subspace_candidates_stay_in_the_span(target, prior):
    g = torch.Generator().manual_seed(2)
    q, _ = torch.linalg.qr(torch.randn(16, 5, generator=g, dtype=torch.float64))
    an = dataclasses.replace(_identity_analysis(), spectrum=Spectrum(torch.ones(5, dtype=torch.float64), q,
                                                                     (20, 16), "full"), k=5)
    rec = _run(target, dataclasses.replace(prior, subspace=an),
               KKTConfig(steps=12, lr_x=0.3, lr_lambda=0.01, dtype="float64", subspace=True, optimizer="adam"))
    flat = rec.x.reshape(prior.m, -1)
    assert torch.allclose(flat, (flat @ q) @ q.T, atol=1e-12)


def test_tv_value_and_gradient_against_autograd():
    x = torch.randn(3, 2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    value, grad = priors.tv_value_and_grad(x, eps=1e-2)
    xr = x.clone().requires_grad_(True)
    ref = sum((torch.sqrt(xr.diff(dim=d) ** 2 + 1e-4) - 1e-2).sum() for d in (-2, -1))
    (gref,) = torch.autograd.grad(ref, xr)
    assert float(value) == pytest.approx(float(ref.detach()), rel=1e-12) and torch.allclose(grad, gref, atol=1e-12)


def test_splitting_direction_matches_the_exact_hessian(target, prior):
    """Power iteration on finite-difference HVPs finds the largest eigenvalue of ∇²_x h_i."""
    attack = KKTAttack(KKTConfig(dtype="float64", split_every=1000, split_iters=60, alpha=5.0))
    x = torch.randn(prior.m, *SHAPE, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 0.5
    lam = torch.linspace(0.5, 1.5, prior.m, dtype=torch.float64)
    v, mu = kkt_split.splitting_directions(attack, target, prior, x, lam, seed=0)
    prep = attack.prepared(target, prior)
    g = kkt_math.combination_gradient(prep.forward, prep.ref, x, prior.labels, lam, margin="binary",
                                      create_graph=False)
    r = {k: (prep.params[k] - g[k]).detach() for k in g}
    for i in (0, 3):
        def h_i(xi, i=i):
            xs = x.clone()
            xs[i] = xi.reshape(SHAPE)
            gg = kkt_math.combination_gradient(prep.forward, prep.ref, xs, prior.labels, lam, margin="binary",
                                               create_graph=True)
            return sum((gg[k] * r[k]).sum() for k in r) * prior.m

        hess = torch.autograd.functional.hessian(h_i, x[i].reshape(-1))
        top = float(torch.linalg.eigvalsh(hess)[-1])
        assert float(mu[i]) == pytest.approx(top, rel=1e-3, abs=1e-8)
        assert float(v[i].norm()) == pytest.approx(1.0)


def test_split_keeps_labels_and_the_multiplier_mass(target, prior):
    attack = KKTAttack(KKTConfig(dtype="float64", split_every=1000, split_fraction=0.5, alpha=5.0))
    x0 = torch.randn(prior.m, *SHAPE, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    state = attack.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
    before_sum = {lab: float(state["lambda"][prior.labels == lab].sum()) for lab in (1.0, -1.0)}
    done = kkt_split.split(attack, target, prior, state, index=3)
    assert done >= 1
    for lab in (1.0, -1.0):  # λ_i is halved and its copy gets the other half; the dropped candidate's λ is gone
        assert float(state["lambda"][prior.labels == lab].sum()) <= before_sum[lab] + 1e-12


def test_unmix_recovers_a_planted_cone_exactly():
    """R = C X̃ with exactly sparse non-negative C: the LP vertices are the true columns."""
    from datarecon.attacks.unmix import unmix_candidates

    torch.manual_seed(0)
    n, d, h = 8, 64, 200
    x = torch.randn(n, d, dtype=torch.float64)
    w2 = torch.randn(1, h, dtype=torch.float64)
    c = (torch.rand(h, n) < 0.5).double() * torch.rand(h, n, dtype=torch.float64)
    y = torch.tensor([1.0] * 4 + [-1.0] * 4, dtype=torch.float64)
    w1 = torch.sign(w2[0])[:, None] * (c @ (y[:, None] * x))
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, h, bias=False), nn.ReLU(), nn.Linear(h, 1, bias=False)).double()
    params = {"1.weight": w1, "3.weight": w2}
    an = analyse(model, params, n=n)
    cand, labels = unmix_candidates(model, params, an, m=n, generator=torch.Generator().manual_seed(0),
                                    lower=-1e3, upper=1e3)
    cos = (x / x.norm(dim=1, keepdim=True)) @ (cand / cand.norm(dim=1, keepdim=True)).T
    assert float(cos.abs().max(1).values.min()) > 1 - 1e-8
    assert labels.tolist() == [1.0] * 4 + [-1.0] * 4  # the balanced layout


# -- resume of the new attacks and options, through execute on a trained model directory ----------


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("model") / "model"
    cfg = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=6, n_heldout_per_class=6),
                      arch=ArchConfig(name="mlp", hidden=(24,), bias=False, init_scale=1e-3), loss="logistic",
                      lr=0.5, epochs=150, dtype="float64")
    train_target(cfg, out=out, progress=False)
    return out


VARIANTS = {
    "loo": ({"method": "loo"}, {"known_init": "seed:0"}, {"name": "gaussian", "scale": 0.05}),
    "kkt-subspace-known-init": ({"subspace": True}, {"known_init": "seed:0", "n": 12},
                                {"name": "gaussian", "scale": 0.05}),
    "kkt-tv": ({"tv_weight": 1e-3}, {}, {"name": "gaussian", "scale": 0.05}),
    "kkt-split": ({"split_every": 4, "split_fraction": 0.2, "split_iters": 3}, {},
                  {"name": "gaussian", "scale": 0.05}),
    "kkt-unmix-init": ({}, {}, {"name": "unmix"}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_new_attacks_resume_bit_identically(kill_after, digits_model, tmp_path, variant):
    from datarecon.attacks.runner import load_checkpoint
    from datarecon.experiments.reconstruct import RunOptions, build_run, execute
    from datarecon.utils.io import load_tensors

    attack, knowledge, init = VARIANTS[variant]
    fields = {"model": str(digits_model), "attack": {"method": "kkt", "steps": 14, "lr_x": 0.05, "lambda_min": 0.2,
                                                     "dtype": "float64", **attack},
              "init": init, "checkpoint": {"every": 3, "log_every": 2}}
    if knowledge:
        fields["knowledge"] = knowledge
    run = build_run(fields)
    full = execute(run, tmp_path / "full", RunOptions(progress=False))
    with pytest.raises(KeyboardInterrupt):
        execute(run, tmp_path / "part", RunOptions(progress=False, hooks=[kill_after(7)]))
    assert load_checkpoint(tmp_path / "part")[1]["steps_done"] == 7  # Ctrl-C saves where it stopped
    resumed = execute(run, tmp_path / "part", RunOptions(progress=False, resume=True))
    assert torch.equal(resumed.x, full.x) and torch.equal(resumed.multipliers, full.multipliers)
    read = lambda p: (p / "history.jsonl").read_text()  # noqa: E731
    assert read(tmp_path / "part") == read(tmp_path / "full")
    a, b = load_tensors(tmp_path / "full" / "candidates.safetensors"), load_tensors(tmp_path / "part" /
                                                                                   "candidates.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a) and "score_subspace" in a
    assert (tmp_path / "full" / "subspace.safetensors").is_file()


@pytest.mark.parametrize("knowledge, subspace, expected", [
    ({"known_init": "seed:0"}, None, True),     # the default with θ_init known: subspace candidates
    ({}, None, False),                          # weights only: the papers' attack
    ({"known_init": "seed:0"}, False, False),   # asked off
    ({}, True, True),                           # asked on
])
def test_subspace_default_follows_the_attackers_knowledge(digits_model, tmp_path, knowledge, subspace, expected):
    """subspace: null resolves to on exactly when θ_init is known (the best measured combination); the
    resolved value is recorded in run.json and the candidates lie in the recorded basis when on."""
    import json

    from datarecon.attacks.subspace import load_analysis
    from datarecon.experiments.reconstruct import RunOptions, build_run, execute

    attack = {"method": "kkt", "steps": 6, "lr_x": 0.05, "lambda_min": 0.2, "dtype": "float64"}
    if subspace is not None:
        attack["subspace"] = subspace
    fields = {"model": str(digits_model), "attack": attack, "init": {"name": "gaussian", "scale": 0.05}}
    if knowledge:
        fields["knowledge"] = knowledge
    out = tmp_path / "run"
    rec = execute(build_run(fields), out, RunOptions(progress=False))
    record = json.loads((out / "run.json").read_text())
    assert record["knowledge"]["subspace_candidates"] is expected
    basis = load_analysis(out / "subspace.safetensors")["basis"].to(torch.float64)
    flat = rec.x.reshape(rec.x.shape[0], -1).to(torch.float64)
    off_span = float((flat - (flat @ basis) @ basis.T).norm() / flat.norm())
    assert (off_span < 1e-10) is expected
