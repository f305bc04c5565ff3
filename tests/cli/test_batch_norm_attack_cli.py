"""The batch-norm priors, restored labels and group consistency from the command line, on a fine-tuned ResNet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datarecon.cli.main import main
from datarecon.utils.io import load_tensors

RESNET = ["--arch", "resnet8", "--channels", "4,8,8", "--batch-norm", "--no-bias", "--loss", "cross-entropy",
          "--normalisation", "unit", "--no-progress", "--quiet"]
DYNAMICS = ["--method", "dynamics", "--known-init", "pretrained", "--known-recipe", "model", "--candidates", "20",
            "--init", "uniform", "--no-progress"]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """A ResNet-8 with batch norm pretrained on public digits and fine-tuned 2 steps on 20 private ones."""
    root = tmp_path_factory.mktemp("bn")
    pre, ft = root / "pre", root / "ft"
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "20", "--skip-per-class", "10",
                 "--n-partition-per-class", "0", "--n-heldout-per-class", "5", *RESNET, "--lr", "0.05",
                 "--batch-size", "50", "--epochs", "2", "--out", str(pre)]) == 0
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "2", "--n-heldout-per-class", "4",
                 *RESNET, "--pretrained", str(pre), "--lr", "0.01", "--batch-size", "20", "--epochs", "2",
                 "--out", str(ft)]) == 0
    return ft


def _history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_the_feature_statistics_prior_and_restored_labels_run_and_are_recorded_and_evaluated(finetuned, tmp_path,
                                                                                            capsys) -> None:
    run = tmp_path / "run"
    assert main(["reconstruct", "--model", str(finetuned), *DYNAMICS, "--steps", "3", "--feature-stats-weight", "0.01",
                 "--known-labels", "restored", "--out", str(run)]) == 0
    meta = json.loads((run / "run.json").read_text())
    labels = meta["knowledge"]["labels"]
    assert labels["source"] == "restored" and sum(labels["counts"]) == 20
    assert "labels restored from θ* − θ_init" in meta["knowledge"]["summary"]
    y = load_tensors(run / "candidates.safetensors")["labels"].long()
    assert torch.bincount(y, minlength=10).tolist() == labels["counts"]
    rows = _history(run)
    assert all(r["feature_stats"] > 0 for r in rows)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "labels restored from theta* - theta_init:" in out and "true [2, 2, 2, 2, 2, 2, 2, 2, 2, 2]" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= metrics["labels"]["accuracy"] <= 1.0 and metrics["labels"]["true_counts"] == [2] * 10


def test_group_consistency_couples_runs_stepped_together(finetuned, tmp_path) -> None:
    out = tmp_path / "group"
    assert main(["reconstruct", "--model", str(finetuned), *DYNAMICS, "--steps", "3", "--group-weight", "0.5",
                 "--runs", "2", "--out", str(out)]) == 0
    rows0, rows1 = _history(out / "run0"), _history(out / "run1")
    assert all(r["group"] > 0 for r in rows0 + rows1)
    # two restarts from different starts: their group terms (distance to the one consensus) are equal at
    # the start (two points, one mean) and each run's own record says it was batched
    assert rows0[0]["group"] == pytest.approx(rows1[0]["group"], rel=1e-5)
    assert json.loads((out / "run0" / "run.json").read_text())["batch"]["mode"] == "batched"


@pytest.mark.parametrize(("flags", "message"), [
    ([*DYNAMICS, "--group-weight", "0.5"], "needs at least two runs stepped together"),
    ([*DYNAMICS, "--group-weight", "0.5", "--runs", "1"], "needs at least two runs stepped together"),
    ([*DYNAMICS, "--group-weight", "0.5", "--runs", "2", "--batch-mode", "looped"], "pass --batch-mode batched"),
    (["--method", "gradnorm", "--candidates", "20", "--known-labels", "restored"], "pass --known-init"),
], ids=["one-run", "runs-1", "looped", "restored-labels-need-the-start"])
def test_group_consistency_and_restored_labels_are_refused_where_they_cannot_work(finetuned, tmp_path, capsys, flags,
                                                                                 message) -> None:
    out = tmp_path / "refused"
    code = main(["reconstruct", "--model", str(finetuned), "--steps", "2", "--no-progress", *flags, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("error:")
    assert not (out / "run.json").exists()
