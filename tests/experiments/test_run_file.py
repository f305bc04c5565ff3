"""The typed run: a run file maps one-to-one to ReconstructionRun; CLI flags override it; execute is the one path."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from datarecon.cli.main import main
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import (
    attack_spec,
    init_spec,
    ReconstructionRun,
    RunOptions,
    build_run,
    execute,
    load_run,
    reconstruct,
)
from datarecon.utils.io import load_tensors


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A digits odd/even bias-free MLP trained briefly (model directory)."""
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("m") / "model"
    config = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=3, n_heldout_per_class=0),
                         arch=ArchConfig(name="mlp", hidden=(16,), bias=False, init_scale=1e-3), lr=0.5, epochs=100,
                         dtype="float64")
    train_target(config, out=out, progress=False)
    return out


def test_tagged_configs_are_built_from_the_registries():
    from datarecon.attacks import ATTACKS, INITS

    for name in ATTACKS.names():
        spec = attack_spec(name)
        assert spec.__base__ is ATTACKS.get(name).config_cls and spec().method == name
    for name in INITS.names():
        assert init_spec(name).__base__ is INITS.get(name).params_cls and init_spec(name)().name == name


def test_run_file_round_trips(tmp_path):
    run = build_run({"model": "m", "attack": {"method": "bilevel", "steps": 3, "hessian": "neumann"},
                     "init": {"name": "mix", "l1": 0.25, "count": "cycle"}, "candidates": 4, "seed": 7,
                     "early_stop": {"patience": 5}, "checkpoint": {"every": 2}})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run.model_dump(mode="json")))
    again = load_run(path)
    assert again == run and again.method == "bilevel" and again.dtype == torch.float64
    assert again.method_config().hessian == "neumann" and again.init_params()["l1"] == 0.25
    # tags may be left out: kkt and gaussian are the defaults
    bare = ReconstructionRun.model_validate({"model": "m", "attack": {"steps": 2}, "init": {"scale": 0.5}})
    assert bare.method == "kkt" and bare.init.name == "gaussian" and bare.dtype == torch.float32


@pytest.mark.parametrize("fields,message", [
    ({"model": "m", "candidate": 3}, "candidate: unknown key (allowed keys: attack, init,"),
    ({"model": "m", "attack": {"method": "gradnorm", "lambda_min": 0.3}},
     "invalid gradnorm config: lambda_min: unknown key (allowed keys: steps, lr_x,"),
    ({"model": "m", "attack": {"method": "nope"}}, "unknown attack method 'nope'; valid names: bilevel, decoreco,"),
    ({"model": "m", "init": {"name": "mix", "l3": 1}}, "l3: unknown key (allowed keys: l1, l2,"),
    ({"model": "m", "seed": "abc"}, "seed: Input should be a valid integer"),
    ({"attack": {"steps": 1}}, "model: Field required"),
    ({"model": "m", "early_stop": {"patience": -1}}, "early_stop.patience: Input should be greater than or equal"),
], ids=["run-key", "attack-key", "method", "init-key", "type", "missing", "nested"])
def test_bad_run_fields_give_one_line_errors(fields, message):
    with pytest.raises(DataReconError) as info:
        build_run(fields)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_execute_equals_the_keyword_api_bit_for_bit(model_dir, tmp_path):
    run = build_run({"model": str(model_dir), "attack": {"method": "kkt", "steps": 4, "lr_x": 0.01},
                     "init": {"name": "gaussian", "scale": 0.05}, "candidates": 6, "seed": 3})
    a = execute(run, tmp_path / "a", RunOptions(progress=False))
    b = reconstruct(model_dir, {"attack": {"method": "kkt", "steps": 4, "lr_x": 0.01},
                                "init": {"name": "gaussian", "scale": 0.05}, "candidates": 6, "seed": 3},
                    tmp_path / "b", RunOptions(progress=False))
    assert torch.equal(a.x, b.x) and torch.equal(a.multipliers, b.multipliers)
    recorded = json.loads((tmp_path / "a" / "run.json").read_text())["run"]
    assert ReconstructionRun.model_validate(recorded) == run  # run.json holds the run it executed


