"""A tiny training problem and attack for tests/kernel/test_checkpoint.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from datarecon.attacks.base import AttackSetup
from datarecon.kernel import checkpoint
from datarecon.kernel.checkpoint import Kind
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.training.fit import FitRecipe

#: fit() settings of the training problem; the tests kill it after epoch 7 of 12 with a checkpoint
#: every 5 epochs, so the checkpoint holds epoch 5
FIT = dict(recipe=FitRecipe(loss="logistic", lr=0.5, momentum=0.5, epochs=12))
FIT_EVERY, FIT_TAG = 5, "legacy-fixture"
ATTACK_STEPS, ATTACK_EVERY, ATTACK_KILL = 12, 4, 6
SHAPE = (1, 4, 4)


def fit_problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(model, x (8, 1, 4, 4), y (8,) in ±1), float64, the same in every process."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, *SHAPE, generator=g, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6, bias=False), nn.ReLU(), nn.Linear(6, 1, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3)
    return model.double(), x, y


def attack_problem():
    """(attack, target, prior, x0, generator factory) of a 6-candidate KKT run against a fixed MLP."""
    from datarecon.attacks.base import AttackerPrior, Target
    from datarecon.attacks.init import CandidateSpec, make_init
    from datarecon.attacks.kkt import KKTAttack, KKTConfig

    model, _, _ = fit_problem()
    params = {n: p.detach() for n, p in model.named_parameters()}
    target = Target(model=model, params=params, loss="logistic", weight_decay=0.0, input_shape=SHAPE,
                    num_outputs=1, homogeneous=True)
    prior = AttackerPrior.balanced(m=6, num_outputs=1, input_shape=SHAPE, lower=-1.0, upper=1.0)
    attack = KKTAttack(KKTConfig(steps=ATTACK_STEPS, lr_x=0.5, lr_lambda=0.01))
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE),
                   generator=torch.Generator().manual_seed(0), scale=0.1)
    return attack, target, prior, x0


def run_attack_problem(out: Path, *, resume: bool = False, hooks=()):
    """The attack of :func:`attack_problem` as a run directory in ``out``."""
    from datarecon.attacks.runner import run_attack

    attack, target, prior, x0 = attack_problem()
    return run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(0), {"seed": 0}),
                      steps=ATTACK_STEPS, out=out,
                      loop=replace(ATTACK_LOOP, log_every=2, progress=False, checkpoint_every=ATTACK_EVERY, resume=resume, hooks=hooks))


def old_vocabulary(meta: dict, kind: Kind) -> dict:
    """A checkpoint's metadata (the one schema) in the vocabulary its kind of loop wrote before it (d8472df):
    training ``tag``, ``epoch``, ``finished``, ``last_margin`` and the stepper's fields at the top; attacks
    ``config_hash``, ``method``, ``steps_done``, ``early_stop``, a complete run's last checkpoint ``running``."""
    status, stops = meta["status"], meta["stop_state"]
    if kind == Kind.TRAIN:
        old = {"tag": meta["resume_key"], "epoch": meta["steps_done"], "wall_time_s": meta["wall_time_s"],
               "history": meta["history"], **meta["stepper"], "finished": status in ("complete", "stopped-early"),
               "status": status, "stop_reason": meta["stop_reason"]}
        return {**old, **({"last_margin": stops[0]["last_margin"]} if stops else {})}
    return {**meta["stepper"], "resume_key": meta["resume_key"], "steps_done": meta["steps_done"],
            "total": meta["total"], "wall_time_s": meta["wall_time_s"],
            "status": "running" if status == "complete" else status, "stop_reason": meta["stop_reason"],
            "metrics": meta["metrics"], "early_stop": stops[0] if stops else {}}


def as_old_vocabulary(folder: Path, kind: Kind) -> None:
    """Rewrite a checkpoint's metadata in its kind's vocabulary before the schema (format 2, as d8472df wrote it)."""
    tensors, meta = checkpoint.load(folder, kind=kind)
    checkpoint.save(folder, tensors, old_vocabulary(meta, kind), kind=kind)
