"""KKTConfig(compile=True): the torch.func + torch.compile step equals the eager step."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior
from datarecon.attacks.kkt import DecoRecoConfig, KKTAttack, KKTConfig
from datarecon.attacks.priors import box_penalty
from datarecon.attacks.surrogate import functional_surrogate, with_surrogate
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import method_config

SHAPE = (1, 4, 4)


@functools.cache
def _compile_unavailable() -> str | None:
    """Why torch.compile cannot run here (e.g. no C++ compiler), or None."""
    try:
        fn = torch.compile(lambda t: torch.sigmoid(t) * 2 + 1, fullgraph=True)
        fn(torch.ones(3, dtype=torch.float64))
    except Exception as exc:  # noqa: BLE001
        return f"torch.compile cannot run on this machine: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


@pytest.fixture
def needs_compile():
    reason = _compile_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _setup(make_target, k: int):
    target = make_target(k=k)
    prior = AttackerPrior.balanced(m=6, num_outputs=k, input_shape=SHAPE, lower=-1.0, upper=1.0)
    g = torch.Generator().manual_seed(1)
    x0 = 0.6 * torch.randn(6, *SHAPE, generator=g, dtype=torch.float64)  # some entries outside the box
    cfg = KKTConfig(lr_x=0.1, lr_lambda=0.1, formulation="auto", dtype="float64")
    eager = KKTAttack(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = eager.init_state(target, prior, x0=x0, generator=g)
    return target, prior, eager, KKTAttack(cfg.model_copy(update={"compile": True})), state


def test_plain_surrogate_matches_autograd_function(make_target):
    target = make_target()
    ref, plain = with_surrogate(target.model, 20.0), functional_surrogate("sigmoid-surrogate", target.model, alpha=20.0)
    x = torch.randn(5, *SHAPE, dtype=torch.float64, requires_grad=True)
    out = {}
    for name, model in (("ref", ref), ("plain", plain)):
        y = model(x)
        (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad((gx**2).sum(), x)
        out[name] = (y, gx, ggx)
    for a, b in zip(out["ref"], out["plain"]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert functional_surrogate("relu", target.model, alpha=20.0) is target.model


def test_functional_objective_matches_terms_eagerly(make_target):
    """kkt_value_and_grad (uncompiled torch.func) == the attack's objective plus the box prior, by autograd."""
    for k in (1, 3):
        target, prior, eager, _, state = _setup(make_target, k)
        c = eager.config
        fn = kkt_math.kkt_value_and_grad(functional_surrogate(c.surrogate, target.model, alpha=c.alpha),
                                         objective=eager.kkt_objective(target))
        lo, hi = eager.bounds(prior, state["x"].device)
        (gx, gl), (loss, (res, box, hinge)) = fn(state["x"], state["lambda"], eager.prepared(target).params,
                                                 eager.labels(prior, state["x"].device), lo, hi)
        x = state["x"].clone().requires_grad_(True)
        lam = state["lambda"].clone().requires_grad_(True)
        terms = dict(eager.objective(target, prior, x, **{"lambda": lam}))  # R + w_λ·hinge; the step adds the box
        terms["box"] = box_penalty(x, lo, hi)
        terms["loss"] = terms["loss"] + c.box_weight * terms["box"]
        ex, el = torch.autograd.grad(terms["loss"], [x, lam])
        assert float(terms["box"].detach()) > 0 and float(terms["lambda_hinge"].detach()) > 0  # every term is exercised
        for a, b in ((loss, terms["loss"]), (res, terms["residual"]), (box, terms["box"]),
                     (hinge, terms["lambda_hinge"]), (gx, ex), (gl, el)):
            torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3], ids=["binary", "multiclass"])
def test_compiled_step_equals_eager(needs_compile, make_target, k):
    """Same metrics and state after 3 steps, float64 (skipped where torch.compile cannot run)."""
    target, prior, eager, compiled, state = _setup(make_target, k)
    s_e = {n: v.clone() for n, v in state.items()}
    s_c = {n: v.clone() for n, v in state.items()}
    for i in range(3):
        me = eager.step(target, prior, s_e, i)
        mc = compiled.step(target, prior, s_c, i)
        assert set(mc) == set(me)
        for key in me:
            assert mc[key] == pytest.approx(me[key], rel=1e-9, abs=1e-14), key
        for key in s_e:
            torch.testing.assert_close(s_c[key], s_e[key], rtol=1e-9, atol=1e-14)


def test_compile_field_keeps_config_hashes_and_resume():
    assert "compile" not in KKTConfig().model_dump()  # default left out: hashes of existing configs unchanged
    assert "compile" not in DecoRecoConfig().model_dump(mode="json")
    on = KKTConfig(compile=True)
    assert on.model_dump()["compile"] is True
    assert KKTConfig(**on.model_dump()) == on
    assert "compile" in KKTAttack.resume_ignore
    assert method_config("decoreco", {}, compile=True).compile is True
    with pytest.raises(DataReconError, match="--compile does not apply"):
        method_config("gradnorm", {}, compile=True)


def test_the_compiled_step_cache_is_not_fooled_by_a_reused_id(make_target):
    """A target that reuses a collected target's ``id`` gets its own compiled step (checked by identity)."""
    target = make_target(k=1)
    attack = KKTAttack(KKTConfig(compile=True))
    attack._compiled[id(target)] = (object(), "the step of a collected target")
    fn = attack.compiled_value_and_grad(target)
    assert callable(fn) and attack.compiled_value_and_grad(target) is fn
