"""The epochs' margin stop tolerance is named for what it is (``stop.margin_stable_rtol``, ``--margin-stable-rtol``),
apart from the margin ascent's convergence tolerance (``margin_ascent.rtol``), and the rename costs no folder its
hash: model directories written before it record ``margin_rtol``, load, and keep their config hash
(:class:`datarecon.config.RecordedConfig`'s ``renamed_fields``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from datarecon.cli.main import main
from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.training.configs import StopConfig
from datarecon.training.target import TrainConfig

#: the ``training`` record of a model.json written before the rename (datarecon 55421b7), and its config hash as
#: that version computed it (``TrainConfig(...).hash()`` on commit 55421b7)
OLD_RECORD = {"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 5}, "epochs": 10,
              "stop": {"loss_threshold": None, "zero_error": False, "margin_patience": 7, "margin_rtol": 0.001}}
OLD_HASH = "e8836e822e3185b2"


def test_a_record_written_before_the_rename_loads_and_keeps_its_hash() -> None:
    cfg = TrainConfig.model_validate(OLD_RECORD)
    assert cfg.stop.margin_stable_rtol == 0.001 and cfg.stop.margin_patience == 7
    assert cfg.hash() == OLD_HASH
    assert cfg.model_dump(mode="json")["stop"]["margin_rtol"] == 0.001  # recorded as before: hashes keep
    new = TrainConfig.model_validate({**OLD_RECORD, "stop": {"margin_patience": 7, "margin_stable_rtol": 0.001}})
    assert new == cfg and new.hash() == OLD_HASH


def test_both_names_at_once_and_a_misspelling_are_refused() -> None:
    with pytest.raises(ValidationError, match="margin_rtol"):  # the earlier name beside the new one
        StopConfig.model_validate({"margin_stable_rtol": 1e-3, "margin_rtol": 1e-3})
    with pytest.raises(DataReconError, match="allowed keys: .*margin_stable_rtol"):
        build_config(StopConfig, {"margin_tol": 1e-3}, where="stop")


def test_the_flag_says_what_it_is_and_the_old_flag_still_works(tmp_path: Path, capsys) -> None:
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--margin-stable-rtol" in text and "margin_ascent.rtol" in text
    base = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "3", "--hidden", "4", "--no-bias",
            "--epochs", "3", "--margin-patience", "2", "--no-progress", "--quiet"]
    records = []
    for flag, out in (("--margin-stable-rtol", tmp_path / "a"), ("--margin-rtol", tmp_path / "b")):
        assert main([*base, flag, "0.01", "--out", str(out)]) == 0
        records.append(json.loads((out / "model.json").read_text())["training"])
    assert records[0] == records[1] and records[0]["stop"]["margin_rtol"] == 0.01
    assert TrainConfig.model_validate({k: v for k, v in records[0].items() if k != "config_hash"}).hash() == \
        records[0]["config_hash"]


def test_the_margin_stop_tolerance_without_the_margin_stop_is_refused(tmp_path: Path, capsys) -> None:
    """--margin-stable-rtol without --margin-patience would do nothing (the margin stop is off): refused in one
    line naming --margin-patience; a record holding such a pair still loads (it is checked where a training is
    asked for, not when a model directory is read)."""
    base = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "3", "--hidden", "4", "--no-bias",
            "--epochs", "2", "--no-progress", "--quiet", "--out", str(tmp_path / "m")]
    for flag in ("--margin-stable-rtol", "--margin-rtol"):
        assert main([*base, flag, "0.01"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--margin-patience N" in err[0], err
    assert not (tmp_path / "m").exists()
    assert TrainConfig.model_validate({**OLD_RECORD, "stop": {"margin_rtol": 0.01}}).stop.margin_stable_rtol == 0.01
