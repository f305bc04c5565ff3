"""Fine-tuning on n = 1, 2, 4 private images of a 10-class task: the pretrained read-out kept, the draw recorded and
reproducible, the same targets through the command line, --runs and sweeps, bad subsets refused in one line."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from datarecon.cli.main import main
from datarecon.data import DataSpec, load_task
from datarecon.experiments.reconstruct import default_candidates
from datarecon.models.checkpoint import load_model_dir
from datarecon.models.pretrained import HEAD_KEPT
from datarecon.training import build_train_config, train_target
from datarecon.utils.io import params_digest

ARCH = {"name": "resnet8", "hidden": [4, 8, 8], "bias": False, "batch_norm": True}
PUBLIC = {"dataset": "digits", "task": "all", "n_per_class": 30, "skip_per_class": 10, "n_partition_per_class": 0,
          "n_heldout_per_class": 5, "normalisation": "unit"}
PRIVATE = {"dataset": "digits", "task": "all", "n_per_class": 2, "n_heldout_per_class": 4, "normalisation": "unit"}


def _config(data: dict, **over):
    return build_train_config({"data": data, "arch": ARCH, "loss": "cross-entropy", "lr": 0.01, "epochs": 2,
                               "log_every": 1, **over})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pre") / "pre"
    train_target(_config(PUBLIC, lr=0.05, momentum=0.9, epochs=2, batch_size=50), out=out, progress=False)
    return out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_private_images_on_the_pretrained_head(pretrained: Path, tmp_path: Path, n: int) -> None:
    res = train_target(_config({**PRIVATE, "n_train": n}, pretrained=str(pretrained), batch_size=n),
                       out=tmp_path / "ft", progress=False)
    pre, ft = load_model_dir(pretrained), load_model_dir(tmp_path / "ft")
    # the read-out is the pretrained one: 10 outputs, kept, and θ_init is the pretrained weights bit for bit
    assert ft.meta["pretrained"]["head"] == HEAD_KEPT and ft.arch.num_outputs == pre.arch.num_outputs == 10
    assert ft.meta["init_sha256"] == params_digest(dict(pre.model.named_parameters()))
    # the draw: n images of n different classes, recorded in model.json's data spec and in the extras
    drawn = ft.meta["data"]["train_indices"]
    assert ft.meta["data"]["n_train"] == n and len(drawn) == n == res.metrics["n_train"]
    assert ft.indices["train"].tolist() == drawn
    task = load_task(DataSpec(**PRIVATE, n_train=n))
    assert task.train.indices.tolist() == drawn and len(set(task.train.y.tolist())) == n
    assert ft.meta["training"]["data"]["train_indices"] == drawn
    assert default_candidates(ft.meta["data"], 10, data_init=False) == 2 * n  # m = 2n from the draw, not the pool


def test_the_draw_is_reproducible_and_its_record_trains_the_same_model(pretrained: Path, tmp_path: Path) -> None:
    data = {**PRIVATE, "n_train": 2}
    train_target(_config(data, pretrained=str(pretrained)), out=tmp_path / "a", progress=False)
    train_target(_config(data, pretrained=str(pretrained)), out=tmp_path / "b", progress=False)
    a, b = load_model_dir(tmp_path / "a"), load_model_dir(tmp_path / "b")
    assert a.meta["data"] == b.meta["data"] and a.meta["config_hash"] == b.meta["config_hash"]
    assert all(torch.equal(v, b.params[k]) for k, v in a.params.items())
    # model.json's data spec, given back as the config, names the same images and trains the same weights
    train_target(_config(a.meta["data"], pretrained=str(pretrained)), out=tmp_path / "c", progress=False)
    c = load_model_dir(tmp_path / "c")
    assert c.meta["data"] == a.meta["data"] and all(torch.equal(v, c.params[k]) for k, v in a.params.items())
    other = train_target(_config({**data, "seed": 5}, pretrained=str(pretrained)), out=tmp_path / "d", progress=False)
    assert load_model_dir(other.out).meta["data"]["train_indices"] != a.meta["data"]["train_indices"]
    # a class subset would get a new read-out; the draw keeps the task and so the head
    assert json.loads((tmp_path / "a" / "model.json").read_text())["pretrained"]["head"] == HEAD_KEPT


def test_a_killed_fine_tuning_on_a_draw_resumes_bit_identically(pretrained: Path, tmp_path: Path, kill_after,
                                                                monkeypatch) -> None:
    config = _config({**PRIVATE, "n_train": 4}, pretrained=str(pretrained), epochs=6, checkpoint_every=2)
    train_target(config, out=tmp_path / "full", progress=False)
    target_mod = sys.modules["datarecon.training.target"]
    real_fit = target_mod.fit
    monkeypatch.setattr(target_mod, "fit", lambda *a, loop, **k: real_fit(
        *a, loop=dataclasses.replace(loop, hooks=(kill_after(4),)), **k))
    with pytest.raises(KeyboardInterrupt):
        train_target(config, out=tmp_path / "part", progress=False)
    monkeypatch.setattr(target_mod, "fit", real_fit)
    res = train_target(config, out=tmp_path / "part", progress=False, resume=True)
    assert res.fit.resumed_from == 4
    a, b = load_model_dir(tmp_path / "full"), load_model_dir(tmp_path / "part")
    assert a.meta["data"] == b.meta["data"] and all(torch.equal(v, b.params[k]) for k, v in a.params.items())


def _cli_train(pre: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--dataset", "digits", "--task", "all", "--n-per-class", "2", "--n-heldout-per-class", "4",
            "--normalisation", "unit", "--arch", "resnet8", "--channels", "4,8,8", "--no-bias", "--batch-norm",
            "--loss", "cross-entropy", "--lr", "0.01", "--epochs", "1", "--pretrained", str(pre), "--out", str(out),
            "--quiet", *extra]


def test_the_command_line_trains_on_a_draw_or_named_images(pretrained: Path, tmp_path: Path, capsys) -> None:
    assert main(_cli_train(pretrained, tmp_path / "one", "--n-train", "1")) == 0
    one = load_model_dir(tmp_path / "one")
    assert one.meta["data"]["n_train"] == 1 and len(one.meta["data"]["train_indices"]) == 1
    assert main(["info", str(tmp_path / "one")]) == 0
    card = capsys.readouterr().out
    assert "trains on 1 of them, drawn across the classes (n_train 1, seed 0): train indices" in card, card
    pool = load_task(DataSpec(**PRIVATE)).train.indices.tolist()
    assert main(_cli_train(pretrained, tmp_path / "named", "--train-indices", f"{pool[3]},{pool[0]}")) == 0
    assert load_model_dir(tmp_path / "named").indices["train"].tolist() == [pool[0], pool[3]]


@pytest.mark.parametrize(("extra", "message"), [
    (["--n-train", "21"], "error: n_train 21 exceeds the 20 images n_per_class 2 selects for the 10 classes of digits "
                          "all; lower n_train (--n-train) or raise n_per_class (--n-per-class)"),
    (["--n-train", "0"], "error: invalid training config: data.n_train: Input should be greater than 0"),
    (["--train-indices", "1,x"], "error: --train-indices must be a comma-separated list of indices into the dataset's "
                                 "train split like 1000,1000; got '1,x'"),
    (["--train-indices", "0,0"], "error: invalid training config: data: train_indices name index 0 more than once; "
                                 "list each image once"),
    (["--n-train", "3", "--train-indices", "0,1"], "error: invalid training config: data: n_train 3 and the 2 "
                                                   "train_indices disagree; pass one of them"),
    (["--train-indices", "99999"], "error: train index 99999 is not among the 20 images n_per_class 2 selects"),
])
def test_bad_subsets_are_refused_in_one_line(pretrained: Path, tmp_path: Path, capsys, extra: list[str],
                                             message: str) -> None:
    code = main(_cli_train(pretrained, tmp_path / "bad", *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "bad").exists()  # refused before the folder was written


@pytest.fixture(scope="module")
def tiny_draw(tmp_path_factory) -> Path:
    """A bias-free MLP on 3 digits drawn from a pool of 5 per side (odd / even)."""
    out = tmp_path_factory.mktemp("tiny") / "m"
    cfg = build_train_config({"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 5, "n_train": 3},
                              "arch": {"name": "mlp", "hidden": [16], "bias": False}, "lr": 0.5, "epochs": 50})
    train_target(cfg, out=out, progress=False)
    return out


def test_runs_and_sweeps_size_their_candidates_from_the_draw(tiny_draw: Path, tmp_path: Path, capsys) -> None:
    from datarecon.experiments.execution import Execution
    from datarecon.experiments.store import Store
    from datarecon.experiments.sweep import SweepConfig, run_sweep
    from datarecon.utils.io import load_tensors

    assert main(["reconstruct", "--model", str(tiny_draw), "--method", "kkt", "--steps", "3", "--runs", "2",
                 "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    capsys.readouterr()
    assert tuple(load_tensors(tmp_path / "runs" / "run0" / "candidates.safetensors")["x"].shape) == (6, 1, 8, 8)
    sweep = SweepConfig(model_dir=str(tiny_draw), method="kkt", steps=3, search={"seeds": 2})
    result = run_sweep(sweep, tmp_path / "store", execution=Execution(workers=1), progress=False)
    assert result.completed == 2
    for row in Store(tmp_path / "store").rows():
        x = load_tensors(tmp_path / "store" / row["run_dir"] / "candidates.safetensors")["x"]
        assert x.shape[0] == 6  # m = 2n with n = 3 drawn, not 2n of the pool of 10


def test_an_experiment_file_trains_on_a_draw_and_attacks_it(tmp_path: Path) -> None:
    from datarecon.experiments.experiment import build_experiment, run_experiment

    exp = build_experiment({
        "name": "draw",
        "train": {"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 5, "n_train": 3,
                           "n_heldout_per_class": 3},
                  "arch": {"name": "mlp", "hidden": [16], "bias": False}, "lr": 0.5, "epochs": 30},
        "attack": {"attack": {"method": "kkt", "steps": 3}},
        "evaluate": {"against": ["train", "heldout"]}, "report": None})
    run_experiment(exp, tmp_path / "out", progress=False)
    model = load_model_dir(tmp_path / "out" / "model")
    assert model.meta["data"]["n_train"] == 3 and len(model.meta["data"]["train_indices"]) == 3
    run = json.loads((tmp_path / "out" / "run" / "run.json").read_text())
    metrics = json.loads((tmp_path / "out" / "run" / "metrics.json").read_text())
    assert run["m"] == 6 and metrics["headline"]["n_train"] == 3  # m = 2n and the evaluation's n: the draw's
