"""``datarecon reconstruct --model package.module:factory --weights FILE``: a user's own model from the CLI."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from datarecon.cli.main import main
from datarecon.utils.io import read_json

NETS = textwrap.dedent('''
    from torch import nn

    def make_cnn():
        return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 4 * 4, 1, bias=False))

    def make_flat():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 1, bias=False), nn.Flatten(0))

    def make_biased():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 1))

    NOT_CALLABLE = 3
''')


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A user's folder: package ``mypkg`` with factories, and weights files; the current directory."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the current folder; undo after the test
    for name in [k for k in sys.modules if k == "mypkg" or k.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)
    exec(compile(NETS, "nets", "exec"), ns := {})  # noqa: S102 - the test's own source
    torch.manual_seed(0)
    save_file(ns["make_cnn"]().state_dict(), str(tmp_path / "net.safetensors"))
    save_file(ns["make_flat"]().state_dict(), str(tmp_path / "flat.safetensors"))
    save_file(ns["make_biased"]().state_dict(), str(tmp_path / "biased.safetensors"))
    torch.save(ns["make_cnn"]().state_dict(), tmp_path / "net.pt")
    return tmp_path


def _run(*args: str) -> int:
    return main(["reconstruct", "--no-progress", *args])


def test_readme_form_runs_and_records_the_model(project, capsys):
    # the README's console example, with fewer steps
    rc = _run("--model", "mypkg.nets:make_cnn", "--weights", "net.safetensors", "--input-shape", "1,8,8",
              "--value-range", "0,1", "--loss", "logistic", "--candidates", "6", "--steps", "5", "--out", "runs/own")
    assert rc == 0, capsys.readouterr().err
    run = read_json(project / "runs" / "own" / "run.json")
    assert run["own_model"]["factory"] == "mypkg.nets:make_cnn"
    assert run["own_model"]["homogeneous_measured"] is True and run["own_model"]["value_range"] == [0.0, 1.0]
    assert run["model_dir"] is None
    # evaluate with the user's own training and held-out inputs, then report
    g = torch.Generator().manual_seed(0)
    save_file({"x": torch.rand(5, 1, 8, 8, generator=g)}, str(project / "train.safetensors"))
    save_file({"x": torch.rand(5, 1, 8, 8, generator=g)}, str(project / "held.safetensors"))
    assert main(["evaluate", "runs/own", "--no-progress"]) == 2
    assert "pass its training inputs: --train" in capsys.readouterr().err
    assert main(["evaluate", "runs/own", "--train", "nope.safetensors", "--no-progress"]) == 2
    assert "--train file nope.safetensors not found" in capsys.readouterr().err
    assert main(["evaluate", "runs/own", "--train", "train.safetensors", "--heldout", "held.safetensors",
                 "--no-progress"]) == 0
    metrics = read_json(project / "runs" / "own" / "metrics.json")
    assert metrics["reference_sizes"] == {"train": 5, "heldout": 5, "noise": 5}
    assert metrics["headline"]["paper"]["heldout"] is not None and metrics["run"]["own_model"]["factory"]
    assert main(["report", "runs/own", "--out", "own.html"]) == 0 and (project / "own.html").is_file()


def test_biased_model_warns_naming_the_layer(project, capsys):
    """One line, once (issue 25 item 4: the measured homogeneity and the attack's own check used to print
    two raw Python warnings, each with a source path and a code line)."""
    rc = _run("--model", "mypkg.nets:make_biased", "--weights", "biased.safetensors", "--input-shape", "1,8,8",
              "--candidates", "4", "--steps", "2", "--out", "runs/b")
    assert rc == 0
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if line.startswith("warning:")]
    assert len(warned) == 1 and "first break: 3 (Linear): it has a bias" in warned[0], err
    assert not any(".py:" in line or "Warning:" in line for line in err), err


def test_warnings_reach_a_terminal_as_one_line_each_and_once(project):
    """In a real process (no pytest capture): the biased model's homogeneity is said once, in one line
    without source paths, and a diverged run is said once, in its error line."""
    import os
    import subprocess

    def run(*args: str) -> tuple[int, list[str]]:
        env = {**os.environ, "PYTHONWARNINGS": "default"}
        r = subprocess.run([sys.executable, "-m", "datarecon.cli.main", "reconstruct", "--no-progress", *args],
                           cwd=project, capture_output=True, text=True, env=env, timeout=300)
        return r.returncode, r.stderr.splitlines()

    rc, err = run("--model", "mypkg.nets:make_biased", "--weights", "biased.safetensors", "--input-shape", "1,8,8",
                  "--candidates", "4", "--steps", "2", "--out", "runs/b")
    assert rc == 0 and [line for line in err if "homogeneous" in line] == [line for line in err
                                                                            if line.startswith("warning:")], err
    assert len(err) == 1 and not any(".py:" in line for line in err), err
    rc, err = run("--model", "mypkg.nets:make_cnn", "--weights", "net.safetensors", "--input-shape", "1,8,8",
                  "--candidates", "4", "--steps", "5", "--lr-x", "1e6", "--out", "runs/d")
    assert rc == 2 and len([line for line in err if "diverged" in line]) == 1, err
    assert err[-1].startswith("error: kkt diverged at step"), err


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "mypkg.nets:nope", "--weights", "net.safetensors"], "module 'mypkg.nets' has no 'nope'"),
    (["--model", "nopkg.nets:make", "--weights", "net.safetensors"], "cannot import module 'nopkg.nets'"),
    (["--model", "mypkg.nets:NOT_CALLABLE", "--weights", "net.safetensors"], "is not callable"),
    (["--model", "mypkg.nets:make_cnn"], "needs --weights"),
    (["--model", "mypkg.nets:make_cnn", "--weights", "biased.safetensors"], "tensor '0.weight' (4, 1, 3, 3) is missing"),
    (["--model", "mypkg.nets:make_cnn", "--weights", "net.pt"], "pickle"),
    (["--model", "mypkg.nets:make_flat", "--weights", "flat.safetensors"], "end forward with .unsqueeze(-1)"),
    (["--model", "mypkg.nets:make_cnn", "--weights", "net.safetensors", "--loss", "cross-entropy"],
     "does not fit a model with 1 output"),
    (["--model", "mypkg.nets:make_cnn", "--weights", "net.safetensors", "--init", "partition"], "needs the model's training data"),
], ids=["unknown-factory", "unknown-module", "not-callable", "no-weights", "mismatched-weights", "pickle",
        "flat-output", "loss-misfit", "data-init"])
def test_bad_own_model_gives_one_line_errors(project, capsys, args, message):
    rc = _run(*args, *(["--input-shape", "1,8,8"]), "--candidates", "4", "--steps", "1", "--out", "runs/x")
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and err.startswith("error: ") and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (project / "runs" / "x").exists()


def test_own_model_options_refused_with_a_model_directory(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    rc = _run("--model", str(tmp_path / "m"), "--input-shape", "1,8,8", "--out", str(tmp_path / "r"))
    assert rc == 2 and "apply to --model package.module:factory only" in capsys.readouterr().err
