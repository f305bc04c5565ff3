"""The haim2022 reproduction's stand-in target: the same training continued by margin ascent, attacked beside the
loss-normalised one; without it the plan (every piece and its hash) is the one of before."""

from __future__ import annotations

import pytest

from datarecon.experiments.reproduce import load_config, plan_reproduction
from datarecon.experiments.reproduce.haim2022 import STAND_IN_LABEL, plan, variants

STAND_IN = {"steps": 20000, "rtol": 0.01, "window": 500}


@pytest.mark.parametrize("scale", ["smoke", "small"])
def test_without_a_stand_in_the_plan_and_its_hashes_are_those_of_the_loss_normalised_targets_alone(scale):
    cfg = load_config("haim2022", scale=scale)
    assert cfg.stand_in is None and "stand_in" not in cfg.model_dump()
    pieces = {p.key: p for p in plan(cfg)}
    assert not any("ascent" in k for k in pieces)
    # the training piece's spec (its hash) has the margin-ascent block of before: no stop-rule fields while unset
    assert pieces["models/cifar10"].spec["training"]["margin_ascent"] == {
        "steps": 0, "step_size": 0.01, "growth": 1.1, "max_step": 0.1, "min_step": 1e-6}
    with_stand_in = {p.key: p for p in plan(load_config("haim2022", scale=scale, overrides={"stand_in": STAND_IN}))}
    for key, piece in pieces.items():  # the loss-normalised pieces are the same pieces with the stand-in beside them
        if key != "tables":
            assert with_stand_in[key].spec == piece.spec, key


def test_the_stand_in_adds_an_ascended_target_per_task_attacked_pooled_and_evaluated_the_same_way(tmp_path):
    cfg = load_config("haim2022", scale="smoke", overrides={"stand_in": STAND_IN})
    assert [name for _, name, _ in variants(cfg)] == ["mnist", "mnist-ascent", "cifar10", "cifar10-ascent"]
    keys = [p.key for p in plan(cfg)]
    for name in ("mnist-ascent", "cifar10-ascent"):
        assert {f"models/{name}", f"runs/{name}", f"pool/{name}", f"eval/{name}", f"figures/{name}"} <= set(keys)
        assert f"membership/{name}" not in keys  # membership is measured on the configured targets
    spec = {p.key: p for p in plan(cfg)}["models/cifar10-ascent"].spec["training"]
    assert {k: spec["margin_ascent"].get(k, 500) for k in STAND_IN} == STAND_IN  # window 500: the default, left out
    assert spec["epochs"] == cfg.target.epochs
    # the dry run estimates the ascended target's training longer than the plain one's (its steps added)
    planned = {p.key: p.estimate_s for p in plan_reproduction("haim2022", out=tmp_path, scale="smoke",
                                                                overrides={"stand_in": STAND_IN})}
    assert planned["models/cifar10-ascent"] > planned["models/cifar10"]
    assert "10^6" in STAND_IN_LABEL
