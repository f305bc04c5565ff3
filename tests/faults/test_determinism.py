"""Same inputs, separate processes: the same bytes (timing fields aside, docs/RELIABILITY.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultlib import run_ok

pytestmark = pytest.mark.slow


def test_evaluating_a_run_twice_writes_identical_files(tmp_path: Path) -> None:
    model, run = tmp_path / "model", tmp_path / "run"
    run_ok("train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "16", "--no-bias",
           "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "60", "--no-progress", "--out", str(model))
    run_ok("reconstruct", "--no-progress", "--model", str(model), "--steps", "20", "--candidates", "8",
           "--out", str(run))
    outputs = ("metrics.json", "candidates.csv", "neighbours.safetensors")
    first = {}
    for attempt in range(2):
        run_ok("evaluate", "--no-progress", str(run))
        files = {name: (run / name).read_bytes() for name in outputs}
        if attempt == 0:
            first = files
    assert files == first
    header = (run / "candidates.csv").read_text().splitlines()[0].split(",")
    scores = [c for c in header if c.startswith("score_")]
    assert scores == sorted(scores) and len(scores) >= 3
    assert "approximate" in json.loads(first["metrics.json"])
