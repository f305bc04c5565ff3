"""Fine-tuning from a pretrained model directory: the start, the head, batch norm in eval mode, the checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from datarecon.data import DataSpec, load_task
from datarecon.errors import DataReconError
from datarecon.models.checkpoint import load_model_dir
from datarecon.models.spec import ArchSpec, build_model
from datarecon.training import build_train_config, train_target
from datarecon.utils.io import params_digest

#: a tiny ResNet-8 with batch norm; public digits after the first 10 of every class
ARCH = {"name": "resnet8", "hidden": [4, 8, 8], "bias": False, "batch_norm": True}
PUBLIC = {"dataset": "digits", "task": "all", "n_per_class": 30, "skip_per_class": 10, "n_partition_per_class": 0,
          "n_heldout_per_class": 5, "normalisation": "unit"}
PRIVATE = {"dataset": "digits", "task": "all", "n_per_class": 2, "n_heldout_per_class": 4, "normalisation": "unit"}


def _config(data: dict, **over):
    fields = {"data": data, "arch": ARCH, "loss": "cross-entropy", "lr": 0.01, "batch_size": 20, "epochs": 20,
              "log_every": 5, **over}
    return build_train_config(fields)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pre") / "pre"
    train_target(_config(PUBLIC, lr=0.05, momentum=0.9, epochs=3, batch_size=50), out=out, progress=False)
    return out


def _finetune(pre: Path, out: Path, data: dict = PRIVATE, **over):
    return train_target(_config(data, pretrained=str(pre), **over), out=out, progress=False)


def test_the_public_data_skip_the_private_images_and_the_check_refuses_an_overlap(pretrained: Path,
                                                                                  tmp_path: Path) -> None:
    public, private = load_task(DataSpec(**PUBLIC)), load_task(DataSpec(**PRIVATE))
    # by construction: the first 10 of every class (train and test split) are never public
    assert not set(public.train.indices.tolist()) & set(private.train.indices.tolist() +
                                                         private.partition.indices.tolist())
    assert not set(public.heldout.indices.tolist()) & set(private.heldout.indices.tolist())
    # checked: a fine-tuning on images the pretrained model trained on is refused in one line
    overlap = dict(PRIVATE, n_per_class=8)  # 8 + 8 partition per class reach past the 10 skipped
    with pytest.raises(DataReconError, match=r"^\d+ training or partition images of this fine-tuning were training "
                                             r"images of the pretrained model .*--skip-per-class"):
        _finetune(pretrained, tmp_path / "ft", data=overlap)
    assert not (tmp_path / "ft").exists()  # refused before the folder was written


def test_the_start_is_the_pretrained_model_and_batch_norm_statistics_stay_frozen(pretrained: Path,
                                                                                 tmp_path: Path) -> None:
    res = _finetune(pretrained, tmp_path / "ft")
    pre, ft = load_model_dir(pretrained), load_model_dir(tmp_path / "ft")
    # θ_init is the pretrained θ (same classes: the head is kept), recorded by its hash
    assert ft.meta["init_sha256"] == params_digest(pre.params)
    record = ft.meta["pretrained"]
    assert record["head"] == "pretrained" and record["weights_sha256"] == pre.meta["sha256"]["weights.safetensors"]
    assert record["path"] == str(pretrained.resolve())
    # eval mode: running statistics untouched, affine weights trained
    stats = [k for k in pre.model.state_dict() if "running" in k]
    assert stats and all(torch.equal(pre.model.state_dict()[k], ft.model.state_dict()[k]) for k in stats)
    assert not torch.equal(pre.params["stem_bn.weight"], ft.params["stem_bn.weight"])
    assert ft.meta["training"]["pretrained"]["sha256"] == record["weights_sha256"]
    assert res.metrics["epochs_done"] == 20


def test_the_pretraining_ran_batch_norm_in_train_mode(pretrained: Path) -> None:
    pre = load_model_dir(pretrained)
    assert not torch.equal(pre.model.state_dict()["stem_bn.running_var"], torch.ones(4))
    assert "pretrained" not in pre.meta and "pretrained" not in pre.meta["training"]


def test_a_new_head_is_drawn_from_the_seed_where_the_classes_differ(pretrained: Path, tmp_path: Path) -> None:
    binary = dict(PRIVATE, task="odd-even", n_per_class=5)
    a = _finetune(pretrained, tmp_path / "a", data=binary, loss="logistic", epochs=1, batch_size=None, seed=3)
    b = _finetune(pretrained, tmp_path / "b", data=binary, loss="logistic", epochs=1, batch_size=None, seed=3)
    _finetune(pretrained, tmp_path / "c", data=binary, loss="logistic", epochs=1, batch_size=None, seed=4)
    ma, mb, mc = (load_model_dir(tmp_path / n).meta for n in "abc")
    assert ma["pretrained"]["head"] == "new" and a.model.head.weight.shape == (1, 8)
    assert ma["init_sha256"] == mb["init_sha256"] != mc["init_sha256"]  # reproducible by seed
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    # the head at the start is the one a model built from the seed draws; the body the pretrained one
    spec = ArchSpec(name="resnet8", input_shape=(1, 8, 8), num_outputs=1, hidden=(4, 8, 8), bias=False,
                    batch_norm=True)
    from datarecon.models.pretrained import finetune_start

    pre = load_model_dir(pretrained)
    weights = {k: v for k, v in pre.model.state_dict().items() if v.is_floating_point()}
    start = finetune_start(weights, pre.arch, spec, seed=3, dtype=torch.float32, new_head=True)
    drawn = build_model(spec, generator=torch.Generator().manual_seed(3))
    assert torch.equal(start.head.weight, drawn.head.weight)
    assert torch.equal(start.stages[0][0].conv1.weight, pre.params["stages.0.0.conv1.weight"])
    assert params_digest(dict(start.named_parameters())) == ma["init_sha256"]


def test_the_config_hash_covers_the_pretrained_weights_not_their_path(pretrained: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(pretrained, moved)
    one = _finetune(pretrained, tmp_path / "one", epochs=1)
    two = _finetune(moved, tmp_path / "two", epochs=1)
    assert one.config.hash() == two.config.hash()
    assert one.config.hash() != _config(PRIVATE, epochs=1).hash()
    assert json.loads((tmp_path / "one" / "model.json").read_text())["training"]["pretrained"]["path"] == str(pretrained)


def test_other_pretrained_weights_are_refused_in_one_line(pretrained: Path, tmp_path: Path) -> None:
    digest = load_model_dir(pretrained).meta["sha256"]["weights.safetensors"]
    wrong = "0" * 64
    with pytest.raises(DataReconError, match=r"^the pretrained model in .* is not the one the config names "
                                             r"\(weights sha256 [0-9a-f]{12} vs 000000000000\); pass the directory"):
        train_target(_config(PRIVATE, pretrained={"path": str(pretrained), "sha256": wrong}), out=tmp_path / "x",
                     progress=False)
    train_target(_config(PRIVATE, epochs=1, pretrained={"path": str(pretrained), "sha256": digest}),
                 out=tmp_path / "ok", progress=False)


@pytest.mark.parametrize("change, message", [
    ({"arch": dict(ARCH, hidden=[4, 8, 16])}, r"^the pretrained model has widths 4,8,8, the fine-tuning 4,8,16; "
                                              r"pass --hidden 4,8,8$"),
    ({"arch": dict(ARCH, batch_norm=False)}, r"^the pretrained model has batch_norm True, the fine-tuning False"),
    ({"data": dict(PRIVATE, normalisation="unit-minus-mean")}, r"^fine-tuning keeps the pretrained model's input "
                                                                r"space.*--normalisation unit$"),
    ({"pretrained": "nowhere"}, r"^--pretrained nowhere: model directory nowhere not found"),
], ids=["widths", "batch-norm", "normalisation", "missing"])
def test_what_does_not_fit_the_pretrained_model_is_refused_in_one_line(pretrained: Path, tmp_path: Path,
                                                                       change: dict, message: str) -> None:
    fields = {"data": PRIVATE, "arch": ARCH, "loss": "cross-entropy", "epochs": 1, "pretrained": str(pretrained),
              **change}
    with pytest.raises(DataReconError, match=message) as err:
        train_target(build_train_config(fields), out=tmp_path / "x", progress=False)
    assert "\n" not in str(err.value)


def test_batch_norm_is_for_resnets_only() -> None:
    with pytest.raises(DataReconError, match=r"^batch_norm applies to the ResNets \(resnet18, resnet8\), not 'cnn'; "
                                             r"drop --batch-norm$"):
        build_train_config({"data": PRIVATE, "arch": {"name": "cnn", "batch_norm": True}, "loss": "cross-entropy"})


def test_a_killed_fine_tuning_resumes_bit_identically(pretrained: Path, tmp_path: Path, kill_after,
                                                      monkeypatch) -> None:
    import dataclasses
    import sys

    config = _config(PRIVATE, pretrained=str(pretrained), momentum=0.9, batch_size=10, epochs=8, checkpoint_every=2)
    train_target(config, out=tmp_path / "full", progress=False)
    target_mod = sys.modules["datarecon.training.target"]
    real_fit = target_mod.fit
    monkeypatch.setattr(target_mod, "fit", lambda *a, loop, **k: real_fit(
        *a, loop=dataclasses.replace(loop, hooks=(kill_after(5),)), **k))
    with pytest.raises(KeyboardInterrupt):
        train_target(config, out=tmp_path / "part", progress=False)
    monkeypatch.setattr(target_mod, "fit", real_fit)
    res = train_target(config, out=tmp_path / "part", progress=False, resume=True)
    assert res.fit.resumed_from == 5
    a, b = load_model_dir(tmp_path / "full"), load_model_dir(tmp_path / "part")
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    # other pretrained weights change the config hash: the checkpoint is refused, naming the weights
    other = tmp_path / "other-pre"
    train_target(_config(PUBLIC, lr=0.05, epochs=1, batch_size=50), out=other, progress=False)
    with pytest.raises(DataReconError, match=f"^the checkpoint in {tmp_path / 'part'} was trained from other "
                                             f"pretrained weights than those in {other} now"):
        train_target(_config(PRIVATE, pretrained=str(other), momentum=0.9, batch_size=10, epochs=8,
                             checkpoint_every=2), out=tmp_path / "part", progress=False, resume=True)


def test_identifiability_of_a_fine_tuned_model_starts_from_the_pretrained_weights(pretrained: Path,
                                                                                  tmp_path: Path) -> None:
    """The objectives that need θ_init take the pretrained start (not a seed's draw, whose hash the model would
    refuse): the recorded fine-tuning replayed from it on the private images ends at θ*; a moved pretrained model
    leaves those objectives unmeasured with the reason, and the others measured."""
    from datarecon.experiments.identifiability import IdentifiabilitySettings, identifiability

    _finetune(pretrained, tmp_path / "ft", epochs=2)
    settings = IdentifiabilitySettings(objectives=("kkt", "kkt-init", "dynamics"))
    res = identifiability(tmp_path / "ft", settings)["objectives"]
    assert "note" not in res["kkt-init"] and "note" not in res["dynamics"]
    assert res["dynamics"]["sets"]["training set"]["relative_residual"] < 1e-6 and res["dynamics"]["identifies"]
    shutil.move(str(pretrained), str(tmp_path / "moved"))
    try:
        res = identifiability(tmp_path / "ft", settings)["objectives"]
    finally:
        shutil.move(str(tmp_path / "moved"), str(pretrained))
    assert "not measured" in res["kkt-init"]["note"] and "pretrained" in res["kkt-init"]["note"]
    assert "note" not in res["kkt"]
