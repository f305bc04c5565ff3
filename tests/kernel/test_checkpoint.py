"""The one checkpoint format (datarecon.kernel.checkpoint): round trip, refusals, and the two older formats it
replaces, written here in their own layouts (as commit a68cf3e wrote them: training's ``state.json``
naming ``state-<epoch>.safetensors`` with its SHA-256, attacks' metadata in a ``progress`` header
entry) and resumed bit-identically; and the metadata vocabularies before the one schema
(datarecon.kernel.resume.Progress), training's ``tag`` / ``epoch`` / ``finished`` and the attacks'
``config_hash`` / ``steps_done`` (as d8472df wrote them, in format 2 and in the older formats), resumed
bit-identically too. No checkpoint file is kept in the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoint_problem import (ATTACK_KILL, FIT, FIT_EVERY, FIT_TAG, as_old_vocabulary, fit_problem, old_vocabulary,
                                run_attack_problem)

from datarecon.kernel import checkpoint
from datarecon.errors import CheckpointError
from datarecon.kernel.engine import LoopOptions
from datarecon.training.fit import training_store, fit
from datarecon.utils.io import save_tensors, sha256_file, to_jsonable
from datarecon.kernel.outdir import identify

ATTACK, TRAIN = checkpoint.Kind.ATTACK, checkpoint.Kind.TRAIN


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3, 4, generator=g, dtype=torch.float64), "h": torch.randn(5, generator=g).bfloat16(),
            "flag": torch.tensor(True), "gen": torch.Generator().manual_seed(7).get_state(), "i": torch.arange(4)}


def test_round_trip_keeps_every_tensor_and_the_metadata(tmp_path: Path) -> None:
    t = _tensors()
    checkpoint.save(tmp_path, t, {"step": 3, "loss": float("nan"), "rows": [{"a": 1.5}]}, kind=ATTACK)
    loaded, meta = checkpoint.load(tmp_path, kind=ATTACK)
    assert set(loaded) == set(t) and all(torch.equal(loaded[k], t[k]) and loaded[k].dtype == t[k].dtype for k in t)
    assert meta == {"step": 3, "loss": None, "rows": [{"a": 1.5}]}
    assert json.loads((tmp_path / checkpoint.PROGRESS_FILE).read_text()) == meta
    assert checkpoint.kind_of(tmp_path) == ATTACK and checkpoint.load(tmp_path / "none", kind=ATTACK) is None


def test_a_checkpoint_of_another_kind_is_refused(tmp_path: Path) -> None:
    checkpoint.save(tmp_path / "a", _tensors(), {}, kind=ATTACK)
    checkpoint.save(tmp_path / "t", _tensors(), {}, kind=TRAIN)
    with pytest.raises(CheckpointError, match="kind 'attack', not 'train'"):
        checkpoint.load(tmp_path / "a", kind=TRAIN)
    with pytest.raises(CheckpointError, match="kind 'train', not 'attack'"):
        checkpoint.load(tmp_path / "t", kind=ATTACK)


def test_a_changed_byte_is_refused(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _tensors(), {"step": 1}, kind=TRAIN)
    path = tmp_path / checkpoint.STATE_FILE
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01  # the last byte of the data buffer
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        checkpoint.load(tmp_path, kind=TRAIN)


def test_a_stale_progress_copy_is_rewritten_from_the_tensor_file(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _tensors(), {"step": 2}, kind=ATTACK)
    (tmp_path / checkpoint.PROGRESS_FILE).write_text('{"step": 1}')  # a kill between the two writes
    assert checkpoint.load(tmp_path, kind=ATTACK)[1] == {"step": 2}
    assert json.loads((tmp_path / checkpoint.PROGRESS_FILE).read_text()) == {"step": 2}


def test_a_readable_copy_nested_too_deeply_is_rewritten(tmp_path: Path) -> None:
    """The seventh trial: a ``progress.json`` of 100 000 nested brackets ended a resume in an internal error
    (RecursionError while comparing the copy with the tensor file's metadata); it is a damaged copy, rewritten."""
    checkpoint.save(tmp_path, _tensors(), {"step": 2}, kind=ATTACK)
    (tmp_path / checkpoint.PROGRESS_FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert checkpoint.load(tmp_path, kind=ATTACK)[1] == {"step": 2}
    assert json.loads((tmp_path / checkpoint.PROGRESS_FILE).read_text()) == {"step": 2}


def test_a_checkpoint_folder_that_is_a_file_is_named(tmp_path: Path) -> None:
    """The seventh trial: a file where the checkpoint folder belongs was answered "File exists: ...; check the path
    and the disk" by the resume; it is named as what it is, with the fix."""
    (tmp_path / "checkpoint").write_text("x")
    with pytest.raises(CheckpointError, match=r"checkpoint is not a folder, where the checkpoint folder belongs; "
                                              r"move it away"):
        checkpoint.load(tmp_path / "checkpoint", kind=ATTACK)


# ----- the older formats ------------------------------------------------------------------------------------


def _as_legacy_train(folder: Path) -> None:
    """Rewrite a format-2 training checkpoint as ``datarecon-train-checkpoint/1`` (what older versions wrote)."""
    tensors, meta = checkpoint.load(folder, kind=TRAIN)
    meta = old_vocabulary(meta, TRAIN) if "schema" in meta else meta
    for p in folder.iterdir():
        p.unlink()
    name = f"state-{meta['epoch']:09d}.safetensors"
    save_tensors(folder / name, tensors)
    info = {"format": checkpoint.LEGACY_TRAIN_FORMAT, "tensors": name, "sha256": sha256_file(folder / name), **meta}
    (folder / checkpoint.LEGACY_TRAIN_JSON).write_text(json.dumps(info, indent=2, sort_keys=True))


def _as_legacy_attack(run: Path) -> None:
    """Rewrite a run's format-2 checkpoint with the metadata in the header (what older versions wrote)."""
    folder = run / checkpoint.FOLDER
    tensors, meta = checkpoint.load(folder, kind=ATTACK)
    meta = old_vocabulary(meta, ATTACK) if "schema" in meta else meta
    save_tensors(folder / checkpoint.STATE_FILE, tensors,
                 metadata={"progress": json.dumps(to_jsonable(meta), sort_keys=True)})


def _same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))


