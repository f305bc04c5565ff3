"""Issue 25, items 8, 9 and 12: what the commands offer and print, and that --overwrite never deletes a
user's file inside datarecon's sub-folders. Every test drives the command line (``main``) and checks
exit codes, printed lines and files on disk."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from datarecon.cli.main import build_command, main
from datarecon.experiments.audit import SCALE_CAVEATS

#: the commands that compute (issue 25 item 8: each takes --threads)
COMPUTING = (["train"], ["reconstruct"], ["evaluate"], ["report"], ["run"], ["sweep"], ["reproduce", "runkel2024"],
             ["reproduce", "haim2022"], ["audit"], ["demo"])
TINY_EXPERIMENT = """name: tiny
train:
  data: {dataset: digits, task: odd-even, n_per_class: 5, n_heldout_per_class: 5}
  arch: {name: mlp, hidden: [16], bias: false, init_scale: 1.0e-2}
  lr: 0.5
  epochs: 50
  dtype: float64
attack:
  attack: {method: kkt, steps: 20, lr_x: 0.01, lr_lambda: 0.01, lambda_min: 0.2}
  init: {name: gaussian, scale: 0.05}
  candidates: 10
"""


def _help(args: list[str], capsys) -> str:
    assert main([*args, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("args", COMPUTING, ids=lambda a: " ".join(a))
def test_every_computing_command_takes_threads(args, capsys) -> None:
    assert "--threads" in _help(args, capsys)


def test_threads_sets_the_torch_threads(tmp_path: Path, capsys) -> None:
    before = torch.get_num_threads()
    try:
        assert main(["examples"]) == 0  # a command that does not compute leaves torch alone
        assert torch.get_num_threads() == before
        assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "2", "--hidden", "4",
                     "--epochs", "1", "--no-progress", "--threads", "2", "--out", str(tmp_path / "m")]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def test_help_is_readable_at_80_columns(monkeypatch) -> None:
    """Plain click help: every line fits 80 columns and every option name is shown whole (the rich
    panels cut names to '--n-heldout-per-c…' and dropped '[dp]' as markup)."""
    monkeypatch.setenv("COLUMNS", "80")
    commands = list(_commands(build_command()))
    # one process prints every command's help (a process per command cost ~2.5 s of imports each)
    marker = "=====DATARECON-HELP====="
    script = ("import sys\nfrom datarecon.cli.main import main\n"
              f"for path in {[list(p) for p, _ in commands]!r}:\n"
              f"    print({marker!r}, flush=True)\n"
              "    code = main([*path, '--help'])\n"
              "    sys.stdout.flush()\n"
              "    assert code == 0, (path, code)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**__import__("os").environ, "COLUMNS": "80"}, timeout=300)
    assert res.returncode == 0, res.stderr
    outputs = res.stdout.split(marker + "\n")[1:]
    assert len(outputs) == len(commands)
    for (path, cmd), text in zip(commands, outputs):
        res = subprocess.CompletedProcess(path, 0, stdout=text, stderr="")
        assert text.strip(), path
        assert all(len(line) <= 80 for line in res.stdout.splitlines()), (path, res.stdout)
        assert "…" not in res.stdout, path
        for param in getattr(cmd, "params", []):
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and not getattr(param, "hidden", False):
                    assert opt in res.stdout, (path, opt)
        if path == ("train",):
            assert "pip install 'datarecon[dp]'" in " ".join(res.stdout.split()), res.stdout


def test_examples_out_folder_is_created(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "configs"
    assert main(["examples", "experiment-digits.yaml", "--out", f"{dest}/"]) == 0
    assert (dest / "experiment-digits.yaml").is_file()
    assert capsys.readouterr().out.strip() == f"wrote {dest / 'experiment-digits.yaml'}"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("experiment")
    path = root / "tiny.yaml"
    path.write_text(TINY_EXPERIMENT)
    out = root / "out"
    res = subprocess.run([sys.executable, "-m", "datarecon.cli.main", "run", str(path), "--out", str(out),
                          "--no-progress"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return path, out, res.stdout


def test_run_prints_its_result(experiment) -> None:
    _, out, stdout = experiment
    assert "attack: kkt complete after 20 steps, relative residual" in stdout
    assert "training images reconstructed" in stdout and "held-out" in stdout  # the count beside its null
    assert f"report: {out / 'report.html'}" in stdout


def test_run_overwrite_never_deletes_a_user_file_in_its_sub_folders(experiment, tmp_path: Path, capsys) -> None:
    path, src, _ = experiment
    out = shutil.copytree(src, tmp_path / "copy")
    for rel in ("run/notes.txt", "model/checkpoint/mine.pt"):
        (out / rel).write_text("mine")
        assert main(["run", str(path), "--out", str(out), "--overwrite", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"it holds '{rel}', which datarecon did not write" in err, err
        assert (out / rel).read_text() == "mine" and (out / "run" / "run.json").is_file()
        (out / rel).unlink()


def test_demo_overwrite_keeps_a_user_file_in_model(tmp_path: Path, capsys) -> None:
    """A demo folder of an earlier version (no manifest): its sub-folders may hold only names datarecon writes."""
    out = tmp_path / "demo-out"
    (out / "model" / "checkpoint").mkdir(parents=True)
    (out / "model" / "model.json").write_text("{}")
    (out / "run").mkdir()
    (out / "run" / "run.json").write_text("{}")
    (out / "model" / "notes.txt").write_text("mine")
    assert main(["demo", "--out", str(out), "--overwrite", "--no-progress"]) == 2
    assert "it holds 'model/notes.txt'" in capsys.readouterr().err
    assert (out / "model" / "notes.txt").read_text() == "mine"


# -- --runs K (item 9) -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--n-heldout-per-class",
                 "10", "--hidden", "16", "--no-bias", "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "50",
                 "--dtype", "float64", "--no-progress", "--out", str(out)]) == 0
    return out


def _runs(model: Path, out: Path, *extra: str) -> list[str]:
    return ["reconstruct", "--model", str(model), "--steps", "40", "--runs", "3", "--candidates", "10",
            "--checkpoint-every", "10", "--no-progress", "--out", str(out), *extra]


def test_runs_are_pooled_into_one_result(model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "k"
    assert main(_runs(model, out)) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("kkt: 3 of 3 runs pooled, 30 candidates; best relative residual ")
    assert printed[-1].endswith(f"wrote {out} (evaluate it with `datarecon evaluate {out}`)")
    run = json.loads((out / "run.json").read_text())
    assert run["method"] == "pool" and run["m"] == 30 and run["config"]["sources"] == ["run0", "run1", "run2"]
    assert main(["evaluate", str(out), "--no-progress"]) == 0  # one evaluation of the K runs
    assert json.loads((out / "metrics.json").read_text())["headline"]["n_candidates"] == 30


def _killed(args: list[str], at: str) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "DATARECON_FAULT_AFTER_CHECKPOINT": at, "OMP_NUM_THREADS": "1"}
    # SIGINT back to its default: a shell without job control starts background jobs with it ignored
    return subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=600, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_an_unfinished_runs_folder_says_exactly_how_to_continue(model: Path, tmp_path: Path, capsys,
                                                                monkeypatch) -> None:
    out = tmp_path / "k"
    args = _runs(model, out)
    assert _killed(args, "run1:20:KILL").returncode == -9  # killed between two runs' checkpoints
    assert main(["evaluate", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    command = "datarecon " + " ".join(args[:]) + " --resume"
    assert "it holds the runs of `reconstruct --runs`, and " in err and "runs are unfinished" in err, err
    assert err.endswith(f"continue with `{command}`"), err
    assert main(args) == 2  # without --resume: the error names it
    assert f"{out} holds an unfinished run; pass --resume to continue it" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert main(["evaluate", str(out), "--no-progress"]) == 0


def test_a_killed_run_names_resume(model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "one"
    args = ["reconstruct", "--model", str(model), "--steps", "40", "--candidates", "10", "--checkpoint-every", "10",
            "--no-progress", "--out", str(out)]
    assert _killed(args, "one:20:KILL").returncode == -9
    assert main(args) == 2
    assert f"{out} holds an unfinished run (stopped at step 20); pass --resume" in capsys.readouterr().err
    assert main(["evaluate", str(out), "--no-progress"]) == 2
    assert f"finish it with `datarecon {' '.join(args)} --resume`" in capsys.readouterr().err


# -- audit (items 8 and 12) ------------------------------------------------------------------------

@pytest.mark.slow
def test_audit_shows_progress_skips_a_no_op_and_keeps_user_files(tmp_path: Path, capsys) -> None:
    pytest.importorskip("opacus", reason="the audit's DP-SGD targets need opacus (pip install 'datarecon[dp]')")
    out = tmp_path / "audit"
    assert main(["audit", "--scale", "smoke", "--out", str(out), "--no-progress"]) == 0
    first = capsys.readouterr().out
    assert "[1/4] baseline/s0: training the target and 2 attack runs ..." in first
    assert "[4/4] dp-eps10/s0: done" in first
    # the smoke scale's counts measure nothing: said with them (issue 50), and in the report's setup
    assert first.splitlines()[-2] == f"note: {SCALE_CAVEATS['smoke']}"
    assert "0 reconstructed is no evidence of safety" in (out / "report.html").read_text(encoding="utf-8")
    t0 = time.perf_counter()
    assert main(["audit", "--scale", "smoke", "--out", str(out), "--no-progress"]) == 0
    took = time.perf_counter() - t0
    again = capsys.readouterr().out
    assert "4 finished earlier" in again and "training the target" not in again
    assert took < 3.0, f"a no-op audit took {took:.1f} s"  # was 5-18 s: Opacus searched sigma again
    nested = out / "runs" / "baseline" / "s0" / "run0" / "mine.txt"
    nested.write_text("mine")
    (tmp_path / "other.yaml").write_text("seeds: [1]\n")
    assert main(["audit", "--scale", "smoke", "--out", str(out), "--config", str(tmp_path / "other.yaml"),
                 "--overwrite", "--no-progress"]) == 2
    assert "it holds 'runs/baseline/s0/run0/mine.txt', which datarecon did not write" in capsys.readouterr().err
    assert nested.read_text() == "mine" and (out / "report.html").is_file()


@pytest.mark.slow
def test_audit_ctrl_c_says_how_to_continue(tmp_path: Path) -> None:
    """Issue 25 item 20: audit's Ctrl-C said only 'interrupted'."""
    pytest.importorskip("opacus", reason="the audit's DP-SGD targets need opacus (pip install 'datarecon[dp]')")
    args = ["audit", "--scale", "smoke", "--out", str(tmp_path / "a"), "--no-progress"]
    res = _killed(args, "run:10:INT")  # Ctrl-C right after the first attack run's checkpoint at step 10
    assert res.returncode == 130, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == ("interrupted; rerun the same command with --resume to continue "
                                                   "(finished pieces are skipped)")
    res = subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args, "--resume"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def test_own_model_records_its_weight_decay(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 25 item 19: --weight-decay of a user's own model was not recorded in run.json."""
    from safetensors.torch import save_file

    pkg = tmp_path / "dr_issue25_own"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Flatten(), "
                                     "nn.Linear(64, 4, bias=False), nn.ReLU(), nn.Linear(4, 1, bias=False))\n")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4, bias=False), torch.nn.ReLU(),
                              torch.nn.Linear(4, 1, bias=False))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "w.safetensors"))
    assert main(["reconstruct", "--model", "dr_issue25_own:make", "--weights", str(tmp_path / "w.safetensors"),
                 "--input-shape", "1,8,8", "--candidates", "4", "--steps", "2", "--weight-decay", "0.01",
                 "--no-progress", "--out", str(tmp_path / "own")]) == 0
    own = json.loads((tmp_path / "own" / "run.json").read_text())["own_model"]
    assert own["weight_decay"] == 0.01


