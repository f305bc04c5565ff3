"""``datarecon report MEMBERSHIP_DIR``: the membership audit report (ROC of every signal, score histograms, the most
exposed training images, the empirical epsilon bound, which members and non-members each figure uses), and the run
report's membership card with the reference attacks (``evaluate --membership DIR``)."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import pytest

from datarecon.cli.main import main


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-model") / "model"
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "3", "--n-heldout-per-class", "6",
                 "--hidden", "64", "--loss", "cross-entropy", "--lr", "0.5", "--epochs", "200", "--dtype", "float64",
                 "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-membership") / "m"
    assert main(["membership", "--model", str(model), "--evaluate", "--nonmembers", "300", "--population", "100",
                 "--references", "8", "--reference-seed", "3", "--no-progress", "--out", str(out)]) == 0
    return out


def _visible(text: str) -> str:
    text = re.sub(r"<pre>.*?</pre>", " ", text, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<img[^>]*>", " ", text))))


def test_a_membership_folder_is_an_audit_report(folder, tmp_path, capsys):
    out = tmp_path / "m.html"
    assert main(["report", str(folder), "--out", str(out)]) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    text = _visible(page)
    result = json.loads((folder / "membership.json").read_text())
    # the cards: the headline beside the loss threshold, who was measured, the reference models, the epsilon bound
    assert "Membership: the strongest signal beside the loss threshold" in text
    assert result["strongest"]["line"] in text and "loss threshold, every candidate" in text
    assert "IN models per half-in candidate mean 4.0 of 8" in text
    assert "Empirical epsilon lower bound" in text and "epsilon >= " in text
    # three figures: ROC, histograms, the most exposed images; each says which members and non-members it uses
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3 and all(base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n" for b in images)
    assert "ROC of every signal on log-log axes" in text and "Score of the members and of the non-members" in text
    assert "lira-online, rmia-online on the half-in pool (30 members, 30 non-members)" in text
    assert "on all candidates (30 members, 300 non-members)" in text
    assert f"training images the headline signal ({result['strongest']['name']}) scores highest" in text
    assert "The most exposed training images by" in text and "p-value" in text


def test_a_folder_without_a_result_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_evaluate_shows_the_reference_attacks_of_a_membership_folder(model, folder, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["reconstruct", "--model", str(model), "--steps", "5", "--no-progress", "--out", str(run)]) == 0
    assert main(["evaluate", str(run), "--membership", str(folder), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "membership: strongest: " in printed and "membership: empirical epsilon" in printed
    section = json.loads((run / "metrics.json").read_text())["membership"]
    assert section["references"]["count"] == 8 and section["signals"]["lira-online"]["applicable"]
    assert section["signals"]["lira-online"]["scope"] == "the half-in pool"
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    card = _visible((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert "lira-online (reference)" in card and "(30 members, 30 non-members; the half-in pool)" in card
    assert "reference models 8; each half-in candidate IN for 4.0 of them on average" in card
    # without the folder the card says the reference attacks were not run, what they may gain and how to run them
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    assert "the reference attacks (LiRA, RMIA) were not run" in capsys.readouterr().out
    assert main(["report", str(run), "--out", str(tmp_path / "r2.html")]) == 0
    assert "usually the strongest" in _visible((tmp_path / "r2.html").read_text(encoding="utf-8"))


def test_evaluate_refuses_the_membership_folder_of_another_model(folder, tmp_path, capsys):
    other = tmp_path / "other"
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "3", "--n-heldout-per-class", "6",
                 "--hidden", "16", "--loss", "cross-entropy", "--epochs", "5", "--no-progress", "--out",
                 str(other)]) == 0
    run = tmp_path / "run"
    assert main(["reconstruct", "--model", str(other), "--steps", "2", "--no-progress", "--out", str(run)]) == 0
    assert main(["evaluate", str(run), "--membership", str(folder), "--no-progress"]) == 2
    assert "is the membership folder of another model" in capsys.readouterr().err


def test_a_panel_that_would_crowd_one_bin_is_drawn_on_the_percentile_axis() -> None:
    """Loss-type scores piled up next to their bound (−loss of memorised members and most non-members close to 0, a
    long tail below) filled one bin of the score axis; on the percentile axis no bin holds more than about 1/bins of
    the scores, and the members still sit above the non-members. A spread score keeps its own axis."""
    import numpy as np

    from datarecon.report.figures import CROWDED_BIN, histogram_axis

    rng = np.random.default_rng(0)
    members, nonmembers = -rng.exponential(1e-6, 20), -rng.exponential(0.05, 2000) ** 2
    edges = np.linspace(np.percentile(np.r_[members, nonmembers], 1), 0, 31)
    crowded, _ = np.histogram(np.clip(np.r_[members, nonmembers], edges[0], 0), edges)
    assert crowded.max() > 0.5 * crowded.sum()  # the score axis: one bin
    m, n, bins, label = histogram_axis(members, nonmembers)
    counts, _ = np.histogram(np.r_[m, n], bins)
    assert label == "percentile among all scores" and counts.max() <= 2 * counts.sum() / 30
    assert np.median(m) > np.median(n)
    spread = histogram_axis(rng.normal(1, 1, 50), rng.normal(0, 1, 500))
    counts, _ = np.histogram(np.r_[spread[0], spread[1]], spread[2])
    assert spread[3] == "score" and counts.max() <= CROWDED_BIN * counts.sum()
