"""Output folders: --overwrite replaces only a datarecon artefact of the same kind, never anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.errors import DataReconError
from datarecon.kernel import files
from datarecon.kernel.outdir import (ARTEFACTS, check_out_dir, check_out_file, check_outside, claim_out_dir, clear_out_dir,
                                     identify, is_temp_file, prepare_out_dir)
from datarecon.utils import manifest
from datarecon.utils.io import atomic_write_text


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _run_dir(d: Path) -> Path:
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "state.safetensors").write_bytes(b"x")
    (d / "run.json").write_text("{}")
    (d / "candidates.safetensors").write_bytes(b"x")
    (d / ".run.json.abc12345.tmp").write_text("left by a killed writer")  # the atomic writer's exact name
    return d


def test_the_table_matches_the_files_each_kind_writes() -> None:
    from datarecon.attacks import runner
    from datarecon.evaluation import run_eval
    from datarecon.experiments import store
    from datarecon.experiments.sweep import worker
    from datarecon.models import checkpoint
    from datarecon.kernel import checkpoint as loop_checkpoint
    from datarecon.training import target

    model, run = ARTEFACTS.get("model"), ARTEFACTS.get("run")
    assert {checkpoint.WEIGHTS, checkpoint.EXTRAS, checkpoint.META, target.HISTORY, target.CHECKPOINT_DIR} \
        <= set(model.names)
    assert target.CHECKPOINT_DIR == loop_checkpoint.FOLDER and target.ASCENT_CHECKPOINT_DIR in model.names
    assert model.checkpoint == loop_checkpoint.Kind.TRAIN and run.checkpoint == loop_checkpoint.Kind.ATTACK
    assert {runner.CANDIDATES, runner.INIT_FILE, runner.RUN_JSON, runner.HISTORY, runner.CHECKPOINT_DIR, run_eval.METRICS_FILE,
            run_eval.CANDIDATES_CSV, run_eval.NEIGHBOURS_FILE, store.TASK_FILE, worker.CLAIM_FILE} <= set(run.names)
    assert runner.CHECKPOINT_DIR == loop_checkpoint.FOLDER
    assert {store.INDEX, store.RUNS, store.POOLS, store.SWEEPS} <= set(ARTEFACTS.get("store").names)
    assert ARTEFACTS.get("reproduction").markers == (files.REPRODUCTION_JSON,)


def test_overwrite_clears_only_a_run_directory(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    with pytest.raises(DataReconError, match="exists; pass --overwrite"):
        check_out_dir(run, kind="run")
    assert check_out_dir(run, kind="run", resume=True) is False
    prepare_out_dir(run, kind="run", overwrite=True)
    assert run.is_dir() and [p.name for p in run.iterdir()] == [".datarecon-manifest"]  # datarecon's record only


@pytest.mark.parametrize("kind", ["model", "run", "demo", "store", "reproduction"])
def test_overwrite_never_deletes_foreign_files(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "u"
    (out / "important").mkdir(parents=True)
    (out / "important" / "thesis.txt").write_text("x")
    before = _files(out)
    with pytest.raises(DataReconError, match=r"refusing to --overwrite .*not a datarecon .*choose another --out"):
        prepare_out_dir(out, kind=kind, overwrite=True)
    assert _files(out) == before


def test_overwrite_refuses_an_artefact_with_extra_files(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    before = _files(run)
    with pytest.raises(DataReconError, match="it holds 'notes.txt'"):
        prepare_out_dir(run, kind="run", overwrite=True)
    assert _files(run) == before


def test_overwrite_of_the_working_directory_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "paper.tex").write_text("x")
    with pytest.raises(DataReconError, match="it holds 'paper.tex'"):
        prepare_out_dir(Path("."), kind="model", overwrite=True)
    assert (tmp_path / "paper.tex").read_text() == "x"


def test_another_kind_is_refused_even_with_resume(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    assert identify(run) == "run"
    with pytest.raises(DataReconError, match="is a datarecon run directory, not a results store"):
        check_out_dir(run, kind="store", resume=True)
    with pytest.raises(DataReconError, match="is a datarecon run directory, not a model directory"):
        check_out_dir(run, kind="model", overwrite=True)


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataReconError, match="is an existing file; choose a directory"):
        check_out_dir(tmp_path / "f", kind="run", overwrite=True)


def test_clear_keeps_the_folder_and_its_foreign_entries(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    (run / "keep.txt").write_text("x")  # clear_out_dir is a second guard: it never touches foreign names
    clear_out_dir(run, kind="run")
    assert [p.name for p in run.iterdir()] == ["keep.txt"]


def _managed_run(d: Path) -> Path:
    """A run folder as datarecon writes it now: a manifest listing what was written."""
    manifest.start(d, kind="run")
    atomic_write_text(d / "run.json", "{}")
    atomic_write_text(d / "checkpoint" / "progress.json", "{}")
    return d


@pytest.mark.parametrize("name, ours", [
    (".run.json.ab12cd34.tmp", True),       # exactly what the atomic writer leaves, of a listed file
    (".run.json.abc123.tmp", False),        # 6 characters: a user's file that only looks like one
    (".notes.txt.ab12cd34.tmp", False),     # the writer's pattern, but of a file datarecon never wrote here
    (".run.json.AB12CD34.tmp", False),      # mkstemp draws lower case letters, digits and _
    ("..datarecon-manifest.ab12cd_4.tmp", True),  # the manifest's own replacement
])
def test_only_the_temporary_names_datarecon_creates_count_as_its_own(tmp_path: Path, name: str, ours: bool) -> None:
    run = _managed_run(tmp_path / "run")
    (run / name).write_text("a user's file, or a killed writer's")
    assert is_temp_file(name, run) is ours
    if ours:
        prepare_out_dir(run, kind="run", overwrite=True)
        assert not (run / name).exists()
    else:
        with pytest.raises(DataReconError, match=f"it holds '{name}'"):
            prepare_out_dir(run, kind="run", overwrite=True)
        assert (run / name).read_text() == "a user's file, or a killed writer's"


def test_a_folder_inside_another_datarecon_folder_is_refused(tmp_path: Path) -> None:
    run = _managed_run(tmp_path / "run")
    for inside in (run / "sub", run / "checkpoint" / "deeper" / "x"):
        with pytest.raises(DataReconError, match=r"lies inside .*run, a datarecon run directory.*outside it"):
            check_out_dir(inside, kind="run")
        with pytest.raises(DataReconError, match="lies inside"):
            with claim_out_dir(inside, kind="model", overwrite=True):
                pass
        assert not inside.exists()
    assert check_out_dir(run / "sub", kind="run", nested=True) is False  # the command's own sub-folder
    check_outside(tmp_path / "elsewhere")
    (tmp_path / "ws" / "model").mkdir(parents=True)  # a model/ and a run/ side by side are not a demo folder
    (tmp_path / "ws" / "model" / "model.json").write_text("{}")
    (tmp_path / "ws" / "run").mkdir()
    (tmp_path / "ws" / "run" / "run.json").write_text("{}")
    check_outside(tmp_path / "ws" / "new")


def _ours(path: Path) -> bool:
    return path.read_text().startswith("ours")


def test_one_output_file_follows_the_same_rule(tmp_path: Path) -> None:
    run = _managed_run(tmp_path / "run")
    rule = {"ours": _ours, "what": "report"}
    with pytest.raises(DataReconError, match="is a folder; pass a file name"):
        check_out_file(run, overwrite=True, **rule)
    with pytest.raises(DataReconError, match="lies inside"):
        check_out_file(run / "run.json", overwrite=True, **rule)
    (tmp_path / "notes.html").write_text("a user's notes")
    for overwrite in (False, True):
        with pytest.raises(DataReconError, match="is not a report datarecon wrote.*not even with --overwrite"):
            check_out_file(tmp_path / "notes.html", overwrite=overwrite, **rule)
    (tmp_path / "r.html").write_text("ours")
    with pytest.raises(DataReconError, match=r"exists \(a report datarecon wrote\); pass --overwrite"):
        check_out_file(tmp_path / "r.html", overwrite=False, **rule)
    assert check_out_file(tmp_path / "r.html", overwrite=True, **rule) == tmp_path / "r.html"
    assert check_out_file(tmp_path / "new.html", overwrite=False, **rule) == tmp_path / "new.html"
    with pytest.raises(DataReconError, match="is not a regular file"):
        check_out_file(Path("/dev/null"), overwrite=True, **rule)


def test_overwrite_refuses_a_listed_entry_the_kind_never_writes(tmp_path: Path) -> None:
    """A model folder whose manifest lists a run another command wrote into it (before such paths were
    refused): --overwrite would delete that run with the model's files; it is refused, naming it."""
    model = tmp_path / "model"
    manifest.start(model, kind="model")
    atomic_write_text(model / "model.json", "{}")
    manifest.start(model / "sub", kind="run")  # what `reconstruct --out model/sub` used to do
    atomic_write_text(model / "sub" / "run.json", "{}")
    before = _files(model)
    with pytest.raises(DataReconError, match="it holds 'sub', which another datarecon command wrote there"):
        prepare_out_dir(model, kind="model", overwrite=True)
    assert _files(model) == before


def test_the_python_api_is_told_its_own_spelling_and_the_command_line_its_own(tmp_path, capsys):
    """The refusal of an existing folder names the options in the caller's spelling: the Python API is told
    ``overwrite=True`` beside ``--overwrite``; the command line only ``--overwrite`` (its user called no Python;
    issue 50: every CLI refusal ended in "(in Python: ...)")."""
    from datarecon.cli.main import main
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    cfg = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=2),
                      arch=ArchConfig(name="mlp", hidden=(4,)), epochs=1)
    train_target(cfg, out=tmp_path / "m", progress=False)
    with pytest.raises(DataReconError, match=r"pass --overwrite .*\(in Python: resume=True, overwrite=True"):
        train_target(cfg, out=tmp_path / "m", progress=False)
    capsys.readouterr()
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "2", "--hidden", "4",
                 "--epochs", "1", "--no-progress", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pass --overwrite to replace it or choose another --out") and "in Python" not in err, err
