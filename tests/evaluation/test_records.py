"""Files read back are untrusted: metrics.json and run.json are checked field by field before a report
or a headline uses them, and an earlier version's files still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datarecon.errors import CheckpointError
from datarecon.evaluation.records import read_metrics
from datarecon.evaluation.run_records import read_run_fields

METRICS = {"nearest": {}, "metric": "ssim", "n_candidates": 20,
           "headline": {"rule": "standard", "threshold": 0.8, "count": 3, "heldout": 0, "noise": 0, "n_train": 10,
                        "paper": {"threshold": 0.4, "count": 5, "heldout": 7, "noise": 0}, "notes": []},
           "privacy": {"n_real": 1, "n_fake": 19, "scores": {"lambda": {"auc": None, "auc_ci_95": None}}},
           "haim": {"counts": {"0.4": 5}, "sorted_ssim": [0.9, 0.5, -0.2]}}


def _write(tmp_path: Path, change=lambda m: None) -> Path:
    m = json.loads(json.dumps(METRICS))
    change(m)
    (tmp_path / "metrics.json").write_text(json.dumps(m))
    return tmp_path


def test_a_metrics_file_datarecon_writes_reads_back(tmp_path: Path) -> None:
    assert read_metrics(_write(tmp_path))["headline"]["count"] == 3


def test_undefined_numbers_of_earlier_versions_still_read(tmp_path: Path) -> None:
    """Older versions wrote an undefined AUC as the string "nan" (now JSON null)."""
    run = _write(tmp_path, lambda m: m["privacy"]["scores"]["lambda"].update(auc="nan"))
    assert read_metrics(run)["privacy"]["scores"]["lambda"]["auc"] == "nan"


@pytest.mark.parametrize("change, message", [
    (lambda m: m["headline"].update(count="NaN"), "headline.count: Input should be a valid integer"),
    (lambda m: m["headline"].update(count=1e308), "headline.count"),
    (lambda m: m["headline"].update(count=11), "count 11 exceeds the 10 training images"),
    (lambda m: m["headline"]["paper"].update(count=12), "paper.count 12 exceeds the 10 training images"),
    (lambda m: m["headline"].update(threshold=7), "headline.threshold: Input should be less than or equal to 1"),
    (lambda m: m["privacy"]["scores"]["lambda"].update(auc=1.5), "privacy.scores.lambda.auc"),
    (lambda m: m["haim"]["counts"].update({"0.4": -1}), "haim.counts.0.4"),
    (lambda m: m.update(metric=3), "metric: Input should be a valid string"),
    (lambda m: m.pop("nearest"), "nearest: Field required"),
], ids=["count-text", "count-huge", "count-above-n", "paper-count-above-n", "threshold-above-1", "auc-above-1",
        "negative-count", "metric-number", "no-nearest"])
def test_a_damaged_metrics_file_is_one_line(tmp_path: Path, change, message) -> None:
    with pytest.raises(CheckpointError, match="is damaged or was changed by hand") as err:
        read_metrics(_write(tmp_path, change))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert f"rerun `datarecon evaluate {tmp_path}` to rewrite it" in str(err.value)


def test_run_json_fields_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"status": "complete", "steps_done": 3, "final": {"loss": None}}))
    assert read_run_fields(path)["steps_done"] == 3
    path.write_text(json.dumps({"status": "complete", "steps_done": "many"}))
    with pytest.raises(CheckpointError, match="steps_done: Input should be a valid integer"):
        read_run_fields(path)
    path.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="does not hold a JSON object"):
        read_run_fields(path)
