"""evaluation_against (pure core) and run_metrics (run directory) end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from datarecon.errors import CheckpointError, DataReconError
from datarecon.evaluation import RunEvaluationSettings, RunRecord, evaluation_against, run_metrics, noise_images
from datarecon.utils.io import atomic_write_json, load_tensors, save_tensors


def _case(smooth):
    train = smooth(16, 3, 16, 16, seed=1)
    held = smooth(16, 3, 16, 16, seed=2)
    part = smooth(16, 3, 16, 16, seed=3)
    noise = noise_images(4, (3, 16, 16), generator=torch.Generator().manual_seed(4))
    cands = torch.cat([train[[3, 9, 12]], noise])  # 3 copies of training images, 4 noise
    return train, held, part, cands


def test_evaluation_against_copies_real_noise_fake(smooth):
    train, held, part, cands = _case(smooth)
    before = cands.clone()
    scores = {"oracle": torch.tensor([1.0, 1, 1, 0, 0, 0, 0]), "rand": torch.arange(7.0)}
    ev = evaluation_against(cands, references={"train": train, "heldout": held, "partition": part,
                                                "noise": noise_images(16, (3, 16, 16))},
                             record=RunRecord(labels=torch.ones(7), scores=scores, multipliers=torch.linspace(0, 1, 7),
                                              margins=torch.rand(16)),
                             config={"top_k": 16, "min_class_size": 1})
    assert torch.equal(cands, before)
    assert ev.real.tolist() == [True] * 3 + [False] * 4
    s = ev.summary
    assert s["privacy"]["scores"]["oracle"]["auc"] == 1.0
    assert s["privacy"]["scores"]["rand"]["auc"] == 0.0
    assert s["privacy"]["n_real"] == 3 and s["privacy"]["floor"] is not None
    assert s["haim"]["counts"]["0.9"] == 3
    assert s["haim"]["counts_by_assignment"]["independent"]["0.9"] >= 3
    assert len(s["haim"]["per_train"]["margin"]) == 16
    base = s["baselines"]["haim_ssim"]
    assert base["real"]["counts"]["0.9"] == 3 and base["noise"]["counts"]["0.4"] == 0
    assert len(base["curves"]["heldout"]) == 16
    assert set(s["mean_l2_to_nearest"]) == {"train", "heldout", "partition", "noise"}
    rows = ev.rows
    assert [r["train_ssim_index"] for r in rows[:3]] == [3, 9, 12]
    assert all(abs(r["train_ssim"] - 1) < 1e-5 for r in rows[:3])
    assert sorted(r["train_rank"] for r in rows[:3]) == [1, 2, 3]
    assert rows[0]["real"] == 1 and rows[5]["real"] == 0 and "score_oracle" in rows[0]
    json.dumps(s)  # JSON-ready


def test_evaluation_against_without_heldout(smooth):
    train, _, _, cands = _case(smooth)
    ev = evaluation_against(cands, references={"train": train}, config={"baselines": False, "top_k": 4})
    assert ev.real is None and "note" in ev.summary["privacy"]
    with pytest.raises(DataReconError, match="2 values for 7"):
        evaluation_against(cands, record=RunRecord(scores={"x": torch.ones(2)}), references={"train": train})
    with pytest.raises(DataReconError, match="reference set 'train' has images"):
        evaluation_against(cands, references={"train": train[:, :1]})


def _make_model_dir(path):
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import ModelDescription, TrainingRecord, save_model_dir
    from datarecon.models.spec import ArchSpec, build_model

    spec = DataSpec(dataset="digits", task="odd-even", n_per_class=10, n_partition_per_class=10,
                    n_heldout_per_class=10)
    task = load_task(spec)
    arch = ArchSpec(name="mlp", input_shape=(1, 8, 8), num_outputs=1, hidden=(8,))
    torch.manual_seed(0)
    model = build_model(arch)
    idx = task.index_tensors()
    save_model_dir(path, model=model, description=ModelDescription(
        arch=arch, loss="logistic", weight_decay=0.0, data=spec.model_dump(mode="json"),
        normalisation=spec.normalisation, training={}, seed=0,
    ), record=TrainingRecord(input_mean=task.normalisation.mean,
                             indices={k[: -len("_indices")]: v for k, v in idx.items()}))
    return task


def test_run_metrics_writes_metrics_and_csv(tmp_path):
    pytest.importorskip("datarecon.models.checkpoint")
    task = _make_model_dir(tmp_path / "model")
    norm = task.normalisation
    noise = noise_images(4, (1, 8, 8), generator=torch.Generator().manual_seed(1))
    x = norm.to_model(torch.cat([task.train.x[[0, 5, 11]], noise]))
    run = tmp_path / "run"
    run.mkdir()
    save_tensors(run / "candidates.safetensors",
                 {"x": x, "labels": torch.tensor([1.0, -1, 1, -1, 1, -1, 1]), "multipliers": torch.ones(7),
                  "score_lambda": torch.tensor([3.0, 3, 3, 0, 1, 2, 0])})
    atomic_write_json(run / "run.json", {"model_dir": str(tmp_path / "model"), "method": "kkt",
                                         "status": "complete", "extra": {"param_distance": 1.5e-3}})
    summary = run_metrics(run, progress=False)
    m = json.loads((run / "metrics.json").read_text())
    assert m["param_distance"] == 1.5e-3 and summary["param_distance"] == 1.5e-3
    assert m["window_size"] == 7  # 8x8 digits: the Gaussian window falls back to 7x7
    assert m["privacy"]["n_real"] == 3
    # 3 real and 4 fake candidates: a perfect separation by luck is not reported as a measurement
    lam = m["privacy"]["scores"]["lambda"]
    assert lam["measurable"] is False and lam["auc"] is None and lam["auc_ci_95"] is None
    assert "not measurable" in lam["note"]
    assert m["privacy"]["roc"] == {} and m["privacy"]["min_class_size"] == 10
    assert set(m["reference_sizes"]) == {"train", "partition", "noise", "heldout"}
    assert len(m["haim"]["per_train"]["margin"]) == 20
    rows = list(csv.DictReader((run / "candidates.csv").open()))
    assert len(rows) == 7 and rows[0]["train_ssim_index"] == "0" and rows[2]["train_ssim_index"] == "11"
    assert [r["real"] for r in rows] == ["1", "1", "1", "0", "0", "0", "0"]
    nb = load_tensors(run / "neighbours.safetensors")
    assert nb["candidates"].shape[0] == 7 and nb["train"].shape == (7, 1, 8, 8)
    assert math.isclose(float(nb["train_score"][0]), 1.0, abs_tol=1e-5)


def test_run_metrics_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        run_metrics(tmp_path / "nope")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(CheckpointError, match="run.json is missing"):
        run_metrics(run)
    atomic_write_json(run / "run.json", {"model_dir": str(tmp_path / "missing"), "status": "running"})
    save_tensors(run / "candidates.safetensors", {"x": torch.zeros(2, 1, 8, 8)})
    with pytest.raises(DataReconError, match="status 'running'"):
        run_metrics(run)
    with pytest.raises(CheckpointError, match="model directory .* not found"):
        run_metrics(run, {"allow_incomplete": True})
    with pytest.raises(DataReconError, match="valid names: heldout, noise, partition, train"):
        run_metrics(run, RunEvaluationSettings(against=("test",)))


def test_approximate_searches_are_labelled(smooth):
    train, held, _, cands = _case(smooth)
    exact = evaluation_against(cands, references={"train": train, "heldout": held},
                                config={"top_k": 4, "n_floor_noise": 20})
    assert exact.summary["approximate"] == [] and exact.summary["nearest"]["train"]["ssim"]["exact"] is True
    approx = evaluation_against(cands, references={"train": train, "heldout": held},
                                 config={"top_k": 4, "exact_up_to": 0, "n_floor_noise": 20})
    s = approx.summary
    assert s["nearest"]["train"]["ssim"]["exact"] is False and s["nearest"]["train"]["l2"]["exact"] is True
    assert any(a.startswith("nearest.train.ssim: best of a top-4 lncc shortlist") for a in s["approximate"])
    assert any(a.startswith("privacy.floor") for a in s["approximate"])


def test_a_run_that_stopped_early_is_evaluated(tmp_path):
    task = _make_model_dir(tmp_path / "model")
    run = tmp_path / "run"
    run.mkdir()
    save_tensors(run / "candidates.safetensors", {"x": task.normalisation.to_model(task.train.x[:4])})
    atomic_write_json(run / "run.json", {"model_dir": str(tmp_path / "model"), "method": "kkt",
                                         "status": "stopped-early"})
    assert run_metrics(run, progress=False)["run"]["status"] == "stopped-early"
    atomic_write_json(run / "run.json", {"model_dir": str(tmp_path / "model"), "method": "kkt", "status": "diverged"})
    # a diverged run is not told to resume (it would diverge again): its last finite state, or a lower step size
    with pytest.raises(DataReconError, match="diverged .*last finite state.*--allow-incomplete.*lower lr_x") as err:
        run_metrics(run, progress=False)
    assert "resume" not in str(err.value)


def test_null_calibrated_threshold_against_a_naive_count():
    """The threshold lets at most floor(rate N) null values above it, and is the lowest such value."""
    import torch

    from datarecon.evaluation.baselines import null_calibrated

    g = torch.Generator().manual_seed(3)
    for n, rate in ((40, 0.05), (20, 0.05), (7, 0.0), (10, 0.3)):
        real, null, noise = torch.rand(n, generator=g), torch.rand(n, generator=g), torch.rand(n, generator=g) * 0.5
        null[0] = float("nan")
        c = null_calibrated(real, null, others={"noise": noise}, rate=rate)
        k = int(rate * n + 1e-9)
        finite = [v for v in null.tolist() if v == v]
        # naive: try every candidate threshold, keep the smallest one with <= k null values above it
        ok = [t for t in finite if sum(v > t for v in finite) <= k]
        assert c.allowed == k and c.threshold == min(ok)
        assert c.null == sum(v > c.threshold for v in finite) <= k
        assert c.count == sum(v > c.threshold for v in real.tolist())
        assert c.others["noise"] == sum(v > c.threshold for v in noise.tolist())


def test_null_calibrated_refuses_mismatched_inputs():
    import pytest
    import torch

    from datarecon.errors import DataReconError
    from datarecon.evaluation.baselines import null_calibrated

    with pytest.raises(DataReconError, match="differ in length"):
        null_calibrated(torch.zeros(3), torch.zeros(4))
    with pytest.raises(DataReconError, match=r"rate must be in \[0, 1\)"):
        null_calibrated(torch.zeros(3), torch.zeros(3), rate=1.0)


def test_evaluation_of_equals_the_mapping_form_and_names_its_seeds(smooth):
    """evaluation_of(train=, heldout=, noise=N) is evaluation_against with the sets in a mapping and the noise
    set drawn with noise_seed; changing a named seed changes only what it seeds."""
    from datarecon.evaluation import EvaluationConfig, evaluation_of

    train, held, part, cands = _case(smooth)
    scores = {"s": torch.arange(7.0)}
    a = evaluation_of(cands, train=train, heldout=held, partition=part, noise=16, record=RunRecord(scores=scores),
                 config={"top_k": 16, "n_floor_noise": 20, "noise_seed": 3})
    b = evaluation_against(cands, record=RunRecord(scores=scores), config={"top_k": 16, "n_floor_noise": 20},
                            references={"train": train, "partition": part, "heldout": held,
                                        "noise": noise_images(16, (3, 16, 16), generator=torch.Generator().manual_seed(3))})
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
    assert a.rows == b.rows and set(a.grid) == {"order", "candidates", "n_candidates", "train", "train_index", "train_score",
                                                "partition", "partition_index", "partition_score"}
    c = evaluation_of(cands, train=train, heldout=held, partition=part, noise=16, record=RunRecord(scores=scores),
                 config=EvaluationConfig(top_k=16, n_floor_noise=20, noise_seed=3, baseline_seed=7))
    assert c.summary["haim"] == a.summary["haim"] and c.summary["nearest"] == a.summary["nearest"]
    assert c.summary["baselines"]["haim_ssim"]["noise"] != a.summary["baselines"]["haim_ssim"]["noise"]
    floors = [evaluation_of(cands, train=train, heldout=held, config={"top_k": 16, "n_floor_noise": 20, "floor_seed": s,
                                                                 "baselines": False}).summary["privacy"]["floor"]
              for s in (12345, 12345, 1)]
    assert floors[0] == floors[1] != floors[2]
    with pytest.raises(DataReconError, match="evaluation settings"):
        evaluation_of(cands, train=train, config={"top_k": 0})
    with pytest.raises(DataReconError, match="labels has 2 values for 7"):
        evaluation_of(cands, train=train, record=RunRecord(labels=torch.ones(2)))


@pytest.mark.parametrize("k", [1, 3], ids=["binary", "multiclass"])
def test_recorded_margins_are_the_training_margins_in_float64(k: int) -> None:
    """The per-image margins evaluation records are :func:`datarecon.kernel.losses.margins` of the model."""
    from types import SimpleNamespace

    from datarecon.evaluation.run_eval import _margins
    from datarecon.kernel.losses import margins

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, k))
    x = torch.randn(5, 1, 2, 2)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0]) if k == 1 else torch.tensor([0, 2, 1, 1, 0])
    got = _margins(SimpleNamespace(model=model), x, y)
    with torch.no_grad():
        out = model(x)
    expected = [float(y[i]) * float(out[i, 0]) if k == 1 else
                float(out[i, int(y[i])]) - max(float(out[i, j]) for j in range(k) if j != int(y[i])) for i in range(5)]
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(got, margins(out, y).double())
