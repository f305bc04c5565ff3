"""``audit --model``'s place on the leakage map: a fine-tuned model's coordinates beside the nearest measured cells of
a tiny fabricated results file, and one line where no results file, no fine-tuning or no cell of its family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datarecon.cli.main import main
from datarecon.experiments.leakage_placement import model_coordinates, nearest_cells, placement_lines


def _cell(arch: str, label: str, steps: int, n: int, count: int, ssim: float) -> dict:
    return {"cell": f"{arch}-s{steps}-n{n}-b1500", "arch": arch, "arch_label": label, "finetune_steps": steps, "n": n,
            "headline": {"count": count, "heldout": 0},
            "simudy": {"mean_best_ssim": ssim, "mean_best_ssim_ci95": [ssim - 0.05, ssim + 0.05],
                       "mean_best_ssim_heldout_null": 0.1}}


CELLS = [_cell("cnn", "CNN 32-64", 1, 2, 2, 0.6), _cell("resnet8", "ResNet-8 16-32-64, batch norm", 1, 1, 0, 0.2),
         _cell("resnet8", "ResNet-8 16-32-64, batch norm", 20, 4, 0, 0.15),
         _cell("resnet8w", "ResNet-8 64-128-256, batch norm", 1, 2, 1, 0.3),
         _cell("resnet8", "ResNet-8 16-32-64, batch norm", 1, 20, 0, 0.14)]


def _meta(*, n: int = 2, batch: int = 2, epochs: int = 1, hidden=None, name: str = "resnet8", pretrained=True) -> dict:
    return {"arch": {"name": name, "hidden": hidden, "batch_norm": name == "resnet8", "bias": False},
            "training": {"batch_size": batch, "epochs": epochs}, "metrics": {"n_train": n},
            **({"pretrained": {"path": "/p"}} if pretrained else {})}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"cells": CELLS}))
    return path


def test_the_coordinates_are_n_the_sgd_steps_and_the_widths() -> None:
    c = model_coordinates(_meta(n=20, batch=8, epochs=3, hidden=[64, 128, 256]))
    assert (c["family"], c["widths"], c["n"], c["steps"], c["fine_tuned"]) == ("resnet8", [64, 128, 256], 20, 9, True)
    assert model_coordinates(_meta(hidden=None))["widths"] == [16, 32, 64]  # the architecture's default


def test_the_nearest_cells_are_the_same_family_by_log_distance(results: Path) -> None:
    near = nearest_cells(model_coordinates(_meta(n=1, batch=1)), CELLS)
    # |log2 n| + |log2 steps| + |log2 width|: 0; 1 + 0 + 2 (n 2, width 64); log2 20 ≈ 4.32; 2 + log2 20 + 0 ≈ 6.32
    assert [d for d, _ in near] == [0.0, 3.0, pytest.approx(4.321928, abs=1e-6)]
    assert [c["cell"] for _, c in near] == ["resnet8-s1-n1-b1500", "resnet8w-s1-n2-b1500", "resnet8-s1-n20-b1500"]
    lines = placement_lines(_meta(n=1, batch=1), results)
    assert lines[0].startswith(f"leakage map ({results}, 5 cells measured): this model is resnet8 16-32-64 with batch "
                               "norm, fine-tuned 1 SGD step(s) on n = 1 private images")
    assert lines[1] == ("  resnet8-s1-n1-b1500 (ResNet-8 16-32-64, batch norm, 1 step(s), n = 1): 0 of 1 above the "
                        "threshold (held-out 0), mean best SSIM 0.200 [0.150, 0.250] vs held-out null 0.100; same n, "
                        "steps and width")
    assert len(lines) == 4 and "distance 3.0" in lines[2]


def test_what_cannot_be_placed_says_so_in_one_line(results: Path, tmp_path: Path) -> None:
    for lines, start in [
            (placement_lines(_meta(), tmp_path / "none.json"), f"leakage map: no results file at {tmp_path / 'none.json'}"),
            (placement_lines(_meta(pretrained=False), results), "leakage map: this model was not fine-tuned"),
            (placement_lines(_meta(name="mlp", hidden=[8]), results), "leakage map: no measured cell of a mlp network")]:
        assert len(lines) == 1 and lines[0].startswith(start) and lines[0].endswith("is not placed on the map")
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert placement_lines(_meta(), tmp_path / "bad.json")[0].startswith("leakage map: ")


def test_audit_model_prints_the_placement_first(results: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    import datarecon.cli.audit as audit_cli

    pre, ft = tmp_path / "pre", tmp_path / "ft"
    common = ["--dataset", "digits", "--task", "all", "--arch", "resnet8", "--channels", "4,8,8", "--batch-norm",
              "--no-bias", "--loss", "cross-entropy", "--normalisation", "unit", "--no-progress", "--quiet"]
    assert main(["train", *common, "--n-per-class", "10", "--skip-per-class", "10", "--n-partition-per-class", "0",
                 "--n-heldout-per-class", "5", "--epochs", "1", "--out", str(pre)]) == 0
    assert main(["train", *common, "--n-per-class", "2", "--n-heldout-per-class", "4", "--n-train", "1", "--pretrained", str(pre), "--batch-size",
                 "1", "--epochs", "1", "--out", str(ft)]) == 0
    monkeypatch.setattr(audit_cli, "audit_model", lambda *a, **k: (tmp_path / "report.html", ["answer"]))
    capsys.readouterr()
    assert main(["audit", "--model", str(ft), "--leakage-map", str(results), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("leakage map (") and "resnet8 4-8-8 with batch norm, fine-tuned 1 SGD step(s) on n = 1" \
        in out[0]
    assert out[1].startswith("  resnet8-s1-n1-b1500 ") and out[-2:] == ["answer", f"report: {tmp_path / 'report.html'}"]
    assert main(["audit", "--leakage-map", str(results), "--out", str(tmp_path / "b")]) == 2
