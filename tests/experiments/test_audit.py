"""The defence audit (experiments/audit.py): a smoke run end to end, resume, the process pool, bad input."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

pytest.importorskip("opacus", reason="the dp extra (pip install 'datarecon[dp]') is installed by make test / CI")

from datarecon.errors import DataReconError  # noqa: E402
from datarecon.experiments.audit import load_audit_config, run_audit, settings  # noqa: E402
from datarecon.experiments.execution import Execution  # noqa: E402
from datarecon.experiments.reproduce import Runtime  # noqa: E402
from datarecon.utils.io import read_json  # noqa: E402

# long end-to-end/science tests: `make test-slow` (CI) runs them, `make test` does not
pytestmark = [pytest.mark.slow]


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "tables" / "audit.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_smoke_audit_end_to_end_and_resume(tmp_path, data_dir):
    cfg = load_audit_config(scale="smoke")
    assert [s.axis for s in settings(cfg)] == ["baseline", "weight_decay", "epochs", "dp"]
    lines: list[str] = []
    report = run_audit(cfg, out=tmp_path / "a", scale="smoke", runtime=Runtime(data_dir=data_dir), log=lines.append)
    html = report.read_text(encoding="utf-8")
    assert "Defences" in html and "DP-SGD bound" in html
    rows = {r["setting"]: r for r in _rows(tmp_path / "a")}
    assert set(rows) == {"baseline", "wd0.001", "epochs30", "dp-eps10"}
    dp = rows["dp-eps10"]
    eps = float(dp["dp_epsilon"])
    assert eps <= 10.0 and eps == pytest.approx(10.0, abs=0.02)  # Opacus's search tolerance
    card = read_json(tmp_path / "a" / "models" / "dp-eps10" / "s0" / "model" / "model.json")["metrics"]
    assert card["dp_epsilon"] == pytest.approx(eps) and card["dp_steps"] == 30  # 10 epochs x round(6 / 2)
    n = int(dp["n_train"])
    assert 0 <= float(dp["bound_count"]) <= n and float(dp["kappa"]) > 0
    for r in rows.values():  # every target evaluated with its nulls
        assert r["count"] != "" and r["count_heldout"] != "" and r["count_noise"] != ""
        assert math.isfinite(float(r["heldout_accuracy"]))
    assert rows["wd0.001"]["weight_decay"] == "0.001" and rows["epochs30"]["epochs"] == "30"
    assert sorted(read_json(tmp_path / "a" / "figures" / "DONE.json")["summary"]["files"]) == \
        ["dp.png", "epochs.png", "weight_decay.png"]
    # a rerun into the same folder runs nothing again
    lines.clear()
    run_audit(cfg, out=tmp_path / "a", scale="smoke", runtime=Runtime(data_dir=data_dir), log=lines.append)
    assert all(": 0 pieces ran" in line for line in lines if "/s0:" in line)


def test_audit_on_a_process_pool(tmp_path, data_dir):
    cfg = load_audit_config(scale="smoke", overrides={"weight_decays": [], "epochs": [],
                                                       "dp": {"target_epsilons": []}, "seeds": [0, 1]})
    run_audit(cfg, out=tmp_path / "p", scale="smoke", runtime=Runtime(data_dir=data_dir),
              execution=Execution(workers=2, threads=1), log=lambda _: None)
    rows = _rows(tmp_path / "p")
    assert [(r["setting"], r["seed"]) for r in rows] == [("baseline", "0"), ("baseline", "1")]


def test_bad_audit_input_is_refused_before_anything_runs(tmp_path, data_dir):
    with pytest.raises(DataReconError, match="unknown audit scale 'huge'; valid scales: smoke, small, gpu"):
        load_audit_config(scale="huge")
    cfg = load_audit_config(scale="smoke", overrides={"dp": {"delta": 0.5}})
    with pytest.raises(DataReconError, match=r"dp delta 0.5 is >= 1/n"):
        run_audit(cfg, out=tmp_path / "d", runtime=Runtime(data_dir=data_dir), log=lambda _: None)
    assert not (tmp_path / "d").exists()
    with pytest.raises(DataReconError, match="keep 3 exceeds the 2 attack runs"):
        load_audit_config(scale="smoke", overrides={"keep": 3})


def test_audit_of_a_cnn_target_under_dp_sgd(tmp_path, data_dir):
    """CNN targets (issue 14) go through the audit, DP-SGD included (Opacus wraps the convolutions)."""
    cfg = load_audit_config(scale="smoke", overrides={
        "target": {"arch": {"name": "cnn", "hidden": [4, 8], "kernel": 3, "bias": False}},
        "weight_decays": [], "epochs": []})
    run_audit(cfg, out=tmp_path / "c", scale="smoke", runtime=Runtime(data_dir=data_dir), log=lambda _: None)
    rows = {r["setting"]: r for r in _rows(tmp_path / "c")}
    assert set(rows) == {"baseline", "dp-eps10"}
    for key in ("baseline/s0", "dp-eps10/s0"):
        card = read_json(tmp_path / "c" / "models" / key / "model" / "model.json")
        assert card["training"]["arch"]["name"] == "cnn"
    assert float(rows["dp-eps10"]["dp_epsilon"]) == pytest.approx(10.0, abs=0.02)
    assert all(r["count_heldout"] != "" and r["count_noise"] != "" for r in rows.values())
