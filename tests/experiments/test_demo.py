"""The demo pipeline: train → KKT attack → evaluate → picture + report, judged against its baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.experiments import demo
from datarecon.experiments.demo import DemoConfig, run_demo


@pytest.mark.slow
def test_demo_reconstructs_more_than_noise_does(tmp_path: Path) -> None:
    cfg = DemoConfig(n_per_class=10, hidden=100, train_epochs=1500, attack_steps=600)
    result = run_demo(cfg, out=tmp_path, progress=False)
    assert result.train_accuracy == 1.0
    assert result.picture.is_file() and result.picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in result.report.read_text()
    assert result.relative_residual is not None and result.relative_residual < 0.5
    # honest comparison: at the threshold that held-out digits (as many as the attack's candidates)
    # pass for at most 5% of the training images, the attack reconstructs clearly more
    cal = result.headline["calibrated"]
    assert result.headline["n_heldout_candidates"] == result.headline["n_candidates"] == 4 * cfg.n_per_class  # m = 2n, n = 2 x n_per_class
    assert cal["heldout"] <= cal["allowed"] == 1
    assert cal["count"] >= cal["heldout"] + 5, result.headline
    assert cal["noise"] <= cal["heldout"]
    lines = result.headline_lines()
    assert lines[0].startswith(f"{cal['count']} of 20 training images reconstructed at SSIM > ")
    assert f"(held-out null {cal['heldout']} of 20, noise {cal['noise']} of 20)" in lines[0]  # beside its null
    assert cal["threshold"] == max(0.4, cal["null_threshold"])  # the one headline rule


def test_the_demo_picture_marks_a_training_image_matched_twice(tmp_path: Path, monkeypatch) -> None:
    """reconstructions.png is drawn with each match's training index, so an image that is the nearest
    of two candidates is marked (×2) instead of reading as two reconstructions."""
    seen = {}
    real = demo.neighbour_grid

    def grid(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "neighbour_grid", grid)  # where run_demo looks it up
    run_demo(DemoConfig(n_per_class=2, hidden=20, train_epochs=50, attack_steps=5), out=tmp_path, progress=False)
    assert len(seen["indices"]["train"]) == seen["total"] == 8 and seen["sorted_by"]


def test_demo_cli_refuses_existing_output(tmp_path: Path, capsys) -> None:
    from datarecon.cli.main import main

    (tmp_path / "keep.txt").write_text("x")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "exists; pass --overwrite" in err and "Traceback" not in err


def test_demo_config_checks_the_training_schedule(tmp_path: Path, capsys) -> None:
    from datarecon.cli.main import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("train_schedule: cosine\n")
    assert main(["demo", "--out", str(tmp_path / "d"), "--quiet", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown schedule 'cosine'; valid names: constant, increasing, loss-normalised"]
    assert not (tmp_path / "d").exists()
