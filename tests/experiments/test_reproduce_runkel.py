"""End-to-end smoke run of ``datarecon reproduce runkel2024`` on the real CIFAR-10 data.

The reproduction runs once per test session (a session-scoped fixture; `make test-slow` gives the
module's tests one worker, --dist loadfile) into a temporary folder; the tests
check its artefacts with comparisons between settings, never hard-coded numbers.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import pytest

from datarecon.errors import DataReconError
from datarecon.experiments.reproduce import Runtime, available_scales, load_config, reproduce
from datarecon.kernel.files import DONE_MARKER as MARKER
from datarecon.utils.io import read_json

# long end-to-end/science tests: `make test-slow` (CI) runs them, `make test` does not
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="session")
def runkel(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("runkel2024")
    lines: list[str] = []
    t0 = time.perf_counter()
    reproduce("runkel2024", scale="smoke", out=out, runtime=Runtime(data_dir=data_dir), log=lines.append)
    return out, lines, time.perf_counter() - t0


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _metrics(out: Path, key: str) -> dict:
    return read_json(out / "eval" / key / "metrics.json")


def test_table1_every_cell_present_and_finite(runkel):
    out, _, _ = runkel
    rows = _csv(out / "tables" / "table1.csv")
    assert [r["x_init"] for r in rows] == ["random", "ground-truth", "partition"]
    for r in rows:
        for model in ("affine", "one-hidden"):
            cols = [f"{model}_{c}" for c in ("ours", "ours_per_param", "x0_per_param", "paper")]
            for col in cols:
                assert math.isfinite(float(r[col])), (r["x_init"], col)
    # the affine energy is strictly convex: the bilevel solve must end below the no-attack reference
    for r in rows:
        if r["x_init"] != "ground-truth":
            assert float(r["affine_ours_per_param"]) < float(r["affine_x0_per_param"]), r


def test_every_figure_and_table_written(runkel):
    out, _, _ = runkel
    expected = {
        "fig01": ["fig01a_affine.png", "fig01b_one-hidden.png"],
        "fig02": ["fig02a_affine.png", "fig02b_one-hidden.png"],
        "fig03": ["fig03a_affine_vs_train.png", "fig03b_affine_vs_partition.png"],
        "fig04": ["fig04a_one-hidden_vs_train.png", "fig04b_one-hidden_vs_partition.png"],
        "fig05": ["fig05.png"],
        "fig06-07": ["fig06.png", "fig07.png", "rank.csv"],
        "fig08": ["fig08.png"],
        "fig09": ["fig09a_vs_train.png", "fig09b_vs_partition.png"],
        "fig10-12": ["fig10a_bilevel.png", "fig10b_decoreco.png", "fig11-12a_bilevel.png", "fig11-12b_decoreco.png"],
    }
    for folder, files in expected.items():
        for f in files:
            p = out / "figures" / folder / f
            assert p.is_file() and p.stat().st_size > 0, p
            if f.endswith(".png"):
                assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for f in ("table1.csv", "nearest.csv", "privacy.csv", "landscape.csv"):
        assert (out / "tables" / f).is_file()
    land = _csv(out / "tables" / "landscape.csv")
    assert len(land) == 2 * 25  # 5x5 grid for bilevel and DecoReco
    assert all(math.isfinite(float(r["mean_l2_train"])) for r in land)


def test_report_embeds_every_figure(runkel):
    out, _, _ = runkel
    html = (out / "report.html").read_text(encoding="utf-8")
    n_png = len(list((out / "figures").rglob("*.png")))
    assert html.count("data:image/png;base64,") >= n_png
    assert "Table 1" in html and "0.001121" in html  # the paper's affine/random value is shown beside ours


def test_ground_truth_init_beats_random_init_on_affine(runkel):
    out, _, _ = runkel
    gt = _metrics(out, "bilevel/affine/ground-truth")["mean_l2_to_nearest"]["train"]
    rnd = _metrics(out, "bilevel/affine/random")["mean_l2_to_nearest"]["train"]
    assert gt < rnd


@pytest.mark.parametrize("setting", ["bilevel/affine/partition", "bilevel/one-hidden/partition",
                                     "decoreco/partition"])
def test_partition_init_stays_closer_to_partition_than_to_training_set(runkel, setting):
    out, _, _ = runkel
    d = _metrics(out, setting)["mean_l2_to_nearest"]
    assert d["partition"] < d["train"]


def test_headline_per_setting_applies_the_rule_of_its_start(runkel):
    """Issue 25 item 1: partition starts count only matches that moved from their start (the partition
    candidates stay at it: SSIM to start far above SSIM to the training match, so nothing counts),
    ground-truth starts report retention instead of a count, every count sits beside its null at
    max(0.4, t)."""
    out, _, _ = runkel
    rows = {r["setting"]: r for r in _csv(out / "tables" / "headline.csv")}
    assert len(rows) == 9
    for r in rows.values():
        assert float(r["threshold"]) == max(0.4, float(r["null_threshold"])) and r["count_heldout"] != ""
    for model in ("affine", "one-hidden"):
        part, gt = rows[f"bilevel/{model}/partition"], rows[f"bilevel/{model}/ground-truth"]
        assert part["rule"] == "init-shift" and int(part["count"]) == 0
        assert float(part["mean_ssim_to_start"]) > float(part["mean_ssim_to_train_match"]) + 0.5
        assert gt["rule"] == "retention" and gt["count"] == "" and int(gt["retained"]) == int(gt["n_train"])
        assert rows[f"bilevel/{model}/random"]["rule"] == "standard"
    for key in ("bilevel/affine/partition", "decoreco/partition"):  # the starts were recorded and used
        m = _metrics(out, key)
        assert m["headline"]["rule"] == "init-shift" and m["init"]["recorded"] is True
    text = (out / "report.html").read_text(encoding="utf-8")
    assert "Headline: training images reconstructed, per setting" in text


def test_privacy_measurement_per_setting(runkel):
    out, _, _ = runkel
    rows = _csv(out / "tables" / "privacy.csv")
    settings = {r["setting"] for r in rows}
    assert {"bilevel/affine/random", "decoreco/tuned", "decoreco/partition"} <= settings
    for r in rows:
        assert int(r["n_real"]) + int(r["n_fake"]) > 0


def test_progress_output_per_piece(runkel):
    out, lines, _ = runkel
    n = len([line for line in lines if ": done in " in line])
    assert n == sum(1 for _ in out.rglob(MARKER))


def test_rerun_skips_finished_pieces_and_reruns_a_killed_one(runkel, data_dir):
    out, _, _ = runkel
    victim = out / "eval" / "bilevel" / "affine" / "random"
    before = {p: p.stat().st_mtime_ns for p in out.rglob(MARKER)}
    (victim / MARKER).unlink()  # as if killed before the marker was written
    lines: list[str] = []
    reproduce("runkel2024", scale="smoke", out=out, runtime=Runtime(data_dir=data_dir), log=lines.append)
    after = {p: p.stat().st_mtime_ns for p in out.rglob(MARKER)}
    assert set(after) == set(before)
    changed = [p for p in after if after[p] != before[p]]
    assert changed == [victim / MARKER]
    assert sum(": done in " in line for line in lines) == 1
    assert sum("skipped" in line for line in lines) == len(before) - 1


def test_tables_rebuilt_from_markers_are_byte_identical(runkel, data_dir):
    """Tables written in the run (summaries in memory) equal tables rebuilt on resume (from markers)."""
    out, _, _ = runkel
    tables = out / "tables"
    before = {p.name: p.read_bytes() for p in tables.glob("*.csv")}
    header = before["nearest.csv"].decode().splitlines()[0].split(",")
    assert header[:5] == ["setting", "mean_l2_train", "mean_l2_partition", "mean_l2_heldout", "mean_l2_noise"]
    (tables / MARKER).unlink()
    reproduce("runkel2024", scale="smoke", out=out, runtime=Runtime(data_dir=data_dir), log=lambda s: None)
    assert {p.name: p.read_bytes() for p in tables.glob("*.csv")} == before


def test_other_configuration_in_same_folder_is_refused(runkel, data_dir):
    out, _, _ = runkel
    with pytest.raises(DataReconError, match="--overwrite"):
        reproduce("runkel2024", scale="smoke", out=out, runtime=Runtime(data_dir=data_dir), log=lambda s: None,
                  overrides={"seed": 1})


@pytest.mark.parametrize("scale", available_scales("runkel2024"))
def test_every_scale_preset_loads(scale):
    cfg = load_config("runkel2024", scale=scale)
    assert cfg.landscape.grid == (0.0, 0.25, 0.5, 0.75, 1.0)


def test_paper_dry_run_overrides_keep_the_published_sizes():
    """examples/runkel2024-paper-dryrun.yaml cuts loops only: sizes stay those of the paper preset."""
    from datarecon.config import read_config_mapping

    path = Path(__file__).resolve().parents[2] / "examples" / "runkel2024-paper-dryrun.yaml"
    paper = load_config("runkel2024", scale="paper")
    dry = load_config("runkel2024", scale="paper", overrides=read_config_mapping(path))
    assert dry.data == paper.data and dry.one_hidden.arch == paper.one_hidden.arch
    assert dry.decoreco_target.arch == paper.decoreco_target.arch and dry.landscape.grid == paper.landscape.grid
    assert dry.bilevel_one_hidden.steps == 1 and dry.bilevel_one_hidden.inner_max_iter == 2  # the example cuts it


def test_unknown_scale_lists_valid_ones():
    with pytest.raises(DataReconError, match="valid scales: smoke, small"):
        load_config("runkel2024", scale="huge")


def test_scales_follow_the_ladder_and_missing_rungs_are_refused(tmp_path, monkeypatch):
    """A rung without a preset file is refused (never silently the paper's defaults)."""
    from datarecon.experiments import reproduce as rp

    monkeypatch.setattr(rp, "PRESETS_DIR", tmp_path)
    (tmp_path / "runkel2024-smoke.yaml").write_text("{}\n")
    assert rp.available_scales("runkel2024") == ("smoke", "paper")
    with pytest.raises(DataReconError, match="valid scales: smoke, paper"):
        load_config("runkel2024", scale="medium")


def test_dry_run_lists_pieces_and_marks_finished_ones(runkel, tmp_path):
    """plan_reproduction runs nothing; pieces finished in OUT show as done, an empty OUT as todo."""
    from datarecon.experiments.reproduce import plan_reproduction
    from datarecon.experiments.pipeline.pieces import format_plan

    out, _, _ = runkel
    done = plan_reproduction("runkel2024", out=out, scale="smoke")
    assert done and all(p.done for p in done)
    fresh = plan_reproduction("runkel2024", out=tmp_path / "empty", scale="smoke")
    assert [p.key for p in fresh] == [p.key for p in done] and not any(p.done for p in fresh)
    assert not (tmp_path / "empty").exists()
    lines = format_plan(fresh, device="cpu")
    assert any(line.startswith(f"to run: {len(fresh)} of {len(fresh)} pieces") for line in lines)


def test_reproduction_times_script_reads_the_markers(runkel, capsys):
    """benchmarks/reproduction_times.py: every piece counted, per-step times for every attack."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduction_times.py"
    spec = importlib.util.spec_from_file_location("reproduction_times", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out, _, _ = runkel
    res = mod.collect(out)
    n_markers = len(list(out.rglob("DONE.json")))
    assert res["pieces"] == n_markers and res["total_wall_s"] > 0
    attacks = [r for r in res["rows"] if r["kind"] == "attack"]
    assert attacks and all(r["ms_per_step"] > 0 and r["steps"] > 0 for r in attacks)
    assert mod.main([str(out / "no-such-folder")]) == 1
    assert "no DONE.json" in capsys.readouterr().err
    # --estimates: every training and attack piece gets its --dry-run estimate beside the measurement
    est = mod.with_estimates(mod.collect(out), out)
    timed = [r for r in est["rows"] if r["kind"] in ("train", "attack")]
    assert timed and all(r["estimate_s"] and r["estimate_s"] > 0 for r in timed)
    assert set(est["measured_over_estimate"]) == {"train", "attack"}
    assert mod.main([str(out), "--estimates"]) == 0 and "measured ÷ estimated" in capsys.readouterr().out


@pytest.mark.parametrize("grouping", ["separate", "auto", "batched", "looped"])
def test_landscape_grouping_keeps_the_evaluation_pieces(grouping):
    """DecoReco landscape runs: one piece per run (separate) or one batch piece; the evaluation
    pieces (and so the figures and tables) are the same either way."""
    from datarecon.experiments.reproduce.runkel2024 import plan

    cfg = load_config("runkel2024", scale="smoke")
    cfg = cfg.model_copy(update={"landscape": cfg.landscape.model_copy(update={"decoreco_grouping": grouping})})
    pieces = plan(cfg)
    keys = [p.key for p in pieces]
    runs = [k for k in keys if k.startswith("runs/landscape/decoreco")]
    assert runs == (["runs/landscape/decoreco"] if grouping != "separate"
                    else [f"runs/landscape/decoreco/l1-{a:g}_l2-{b:g}" for a in cfg.landscape.grid
                          for b in cfg.landscape.grid])
    evals = [p for p in pieces if p.key.startswith("eval/landscape/decoreco/")]
    assert len(evals) == len(cfg.landscape.grid) ** 2 and all(set(p.deps) <= set(keys) for p in evals)


def test_overwrite_deletes_only_what_the_reproduction_wrote(runkel):
    """--overwrite of a reproduction folder removes the entries its manifest lists; a file the user put
    there is refused with a one-line error and nothing is deleted."""
    import shutil

    from datarecon.experiments.pipeline.pieces import check_manifest
    from datarecon.kernel.files import REPRODUCTION_JSON as MANIFEST

    src, _, _ = runkel
    out = shutil.copytree(src, src.parent / "overwrite-copy")

    def entries() -> list[str]:  # what is in the folder, without datarecon's own record of it
        return sorted(p.name for p in out.iterdir() if p.name != ".datarecon-manifest")

    written = entries()
    assert sorted(read_json(out / MANIFEST)["entries"]) == written  # the manifest lists every entry
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DataReconError, match=r"refusing to --overwrite .*it holds 'notes.txt'"):
        check_manifest(out, name="runkel2024", config_hash_="another", overwrite=True)
    assert entries() == sorted([*written, "notes.txt"])
    (out / "notes.txt").unlink()
    nested = next(p for p in sorted(out.rglob("*")) if p.is_dir() and p.parent != out)
    (nested / "mine.txt").write_text("mine")  # a user's file inside one of datarecon's sub-folders (issue 25)
    with pytest.raises(DataReconError, match=r"refusing to --overwrite .*it holds '.*mine.txt', which datarecon"):
        check_manifest(out, name="runkel2024", config_hash_="another", overwrite=True)
    assert (nested / "mine.txt").read_text() == "mine" and entries() == written
    (nested / "mine.txt").unlink()
    check_manifest(out, name="runkel2024", config_hash_="another", overwrite=True)
    assert entries() == []


def test_real_vs_fake_labels_by_start_and_by_nearest_image(runkel):
    """Runkel's question in real_vs_fake.csv: per model, ground-truth starts (real) against partition
    starts (fake) and the same candidates under the nearest-image rule; each AUC equals a direct
    Mann-Whitney count on the candidates' own scores."""
    out, _, _ = runkel
    rows = _csv(out / "tables" / "real_vs_fake.csv")
    for model in ("affine", "one-hidden"):
        gt = _csv(out / "eval" / "bilevel" / model / "ground-truth" / "candidates.csv")
        part = _csv(out / "eval" / "bilevel" / model / "partition" / "candidates.csv")
        mine = {(r["labels"], r["score"]): r for r in rows if r["model"] == model}
        assert {"start", "nearest image"} == {lab for lab, _ in mine}
        scores = sorted(k[6:] for k in gt[0] if k.startswith("score_"))
        assert "subspace" in scores and all(("start", s) in mine for s in scores)
        for s in scores:
            r = mine[("start", s)]
            assert (int(r["n_real"]), int(r["n_fake"])) == (len(gt), len(part))
            real = [float(c[f"score_{s}"]) for c in gt]
            fake = [float(c[f"score_{s}"]) for c in part]
            wins = sum((a > b) + 0.5 * (a == b) for a in real for b in fake) / (len(real) * len(fake))
            assert float(r["auc"]) == pytest.approx(wins, abs=1e-9)
            assert float(r["auc_ci_low"]) <= float(r["auc"]) <= float(r["auc_ci_high"])
