"""``evaluate_membership`` with reference models: every signal on the same members and non-members (the online
signals on LiRA's half-in pool, each of its candidates IN for half of the models), reference models reproducible
by seed, kept and reused, resumed after a kill, a strongest signal that never reads the numbers it headlines and
is never weaker than the loss threshold, and the automatic count within a time budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from datarecon.experiments.membership import references as membership_references
from datarecon.experiments.membership.choice import compare_signals
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.reference_store import REFERENCES_DIR, load_statistics
from datarecon.experiments.membership.settings import MembershipSettings, ReferenceSettings, Runtime
from datarecon.experiments.membership.signals import SignalScores
from datarecon.kernel.outdir import claim_out_dir
from datarecon.utils.lock import LOCK_FILE


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory) -> Path:
    """A small digits MLP that memorises its 20 training images (cross-entropy over 10 classes)."""
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("mia") / "model"
    cfg = TrainConfig(data=DataSpec(dataset="digits", task="all", n_per_class=3, n_heldout_per_class=6),
                      arch=ArchConfig(name="mlp", hidden=(64,), bias=True), loss="cross-entropy", lr=0.5,
                      epochs=200, dtype="float64")
    train_target(cfg, out=out, progress=False)
    return out


SETTINGS = MembershipSettings(nonmembers=300, population=100, references=ReferenceSettings(count=6, seed=3))


def _bytes(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (the lock file, which names the process holding the folder, aside)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def _evaluate(model: Path, out: Path, settings: MembershipSettings = SETTINGS, **kw) -> dict:
    with claim_out_dir(out, kind="membership", resume=True) as claim:
        claim.prepare()
        return evaluate_membership(model, settings=settings, out=out, runtime=Runtime(log=lambda s: None), **kw)


def test_every_signal_is_measured_on_the_same_candidates_and_the_folder_is_complete(digits_model, tmp_path):
    res = _evaluate(digits_model, tmp_path / "m")
    sig = res["signals"]
    measured = {k for k, v in sig.items() if v["applicable"]}
    assert measured == {"loss", "confidence", "gradient-norm", "subspace", "lira-offline", "lira-online", "rmia",
                        "rmia-online"}
    sizes = {k: (v["report"]["n_members"], v["report"]["n_nonmembers"]) for k, v in sig.items() if k in measured}
    # chosen on reference models: every candidate of a signal's scope is reported; the online signals on the half-in
    # pool (the 30 members and 30 non-members of the same classes), the others on all 300 non-members
    assert sizes == {k: (30, 30) if k in ("lira-online", "rmia-online") else (30, 300) for k in measured}
    assert sig["lira-online"]["scope"] == "the half-in pool" and "loss: AUC" in sig["lira-online"]["baseline_line"]
    assert res["split"]["calibration"] == {"members": 0, "nonmembers": 0}
    assert res["strongest"]["chosen"] in measured and "pseudo-targets" in res["strongest"]["rule"]
    assert res["candidates"]["nonmembers"]["count"] == 300 and "did not train the model" in \
        res["candidates"]["nonmembers"]["source"]
    assert res["references"]["count"] == 6 and res["references"]["trained"] == 6
    for f in ("membership.json", "signals.csv", "roc.png", "scores.safetensors", "pool.safetensors", "exposed.csv",
              "exposed.safetensors"):
        assert (tmp_path / "m" / f).is_file(), f
    written = json.loads((tmp_path / "m" / "membership.json").read_text())
    assert written["strongest"] == res["strongest"]
    # the members memorised: the loss threshold alone separates them well here
    assert sig["loss"]["report"]["auc"] > 0.8


def test_reference_models_are_reproducible_reused_and_resumed(digits_model, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _evaluate(digits_model, a)
    _evaluate(digits_model, b)
    sa, sb = load_statistics(a, 6), load_statistics(b, 6)
    assert torch.equal(sa.confidence, sb.confidence) and torch.equal(sa.inside, sb.inside)  # same seed, same models
    # the same evaluation again: the folder holds it, so nothing runs and no file changes (the result as recorded)
    before = _bytes(a)
    again = _evaluate(digits_model, a)
    assert _bytes(a) == before and again["references"]["trained"] == 6
    assert again == {**json.loads((a / "membership.json").read_text()), "model": str(digits_model)}
    # another evaluation on the same reference models (another calibration split) reuses every one of them
    other = _evaluate(digits_model, a, SETTINGS.model_copy(update={"calibration_fraction": 0.4}))
    assert other["references"]["trained"] == 0 and other["references"]["reused"] == 6
    # a larger K trains only the new models
    more = _evaluate(digits_model, a, SETTINGS.model_copy(update={"references": ReferenceSettings(count=8, seed=3)}))
    assert more["references"]["trained"] == 2
    # a killed call: reference 3 lost its completion marker and its statistics; the rerun trains it alone, the same
    shutil.rmtree(a / REFERENCES_DIR / "ref-00003")
    resumed = _evaluate(digits_model, a, SETTINGS.model_copy(update={"references": ReferenceSettings(count=8, seed=3)}))
    assert resumed["references"]["trained"] == 1
    assert torch.equal(load_statistics(a, 6).confidence, sa.confidence)
    # another seed: other subsets
    c = _evaluate(digits_model, tmp_path / "c", SETTINGS.model_copy(update={"references": ReferenceSettings(count=6,
                                                                                                           seed=4)}))
    assert not torch.equal(load_statistics(tmp_path / "c", 6).inside, sa.inside)
    assert c["references"]["trained"] == 6


def test_other_draws_into_the_same_folder_are_refused(digits_model, tmp_path):
    from datarecon.errors import DataReconError

    _evaluate(digits_model, tmp_path / "m")
    with pytest.raises(DataReconError, match="another pool"):
        _evaluate(digits_model, tmp_path / "m", SETTINGS.model_copy(update={"nonmembers": 200}))


def test_without_references_a_calibration_part_too_small_to_measure_is_not_made(digits_model):
    """30 members: a 30 % calibration part would hold 9, fewer than the 10 of a class any ROC needs (the rule of
    evaluate too), so nothing is chosen on it and the rule fixed in advance picks the strongest signal."""
    res = evaluate_membership(digits_model, settings=MembershipSettings(nonmembers=300).without_references(),
                              runtime=Runtime(log=lambda s: None))
    split = res["split"]
    assert split["calibration"] == {"members": 0, "nonmembers": 0}
    assert split["report"] == {"members": 30, "nonmembers": 300}
    assert res["strongest"]["report"]["n_members"] == 30
    # the rule is stated: the order it follows, and why nothing was chosen on data
    assert res["strongest"]["rule"] == ("the rule fixed in advance, the first measured of subspace, loss, confidence, "
                                        "gradient-norm (a calibration part of 9 members and 90 non-members would be "
                                        "too small to choose on: each class needs at least 10)")
    assert res["signals"]["lira-online"]["applicable"] is False
    assert "--references" in res["signals"]["lira-online"]["note"]


def test_without_references_the_strongest_is_chosen_on_a_calibration_part():
    rng = np.random.default_rng(4)
    mem = np.r_[np.ones(40, bool), np.zeros(400, bool)]
    res = compare_signals(SignalScores({"loss": rng.normal(size=440) + mem * 2.0}, {}), mem, calibration=0.3, seed=0)
    assert res["split"]["calibration"] == {"members": 12, "nonmembers": 120}
    assert res["split"]["report"] == {"members": 28, "nonmembers": 280}
    assert res["strongest"]["report"]["n_members"] == 28  # its headline: the reported part only
    assert res["signals"]["loss"]["report"]["n_members"] == 40  # the table: every candidate
    assert "calibration part" in res["strongest"]["rule"]


def test_the_strongest_choice_never_reads_the_reported_part():
    """Scores that differ only on the reported part give the same choice; the reported ROC follows the change."""
    rng = np.random.default_rng(0)
    mem = np.r_[np.ones(60, bool), np.zeros(600, bool)]
    base = {"loss": rng.normal(size=660) + mem * 1.0, "gradient-norm": rng.normal(size=660) + mem * 3.0}
    first = compare_signals(SignalScores(base, {}), mem, calibration=0.3, seed=1)
    cal = first.pop("_calibration")
    changed = {k: v.copy() for k, v in base.items()}
    changed["loss"][~cal] = mem[~cal] * 10.0 + rng.normal(size=(~cal).sum())  # loss is perfect on the reported part
    changed["gradient-norm"][~cal] = rng.normal(size=(~cal).sum())  # and gradient-norm useless there
    second = compare_signals(SignalScores(changed, {}), mem, calibration=0.3, seed=1)
    assert first["strongest"]["chosen"] == second["strongest"]["chosen"] == "gradient-norm"
    assert first["strongest"]["name"] == "gradient-norm" and first["strongest"]["demoted"] == ""
    # on the reported part the chosen signal is now useless, its AUC interval below the loss threshold's: the headline
    # is the loss threshold, with the reason, measured on the reported part only
    assert second["strongest"]["name"] == "loss"
    assert "gradient-norm's AUC interval" in second["strongest"]["demoted"] and "lies below" in \
        second["strongest"]["demoted"]
    assert second["strongest"]["report"]["n_members"] == 42 and second["signals"]["loss"]["report"]["n_members"] == 60
    assert second["signals"]["loss"]["report"]["auc"] > first["signals"]["loss"]["report"]["auc"]


def test_the_headline_is_never_below_the_loss_threshold():
    """A chosen signal whose AUC interval lies below 0.5, below the loss threshold's, or that is weaker in AUC and in
    TPR at 1 % FPR, is replaced by the loss threshold in the headline (the rule is the same pure function)."""
    from datarecon.evaluation.membership import headline_verdict, membership_roc

    rng = np.random.default_rng(3)
    pos, neg = rng.normal(size=(2, 100)), rng.normal(size=(2, 1000))
    loss = membership_roc(pos[0] + 1.0, neg[0], name="loss")
    below_half = membership_roc(pos[1] - 1.0, neg[1], name="rmia-online")
    assert "lies below 0.5" in headline_verdict(below_half, loss)
    weaker = membership_roc(pos[1] + 0.3, neg[1], name="subspace")
    assert "lies below the loss threshold's" in headline_verdict(weaker, loss)
    close = membership_roc(pos[0] + 0.9, neg[0], name="gradient-norm")  # the same images, slightly weaker
    assert "weaker than the loss threshold" in headline_verdict(close, loss)
    stronger = membership_roc(pos[1] + 2.0, neg[1], name="lira-online")
    assert headline_verdict(stronger, loss) == "" and headline_verdict(loss, loss) == ""


def test_your_own_module_gets_every_signal_and_reference_models_from_your_training(data_dir, tmp_path):
    """Bring your own model: a torch MLP on 20 digits, reference models from the same training function, kept in a
    membership folder that a second call reuses; the subspace signal where its first dense layer reads the inputs."""
    from torch import nn

    from datarecon.data import DataSpec
    from datarecon.data.selection import draw_outside
    from datarecon.experiments.membership.own import membership_of_module

    spec = DataSpec(dataset="digits", task="all", n_per_class=2, n_heldout_per_class=0)
    members, _ = draw_outside(spec, split="train", count=20, seed=0)
    non, _ = draw_outside(spec, split="train", exclude=members.indices, count=200, seed=1)
    pop, _ = draw_outside(spec, split="test", count=60, seed=2)

    def train(x, y, seed):
        torch.manual_seed(seed % 2**31)
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).double()
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in range(150):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x.double()), y).backward()
            opt.step()
        return net

    target = train(members.x, members.y, 0)
    args = {"loss": "cross-entropy", "members": (members.x.double(), members.y), "nonmembers": (non.x.double(), non.y),
            "population": (pop.x.double(), pop.y), "recipe": train, "settings": MembershipSettings(references=ReferenceSettings(count=6)), "out": tmp_path / "m"}
    res = membership_of_module(target, **args)
    measured = {k for k, v in res["signals"].items() if v["applicable"]}
    assert measured == {"loss", "confidence", "gradient-norm", "subspace", "lira-offline", "lira-online", "rmia",
                        "rmia-online"}
    assert "pseudo-targets" in res["strongest"]["rule"] and res["strongest"]["chosen"] in measured
    assert res["signals"]["loss"]["report"]["n_members"] == 20
    # LiRA's design: each of the 40 candidates of the half-in pool is IN for exactly half of the 6 models on average
    assert res["references"]["in_models"]["mean"] == 3.0 and res["references"]["half_in"] == 40
    assert {"membership.json", "roc.png", "exposed.csv", "references"} <= {p.name for p in (tmp_path / "m").iterdir()}
    before = _bytes(tmp_path / "m")
    again = membership_of_module(target, **args)  # finished: nothing runs, no file changes
    assert _bytes(tmp_path / "m") == before and again["references"]["trained"] == 6
    other = membership_of_module(target, **{**args, "settings": MembershipSettings(
        references=ReferenceSettings(count=6), calibration_fraction=0.4)})
    assert other["references"]["trained"] == 0 and other["references"]["reused"] == 6
    plain = membership_of_module(target, loss="cross-entropy", members=(members.x.double(), members.y),
                                 nonmembers=(non.x.double(), non.y))
    assert "calibration part" in plain["strongest"]["rule"] and plain["signals"]["rmia"]["applicable"] is False


def test_progress_counts_reference_models_as_their_markers_appear(tmp_path):
    """Inside a task of several models (a worker process or Ray), progress still moves one model at a time: the
    driver counts the completion markers the task writes."""
    import io

    from datarecon.data import DataSpec
    from datarecon.experiments.membership.reference_training import FinishedModels, ReferenceJob
    from datarecon.experiments.membership.trainers import RecipeTrainer
    from datarecon.experiments.pipeline.pieces import piece_hashes
    from datarecon.kernel.engine import LineRate, ProgressBar
    from datarecon.training.target import ArchConfig, TrainConfig
    from datarecon.utils.io import atomic_write_json

    config = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=5),
                         arch=ArchConfig(name="mlp", hidden=(4,)))
    job = ReferenceJob(out=tmp_path, trainer=RecipeTrainer(config), pool_key="k", settings=ReferenceSettings(count=4),
                       per_class=5)
    stream = io.StringIO()
    bar = ProgressBar(desc="reference models", unit="model", mode="lines", stream=stream,
                      rate=LineRate(interval_s=0.0, min_fraction=0.1))
    finished = FinishedModels(job, [0, 1, 2, 3], bar)
    hashes = piece_hashes(job.pieces())
    for k in (0, 2):
        key = job.pieces()[k].key
        atomic_write_json(tmp_path / key / "DONE.json", {"hash": hashes[key]})
    atomic_write_json(tmp_path / job.pieces()[3].key / "DONE.json", {"hash": "stale"})  # another recipe's: not done
    finished.poll()
    assert finished.state.step == 2 and finished.left == [1, 3]
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("reference models: model 1/4 (25%)") and lines[1].startswith("reference models: model "
                                                                                            "2/4 (50%)")


def test_the_number_of_reference_models_needed_is_the_fewest_whose_fits_all_work():
    """The subsets follow from the seed, so the fewest K whose LiRA and RMIA fits all work (also with each of the
    first pseudo-targets left out) is known before training; a naive search over the subsets agrees."""
    from datarecon.experiments.membership.reference_training import subset
    from datarecon.experiments.membership.references import PSEUDO_TARGETS, references_needed

    classes = torch.tensor([0] * 60 + [1] * 60)
    needed = references_needed(classes, 5, seed=3, count=1)
    assert needed is not None and needed > 2
    assert references_needed(classes, 5, seed=3, count=needed - 1) == needed
    assert references_needed(classes, 5, seed=3, count=needed + 3) == needed + 3

    def fits(rows):
        inside = np.array(rows)
        return (inside.sum(0) >= 2).any() and ((len(rows) - inside.sum(0)) >= 2).any()

    rows = []
    for k in range(needed):
        row = np.zeros(120, int)
        row[subset(classes, 5, seed=3, index=k)] = 1
        rows.append(row)
    ok = [fits(rows[:m]) and (m < 3 or all(fits([r for j, r in enumerate(rows[:m]) if j != t])
                                            for t in range(min(PSEUDO_TARGETS, m))))
          for m in range(1, needed + 1)]
    assert ok[-1] and not any(ok[:-1])


def test_auto_picks_the_largest_count_whose_estimated_time_fits_the_budget(digits_model, tmp_path, monkeypatch):
    """references auto: the first model is trained and timed (its completion marker's wall time, here set to 1 s),
    then the largest of 16..256 models whose remaining time fits the budget is trained; the IN count of each
    candidate of the half-in pool is K/2 on average."""
    monkeypatch.setattr(membership_references, "trained_times", lambda out, indices: [1.0 for _ in indices])
    settings = SETTINGS.model_copy(update={"references": ReferenceSettings(count="auto", budget_minutes=1.0, seed=3)})
    res = _evaluate(digits_model, tmp_path / "m", settings)
    auto = res["references"]["auto"]
    assert auto["probe_models"] == 1 and auto["seconds_per_model"] == 1.0 and "skipped" not in auto
    assert res["references"]["count"] == 32  # at 1 s a model 16, then 32 fit in the minute; 64 would not
    # all 32 trained by this call (the seventh trial: a fresh folder said "0 trained now, 32 reused")
    assert res["references"]["trained"] == 32 and res["references"]["reused"] == 0
    assert res["references"]["in_models"]["mean"] == 16.0 and res["references"]["half_in"] == 60
    assert res["strongest"]["chosen"] is not None and "pseudo-targets" in res["strongest"]["rule"]


def test_auto_skips_what_does_not_fit_and_says_what_it_would_cost_and_gain(digits_model, tmp_path, monkeypatch):
    monkeypatch.setattr(membership_references, "trained_times", lambda out, indices: [30.0 for _ in indices])
    settings = SETTINGS.model_copy(update={"references": ReferenceSettings(count="auto", budget_minutes=2.0)})
    res = _evaluate(digits_model, tmp_path / "m", settings)
    skipped = res["references"]["auto"]["skipped"]
    assert res["references"]["count"] == 0 and res["signals"]["lira-online"]["applicable"] is False
    assert "16 reference models would take about 8.0 min (30.0 s each, measured on the first 1" in skipped
    assert "raised the TPR at 1% FPR" in skipped and "--budget-minutes 10" in skipped
    assert res["signals"]["lira-online"]["note"] == skipped


def test_without_a_folder_auto_trains_in_a_temporary_one(digits_model, monkeypatch):
    monkeypatch.setattr(membership_references, "trained_times", lambda out, indices: [1.0 for _ in indices])
    settings = SETTINGS.model_copy(update={"references": ReferenceSettings(count="auto", budget_minutes=0.5)})
    res = evaluate_membership(digits_model, settings=settings, runtime=Runtime(log=lambda s: None))
    assert res["references"]["count"] == 16 and res["references"]["kept"] is False
    assert res["signals"]["lira-online"]["applicable"]


def test_keeping_weights_or_not_chooses_the_same_strongest_signal(digits_model, tmp_path):
    """The first four reference models keep their weights whatever keep_weights says (they play the target, and the
    white-box signals need their weights there), so --no-reference-keep-weights changes what is kept, not the
    choice."""
    kept = _evaluate(digits_model, tmp_path / "kept")
    lean = _evaluate(digits_model, tmp_path / "lean", SETTINGS.model_copy(
        update={"references": ReferenceSettings(count=6, seed=3, keep_weights=False)}))
    assert lean["strongest"]["chosen"] == kept["strongest"]["chosen"] and lean["strongest"]["rule"] == \
        kept["strongest"]["rule"]
    assert lean["signals"]["gradient-norm"]["chosen_on"] is not None  # it competed on the pseudo-targets
    assert lean["signals"]["gradient-norm"]["chosen_on"] == kept["signals"]["gradient-norm"]["chosen_on"]
    weights = sorted(p.parent.name for p in (tmp_path / "lean" / REFERENCES_DIR).glob("*/weights.safetensors"))
    assert weights == ["ref-00000", "ref-00001", "ref-00002", "ref-00003"]


def test_a_finished_folder_of_an_earlier_version_of_the_model_is_not_returned(digits_model, tmp_path):
    """A finished evaluation is returned as recorded only for the very model the folder measures: the same path
    retrained (here: the folder's record of the model's identity changed) is refused, never answered from the
    folder, also without reference models."""
    from datarecon.errors import DataReconError

    out, plain = tmp_path / "m", SETTINGS.without_references()
    first = evaluate_membership(digits_model, settings=plain, out=out, runtime=Runtime(log=lambda s: None))
    assert evaluate_membership(digits_model, settings=plain, out=out, runtime=Runtime(log=lambda s: None)) == first
    target = json.loads((out / "target.json").read_text())
    (out / "target.json").write_text(json.dumps({**target, "identity": "0" * 16}))
    with pytest.raises(DataReconError, match="an earlier version of"):
        evaluate_membership(digits_model, settings=plain, out=out, runtime=Runtime(log=lambda s: None))