def test_cli_config_is_a_run_file_and_flags_override_it(model_dir, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model_dir), "attack": {"method": "gradnorm", "steps": 3, "lr_x": 0.02},
        "init": {"name": "uniform", "high": 0.5}, "candidates": 5, "seed": 2, "checkpoint": {"log_every": 1}}))
    out = tmp_path / "r"
    assert main(["reconstruct", "--no-progress", "--config", str(path), "--out", str(out), "--steps", "4",
                 "--set", "init.low=0.1"]) == 0, capsys.readouterr().err
    meta = json.loads((out / "run.json").read_text())
    assert meta["method"] == "gradnorm" and meta["steps_done"] == 4 and meta["m"] == 5 and meta["seed"] == 2
    assert meta["config"]["lr_x"] == 0.02 and meta["run"]["init"] == {"name": "uniform", "low": 0.1, "high": 0.5}
    assert len((out / "history.jsonl").read_text().splitlines()) == 4  # checkpoint.log_every: 1 from the file
    x = load_tensors(out / "candidates.safetensors")["x"]
    assert x.shape == (5, 1, 8, 8)
    # the same run from flags alone gives the same candidates
    out2 = tmp_path / "r2"
    assert main(["reconstruct", "--no-progress", "--model", str(model_dir), "--method", "gradnorm", "--steps", "4",
                 "--lr-x", "0.02", "--init", "uniform", "--set", "init.high=0.5", "--set", "init.low=0.1",
                 "--candidates", "5", "--seed", "2", "--out", str(out2)]) == 0, capsys.readouterr().err
    assert torch.equal(load_tensors(out2 / "candidates.safetensors")["x"], x)


def test_cli_run_file_errors_are_one_line(model_dir, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": str(model_dir), "candidatez": 5}))
    assert main(["reconstruct", "--no-progress", "--config", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: invalid run file {path}: candidatez: unknown key") and \
        "allowed keys:" in err and "\n" not in err
    assert main(["reconstruct", "--no-progress", "--out", str(tmp_path / "r")]) == 2
    assert "missing --model" in capsys.readouterr().err
    # unknown keys are named before a missing model, each once, with the allowed keys listed once
    path.write_text(yaml.safe_dump({"bogus": 1, "foo": 2}))
    assert main(["reconstruct", "--no-progress", "--config", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "bogus, foo: unknown keys (allowed keys: attack, init," in err and err.count("allowed keys") == 1, err
    path.write_text(yaml.safe_dump({"model": str(model_dir), **{f"k{i}": i for i in range(9)}}))
    assert main(["reconstruct", "--no-progress", "--config", str(path), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.count("allowed keys") == 1


def test_executing_the_run_a_run_json_records_reproduces_it_bit_for_bit(model_dir, tmp_path):
    """run.json's ``run`` is the complete description: executing it again gives the same candidates
    and multipliers, for a single run and for run j of ``--runs K`` (looped: each run's own step)."""
    from datarecon.experiments.reconstruct import reconstruct_runs, run_name

    run = build_run({"model": str(model_dir), "attack": {"method": "kkt", "steps": 5, "lr_x": 0.01},
                     "init": {"name": "gaussian", "scale": 0.05}, "candidates": 6, "seed": 3})
    first = execute(run, tmp_path / "a", RunOptions(progress=False))
    again = execute(load_run_json(tmp_path / "a"), tmp_path / "a2", RunOptions(progress=False))
    assert torch.equal(first.x, again.x) and torch.equal(first.multipliers, again.multipliers)
    recs = reconstruct_runs(run, tmp_path / "k", RunOptions(progress=False), runs=2, mode="looped")
    member = load_run_json(tmp_path / "k" / run_name(1))
    assert member.seed == run.seed + 1
    alone = execute(member, tmp_path / "k1", RunOptions(progress=False))
    assert torch.equal(recs[1].x, alone.x) and torch.equal(recs[1].multipliers, alone.multipliers)


def load_run_json(run_dir):
    return ReconstructionRun.model_validate(json.loads((run_dir / "run.json").read_text())["run"])


@pytest.mark.parametrize("method", [[1], {"a": 1}])
def test_an_unhashable_method_name_gets_a_one_line_error(method):
    """A run file's method that is a list or a mapping is an unknown name, not an internal error."""
    with pytest.raises(DataReconError, match="unknown attack method .*; valid names: "):
        build_run({"model": "m", "attack": {"method": method}})
