"""Resuming a run: only against the same target, prior, x₀ and generator; a finished run stays as it was."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from datarecon.attacks.base import AttackerPrior, AttackSetup, Target
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import load_checkpoint, resume_key, run_attack, save_checkpoint
from datarecon.attacks.loop import Plateau
from datarecon.errors import DataReconError

SHAPE = (1, 4, 4)


def _x0(seed: int = 0) -> torch.Tensor:
    return make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE),
                     generator=torch.Generator().manual_seed(seed), scale=0.1)


def _run(target, prior, out: Path, *, steps: int = 12, x0=None, seed: int = 0, resume: bool = False,
         early_stop=None):
    attack = KKTAttack(KKTConfig(steps=steps, lr_x=0.5, lr_lambda=0.01))
    return run_attack(attack,
                      AttackSetup(target, prior, _x0() if x0 is None else x0, torch.Generator().manual_seed(seed)),
                      out=out,
                      loop=replace(ATTACK_LOOP, log_every=3, progress=False, checkpoint_every=4, resume=resume),
                      early_stop=early_stop)


def _nudged(target: Target) -> Target:
    """The same architecture with one weight changed by one ulp-ish step."""
    params = {k: v.clone() for k, v in target.params.items()}
    first = next(iter(params))
    params[first].view(-1)[0] += 1e-12
    return Target(model=target.model, params=params, loss=target.loss, weight_decay=target.weight_decay,
                  input_shape=target.input_shape, num_outputs=target.num_outputs, homogeneous=target.homogeneous,
                  model_dir=target.model_dir)


def test_resume_against_another_target_prior_init_or_seed_is_refused(target, prior, tmp_path) -> None:
    _run(target, prior, tmp_path / "run", steps=4)
    other_prior = AttackerPrior(labels=prior.labels.flip(0), input_shape=SHAPE, lower=prior.lower, upper=prior.upper)
    for label, kwargs in [("weights", {"target": _nudged(target)}), ("prior", {"prior": other_prior}),
                          ("x0", {"x0": _x0(seed=1)}), ("generator", {"seed": 1}),
                          ("early stop", {"early_stop": Plateau("rel_residual", patience=3)})]:
        args = {"target": target, "prior": prior, **kwargs}
        with pytest.raises(DataReconError, match="was run against another model, initialisation, seed or prior"):
            _run(args.pop("target"), args.pop("prior"), tmp_path / "run", steps=8, resume=True, **args)
    rec = _run(target, prior, tmp_path / "run", steps=8, resume=True)  # the same inputs resume
    assert rec.steps_done == 8


def test_resume_key_ignores_what_does_not_change_the_result(target, prior) -> None:
    a = KKTAttack(KKTConfig(steps=10, lr_x=0.5))
    b = KKTAttack(KKTConfig(steps=99, lr_x=0.5))  # steps may grow on resume
    key = lambda att, t: resume_key(att, t, prior, x0=_x0(), generator=torch.Generator().manual_seed(0))  # noqa: E731
    assert key(a, target) == key(b, target)
    assert key(a, target) != key(a, _nudged(target))
    # formulation "auto" resolves to "binary" on this target: a run started with an explicit binary resumes
    assert key(KKTAttack(KKTConfig(steps=10, lr_x=0.5, formulation="binary")), target) == key(a, target)


def test_checkpoint_from_before_resume_keys_checks_the_model_path(target, prior, tmp_path) -> None:
    run = tmp_path / "run"
    _run(Target(**{**target.__dict__, "model_dir": "/models/a"}), prior, run, steps=4)
    state, meta = load_checkpoint(run)
    gen = state.pop("__generator_state__")
    meta.pop("resume_key")
    g = torch.Generator()
    g.set_state(gen)
    save_checkpoint(run, state, meta, generator=g)
    b = Target(**{**target.__dict__, "model_dir": "/models/b"})
    with pytest.raises(DataReconError, match="was run against the model /models/a, not /models/b"):
        _run(b, prior, run, steps=8, resume=True)
    a = Target(**{**target.__dict__, "model_dir": "/models/a"})
    with pytest.warns(UserWarning, match="checkpoint predates resume keys"):
        assert _run(a, prior, run, steps=8, resume=True).steps_done == 8


def test_resuming_a_finished_run_changes_nothing(target, prior, tmp_path) -> None:
    first = _run(target, prior, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    again = _run(target, prior, tmp_path / "run", resume=True)
    after = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    assert after == before  # run.json (final losses, wall time), candidates, history: byte for byte
    assert again.summary["final"] == first.summary["final"] and again.summary["final"]["loss"] > 0
    assert json.loads(before["run.json"])["final"]["loss"] == first.summary["final"]["loss"]


def test_resuming_a_run_that_stopped_early_keeps_it_stopped(target, prior, tmp_path) -> None:
    stop = lambda: Plateau("rel_residual", patience=2, rel_tol=0.5)  # noqa: E731
    first = _run(target, prior, tmp_path / "run", steps=200, early_stop=stop())
    assert first.status == "stopped-early"
    before = (tmp_path / "run" / "run.json").read_bytes()
    again = _run(target, prior, tmp_path / "run", steps=200, early_stop=stop(), resume=True)
    assert again.status == "stopped-early" and again.steps_done == first.steps_done
    assert (tmp_path / "run" / "run.json").read_bytes() == before


def test_finished_bilevel_run_keeps_its_final_losses(tmp_path) -> None:
    from torch import nn

    from datarecon.attacks.bilevel import BilevelAttack, BilevelConfig

    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 1)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    target = Target(model=model, params=params, loss="logistic", weight_decay=0.05, input_shape=(1, 3, 3),
                    num_outputs=1)
    prior = AttackerPrior(labels=torch.tensor([1.0, 1, -1, -1], dtype=torch.float64), input_shape=(1, 3, 3),
                          lower=-0.5, upper=0.5)
    x0 = torch.rand(4, 1, 3, 3, generator=g, dtype=torch.float64) - 0.5

    def run(resume: bool):
        return run_attack(BilevelAttack(BilevelConfig(steps=3)),
                          AttackSetup(target, prior, x0, torch.Generator().manual_seed(0)), out=tmp_path / "b",
                          loop=replace(ATTACK_LOOP, progress=False, resume=resume))

    first = run(False)
    before = (tmp_path / "b" / "run.json").read_bytes()
    again = run(True)
    assert json.loads(before)["final"] and again.summary["final"] == first.summary["final"]
    assert (tmp_path / "b" / "run.json").read_bytes() == before


@pytest.mark.parametrize("undefined", [None, "nan"], ids=["null", "old-nan-string"])
def test_finished_run_with_an_undefined_metric_resumes(target, prior, tmp_path, undefined) -> None:
    """A last-step metric that was NaN is saved as JSON null (older checkpoints: the string "nan");
    resuming the finished run reads either back as NaN instead of failing, and rewrites nothing."""
    import math

    first = _run(target, prior, tmp_path / "run")
    state, meta = load_checkpoint(tmp_path / "run")
    g = torch.Generator()
    g.set_state(state.pop("__generator_state__"))
    name = sorted(meta["metrics"])[0]
    meta["metrics"][name] = undefined
    save_checkpoint(tmp_path / "run", state, meta, generator=g)
    before = (tmp_path / "run" / "run.json").read_bytes()
    again = _run(target, prior, tmp_path / "run", resume=True)
    assert math.isnan(again.summary["final"][name])
    assert {k: v for k, v in again.summary["final"].items() if k != name} == \
        {k: v for k, v in first.summary["final"].items() if k != name}
    assert (tmp_path / "run" / "run.json").read_bytes() == before
