"""The known-initialisation objective (Loo et al. 2023) against independent references, and its misuse."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior
from datarecon.attacks.knowledge import KnownInit, KnowledgeSettings, init_digest, resolve_known_init
from datarecon.attacks.kkt import KKTAttack, KKTConfig, LooAttack, LooConfig
from datarecon.errors import DataReconError


SHAPE = (1, 4, 4)


def _setup(make_target, seed: int = 0, m: int = 6):
    target = make_target(hidden=7, seed=seed)
    init = make_target(hidden=7, seed=seed + 100).params  # a θ_init of the same architecture
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, *SHAPE, generator=g, dtype=torch.float64)
    lam = torch.rand(m, generator=g, dtype=torch.float64) + 0.5
    y = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)[:m]
    return target, init, x, y, lam


def _naive_residual(target, ref, goal_theta, init, x, y, lam, *, a, model=None):
    """R = ‖θ* − a·θ_init − (1/m) Σ_i λ_i y_i ∇_θΦ(θ_ref; x_i)‖², one per-sample gradient at a time."""
    m = x.shape[0]
    g = {k: torch.zeros_like(v) for k, v in ref.items()}
    for i in range(m):
        p = {k: v.detach().clone().requires_grad_(True) for k, v in ref.items()}
        out = functional_call(model if model is not None else target.model, p, (x[i:i + 1],))[0, 0]
        grads = torch.autograd.grad(out, list(p.values()))
        for (k, _), gr in zip(p.items(), grads, strict=True):
            g[k] += lam[i] * y[i] * gr / m
    return sum(((goal_theta[k] - a * init[k] - g[k]) ** 2).sum() for k in ref), g


@pytest.mark.parametrize("reference", ["theta-star", "theta-init"])
def test_objective_equals_a_naive_loop(make_target, reference):
    target, init, x, y, lam = _setup(make_target)
    ref = target.params if reference == "theta-star" else init
    naive, _ = _naive_residual(target, ref, target.params, init, x, y, lam, a=0.8)
    terms = kkt_math.kkt_terms(lambda z, p: functional_call(target.model, dict(p), (z,)), ref, x, y, lam,
                               objective=kkt_math.KKTObjective(margin="binary", lambda_min=0.0, lambda_min_weight=0.0,
                                                               box_weight=0.0),
                               box=(-10.0, 10.0), matching=kkt_math.Matching(theta=target.params, init=init,
                                                                             coefficient=0.8))
    assert float(terms["residual"].detach()) == pytest.approx(float(naive), rel=1e-12)


def test_fitted_coefficient_is_the_least_squares_factor(make_target):
    target, init, x, y, lam = _setup(make_target)
    _, g = _naive_residual(target, target.params, target.params, init, x, y, lam, a=0.0)
    a = kkt_math.init_factor(target.params, g, init)
    grid = torch.linspace(float(a) - 0.5, float(a) + 0.5, 101, dtype=torch.float64)
    values = [sum(((target.params[k] - t * init[k] - g[k]) ** 2).sum() for k in g) for t in grid]
    assert float(grid[int(torch.stack(values).argmin())]) == pytest.approx(float(a), abs=0.011)


@pytest.mark.parametrize("coefficient", [1.0, None], ids=["a=1", "a fitted"])
def test_gradients_match_finite_differences(make_target, coefficient):
    """The step's closed-form seed (a held fixed at its fit) against central differences, float64."""
    target, init, x, y, lam = _setup(make_target)
    fwd = lambda z, p: functional_call(target.model, dict(p), (z,))  # noqa: E731
    kw = dict(objective=kkt_math.KKTObjective(margin="binary", lambda_min=0.7, lambda_min_weight=5.0, box_weight=0.0),
              matching=kkt_math.Matching(theta=target.params, init=init, coefficient=coefficient))
    terms, gx, gl = kkt_math.kkt_residual_and_grads(fwd, target.params, x, y, lam, **kw)

    def value(xx, ll):
        t, _, _ = kkt_math.kkt_residual_and_grads(fwd, target.params, xx, y, ll, **kw)
        return float(t["loss"])

    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        dx = torch.randn(x.shape, generator=g, dtype=torch.float64)
        dl = torch.randn(lam.shape, generator=g, dtype=torch.float64)
        h = 1e-6
        fd = (value(x + h * dx, lam + h * dl) - value(x - h * dx, lam - h * dl)) / (2 * h)
        an = float((gx * dx).sum() + (gl * dl).sum())
        assert an == pytest.approx(fd, rel=1e-6, abs=1e-10)
    assert "init_coefficient" in terms