@pytest.mark.parametrize("layout", ["format-1", "format-2-old-vocabulary"])
def test_an_old_training_checkpoint_resumes_bit_identically(tmp_path: Path, hard_kill, layout: str) -> None:
    full = fit(*fit_problem(), **FIT)
    hard_kill(lambda hooks: fit(*fit_problem(), checkpoint=training_store(tmp_path / "ck", tag=FIT_TAG),
                                loop=LoopOptions(checkpoint_every=FIT_EVERY, hooks=tuple(hooks)), **FIT), 7)
    (_as_legacy_train if layout == "format-1" else lambda f: as_old_vocabulary(f, TRAIN))(tmp_path / "ck")
    assert checkpoint.kind_of(tmp_path / "ck") == TRAIN
    assert "schema" not in checkpoint.load(tmp_path / "ck", kind=TRAIN)[1]
    resumed = fit(*fit_problem(), checkpoint=training_store(tmp_path / "ck", tag=FIT_TAG),
                  loop=LoopOptions(checkpoint_every=FIT_EVERY, resume=True), **FIT)
    assert resumed.resumed_from == 5 and resumed.epochs_done == 12
    assert _same_weights(resumed, full) and resumed.history == full.history
    # the next save replaced the old files by the one format
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [checkpoint.PROGRESS_FILE, checkpoint.STATE_FILE]


def test_a_changed_old_training_checkpoint_is_refused(tmp_path: Path, hard_kill) -> None:
    hard_kill(lambda hooks: fit(*fit_problem(), checkpoint=training_store(tmp_path / "ck", tag=FIT_TAG),
                                loop=LoopOptions(checkpoint_every=FIT_EVERY, hooks=tuple(hooks)), **FIT), 7)
    _as_legacy_train(tmp_path / "ck")
    (tensors,) = (tmp_path / "ck").glob("state-*.safetensors")
    tensors.write_bytes(tensors.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="does not match state.json"):
        fit(*fit_problem(), checkpoint=training_store(tmp_path / "ck", tag=FIT_TAG),
            loop=LoopOptions(checkpoint_every=FIT_EVERY, resume=True), **FIT)

@pytest.mark.parametrize("layout", ["progress-header", "format-2-old-vocabulary"])
def test_an_old_attack_checkpoint_resumes_bit_identically(tmp_path: Path, kill_after, layout: str) -> None:
    full = run_attack_problem(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run_attack_problem(tmp_path / "part", hooks=[kill_after(ATTACK_KILL)])
    if layout == "progress-header":
        _as_legacy_attack(tmp_path / "part")
    else:
        as_old_vocabulary(tmp_path / "part" / checkpoint.FOLDER, ATTACK)
    resumed = run_attack_problem(tmp_path / "part", resume=True)
    assert resumed.steps_done == full.steps_done
    assert torch.equal(resumed.x, full.x) and torch.equal(resumed.multipliers, full.multipliers)
    assert (tmp_path / "part" / "history.jsonl").read_text() == (tmp_path / "full" / "history.jsonl").read_text()
    assert checkpoint.kind_of(tmp_path / "part" / checkpoint.FOLDER) == ATTACK


def test_a_folder_with_only_a_checkpoint_is_recognised_by_its_kind(tmp_path: Path) -> None:
    """A killed ``train`` or ``reconstruct`` leaves only ``checkpoint/``: the kind tells which folder it is."""
    for d, kind in (("m", TRAIN), ("r", ATTACK), ("old-m", TRAIN), ("old-r", ATTACK)):
        checkpoint.save(tmp_path / d / checkpoint.FOLDER, _tensors(), {"epoch": 3}, kind=kind)
    _as_legacy_train(tmp_path / "old-m" / checkpoint.FOLDER)
    _as_legacy_attack(tmp_path / "old-r")
    assert [identify(tmp_path / d) for d in ("m", "r", "old-m", "old-r")] == ["model", "run", "model", "run"]
