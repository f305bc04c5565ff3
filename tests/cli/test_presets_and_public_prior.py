"""Settings presets (``reconstruct --preset``: SimuDy's schedule beside the gradient-inversion one) and the public-data
prior (the principal subspace of the pretraining images) on a fine-tuned model, end to end on 8x8 digits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from datarecon.attacks.dynamics import DynamicsConfig
from datarecon.attacks.presets import PRESETS
from datarecon.cli.main import main
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import RunLayers, run_from_layers

RESNET = ["--arch", "resnet8", "--channels", "4,8,8", "--batch-norm", "--no-bias", "--loss", "cross-entropy",
          "--normalisation", "unit", "--no-progress", "--quiet"]
PUBLIC = ["--dataset", "digits", "--task", "all", "--n-per-class", "20", "--skip-per-class", "10",
          "--n-partition-per-class", "0", "--n-heldout-per-class", "5"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """(pretrained on 200 public digits, fine-tuned one step on 2 private ones with the pretrained head)."""
    root = tmp_path_factory.mktemp("presets")
    pre, ft = root / "pre", root / "ft"
    assert main(["train", *PUBLIC, *RESNET, "--lr", "0.05", "--batch-size", "50", "--epochs", "1", "--out",
                 str(pre)]) == 0
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "2", "--n-heldout-per-class", "4",
                 "--n-train", "2", *RESNET, "--pretrained", str(pre), "--lr", "0.01", "--batch-size", "2",
                 "--epochs", "1", "--out", str(ft)]) == 0
    return pre, ft


def _run(**layers):
    return run_from_layers(RunLayers(model="m", **layers))


def test_the_simudy_preset_resolves_to_simudys_settings() -> None:
    run = _run(preset="simudy")
    a = run.attack
    assert (a.method, a.optimizer, a.lr_x, a.adam_beta1, a.adam_beta2) == ("dynamics", "adam", 0.01, 0.8, 0.9)
    assert (a.lr_schedule, a.cosine_t_max, a.objective, a.tv_weight, a.signed) == ("cosine", 100, "cosine", 1e-3, False)
    assert a.box_weight == 0.0  # the reference has no pixel-box term
    assert (run.init.name, run.init.scale) == ("gaussian", 0.5)
    assert run.knowledge.labels == "balanced"


def test_the_gradient_inversion_preset_is_the_leakage_maps_former_flags_one_run_key() -> None:
    explicit = _run(method="dynamics", init="uniform", flags={"attack": {"lr_x": 0.1, "signed": True,
                                                                          "lr_schedule": "step", "tv_weight": 0.8}})
    assert _run(preset="gradient-inversion").model_dump(mode="json") == explicit.model_dump(mode="json")


def test_explicit_fields_win_over_a_preset_and_a_preset_of_another_method_is_refused() -> None:
    run = _run(preset="simudy", flags={"attack": {"lr_x": 0.02}, "knowledge": {"labels": "restored"}},
               sets={"init.scale": 0.25})
    assert run.attack.lr_x == 0.02 and run.attack.adam_beta1 == 0.8
    assert run.knowledge.labels == "restored" and run.init.scale == 0.25
    assert _run(preset="simudy", init="uniform").init.name == "uniform"  # another init: the preset's scale goes
    with pytest.raises(DataReconError, match=r"^preset 'simudy' sets dynamics settings and this run's method is "
                                             r"'kkt'; drop --preset or pass --method dynamics$"):
        _run(preset="simudy", method="kkt")
    with pytest.raises(DataReconError, match=r"^unknown preset 'geiping'; valid names: gradient-inversion, simudy$"):
        _run(preset="geiping")
    assert sorted(PRESETS.names()) == ["gradient-inversion", "simudy"]


def test_the_cosine_schedule_is_torchs_cosine_annealing_stepped_every_outer_step() -> None:
    config = DynamicsConfig(steps=450, lr_x=0.01, lr_schedule="cosine", cosine_t_max=100)
    x = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.01, betas=(0.8, 0.9))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    for i in range(450):  # the reference's order: the step at this lr, then scheduler.step()
        assert config.lr_x_at(i) == pytest.approx(opt.param_groups[0]["lr"], abs=1e-12), i
        opt.step()
        sched.step()
    assert config.lr_x_at(100) == pytest.approx(0.0, abs=1e-15) and config.lr_x_at(200) == pytest.approx(0.01)
    with pytest.raises(DataReconError, match=r"cosine_t_max 50 is the period of the cosine schedule and this run's "
                                             r"lr_schedule is 'step': pass --lr-schedule cosine, or drop cosine_t_max"):
        DynamicsConfig(lr_schedule="step", cosine_t_max=50)
    assert "cosine_t_max" not in DynamicsConfig().model_dump()  # added field: left out at its default


def test_a_short_simudy_run_with_the_public_prior_uses_them(models, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DATARECON_CACHE", str(tmp_path / "cache"))
    pre, ft = models
    out = tmp_path / "run"
    assert main(["reconstruct", "--model", str(ft), "--preset", "simudy", "--known-init", "pretrained",
                 "--known-recipe", "model", "--candidates", "2", "--steps", "3", "--pca-weight", "2",
                 "--pca-components", "10", "--log-every", "1", "--no-progress", "--out", str(out)]) == 0
    meta = json.loads((out / "run.json").read_text())
    attack = meta["config"]
    assert (attack["lr_schedule"], attack["adam_beta1"], attack["pca_weight"], attack["box_weight"]) == \
        ("cosine", 0.8, 2.0, 0.0)
    assert meta["preset"] == "simudy" and meta["method"] == "dynamics" and meta["init"]["params"] == {"scale": 0.5}
    public = meta["public_prior"]
    assert public["components"] == 10 and public["n_public"] == 200 and public["dims"] == 64
    assert 0 < public["explained_variance"] <= 1 and Path(public["cache"]).is_file()
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert all(r["pca"] > 0 for r in rows if "pca" in r) and any("pca" in r for r in rows)
    # the pretrained model itself was trained on the public data from scratch: no public data beyond it is known
    capsys.readouterr()
    assert main(["reconstruct", "--model", str(pre), "--method", "dynamics", "--pca-weight", "1", "--steps", "1",
                 "--known-init", "seed", "--known-recipe", "model", "--no-progress", "--out",
                 str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the public-data prior (pca_weight) reads the public images") and "\n" not in err


def test_the_public_subspace_is_cached_and_the_top_principal_directions(models, tmp_path: Path, monkeypatch) -> None:
    from datarecon.attacks.public import public_subspace
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import EXTRAS, read_model_meta
    from datarecon.utils.io import load_tensors

    monkeypatch.setenv("DATARECON_CACHE", str(tmp_path / "cache"))
    _, ft = models
    meta, mean = read_model_meta(ft), load_tensors(ft / EXTRAS)["input_mean"].double()
    first = public_subspace(meta, input_mean=mean, components=None)
    assert first.k == 21 and first.cache  # min(1024, 64 // 3)
    again = public_subspace(meta, input_mean=mean, components=None)
    assert torch.equal(again.basis, first.basis) and again.summary()["sha256"] == first.summary()["sha256"]
    # independent reference: numpy's SVD of the centred public images in model space
    x = load_task(DataSpec(**meta["pretrained"]["data"])).train.x.double().reshape(200, -1) - mean.reshape(1, -1)
    centred = (x - x.mean(0)).numpy()
    import numpy as np

    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    ref = torch.from_numpy(vt[:21])
    assert torch.allclose(first.basis @ first.basis.T, torch.eye(21, dtype=torch.float64), atol=1e-10)
    assert torch.allclose((first.basis.T @ first.basis), ref.T @ ref, atol=1e-8)  # the same subspace
    assert first.explained == pytest.approx(float((s[:21] ** 2).sum() / (s ** 2).sum()), rel=1e-10)
    assert math.isclose(float(first.mean.sum()), float(x.mean(0).sum()), rel_tol=1e-12)
