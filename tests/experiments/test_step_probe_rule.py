"""The step-size rule in a run: every attack that declares step sizes is probed through the attack interface; a
run whose configured step sizes fail gets the bracketed largest stable scale, run.json records every probed
setting with its verdict and residual, and a killed probed run resumes bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datarecon.attacks.base import ATTACKS
from datarecon.experiments.reconstruct import RunOptions, build_run, execute
from datarecon.utils.io import load_tensors

#: step sizes far too large for the small digits MLP below: every probed method fails at scale 1
HUGE = {"kkt": {"lr_x": 30.0, "lr_lambda": 3.0}, "decoreco": {"lr_x": 30.0, "lr_lambda": 3.0},
        "loo": {"lr_x": 30.0, "lr_lambda": 3.0}, "gradnorm": {"lr_x": 300.0}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("probe") / "model"
    train_target(TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=4, n_heldout_per_class=0),
                             arch=ArchConfig(name="mlp", hidden=(16,), bias=False, init_scale=1e-3), lr=0.5,
                             epochs=200, dtype="float64"), out=out, progress=False)
    return out


def _run(model_dir: Path, method: str, *, steps: int = 40, **fields):
    knowledge = {"known_init": "seed"} if method == "loo" else {}
    return build_run({"model": str(model_dir), "step_probe": 20, "knowledge": knowledge,
                      "attack": {"method": method, "steps": steps, "dtype": "float64", **HUGE[method]},
                      "init": {"name": "gaussian", "scale": 0.05}, "checkpoint": {"every": 10}, **fields})


def test_every_attack_with_step_sizes_declares_them_and_is_covered_here() -> None:
    built_in = [name for name in ATTACKS.names() if ATTACKS.get(name).__module__.startswith("datarecon.")]
    assert {name for name in built_in if ATTACKS.get(name).step_size_fields} == set(HUGE)


@pytest.mark.parametrize("method", sorted(HUGE))
def test_a_failing_setting_is_bracketed_and_run_json_records_every_probe(model_dir, tmp_path, method) -> None:
    rec = execute(_run(model_dir, method), tmp_path / method, RunOptions(progress=False))
    record = json.loads((tmp_path / method / "run.json").read_text())
    probe = record["step_probe"]
    tried = probe["tried"]
    assert tried[0]["scale"] == 1.0 and tried[0]["verdict"] != "ok" and tried[0]["residual"] is None
    ok = [t for t in tried if t["verdict"] == "ok"]
    assert ok and probe["scale"] == min(ok, key=lambda t: (t["residual"], -t["scale"]))["scale"]
    coarse = [t for t in tried if t["scale"] in (1.0, 0.1, 0.1 ** 2, 0.1 ** 3, 0.1 ** 4)]
    bisections = tried[len(coarse):len(coarse) + 3]  # the three bisections above the first ok coarse scale
    assert len(bisections) == 3 and len(tried) <= len(coarse) + 3 + 2  # then at most 2 polish probes
    bad = min(t["scale"] for t in tried if t["verdict"] != "ok")
    good = max(t["scale"] for t in ok)
    assert good < bad <= good * 10 ** (1 / 8) * (1 + 1e-12)  # the edge bracketed within the rule's resolution
    assert probe["fields"] == {f: v * probe["scale"] for f, v in HUGE[method].items()}
    assert {f: record["config"][f] for f in HUGE[method]} == probe["fields"]
    assert probe["rule"] == {"factor": 0.1, "tries": 4, "refine": 3, "polish": 2, "growth": 1e3,
                             "window": 0.2}
    assert rec.status == "complete"


def test_a_killed_probed_run_resumes_bit_for_bit(model_dir, tmp_path, kill_after) -> None:
    whole = execute(_run(model_dir, "kkt"), tmp_path / "whole", RunOptions(progress=False))
    with pytest.raises(KeyboardInterrupt):
        execute(_run(model_dir, "kkt"), tmp_path / "killed", RunOptions(progress=False, hooks=(kill_after(25),)))
    again = execute(_run(model_dir, "kkt"), tmp_path / "killed", RunOptions(progress=False, resume=True))
    assert whole.status == again.status == "complete"
    a, b = load_tensors(tmp_path / "whole" / "candidates.safetensors"), load_tensors(tmp_path / "killed" / "candidates.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("whole", "killed"))
    assert ra["step_probe"] == rb["step_probe"] and ra["config"] == rb["config"]
