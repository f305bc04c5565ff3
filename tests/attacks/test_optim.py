"""Pure optimisers match torch.optim step for step and keep all state in the dict."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.optim import OptimizerSettings, init_optimizer_state, optimizer_step


@pytest.mark.parametrize("name", ["sgd", "sgd-nesterov", "adam"])
def test_matches_torch_optim(name):
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(5, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(6)]
    ref = p0.clone().requires_grad_(True)
    if name == "adam":
        opt = torch.optim.Adam([ref], lr=0.1)
        settings, opt_name = OptimizerSettings(), "adam"
    else:
        nest = name == "sgd-nesterov"
        opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, nesterov=nest)
        settings, opt_name = OptimizerSettings(momentum=0.9, nesterov=nest), "sgd"
    state = {"x": p0.clone()}
    state.update(init_optimizer_state(opt_name, state))
    for gr in grads:
        ref.grad = gr.clone()
        opt.step()
        state.update(optimizer_step(opt_name, state, {"x": gr}, lrs={"x": 0.1}, settings=settings))
    torch.testing.assert_close(state["x"], ref.detach(), rtol=1e-14, atol=1e-15)
    assert int(state["opt.step"]) == 6


def test_separate_learning_rates_and_no_mutation():
    state = {"x": torch.ones(2), "lambda": torch.ones(3)}
    state.update(init_optimizer_state("sgd", state))
    before = {k: v.clone() for k, v in state.items()}
    new = optimizer_step("sgd", state, {"x": torch.ones(2), "lambda": torch.ones(3)}, lrs={"x": 0.5, "lambda": 0.0},
                         settings=OptimizerSettings(momentum=0.0))
    for k in before:
        assert torch.equal(before[k], state[k])  # nothing committed
    torch.testing.assert_close(new["x"], torch.full((2,), 0.5))
    torch.testing.assert_close(new["lambda"], torch.ones(3))


@pytest.mark.parametrize("name,dtype", [("adam", torch.float64), ("adam", torch.float32), ("sgd", torch.float32)])
def test_stacked_step_equals_each_run_stepped_alone_bit_for_bit(name, dtype):
    """K runs in one stacked state: runs with other learning rates or step counts, a run whose update
    is not finite (refused, its state kept) and a run that does not step (untouched) — each row ends
    exactly where optimizer_step leaves that run alone."""
    from datarecon.attacks.optim import STEP_KEY, stacked_optimizer_step

    settings = OptimizerSettings(momentum=0.9, nesterov=True)
    g = torch.Generator().manual_seed(1)
    K = 5
    alone = []
    for k in range(K):
        s = {"x": torch.randn(3, 4, generator=g).to(dtype), "lambda": torch.rand(3, generator=g).to(dtype)}
        s.update(init_optimizer_state(name, s))
        s[STEP_KEY] = torch.tensor(k % 2 * 3, dtype=torch.int64)  # runs 1 and 3 have taken 3 steps
        alone.append(s)
    lrs = [{"x": 0.1, "lambda": 0.01}] * 2 + [{"x": 0.5, "lambda": 0.01}] * 3
    stacked = {key: torch.stack([s[key] for s in alone]) for key in alone[0]}
    rows = [0, 1, 2, 4]  # run 3 does not step
    for it in range(4):
        grads = {"x": torch.randn(K, 3, 4, generator=g).to(dtype), "lambda": torch.randn(K, 3, generator=g).to(dtype)}
        if it == 2:
            grads["x"][2, 0, 0] = float("inf")  # run 2's update is not finite this time
        done = stacked_optimizer_step(name, stacked, grads, lrs=lrs, rows=rows, settings=settings)
        assert done == ([0, 1, 4] if it == 2 else rows)
        for k in done:
            alone[k].update(optimizer_step(name, alone[k], {v: gr[k] for v, gr in grads.items()}, lrs=lrs[k],
                                           settings=settings))
    for k, s in enumerate(alone):
        for key, t in s.items():
            assert torch.equal(stacked[key][k], t), (k, key)
    assert stacked[STEP_KEY].tolist() == [4, 7, 3, 3, 4]
