"""Model directories: bit-exact round trip and refusal of tampered / unsafe / mismatched files."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch

from datarecon.errors import CheckpointError
from datarecon.models.checkpoint import (EXTRAS, META, WEIGHTS, ModelDescription, TrainingRecord, load_model_dir,
                                         read_model_meta, save_model_dir)
from datarecon.models.spec import ArchSpec, build_model


def _save(out: Path, *, dtype: torch.dtype = torch.float32, hidden=(6,)) -> tuple[torch.nn.Module, ArchSpec]:
    spec = ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=hidden, bias=False)
    model = build_model(spec, generator=torch.Generator().manual_seed(0), dtype=dtype)
    description = ModelDescription(arch=spec, loss="logistic", weight_decay=1e-3,
                                   data={"dataset": "digits", "task": "odd-even", "n_per_class": 2},
                                   normalisation="unit-minus-mean", training={"lr": 0.1}, seed=0)
    record = TrainingRecord(input_mean=torch.rand(1, 3, 3),
                            indices={"train": torch.tensor([0, 3, 5, 9]), "partition": torch.tensor([1]),
                                     "heldout": torch.tensor([2])},
                            metrics={"train_accuracy": 1.0},
                            extra_tensors={"train_margins": torch.tensor([1.0, 2.0, 3.0, 4.0])})
    save_model_dir(out, model=model, description=description, record=record)
    return model, spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: torch.dtype) -> None:
    model, spec = _save(tmp_path / "m", dtype=dtype)
    b = load_model_dir(tmp_path / "m")
    assert b.arch == spec and b.loss == "logistic" and b.weight_decay == 1e-3
    for k, v in model.state_dict().items():
        assert b.params[k].dtype == dtype
        assert torch.equal(b.params[k], v)
    assert torch.equal(b.indices["train"], torch.tensor([0, 3, 5, 9]))
    assert set(b.indices) == {"train", "partition", "heldout"}
    assert torch.equal(b.extras["train_margins"], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    x = torch.randn(2, 1, 3, 3, dtype=dtype)
    assert torch.equal(b.model(x), model(x))
    assert b.meta["num_parameters"] == 9 * 6 + 6
    assert read_model_meta(tmp_path / "m")["metrics"] == {"train_accuracy": 1.0}


def test_tampered_weights_are_refused(tmp_path: Path) -> None:
    _save(tmp_path / "m")
    other = tmp_path / "other"
    model = build_model(ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=(6,), bias=False),
                        generator=torch.Generator().manual_seed(9))
    from datarecon.utils.io import save_tensors

    save_tensors(other / WEIGHTS, model.state_dict())
    (tmp_path / "m" / WEIGHTS).write_bytes((other / WEIGHTS).read_bytes())
    with pytest.raises(CheckpointError, match="does not match the hash"):
        load_model_dir(tmp_path / "m")


def test_pickle_posing_as_weights_is_refused(tmp_path: Path) -> None:
    model, _ = _save(tmp_path / "m")
    weights = tmp_path / "m" / WEIGHTS
    torch.save(model.state_dict(), weights)  # zip archive
    def rehash() -> None:  # a careful tamperer records the new hash: the loader must still not unpickle
        meta = json.loads((tmp_path / "m" / META).read_text())
        meta["sha256"][WEIGHTS] = hashlib.sha256(weights.read_bytes()).hexdigest()
        (tmp_path / "m" / META).write_text(json.dumps(meta))

    rehash()
    with pytest.raises(CheckpointError, match="pickle/torch.save file"):
        load_model_dir(tmp_path / "m")
    weights.write_bytes(pickle.dumps({"x": 1}, protocol=4))
    rehash()
    with pytest.raises(CheckpointError, match="pickle/torch.save file"):
        load_model_dir(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / META).read_text())
    meta.pop("sha256")  # and a record without the hashes is refused before any file is read
    (tmp_path / "m" / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="records no hash of weights.safetensors and extras.safetensors"):
        load_model_dir(tmp_path / "m")


def test_mismatched_shapes_are_refused(tmp_path: Path) -> None:
    _save(tmp_path / "m", hidden=(6,))
    meta = json.loads((tmp_path / "m" / META).read_text())
    meta["arch"]["hidden"] = [7]
    (tmp_path / "m" / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not fit architecture mlp"):
        load_model_dir(tmp_path / "m")


def test_missing_directory_and_wrong_format(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found; train one"):
        load_model_dir(tmp_path / "nope")
    _save(tmp_path / "m")
    (tmp_path / "m" / EXTRAS).unlink()
    with pytest.raises(CheckpointError, match="missing; the model directory is incomplete"):
        load_model_dir(tmp_path / "m")
    (tmp_path / "m" / META).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not a datarecon model file"):
        load_model_dir(tmp_path / "m")


def test_safetensors_whose_header_starts_with_pickle_byte_loads(tmp_path: Path) -> None:
    """A safetensors header length ≡ 0x80 (mod 256) starts with the pickle PROTO byte; it must still load."""
    from safetensors.torch import save as st_save

    from datarecon.utils.io import load_tensors, save_tensors

    for i in range(300):  # find a tensor dict whose encoding starts with 0x80
        tensors = {"k" * i: torch.zeros(2)}
        if st_save(tensors)[:1] == b"\x80":
            break
    else:  # pragma: no cover
        pytest.fail("no colliding header found in 300 tries")
    save_tensors(tmp_path / "t.safetensors", tensors)
    assert (tmp_path / "t.safetensors").read_bytes()[:1] == b"\x80"
    assert torch.equal(load_tensors(tmp_path / "t.safetensors")["k" * i], torch.zeros(2))


def _ascent_record(curve: list[dict]) -> dict:
    return {"margin_ascent_steps": 40, "margin_ascent_status": "complete", "margin_ascent_curve": curve}


def test_the_writer_writes_only_what_the_reader_reads(tmp_path: Path) -> None:
    """save_model_dir checks model.json against the read-model before it writes it (issue 50): metrics the reader
    would refuse (a curve point without its margin) are not written, and the folder gets no model.json."""
    spec = ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=(6,), bias=False)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    description = ModelDescription(arch=spec, loss="logistic", weight_decay=0.0, data={}, normalisation="unit",
                                   training={"margin_ascent": {"steps": 40, "window": 20}}, seed=0)
    bad = TrainingRecord(input_mean=torch.zeros(1, 3, 3), indices={},
                         metrics=_ascent_record([{"step": 0, "normalised_margin": 0.1}, {"step": 20}]))
    with pytest.raises(CheckpointError, match=r"metrics.margin_ascent_curve.1.normalised_margin: Field required"):
        save_model_dir(tmp_path / "m", model=model, description=description, record=bad)
    assert not (tmp_path / "m" / META).exists()


def test_an_undefined_probe_value_reads_and_is_shown_as_undefined(tmp_path: Path) -> None:
    """The curve records a value its probe could not define as the text "nan" (training/target.py): read back, the
    card says "undefined" where it printed "gap +nan" for any text before (issue 50); other text is refused."""
    from datarecon.training.target import ascent_curve_lines

    curve = [{"step": 0, "normalised_margin": 0.1, "kkt_truth": 0.9, "kkt_best_fake": "nan", "kkt_gap": "nan"},
             {"step": 20, "normalised_margin": 0.2, "kkt_truth": 0.5, "kkt_best_fake": 0.7, "kkt_gap": 0.2}]
    lines = ascent_curve_lines(_ascent_record(curve))
    assert lines[1].split() == ["0:", "0.1,", "0.9", "/", "undefined,", "gap", "undefined"]
    assert lines[2].endswith("0.5 / 0.7, gap +0.200")
    from datarecon.models.checkpoint import validate_meta

    meta = json.loads(json.dumps({"format": "datarecon-model/1", "arch": ArchSpec(
        name="mlp", input_shape=(1, 3, 3), hidden=(6,), bias=False).model_dump(mode="json"), "loss": "logistic",
        "weight_decay": 0.0, "metrics": _ascent_record(curve)}))
    validate_meta(meta)
    meta["metrics"]["margin_ascent_curve"][0]["kkt_gap"] = "wide"
    with pytest.raises(CheckpointError, match=r"margin_ascent_curve.0.kkt_gap: Input should be a valid number"):
        validate_meta(meta)
