"""Output folders: --overwrite replaces only a datarecon artefact of the same kind, never anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.errors import DataReconError
from datarecon.kernel import files
from datarecon.kernel.outdir import ARTEFACTS, check_out_dir, clear_out_dir, identify, prepare_out_dir


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _run_dir(d: Path) -> Path:
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "state.safetensors").write_bytes(b"x")
    (d / "run.json").write_text("{}")
    (d / "candidates.safetensors").write_bytes(b"x")
    (d / ".run.json.abc123.tmp").write_text("left by a killed writer")
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
