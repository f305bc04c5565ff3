"""Shipped example files: listed, parsed by their config types, copied out without clobbering."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.cli.main import main
from datarecon.config import load_config_file, read_config_mapping
from datarecon.errors import DataReconError
from datarecon.experiments.examples import copy_example, list_examples, read_example

ROOT = Path(__file__).resolve().parents[2]


def test_examples_are_listed_with_summaries_and_match_the_checkout() -> None:
    names = list_examples()
    assert set(names) == {p.name for p in (ROOT / "examples").glob("*.yaml")}
    assert all(names.values())
    for name in names:
        assert read_example(name) == (ROOT / "examples" / name).read_bytes()


def test_sweep_examples_parse_as_sweep_configs(tmp_path: Path) -> None:
    from datarecon.experiments.sweep import SweepConfig

    for name in list_examples():
        path = copy_example(name, out=tmp_path)
        if name.startswith("sweep-"):
            load_config_file(path, SweepConfig)
        elif name.startswith("experiment-"):
            from datarecon.experiments.experiment import load_experiment

            load_experiment(path)
        else:
            assert isinstance(read_config_mapping(path), dict)


def test_copy_refuses_to_overwrite_and_unknown_names_list_the_valid_ones(tmp_path: Path, capsys) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("keep me")
    for overwrite in (False, True):  # a user's file is never replaced, not even with --overwrite
        with pytest.raises(DataReconError, match="is not a copy of a shipped example datarecon wrote"):
            copy_example("sweep-tiny.yaml", out=target, overwrite=overwrite)
    assert target.read_text() == "keep me"
    target.unlink()
    assert copy_example("experiment-digits.yaml", out=target) == target
    with pytest.raises(DataReconError, match=r"exists \(a copy of a shipped example datarecon wrote\); pass --overwrite"):
        copy_example("sweep-tiny.yaml", out=target)
    assert main(["examples", "nope.yaml", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown example 'nope.yaml'; shipped examples: experiment-digits.yaml, haim2022-medium-cifar.yaml, haim2022-medium-mnist.yaml, haim2022-paper-cifar-stand-in.yaml, runkel2024-paper-dryrun.yaml")
    assert main(["examples", "sweep-tiny.yaml", "--out", str(target), "--overwrite"]) == 0
    assert target.read_bytes() == read_example("sweep-tiny.yaml")


def test_reproduction_override_examples_load_over_their_presets() -> None:
    from datarecon.experiments.reproduce import load_config

    import yaml

    cfg = load_config("haim2022", scale="medium", overrides=yaml.safe_load(read_example("haim2022-medium-cifar.yaml")))
    assert [d.dataset for d in cfg.datasets] == ["cifar10"] and len(cfg.datasets[0].runs) == 2
    assert cfg.target.epochs == 3000 and cfg.target.arch.hidden == (1000, 1000)
    cfg = load_config("haim2022", scale="medium", overrides=yaml.safe_load(read_example("haim2022-medium-mnist.yaml")))
    assert [d.dataset for d in cfg.datasets] == ["mnist"] and len(cfg.datasets[0].runs) == 3
    assert cfg.target.epochs == 3000 and cfg.target.arch.hidden == (1000, 1000)
    cfg = load_config("haim2022", scale="paper",
                      overrides=yaml.safe_load(read_example("haim2022-paper-cifar-stand-in.yaml")))
    assert [d.dataset for d in cfg.datasets] == ["cifar10"] and len(cfg.datasets[0].runs) == 2
    assert cfg.stand_in is not None and cfg.stand_in.rtol == 0.01 and cfg.attack.steps == 30000


def example_commands(name: str) -> list[list[str]]:
    """The ``datarecon ...`` commands an example's header comment tells the user to run (continuation
    lines joined, trailing comments dropped)."""
    import shlex

    lines = [line[1:].strip() for line in read_example(name).decode().splitlines() if line.startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [shlex.split(line.split("#", 1)[0])[1:] for line in text.splitlines() if line.startswith("datarecon ")]


def test_sweep_tiny_runs_as_its_comment_says_and_reconstructs_no_more_than_its_null(tmp_path, monkeypatch, capsys):
    """Issue 25 item 6: the shipped smoke example's commands run as written, and its text is honest: 20
    steps reconstruct nothing beyond the held-out null."""
    from datarecon.utils.io import read_json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    copy_example("sweep-tiny.yaml", out=tmp_path / "examples")
    commands = example_commands("sweep-tiny.yaml")
    assert [c[:2] for c in commands] == [["train", "--dataset"], ["sweep", "--config"], ["store", "list"],
                                        ["sweep", "pool"], ["evaluate", "--sweep"]]
    for argv in commands:
        assert main([*argv, *(["--no-progress"] if argv[0] in ("train", "evaluate") else [])]) == 0, argv
    pools = list((tmp_path / "sweeps" / "tiny" / "pools").glob("*/metrics.json"))
    assert len(pools) == 1
    head = read_json(pools[0])["headline"]
    assert head["count"] <= head["heldout"], head
    assert "0 of 10 reconstructed, held-out null 0" in read_example("sweep-tiny.yaml").decode()
    assert (head["count"], head["heldout"], head["n_train"]) == (0, 0, 10)