def test_attack_uses_the_known_initialisation(make_target):
    target, init, x, y, lam = _setup(make_target)
    known = KnownInit(params=init, sha256=init_digest(init), source="test")
    plain = AttackerPrior(labels=y, input_shape=SHAPE, lower=-10.0, upper=10.0)
    with_init = AttackerPrior(labels=y, input_shape=SHAPE, lower=-10.0, upper=10.0, known_init=known)
    attack = KKTAttack(KKTConfig(steps=1, lambda_min=0.0, init_coefficient=1.0, dtype="float64"))
    a = attack.objective(target, plain, x, **{"lambda": lam})["residual"].detach()
    b = attack.objective(target, with_init, x, **{"lambda": lam})["residual"].detach()
    surrogate = attack.prepared(target, with_init).model  # the attack differentiates a sigmoid-backward ReLU
    naive, _ = _naive_residual(target, target.params, target.params, init, x, y, lam, a=1.0, model=surrogate)
    assert float(b) == pytest.approx(float(naive), rel=1e-10) and float(a) != pytest.approx(float(b))
    loo = LooAttack(LooConfig(steps=1, lambda_min=0.0, init_coefficient=1.0, dtype="float64"))
    naive_loo, _ = _naive_residual(target, init, target.params, init, x, y, lam, a=1.0,
                                   model=loo.prepared(target, with_init).model)
    assert float(loo.objective(target, with_init, x, **{"lambda": lam})["residual"].detach()) == pytest.approx(float(naive_loo),
                                                                                             rel=1e-10)
    with pytest.raises(DataReconError, match="needs the initialisation"):
        loo.init_state(target, plain, x0=x, generator=torch.Generator().manual_seed(0))


def test_resolve_refuses_what_does_not_fit(make_target, tmp_path):
    from safetensors.torch import save_file

    target = make_target(hidden=7)
    params = target.params
    good = {k: v.clone() for k, v in params.items()}
    save_file(good, str(tmp_path / "init.safetensors"))
    known = resolve_known_init(str(tmp_path / "init.safetensors"), params, model_meta=None)
    assert known.sha256 == init_digest(good)
    missing = {k: v for k, v in list(good.items())[:1]}
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(DataReconError, match="does not fit the model .missing 3.weight"):
        resolve_known_init(str(tmp_path / "missing.safetensors"), params, model_meta=None)
    wrong = {k: torch.zeros(2, 2, dtype=torch.float64) for k in good}
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(DataReconError, match="has shape \\(2, 2\\), the model's is"):
        resolve_known_init(str(tmp_path / "wrong.safetensors"), params, model_meta=None)
    with pytest.raises(DataReconError, match="is not the initialisation this model was trained from"):
        resolve_known_init(str(tmp_path / "init.safetensors"), params, model_meta={"init_sha256": "0" * 64})
    with pytest.raises(DataReconError, match="needs a model directory to rebuild the architecture"):
        resolve_known_init("seed:0", params, model_meta=None)
    with pytest.raises(DataReconError, match="this model records none; pass seed:N"):
        resolve_known_init("seed", params, model_meta={"arch": {}})
    other_arch = {"arch": {"name": "mlp", "input_shape": [1, 4, 4], "hidden": [9], "bias": False},
                  "seed": 0}  # the architecture rebuilt from seed:N does not fit the weights
    with pytest.raises(DataReconError, match="known_init seed:0: 1.weight has shape \\(9, 16\\), the model's is"):
        resolve_known_init("seed", params, model_meta=other_arch)
    with pytest.raises(DataReconError, match="not found"):
        resolve_known_init(str(tmp_path / "absent.safetensors"), params, model_meta=None)
    (tmp_path / "pickle.safetensors").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(DataReconError):
        resolve_known_init(str(tmp_path / "pickle.safetensors"), params, model_meta=None)


def test_knowledge_settings_validate_their_form():
    assert KnowledgeSettings(known_init="seed:3").known_init == "seed:3"
    for bad in ("seed:x", "seed:-1", " "):
        with pytest.raises(ValueError):
            KnowledgeSettings(known_init=bad)
    with pytest.raises(ValueError):
        KnowledgeSettings(n=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_seed_rebuilds_the_initialisation_in_the_dtype_training_used(tmp_path, dtype):
    """``--known-init seed`` on a model trained in float32 (the default): a float32 draw of the
    initialisation is not a rounded float64 draw, so it is rebuilt in the training dtype (it was
    refused as "not the initialisation this model was trained from")."""
    from datarecon.attacks.knowledge import resolve_known_init
    from datarecon.data import DataSpec
    from datarecon.models.checkpoint import read_model_meta
    from datarecon.models.spec import ArchSpec, build_model
    from datarecon.training.target import ArchConfig, TrainConfig, train_target
    from datarecon.utils.io import load_tensors

    out = tmp_path / "model"
    cfg = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=4), arch=ArchConfig(name="mlp",
                      hidden=(8,)), loss="logistic", lr=0.1, epochs=2, dtype=dtype, seed=3)
    train_target(cfg, out=out, progress=False)
    meta = read_model_meta(out)
    params = load_tensors(out / "weights.safetensors")
    known = resolve_known_init("seed", params, model_meta=meta)
    net = build_model(ArchSpec.model_validate(meta["arch"]), generator=torch.Generator().manual_seed(3),
                      dtype=getattr(torch, dtype))
    assert known.sha256 == meta["init_sha256"]
    assert all(torch.equal(known.params[k], v.detach()) for k, v in net.named_parameters())


def test_a_recorded_norm_mode_no_training_writes_is_refused():
    """A model.json whose training.norm_mode was changed by hand is named as such, not replayed in a guessed mode
    (the fifth adversarial trial: dynamics matching ran with 'bogus'); auto still resolves by the pretrained start."""
    from datarecon.attacks.knowledge import recorded_norm_mode

    with pytest.raises(DataReconError, match="records training.norm_mode 'bogus', which no training writes"):
        recorded_norm_mode({"training": {"norm_mode": "bogus"}})
    assert recorded_norm_mode({"training": {"norm_mode": "auto"}, "pretrained": {"path": "p"}}) == "eval"
    assert recorded_norm_mode({"training": {}}) == "train"
