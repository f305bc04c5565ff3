"""benchmarks/leakage_map.py at its smoke scale (8x8 digits, tiny networks, budgets of a few steps): cells filled on the
local process pool, a rerun keeps finished cells, the table's boundary and extrapolations, the figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "leakage_map.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import leakage_map  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.slow
def test_the_smoke_map_fills_cells_keeps_them_and_draws(tmp_path: Path, data_dir) -> None:
    work = tmp_path / "map"
    res = _run("run", str(work), "--scale", "smoke", "--cells", "cnn-s1-n1-b1500", "cnn-s1-n2-b1500", "--workers", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 of 2 cells filled" in res.stdout
    cell = json.loads((work / "cells" / "cnn-s1-n2-b1500" / "cell.json").read_text())
    assert cell["n"] == 2 and cell["simudy"]["n"] == cell["simudy"]["m"] == 2 and cell["scale"] == "smoke"
    assert len(cell["target"]["train_indices"]) == 2 and cell["outer_steps"] == 4
    assert cell["headline"]["n_train"] == 2 and "threshold" in cell["headline"]
    null = cell["heldout_null_draws"]
    assert null["m"] == 2 and null["interval95"][0] <= null["mean"] <= null["interval95"][1]
    assert "--n-train 2" in cell["commands"]["finetune"] and "--known-labels restored" in cell["commands"]["attack"]
    # a rerun keeps the finished cells: nothing runs again
    stamp = (work / "cells" / "cnn-s1-n2-b1500" / "cell.json").stat().st_mtime_ns
    again = _run("run", str(work), "--scale", "smoke", "--cells", "cnn-s1-n*-b1500", "--workers", "1",
                 "--max-hours", "0")  # the three cells not run are extrapolated to > 0 h: left out
    assert again.returncode == 0, again.stdout + again.stderr
    assert (work / "cells" / "cnn-s1-n2-b1500" / "cell.json").stat().st_mtime_ns == stamp
    assert "cnn-s1-n4-b1500: left out, extrapolated" in again.stdout and "0 of 0 cells filled" in again.stdout
    # a work folder holds one scale
    wrong = _run("cell", "cnn-s1-n1-b1500", str(work))
    assert wrong.returncode == 2 and wrong.stderr.strip().startswith(f"error: {work} holds the smoke map, not cifar")
    out = tmp_path / "map.json"
    res = _run("table", str(work), "--out", str(out), "--markdown")
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| cnn-s1-")]
    assert [r.split(" | ")[0] for r in rows] == ["| cnn-s1-n1-b1500", "| cnn-s1-n2-b1500"]
    assert " / 2 (" in rows[1]  # the count of 2 beside the nulls' counts
    table = json.loads(out.read_text())
    assert {c["cell"] for c in table["cells"]} == {"cnn-s1-n1-b1500", "cnn-s1-n2-b1500"}
    pending = {p["cell"]: p for p in table["pending"]}
    assert pending["cnn-s1-n4-b1500"]["extrapolation"] and "scaled by n/2" in pending["cnn-s1-n4-b1500"]["basis"]
    assert "attack_s" not in pending["resnet8-s1-n1-b1500"]  # nothing of that architecture measured
    assert table["boundary"]["cnn"]["cells_measured"] == 2
    assert _run("figure", "--results", str(out), "--out", str(tmp_path / "map.png")).returncode == 0
    assert (tmp_path / "map.png").stat().st_size > 10_000


def _record(arch: str, n: int, count: int, ssim: float, budget: str = "b1500", steps: int = 1) -> dict:
    return {"arch": arch, "n": n, "finetune_steps": steps, "budget": budget, "cell": f"{arch}-s{steps}-n{n}-{budget}",
            "headline": {"count": count}, "simudy": {"mean_best_ssim": ssim}}


def test_the_boundary_is_the_largest_n_with_half_recovered_else_the_best_ssim() -> None:
    records = [_record("cnn", 1, 1, 0.5), _record("cnn", 4, 2, 0.4), _record("cnn", 8, 3, 0.3),
               _record("cnn", 2, 1, 0.45, steps=20), _record("resnet8", 1, 0, 0.2), _record("resnet8", 20, 0, 0.13),
               dict(_record("cnn", 8, 4, 0.35), setting="simudy"), dict(_record("cnn", 20, 1, 0.1), setting="pca")]
    b = leakage_map.boundary(records)
    assert b["cnn"]["largest_n_half_recovered"] == 8  # 3 of 8 is less than half; 4 of 8 (simudy) is half
    assert b["cnn"]["per_setting"] == {"s1-b1500": 4, "s20-b1500": 2, "s1-b1500-simudy": 8, "s1-b1500-pca": None}
    assert b["resnet8"]["largest_n_half_recovered"] is None
    assert (b["resnet8"]["best_mean_best_ssim"], b["resnet8"]["best_cell"]) == (0.2, "resnet8-s1-n1-b1500")
    assert "resnet8w" not in b


def names_of_budget(cells: list, name: str) -> list[str]:
    return [c.name for c in cells if c.budget == name]


def test_the_cells_and_their_order() -> None:
    cells = leakage_map.all_cells()
    assert len(cells) == len({c.name for c in cells}) == 3 * 2 * 5 * 2 + 3 * 2 * 2 * 5 + 2 * 2 * 3 + 1  # + settings
    assert names_of_budget(cells, "b30k") == [f"{a}-s{s}-n{n}-b30k-simudy" for s in (1, 20) for a in ("cnn", "resnet8")
                                              for n in (1, 2, 4)] + ["resnet8-s20-n20-b30k-simudy"]
    names = [c.name for c in cells]
    assert names[:5] == [f"cnn-s1-n{n}-b1500" for n in (1, 2, 4, 8, 20)]
    assert names.index("resnet8-s20-n20-b1500") < names.index("resnet8w-s1-n1-b1500") < names.index("cnn-s1-n1-b10k")
    assert names.index("resnet8w-s20-n4-b10k") < names.index("cnn-s1-n8-b10k")
    assert names.index("resnet8w-s20-n20-b10k") < names.index("cnn-s1-n1-b1500-simudy")
    assert {"resnet8-s1-n1-b1500-simudy", "resnet8-s1-n2-b1500-pca", "cnn-s20-n20-b1500-simudy-pca"} <= set(names)
    res = _run("cell", "resnet8-s3-n4-b1500", "/nonexistent")
    assert res.returncode == 2 and res.stderr.strip().startswith("error: 'resnet8-s3-n4-b1500' names no cell")


def _fake_run(folder: Path, status: str, cosine: float | None, steps: int = 10) -> None:
    folder.mkdir(parents=True)
    (folder / "candidates.safetensors").write_bytes(b"")
    (folder / "run.json").write_text(json.dumps({"status": status, "steps_done": steps,
                                                 "selection": {"cosine": {"value": cosine}}}))


def test_the_kept_restart_is_the_highest_final_cosine_and_a_diverged_one_only_when_all_diverged(tmp_path: Path) -> None:
    attack = tmp_path / "attack"
    _fake_run(attack / "run0", "complete", 0.91)
    _fake_run(attack / "run1", "diverged", None, steps=3)
    _fake_run(attack / "run2", "complete", 0.95)
    kept, runs = leakage_map.kept_restart(attack)
    assert kept == attack / "run2" and runs["run1"] == {"status": "diverged", "steps_done": 3, "final_cosine": None}
    one = tmp_path / "one"
    _fake_run(one, "diverged", None, steps=0)  # a single restart is the folder itself
    kept, runs = leakage_map.kept_restart(one)
    assert kept == one and runs["one"]["status"] == "diverged"
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no restart wrote candidates"):
        leakage_map.kept_restart(tmp_path / "empty")


def test_a_cells_cost_per_step_counts_the_steps_its_restarts_took() -> None:
    base = {"outer_steps": 100, "restarts": 2}
    assert leakage_map._per_step({**base, "attack": {"wall_s": 50.0}}) == 0.25  # a record without its restarts
    took = {"run0": {"steps_done": 100}, "run1": {"steps_done": 25}}
    assert leakage_map._per_step({**base, "attack": {"wall_s": 50.0, "restarts": took}}) == 0.4
    stopped = {"run0": {"steps_done": 0}, "run1": {"steps_done": 0}}  # diverged at once: says nothing of the cost
    assert leakage_map._per_step({**base, "attack": {"wall_s": 3.0, "restarts": stopped}}) is None
    assert leakage_map._per_step({**base, "attack": {"wall_s": 9.0, "resumed": True, "run_wall_time_s": 5.0}}) is None


@pytest.mark.slow
def test_a_setting_cell_runs_its_preset_and_the_public_prior(tmp_path: Path, data_dir, monkeypatch) -> None:
    monkeypatch.setenv("DATARECON_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "map"
    res = _run("cell", "cnn-s1-n1-b1500-simudy-pca", str(work), "--scale", "smoke")
    assert res.returncode == 0, res.stdout + res.stderr
    cell = json.loads((work / "cells" / "cnn-s1-n1-b1500-simudy-pca" / "cell.json").read_text())
    assert cell["setting"] == "simudy-pca" and "--preset simudy --pca-weight 10" in cell["commands"]["attack"]
    run = json.loads((work / "cells" / "cnn-s1-n1-b1500-simudy-pca" / "attack" / "run.json").read_text())
    assert run["preset"] == "simudy" and run["config"]["lr_schedule"] == "cosine" and run["config"]["pca_weight"] == 10
    assert run["public_prior"]["n_public"] == 300 and run["public_prior"]["components"] == 21
    assert sum(run["knowledge"]["labels"]["counts"]) == 1  # restored (the preset's balanced labels overridden)
    b = leakage_map.boundary([cell])
    assert list(b["cnn"]["per_setting"]) == ["s1-b1500-simudy-pca"]
