"""``datarecon audit --model DIR``: one trained model audited in one folder (membership with the reference attacks,
the scale's KKT runs, a report) and its answer printed; a rerun skips what finished."""

from __future__ import annotations

import json

import pytest

from datarecon.cli.main import main
from datarecon.experiments.audit import SCALE_CAVEATS


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit-model") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "10", "--hidden", "32",
                 "--no-bias", "--init-scale", "1e-3", "--lr", "0.5", "--epochs", "300", "--dtype", "float64",
                 "--no-progress", "--out", str(out)]) == 0
    return out


def test_audit_a_given_model_prints_the_answer_and_writes_a_report(model, tmp_path, capsys):
    (tmp_path / "cfg.yaml").write_text("model_membership: {nonmembers: 300, population: 60, references: {count: 4}}\n"
                                       "keep: 2\n")  # both runs pooled: 80 candidates against 40 held-out images
    args = ["audit", "--scale", "smoke", "--model", str(model), "--config", str(tmp_path / "cfg.yaml"),
            "--no-progress", "--out", str(tmp_path / "a")]
    assert main(args) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "reconstruction (the audit's KKT runs, pooled): " in text and "(held-out null" in text
    # the count's caveats go with it (issue 50): the null's candidate count, and that a smoke count measures nothing
    assert "reconstruction: note: the held-out null has 40 candidates, the attack 80: fewer null candidates lower " \
           "the threshold and flatter the attack" in text
    assert f"reconstruction: note: {SCALE_CAVEATS['smoke']}" in text
    assert "membership: strongest: " in text and "membership: loss threshold (baseline): loss: AUC" in text
    assert "membership: empirical epsilon" in text and "report: " in text
    result = json.loads((tmp_path / "a" / "membership" / "membership.json").read_text())
    assert result["references"]["count"] == 4 and result["references"]["in_models"]["mean"] == 2.0
    page = (tmp_path / "a" / "report.html").read_text(encoding="utf-8")
    assert "Membership: the strongest signal beside the loss threshold" in page and "Reconstruction: 2 KKT runs" in page
    # the reconstruction figures beside the membership ones (issue 50: the report showed membership figures only)
    assert "Best SSIM of each training image&#x27;s reconstruction, sorted, against held-out images" in page
    assert "candidates, sorted by SSIM to their nearest training image" in page
    assert "0 reconstructed is no evidence of safety" in page
    assert main(args) == 0  # a rerun: every piece done earlier, the same answer
    again = capsys.readouterr().out
    assert again.count("done earlier, skipped") == 6 and "membership: strongest: " in again


def test_audit_of_a_model_is_one_process(model, tmp_path, capsys):
    assert main(["audit", "--scale", "smoke", "--model", str(model), "--workers", "2", "--out", str(tmp_path / "a")]) == 2
    assert "drop --backend and --workers" in capsys.readouterr().err and not (tmp_path / "a").exists()


def test_audit_announces_only_what_its_membership_runs(model, tmp_path, capsys, monkeypatch):
    """Where not even 16 reference models fit the budget (here each takes 30 s, as their markers say), the audit's
    announcement claimed no reference attacks and its answer says they were not run, with their cost and the
    audit's own options to run them; --references K runs K."""
    from datarecon.experiments.membership import references

    monkeypatch.setattr(references, "trained_times", lambda out, indices: [30.0 for _ in indices])
    base = ["audit", "--scale", "smoke", "--model", str(model), "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert ("membership (reference attacks if 16 or more reference models fit --budget-minutes 0.5, else a line with "
            "their cost)") in text
    assert ("membership: reference attacks (LiRA, RMIA) not run: 16 reference models would take about 8.0 min "
            "(30.0 s each") in text and "pass --budget-minutes 10 or --references 16" in text
    assert main([*base, "--references", "4", "--out", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "membership (4 reference models)" in text and "membership: reference models: 4 reference models" in text
    assert json.loads((tmp_path / "b" / "membership" / "membership.json").read_text())["references"]["count"] == 4
