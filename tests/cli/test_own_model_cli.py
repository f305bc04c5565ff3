"""A user's own model from the shell: ``membership`` and ``identifiability`` take ``--model package.module:factory
--weights FILE`` as ``reconstruct`` does, with the model's examples as safetensors files of inputs and labels."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from safetensors.torch import save_file

from datarecon.cli.main import main

NETS = textwrap.dedent('''
    import torch
    from torch import nn

    def make_mlp():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 10, bias=False))

    def train(x, y, seed):
        torch.manual_seed(seed % 2**31)
        net = make_mlp().double()
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in range(150):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x.double()), y).backward()
            opt.step()
        return net
''')

#: a float32 model and a recipe that uses its inputs as given (no cast): it must receive float32 inputs and int64
#: class indices (a recipe of float64 inputs failed every reference model with a dtype error)
NETS32 = textwrap.dedent('''
    import torch
    from torch import nn

    def make_mlp():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 10, bias=False))

    def train(x, y, seed):
        assert x.dtype == torch.float32 and y.dtype == torch.int64, (x.dtype, y.dtype)
        torch.manual_seed(seed % 2**31)
        net = make_mlp()
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in range(50):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return net
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory, data_dir):
    """A user's folder: package ``mypkg`` (a factory and its training function), the trained weights and the
    training, held-out and public examples (digits, ten classes)."""
    from datarecon.data import DataSpec
    from datarecon.data.selection import draw_outside

    root = tmp_path_factory.mktemp("own")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "nets.py").write_text(NETS)
    (root / "mypkg" / "nets32.py").write_text(NETS32)
    ns: dict = {}
    exec(compile(NETS, "nets", "exec"), ns)  # noqa: S102 - the test's own source
    spec = DataSpec(dataset="digits", task="all", n_per_class=2, n_heldout_per_class=0)
    members, _ = draw_outside(spec, split="train", count=20, seed=0)
    non, _ = draw_outside(spec, split="train", exclude=members.indices, count=300, seed=1)
    pop, _ = draw_outside(spec, split="test", count=60, seed=2)
    for name, part in (("train", members), ("heldout", non), ("public", pop)):
        save_file({"x": part.x.double().contiguous(), "y": part.y.contiguous()}, str(root / f"{name}.safetensors"))
    net = ns["train"](members.x, members.y, 0)
    save_file(net.state_dict(), str(root / "net.safetensors"))
    ns32: dict = {}
    exec(compile(NETS32, "nets32", "exec"), ns32)  # noqa: S102 - the test's own source
    save_file(ns32["train"](members.x.float(), members.y, 0).state_dict(), str(root / "net32.safetensors"))
    save_file(ns["make_mlp"]().double().state_dict(), str(root / "init.safetensors"))
    return root


@pytest.fixture()
def inside(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the current folder; undo after the test
    for name in [k for k in sys.modules if k == "mypkg" or k.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)
    return project


OWN = ["--model", "mypkg.nets:make_mlp", "--weights", "net.safetensors", "--input-shape", "1,8,8", "--loss",
       "cross-entropy"]


def test_membership_of_your_own_model_with_a_folder_roc_kept_references_and_the_subspace(inside, capsys):
    args = ["membership", *OWN, "--train", "train.safetensors", "--heldout", "heldout.safetensors", "--public",
            "public.safetensors", "--recipe", "mypkg.nets:train", "--evaluate", "--references", "6", "--out", "m",
            "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "strongest: " in text and "loss threshold (baseline): loss: AUC" in text and "empirical epsilon" in text
    result = json.loads((inside / "m" / "membership.json").read_text())
    applicable = {k for k, v in result["signals"].items() if v["applicable"]}
    assert {"subspace", "lira-online", "rmia", "gradient-norm"} <= applicable
    assert result["references"]["in_models"]["mean"] == 3.0 and result["references"]["recipe"].endswith(
        "mypkg.nets:train")
    assert {"roc.png", "exposed.csv", "target.json"} <= {p.name for p in (inside / "m").iterdir()}
    assert len(list((inside / "m" / "references").glob("ref-*"))) == 6
    assert json.loads((inside / "m" / "target.json").read_text())["model"] == "mypkg.nets:make_mlp"
    # a second call reuses them; a larger K trains the new ones in worker processes (the recipe is importable)
    assert main([*args[:-4], "8", "--workers", "2", "--out", "m", "--no-progress"]) == 0
    assert "(2 trained now, 6 reused)" in capsys.readouterr().out


def test_a_float32_recipe_gets_float32_inputs_and_class_indices(inside, capsys):
    """A recipe receives the inputs in the dtype of the model's weights and the labels as its loss takes them (the
    files hold float64 inputs): a float32 recipe that does not cast trains every reference model."""
    args = ["membership", "--model", "mypkg.nets32:make_mlp", "--weights", "net32.safetensors", "--input-shape",
            "1,8,8", "--loss", "cross-entropy", "--train", "train.safetensors", "--heldout", "heldout.safetensors",
            "--public", "public.safetensors", "--recipe", "mypkg.nets32:train", "--evaluate", "--references", "6",
            "--out", "m32", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    result = json.loads((inside / "m32" / "membership.json").read_text())
    assert result["references"]["count"] == 6 and result["references"]["trained"] == 6
    assert result["signals"]["lira-online"]["applicable"]


@pytest.mark.parametrize("extra, message", [
    (["--evaluate"], "needs --train FILE (its training examples) and --heldout FILE"),
    (["--evaluate", "--train", "train.safetensors", "--heldout", "net.safetensors"], "has no tensor 'x'"),
    (["--images", "train.safetensors"], "for your own model measure the signals with --evaluate"),
    (["--evaluate", "--train", "train.safetensors", "--heldout", "heldout.safetensors", "--references", "4"],
     "no training function was given for the reference models (--recipe"),
], ids=["no-examples", "bad-file", "images", "references-without-recipe"])
def test_your_own_model_bad_input_is_one_line(inside, capsys, extra, message):
    code = main(["membership", *OWN, *extra, "--out", "bad"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (inside / "bad").exists()


def test_a_model_directorys_call_refuses_the_own_model_options(trained_digits, capsys):
    assert main(["membership", "--model", str(trained_digits), "--evaluate", "--recipe", "mypkg.nets:train"]) == 2
    assert "--recipe apply to --model package.module:factory only" in capsys.readouterr().err


def test_identifiability_of_your_own_model(inside, capsys):
    assert main(["identifiability", "mypkg.nets:make_mlp", "--weights", "net.safetensors", "--input-shape", "1,8,8",
                 "--loss", "cross-entropy", "--train", "train.safetensors", "--heldout", "heldout.safetensors",
                 "--known-init", "init.safetensors", "--objectives", "kkt,kkt-init,dynamics", "--out", "id.json",
                 "--no-progress"]) == 0, capsys.readouterr().err
    result = json.loads((inside / "id.json").read_text())
    assert result["sets"] == ["training set", "held-out images", "means of two training images"]
    assert "sets" in result["objectives"]["kkt"] and "sets" in result["objectives"]["kkt-init"]
    assert "records no training recipe to replay" in result["objectives"]["dynamics"]["note"]
    assert main(["identifiability", "mypkg.nets:make_mlp", "--weights", "net.safetensors", "--input-shape", "1,8,8",
                 "--train", "train.safetensors", "--objectives", "loo", "--no-progress"]) == 0
    assert "pass --known-init FILE" in capsys.readouterr().out


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("dir") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "8",
                 "--no-bias", "--epochs", "5", "--no-progress", "--out", str(out)]) == 0
    return out