# -- issue 36: the newcomer's findings --------------------------------------------------------------


def test_a_rerun_of_a_finished_experiment_says_it_skipped(experiment, capsys) -> None:
    path, out, _ = experiment
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert (f"{out}: train, attack, evaluate, report already finished there, not run again; nothing left to do "
            "(--overwrite starts afresh)") in printed


def test_evaluate_says_whether_the_attack_converged(model: Path, tmp_path: Path, capsys) -> None:
    """The README promises it: a short run, alone or pooled (--runs), is called not converged by evaluate
    itself, not only by the HTML report."""
    one = tmp_path / "one"
    assert main(["reconstruct", "--model", str(model), "--steps", "3", "--candidates", "10", "--no-progress",
                 "--out", str(one)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(one), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("attack: NOT converged: relative residual ")
    pool = tmp_path / "pool"
    assert main(_runs(model, pool)) == 0
    capsys.readouterr()
    assert main(["evaluate", str(pool), "--no-progress"]) == 0
    assert "attack: NOT converged: 3 of 3 pooled runs (run" in capsys.readouterr().out


def test_evaluate_against_train_alone_says_what_is_missing(model: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "r"
    assert main(["reconstruct", "--model", str(model), "--steps", "3", "--candidates", "10", "--no-progress",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--against", "train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "'train'" not in out and "real/fake" not in out, out
    assert "held-out images not measured" in out
    assert "privacy: not measured: no 'heldout' reference set" in out
    assert "privacy: needs both training and held-out images: evaluate against train and heldout" in out


def test_the_two_residuals_are_named_apart_in_the_progress(model: Path, tmp_path: Path, capsys) -> None:
    assert main(["reconstruct", "--model", str(model), "--steps", "3", "--candidates", "10", "--progress",
                 "--out", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert "surrogate_rel_residual " in captured.err and " rel_residual " not in captured.err, captured.err
    assert ", relative residual " in captured.out  # the exact one, at the end


def test_version_flag_and_help_items(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("datarecon ")
    text = " ".join(_help(["reconstruct"], capsys).split())
    helps = [text.split(f"--{o} ")[1].split(" --")[0] for o in ("ls-c1", "ls-grow", "ls-max-trials")]
    assert len(set(helps)) == 3, helps  # three descriptions, not one copied three times
    assert "--max-lr-factor <float|none>" in _help(["train"], capsys)
    assert "[default: 0.01]" in " ".join(_help(["membership"], capsys).split())  # --fpr's default shown
    for args in (["train"], ["reconstruct"], ["evaluate"], ["membership"], ["run"], ["audit"], ["data", "info"],
                 ["data", "download"]):
        assert "--data-dir <path>" in _help(args, capsys), args
    assert "[default: 1]" in " ".join(_help(["train"], capsys).split("--threads")[1].split("--")[0].split())


def test_demo_takes_threads_zero_and_refuses_more_threads_than_cores(tmp_path: Path, capsys) -> None:
    from datarecon.cli._common import cpu_count
    from datarecon.experiments.demo import DemoConfig

    assert DemoConfig(threads=0).threads == 0  # 0: PyTorch's default, as for every other command
    assert main(["demo", "--threads", str(cpu_count() + 1), "--out", str(tmp_path / "d")]) == 2
    assert f"exceeds the {cpu_count()} CPU cores" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
