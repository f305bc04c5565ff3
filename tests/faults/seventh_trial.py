"""The seventh adversarial trial (issue 50 item 5): hostile inputs on what issue 49-51 changed, as rows of the
catalogue (``tests/faults/hostile_inputs.py``, groups ``seventh-*``).

* ``seventh-attacks``: every attack x the priors (``--tv-weight``, ``--feature-stats-weight``, ``--group-weight``),
  early stops, ``--step-probe``, ``--retry-diverged``, labels; ``--norm-mode`` of training;
* ``seventh-plugins``: plug-in attacks by entry point with bad declarations (a process of their own);
* ``seventh-resume``: SIGKILL and SIGINT at a fixed step (``DATARECON_FAULT_AT_STEP``,
  ``DATARECON_FAULT_AFTER_CHECKPOINT``) then the same command with ``--resume``, compared file by file with an
  uninterrupted run (``faultlib.assert_same_tree``); damaged ``checkpoint/`` files; resumes with changed options;
* ``seventh-membership``: own-model membership with ``--recipe``, ``--references``, ``--budget-minutes``,
  ``--reference-seed``, ``--population``; membership killed while its reference models are made, then rerun;
* ``seventh-targets``: the leakage map's targets, ``train --n-train`` / ``--train-indices`` on a pretrained head,
  attacked with ``--runs`` and in sweeps, a sweep on such a target killed and rerun;
* ``seventh-audit``: ``audit --model`` of a fine-tuned batch-norm ResNet at smoke scale.

Each row is ``(group, name, prepare, options)``; ``hostile_inputs`` makes them its ``Trial``s (this module imports
nothing of it, so either can be run). A row's ``check(ws)`` runs after a command that ran: a message means the
resumed folder differs from the uninterrupted one (counted ``resume changed files``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import adversarial_trials
from adversarial_trials import DIGITS

Row = tuple[str, str, Callable[[Path], list[str]], dict[str, Any]]

REC = ["reconstruct", "--candidates", "4", "--no-progress"]
FT = ["--dataset", "digits", "--task", "classes:0,1,2", "--n-per-class", "4", "--loss", "cross-entropy",
      "--normalisation", "unit", "--no-progress"]
FT_MC = ["train", *FT, "--hidden", "8", "--no-bias", "--epochs", "5", "--pretrained", "mc"]
TRAIN = ["train", *DIGITS, "--hidden", "4", "--no-bias", "--no-progress"]
#: a training whose data are separated after its epochs, so its margin ascent runs (tests/faults/test_resume_unchanged)
ASCENT = ["train", *DIGITS, "--hidden", "20", "--no-bias", "--dtype", "float64", "--init-scale", "1e-3", "--lr", "0.01",
          "--schedule", "loss-normalised", "--max-lr-factor", "1e9", "--epochs", "50", "--checkpoint-every", "10",
          "--no-progress"]
METHODS = {"kkt": [], "decoreco": [], "gradnorm": [], "bilevel": ["--weight-decay-override", "0.01"],
           "loo": ["--known-init", "seed:0"],
           "dynamics": ["--known-init", "seed:0", "--known-recipe", "model", "--candidates", "10"]}
STEP_ENV, CKPT_ENV = "DATARECON_FAULT_AT_STEP", "DATARECON_FAULT_AFTER_CHECKPOINT"
#: the recipe of a user's own model for its reference models (``nets:make``, logistic loss)
RECIPE = """import torch
from torch import nn
import nets


def train(x, y, seed):
    torch.manual_seed(seed)
    net = nets.make().to(x.dtype)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(net(x).squeeze(1), y.to(x.dtype)).backward()
        opt.step()
    return net


def nan(x, y, seed):
    net = nets.make().to(x.dtype)
    for p in net.parameters():
        p.data.fill_(float("nan"))
    return net


def other(x, y, seed):
    return nn.Linear(64, 1)


def none(x, y, seed):
    return None
"""


def _w(ws: Path, rel: str, data: str | bytes) -> str:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return rel


def _json(ws: Path, rel: str, change: Callable[[dict], object]) -> None:
    path = ws / rel
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _ok(ws: Path, *args: str, env: dict[str, str] | None = None, code: int = 0) -> None:
    res = adversarial_trials.cli(*args, cwd=ws, extra_env=env)
    assert res.returncode == code, (args, res.stderr[-1500:])


def _killed(ws: Path, *args: str, env: dict[str, str]) -> None:
    """``args`` run with a fault hook: it must end by the fault (not finish, not fail otherwise)."""
    res = adversarial_trials.cli(*args, cwd=ws, extra_env=env)
    assert res.returncode in (-9, 130, 143), (args, env, res.returncode, res.stderr[-1500:])


def _x(*argv: str) -> Callable[[Path], list[str]]:
    return lambda ws: list(argv)


def _rc(*args: str, model: str = "model", out: str = "n", steps: str = "2") -> Callable[[Path], list[str]]:
    return lambda ws: [*REC, "--steps", steps, "--model", model, "--out", out, *args]


def build_seventh_extras(ws: Path) -> None:
    """The seventh trial's additions to the fifth trial's workspace: fine-tunings of ``mc`` on part of its pool
    (``t2``: 2 images drawn, ``ti``: indices 0,1,2) and a user's training function ``rec.py``."""
    _ok(ws, *FT_MC, "--n-train", "2", "--out", "t2")
    _ok(ws, *FT_MC, "--train-indices", "0,1,2", "--out", "ti")
    _w(ws, "rec.py", RECIPE)


# -- kill and resume -------------------------------------------------------------------------------------------------

def _same(ref: str, got: str, *, skip: tuple[str, ...] = ()) -> Callable[[Path], str | None]:
    def check(ws: Path) -> str | None:
        import faultlib

        try:
            faultlib.assert_same_tree(ws / ref, ws / got, skip=skip)
        except AssertionError as exc:
            return f"{got} differs from the uninterrupted {ref}: {str(exc)[:300]}"
        return None
    return check


def _kill_resume(args: list[str], env: dict[str, str], *, resume: tuple[str, ...] = ("--resume",),
                 before: Callable[[Path], None] | None = None) -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    """``args --out ref`` uninterrupted, ``args --out n`` faulted by ``env``, then ``args --out n RESUME``; the check
    compares n with ref."""
    def prepare(ws: Path) -> list[str]:
        if before is not None:
            before(ws)
        _ok(ws, *args, "--out", "n")
        (ws / "n").rename(ws / "ref")  # the same path as the faulted run's: records name their folder
        _killed(ws, *args, "--out", "n", env=env)
        return [*args, "--out", "n", *resume]
    return prepare, {"expect": "accept", "check": _same("ref", "n")}


def _finished_resume(args: list[str], *, code: int = 0) -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    """A finished run resumed: it changes no byte (the copy ``ref`` is the folder before); a diverged run
    (``code`` 2) is refused again with its line."""
    def prepare(ws: Path) -> list[str]:
        _ok(ws, *args, "--out", "n", code=code)
        shutil.copytree(ws / "n", ws / "ref", symlinks=True)
        return [*args, "--out", "n", "--resume"]
    if code:
        return prepare, {"must": "diverged", "warn": True, "check": _same("ref", "n")}
    return prepare, {"expect": "accept", "check": _same("ref", "n")}


def _resume_changed(base: list[str], changed: list[str], *, must: str | None = None,
                    expect: str = "refuse") -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    """A run killed after step 3 (of 8, checkpoints every 2), resumed with other options; accepted, it must equal
    an uninterrupted run with those options."""
    def prepare(ws: Path) -> list[str]:
        if expect == "accept":
            _ok(ws, *base, *changed, "--out", "n")
            (ws / "n").rename(ws / "ref")
        _killed(ws, *base, "--out", "n", env={STEP_ENV: "3:KILL"})
        return [*base, *changed, "--out", "n", "--resume"]
    kw: dict[str, Any] = {"expect": expect, "check": _same("ref", "n") if expect == "accept" else None}
    if must:
        kw["must"] = must
    return prepare, kw


def _damaged(base: list[str], damage: Callable[[Path], None], *, must: str | None = None,
             expect: str = "refuse") -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    """A run killed after step 3, its checkpoint damaged, then resumed; accepted, it must equal an uninterrupted
    run (``progress.json`` is a readable copy of ``state.safetensors``' metadata, which wins, and is rewritten)."""
    def prepare(ws: Path) -> list[str]:
        if expect == "accept":
            _ok(ws, *base, "--out", "n")
            (ws / "n").rename(ws / "ref")
        _killed(ws, *base, "--out", "n", env={STEP_ENV: "3:KILL"})
        damage(ws / "n" / "checkpoint")
        return [*base, "--out", "n", "--resume"]
    kw: dict[str, Any] = {"expect": expect, "check": _same("ref", "n") if expect == "accept" else None}
    if must:
        kw["must"] = must
    return prepare, kw


def _progress(change: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda ck: _json(ck.parent, "checkpoint/progress.json", change)


def _flip(name: str, at: int = -10) -> Callable[[Path], None]:
    def damage(ck: Path) -> None:
        data = bytearray((ck / name).read_bytes())
        data[at] ^= 0xFF
        (ck / name).write_bytes(bytes(data))
    return damage


ATK = [*REC, "--model", "model", "--steps", "8", "--checkpoint-every", "2", "--log-every", "1"]


def _resume_rows() -> list[Row]:
    rows: list[tuple[str, tuple[Callable, dict]]] = []
    for method, extra in METHODS.items():
        steps = ["--set", "inner_max_iter_first=30"] if method == "bilevel" else []
        rows.append((f"{method} killed (SIGKILL) after step 3 of 8, resumed",
                     _kill_resume([*ATK, "--method", method, *extra, *steps], {STEP_ENV: "3:KILL"})))
    rows += [
        ("kkt interrupted (SIGINT) after step 5, resumed", _kill_resume(ATK, {STEP_ENV: "5:INT"})),
        ("kkt terminated (SIGTERM) after step 1, resumed", _kill_resume(ATK, {STEP_ENV: "1:TERM"})),
        ("kkt with --tv-weight 0.1 --known-labels balanced killed after step 4", _kill_resume(
            [*ATK, "--tv-weight", "0.1"], {STEP_ENV: "4:KILL"})),
        ("kkt on the fine-tuned ResNet with --feature-stats-weight 1 killed after step 3", _kill_resume(
            [*REC, "--model", "bnft", "--steps", "6", "--checkpoint-every", "2", "--feature-stats-weight", "1"],
            {STEP_ENV: "3:KILL"})),
        ("kkt restored labels on the n-train target killed after step 3", _kill_resume(
            [*REC, "--model", "t2", "--steps", "6", "--checkpoint-every", "2", "--known-init", "pretrained",
             "--known-labels", "restored"], {STEP_ENV: "3:KILL"})),
        ("an early-stopping attack (patience 2, tol 0.5) killed after step 1, resumed", _kill_resume(
            [*REC, "--model", "model", "--steps", "40", "--checkpoint-every", "1", "--early-stop-patience", "2",
             "--early-stop-tol", "0.5"], {STEP_ENV: "1:KILL"})),
        ("an early-stopped attack resumed (finished)", _finished_resume(
            [*REC, "--model", "model", "--steps", "40", "--early-stop-patience", "2", "--early-stop-tol", "0.5"])),
        ("--step-probe 3 --lr-x 1e3 (the probe lowers the step) killed after step 3, resumed", _kill_resume(
            [*ATK, "--step-probe", "3", "--lr-x", "1e3"], {STEP_ENV: "3:KILL"})),
        # lr_x 1e3 diverges, then 1e2 at step 4 and 10 at step 6; 1 completes: killed in the retry at 10
        ("--retry-diverged 3 --lr-x 1e3 --step-probe 0 killed inside its second retry, resumed", _kill_resume(
            [*ATK, "--retry-diverged", "3", "--lr-x", "1e3", "--step-probe", "0"], {STEP_ENV: "3:KILL:2"})),
        ("--retry-diverged 3 --lr-x 1e3 --step-probe 0 interrupted inside its last retry, resumed", _kill_resume(
            [*ATK, "--retry-diverged", "3", "--lr-x", "1e3", "--step-probe", "0"], {STEP_ENV: "5:INT:3"})),
        ("a run diverged after --retry-diverged 1, resumed (finished)", _finished_resume(
            [*ATK, "--retry-diverged", "1", "--lr-x", "1e3", "--step-probe", "0"], code=2)),
        ("--runs 2 looped killed after step 3, resumed", _kill_resume([*ATK, "--runs", "2"], {STEP_ENV: "3:KILL"})),
        ("--runs 3 --batch-mode batched killed after run1's checkpoint at step 4", _kill_resume(
            [*ATK, "--runs", "3", "--batch-mode", "batched"], {CKPT_ENV: "run1:4:KILL"})),
        ("--runs 2 --group-weight 1 (coupled) killed after run0's checkpoint at step 4", _kill_resume(
            [*ATK, "--runs", "2", "--group-weight", "1"], {CKPT_ENV: "run0:4:KILL"})),
        ("--runs 2 --group-weight 1 (coupled) interrupted after run1's checkpoint at step 2", _kill_resume(
            [*ATK, "--runs", "2", "--group-weight", "1"], {CKPT_ENV: "run1:2:INT"})),
        ("--runs 3 --group-weight 0.5 --method gradnorm killed after run2's checkpoint at step 6", _kill_resume(
            [*ATK, "--runs", "3", "--group-weight", "0.5", "--method", "gradnorm"], {CKPT_ENV: "run2:6:KILL"})),
        ("--runs 2 coupled, finished, resumed", _finished_resume([*ATK, "--runs", "2", "--group-weight", "1"])),
        ("train killed after epoch 7 of 20, resumed", _kill_resume(
            [*TRAIN, "--epochs", "20", "--checkpoint-every", "5"], {STEP_ENV: "7:KILL"})),
        ("train interrupted after epoch 12, resumed", _kill_resume(
            [*TRAIN, "--epochs", "20", "--checkpoint-every", "5"], {STEP_ENV: "12:INT"})),
        ("DP-SGD training killed after step 6, resumed", _kill_resume(
            [*TRAIN, "--epochs", "12", "--checkpoint-every", "4", "--dp-noise", "1", "--dp-clip", "1",
             "--dp-batch-size", "4"], {STEP_ENV: "6:KILL"})),
        ("margin ascent killed after ascent step 5, resumed", _kill_resume(
            [*ASCENT, "--margin-ascent-steps", "12"], {STEP_ENV: "5:KILL:1"})),
        ("margin ascent to convergence (rtol, window) interrupted after ascent step 4", _kill_resume(
            [*ASCENT, "--margin-ascent-steps", "12", "--margin-ascent-window", "2", "--margin-ascent-rtol", "1e-9"],
            {STEP_ENV: "4:INT:1"})),
        ("a margin-ascent training finished, resumed", _finished_resume(
            [*ASCENT, "--margin-ascent-steps", "6"])),
        ("a fine-tuning with --n-train 2 killed after epoch 3, resumed", _kill_resume(
            [*FT_MC, "--n-train", "2", "--checkpoint-every", "1"], {STEP_ENV: "3:KILL"})),
        ("a train-mode batch-norm fine-tuning killed after epoch 1, resumed", _kill_resume(
            ["train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "3", "--pretrained", "bn", "--norm-mode",
             "train", "--checkpoint-every", "1"], {STEP_ENV: "1:KILL"})),
    ]
    kkt8 = ATK
    rows += [
        ("resume with another --lr-x", _resume_changed(kkt8, ["--lr-x", "0.5"])),
        ("resume with another --seed", _resume_changed(kkt8, ["--seed", "1"])),
        ("resume with --tv-weight 1 added", _resume_changed(kkt8, ["--tv-weight", "1"])),
        ("resume with --early-stop-patience 3 added", _resume_changed(kkt8, ["--early-stop-patience", "3"])),
        ("resume with another --candidates", _resume_changed(kkt8, ["--candidates", "6"])),
        ("resume with another --method", _resume_changed(kkt8, ["--method", "decoreco"])),
        ("resume with --known-labels restored added", _resume_changed(kkt8, ["--known-init", "seed:0",
                                                                            "--known-labels", "restored"])),
        # the checkpoint of a kill after step 3 is at step 2: --steps 2 ends the run there (before the fix it took no
        # step and recorded no final metrics, "loss nan"), --steps 1 is fewer than done
        ("resume with --steps 2 (its checkpoint's step)", _resume_changed(kkt8, ["--steps", "2"], expect="accept")),
        ("resume with --steps 1 (fewer than done)", _resume_changed(kkt8, ["--steps", "1"])),
        ("resume with --steps 12 (more)", _resume_changed(kkt8, ["--steps", "12"], expect="accept")),
        ("resume with --checkpoint-every 3", _resume_changed(kkt8, ["--checkpoint-every", "3"], expect="accept")),
        # accepted when the run is what the new options give uninterrupted (the probe is run again: another scale is
        # refused by the config's hash; retries apply to what is left)
        ("resume with --step-probe 5 (the run was probed for 50)", _resume_changed(kkt8, ["--step-probe", "5"],
                                                                                   expect="accept")),
        ("resume with --retry-diverged 2 added", _resume_changed(kkt8, ["--retry-diverged", "2"], expect="accept")),
        ("resume with --runs 2 (a single run)", _resume_changed(kkt8, ["--runs", "2"])),
        ("resume of --runs 2 with --runs 3 (runs 0-1 resumed, run 2 new)", _resume_changed(
            [*kkt8, "--runs", "2"], ["--runs", "3"], expect="accept")),
        ("resume of a coupled group with --group-weight 2", _resume_changed(
            [*kkt8, "--runs", "2", "--group-weight", "1"], ["--group-weight", "2"])),
        ("resume of a coupled group without --group-weight", _resume_changed(
            [*kkt8, "--runs", "2", "--group-weight", "1"], ["--group-weight", "0"])),
        ("resume with --dtype float64", _resume_changed(kkt8, ["--dtype", "float64"])),
        ("resume of a training with another --lr", lambda: (lambda ws: _train_changed(ws, ["--lr", "0.5"]),
                                                            {"expect": "refuse"})),
        ("resume of a training with --margin-ascent-steps 4 added", lambda: (
            lambda ws: _train_changed(ws, ["--margin-ascent-steps", "4"]), {"expect": "refuse"})),
        # unlike an attack's steps, a training's epochs are part of its configuration's hash
        ("resume of a training with another --epochs", lambda: (
            lambda ws: _train_changed(ws, ["--epochs", "30"]), {"must": "another configuration"})),
        ("resume of a training with --n-train 2 added", lambda: (
            lambda ws: _train_changed(ws, ["--n-train", "2"]), {"expect": "refuse"})),
    ]
    damages = [
        ("progress.json garbage", lambda ck: _w(ck.parent, "checkpoint/progress.json", "{garbage"), "progress.json"),
        ("progress.json empty", lambda ck: _w(ck.parent, "checkpoint/progress.json", ""), "progress.json"),
        ("progress.json removed", lambda ck: (ck / "progress.json").unlink(), None),
        ("state.safetensors removed", lambda ck: (ck / "state.safetensors").unlink(), None),
        ("state.safetensors truncated", lambda ck: (ck / "state.safetensors").write_bytes(
            (ck / "state.safetensors").read_bytes()[:100]), "state.safetensors"),
        ("a flipped byte in state.safetensors", _flip("state.safetensors"), "state.safetensors"),
        ("progress.json steps_done -1", _progress(lambda p: p.update(steps_done=-1)), "progress.json"),
        ("progress.json steps_done 100 (beyond total 8)", _progress(lambda p: p.update(steps_done=100)), None),
        ("progress.json steps_done '3'", _progress(lambda p: p.update(steps_done="3")), "progress.json"),
        ("progress.json status 'bogus'", _progress(lambda p: p.update(status="bogus")), "progress.json"),
        ("progress.json status 'complete' at step 3", _progress(lambda p: p.update(status="complete")), None),
        ("progress.json resume_key changed", _progress(lambda p: p.update(resume_key="0" * 16)), None),
        ("progress.json schema datarecon-progress/9", _progress(lambda p: p.update(schema="datarecon-progress/9")),
         None),
        ("progress.json stepper method 'decoreco'", _progress(lambda p: p["stepper"].update(method="decoreco")),
         None),
        ("progress.json a list", lambda ck: _w(ck.parent, "checkpoint/progress.json", "[1, 2]"), "progress.json"),
        ("progress.json nested 100000 deep", lambda ck: _w(ck.parent, "checkpoint/progress.json",
                                                           "[" * 100000 + "]" * 100000), "progress.json"),
        ("a checkpoint folder that is a file", lambda ck: (shutil.rmtree(ck), ck.write_text("x")), "not a folder"),
        ("history.jsonl removed", lambda ck: (ck.parent / "history.jsonl").unlink(), "history.jsonl is missing"),
        ("run.json removed", lambda ck: (ck.parent / "run.json").unlink(missing_ok=True), None),
    ]
    # progress.json is never read for the state (state.safetensors' metadata wins): damage to it alone is repaired
    copy_only = ("progress.json", "state.safetensors removed")
    rows += [(f"damaged checkpoint: {name}", (lambda d=damage, m=must, a=name.startswith(copy_only) or name in (
        "run.json removed",): _damaged(kkt8, d, must=m, expect="accept" if a else "refuse"))())
        for name, damage, must in damages]
    out: list[Row] = []
    for name, made in rows:
        prepare, kw = made() if callable(made) else made
        out.append(("seventh-resume", name, prepare, kw))
    return out


def _train_changed(ws: Path, changed: list[str]) -> list[str]:
    base = [*TRAIN, "--epochs", "20", "--checkpoint-every", "5"]
    _killed(ws, *base, "--out", "n", env={STEP_ENV: "7:KILL"})
    return [*base, *changed, "--out", "n", "--resume"]


# -- the attack interface --------------------------------------------------------------------------------------------

def _attack_rows() -> list[Row]:
    rows: list[tuple[str, Callable, dict]] = []
    for method, extra in METHODS.items():
        e = list(extra)
        bil = ["--set", "inner_max_iter_first=20"] if method == "bilevel" else []
        rows += [
            (f"{method} --tv-weight -1", _rc("--method", method, *e, "--tv-weight", "-1"), {}),
            (f"{method} --tv-weight nan", _rc("--method", method, *e, "--tv-weight", "nan"), {}),
            (f"{method} --feature-stats-weight 1 on the MLP", _rc("--method", method, *e, "--feature-stats-weight",
                                                                  "1"), {"must": "batch"}),
            (f"{method} --group-weight 1 with one run", _rc("--method", method, *e, "--group-weight", "1"),
             {"must": "--group-weight" if method == "bilevel" else "--runs"}),
            (f"{method} --early-stop-patience 1", _rc("--method", method, *e, *bil, "--early-stop-patience", "1"),
             {"expect": "accept"}),
            (f"{method} --early-stop-tol 0 --early-stop-patience 2", _rc("--method", method, *e,
                                                                         "--early-stop-patience", "2",
                                                                         "--early-stop-tol", "0"), {}),
            # bilevel and dynamics choose or bound their own steps: a retry is refused ("no step sizes")
            (f"{method} --retry-diverged 1", _rc("--method", method, *e, *bil, "--retry-diverged", "1"),
             {"must": "no step sizes"} if method in ("bilevel", "dynamics") else {"expect": "accept"}),
            (f"{method} --known-labels bogus", _rc("--method", method, *e, "--known-labels", "bogus"), {}),
        ]
    rows += [
        ("kkt --tv-weight 1 on the n-train target", _rc("--tv-weight", "1", model="t2"), {"expect": "accept"}),
        ("gradnorm --tv-weight 0 (off; the option is not gradnorm's)", _rc("--method", "gradnorm", "--tv-weight",
                                                                          "0"), {"must": "does not apply"}),
        ("bilevel --tv-weight 1", _rc("--method", "bilevel", *METHODS["bilevel"], "--tv-weight", "1"),
         {"must": "tv"}),
        ("loo --feature-stats-weight 1 on the fine-tuned ResNet", _rc(
            "--method", "loo", "--known-init", "pretrained", "--feature-stats-weight", "1", model="bnft"),
         {"expect": "accept"}),
        ("kkt --feature-stats-weight 1 --runs 2 --group-weight 1 on batch norm", _rc(
            "--feature-stats-weight", "1", "--runs", "2", "--group-weight", "1", model="bn"), {"expect": "accept"}),
        ("kkt --group-weight -1 --runs 2", _rc("--group-weight", "-1", "--runs", "2"), {}),
        ("kkt --group-weight inf --runs 2", _rc("--group-weight", "inf", "--runs", "2"), {}),
        # the probe divides by 10 at most 4 times (1e30 -> 1e26), then the run shows the divergence itself
        ("kkt --step-probe 3 --lr-x 1e30 (beyond what the probe lowers)", _rc(
            "--step-probe", "3", "--lr-x", "1e30"), {"must": "diverged"}),
        ("kkt --step-probe 3 --lr-x 1e3 (the probe lowers it)", _rc("--step-probe", "3", "--lr-x", "1e3"),
         {"expect": "accept"}),
        ("gradnorm --step-probe 3", _rc("--method", "gradnorm", "--step-probe", "3"), {"expect": "accept"}),
        ("loo --step-probe 3 --known-init seed:0", _rc("--method", "loo", "--known-init", "seed:0", "--step-probe",
                                                       "3"), {"expect": "accept"}),
        ("kkt --step-probe 3 --runs 2 --batch-mode batched", _rc("--step-probe", "3", "--runs", "2", "--batch-mode",
                                                                 "batched"), {"expect": "accept"}),
        ("kkt --retry-diverged 1 --lr-x 1e30 --step-probe 0 (diverges on every setting)", _rc(
            "--retry-diverged", "1", "--lr-x", "1e30", "--step-probe", "0"), {"must": "diverged", "warn": True}),
        ("kkt --retry-diverged 6 --runs 2", _rc("--retry-diverged", "6", "--runs", "2"), {"expect": "accept"}),
        ("kkt --early-stop-patience 2 --runs 2 --batch-mode batched", _rc(
            "--early-stop-patience", "2", "--runs", "2", "--batch-mode", "batched"), {"expect": "accept"}),
        ("kkt --early-stop-patience 2 --early-stop-tol 1e-320 (in (0, 1))", _rc(
            "--early-stop-patience", "2", "--early-stop-tol", "1e-320"), {"expect": "accept"}),
        ("kkt --early-stop-patience 2 --early-stop-tol -0.1", _rc(
            "--early-stop-patience", "2", "--early-stop-tol", "-0.1"), {}),
        ("kkt --known-labels restored on the n-train target without --known-init", _rc(
            "--known-labels", "restored", model="t2"), {"must": "--known-init"}),
        ("kkt --known-labels restored with --known-init pretrained on the n-train target", _rc(
            "--known-labels", "restored", "--known-init", "pretrained", model="t2"), {"expect": "accept"}),
        ("kkt --known-labels restored --known-init seed:0 on the n-train target (fine-tuned)", _rc(
            "--known-labels", "restored", "--known-init", "seed:0", model="t2"), {"must": "pretrained"}),
        ("dynamics --candidates 2 on the n-train target (its n)", _rc(
            "--method", "dynamics", "--known-init", "pretrained", "--known-recipe", "model", "--candidates", "2",
            model="t2"), {"expect": "accept"}),
        ("dynamics on the n-train target with the default m", lambda ws: [
            "reconstruct", "--steps", "2", "--no-progress", "--model", "t2", "--method", "dynamics", "--known-init",
            "pretrained", "--known-recipe", "model", "--out", "n"], {"expect": "accept"}),
        ("--config run file with tv_weight for gradnorm", lambda ws: [
            "reconstruct", "--config", _w(ws, "c.yaml", "model: model\nattack: {method: gradnorm, tv_weight: 1}\n"),
            "--steps", "2", "--candidates", "4", "--out", "n", "--no-progress"], {"must": "tv"}),
        ("--set attack.tv_weight=1 --method bilevel", _rc("--method", "bilevel", *METHODS["bilevel"], "--set",
                                                          "attack.tv_weight=1"), {"must": "tv"}),
        ("--set early_stop.patience=-1", _rc("--set", "early_stop.patience=-1"), {}),
        ("--set step_probe=abc", _rc("--set", "step_probe=abc"), {}),
        ("--set retry_diverged=100", _rc("--set", "retry_diverged=100"), {}),
        ("train --norm-mode train on the fine-tuned ResNet's start", _x(
            "train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1", "--pretrained", "bn", "--norm-mode",
            "train", "--out", "m"), {"expect": "accept"}),
        ("train --norm-mode TRAIN (case)", _x("train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1",
                                              "--pretrained", "bn", "--norm-mode", "TRAIN", "--out", "m"), {}),
        ("train --norm-mode '' ", _x("train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1",
                                     "--norm-mode", "", "--out", "m"), {}),
        ("train --norm-mode eval with --n-train 2 on a batch-norm start", _x(
            "train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1", "--pretrained", "bn", "--norm-mode",
            "eval", "--n-train", "2", "--out", "m"), {"expect": "accept"}),
        # a batch of one still has 2x2 values per channel at the last stage: train-mode batch norm is defined
        ("train --norm-mode train --n-train 1 (a batch of one in train mode)", _x(
            "train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1", "--pretrained", "bn", "--norm-mode",
            "train", "--n-train", "1", "--out", "m"), {"expect": "accept"}),
        ("train --norm-mode train --dp-noise 1 on batch norm", _x(
            "train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1", "--norm-mode", "train", "--dp-noise",
            "1", "--dp-batch-size", "4", "--out", "m"), {}),
    ]
    return [("seventh-attacks", n, p, kw) for n, p, kw in rows]


PLUGIN = """from typing import ClassVar
import torch
import torch.nn.functional as F
from datarecon.attacks.base import Attack, AttackConfig


class Inv(Attack):
    name: ClassVar[str] = "inv"

    def objective(self, target, prior, x):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean()}


class StepStr(Inv):
    name: ClassVar[str] = "stepstr"
    step_size_fields: ClassVar = "lr_x"


class StepEmpty(Inv):
    name: ClassVar[str] = "stepempty"
    step_size_fields: ClassVar[tuple] = ()


class StepBool(Inv):
    name: ClassVar[str] = "stepbool"
    step_size_fields: ClassVar[tuple] = ("nesterov",)


class MetricNone(Inv):
    name: ClassVar[str] = "metricnone"
    early_stop_metric: ClassVar = None


class MetricNum(Inv):
    name: ClassVar[str] = "metricnum"
    early_stop_metric: ClassVar = 3


class NoName(Inv):
    name: ClassVar[str] = ""


class Spaced(Inv):
    name: ClassVar[str] = "two words"


class CfgNot(Inv):
    name: ClassVar[str] = "cfgnot"
    config_cls: ClassVar = dict


class LossVec(Inv):
    name: ClassVar[str] = "lossvec"

    def objective(self, target, prior, x):
        return {"loss": (x ** 2).flatten(1).sum(1)}


class LossInt(Inv):
    name: ClassVar[str] = "lossint"

    def objective(self, target, prior, x):
        return {"loss": 3}


class LossNone(Inv):
    name: ClassVar[str] = "lossnone"

    def objective(self, target, prior, x):
        return None


class ExtraStr(Inv):
    name: ClassVar[str] = "extrastr"

    def objective(self, target, prior, x):
        return {"loss": (x ** 2).sum(), "note": "text"}


class Inf(Inv):
    name: ClassVar[str] = "infloss"

    def objective(self, target, prior, x):
        return {"loss": (x ** 2).sum() * float("inf")}


class Complex(Inv):
    name: ClassVar[str] = "complexloss"

    def objective(self, target, prior, x):
        return {"loss": torch.view_as_complex(torch.stack([x.sum(), x.sum()]))}
"""


def _plug(name: str, cls: str, *args: str, ep: str | None = None) -> Callable[[Path], list[str]]:
    def prepare(ws: Path) -> list[str]:
        _w(ws, "hostile7.py", PLUGIN)
        _w(ws, "hostile7-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: hostile7\nVersion: 0.1\n")
        _w(ws, "hostile7-0.1.dist-info/entry_points.txt", ep or f"[datarecon.attacks]\n{name} = hostile7:{cls}\n")
        return [*REC, "--steps", "2", "--model", "model", "--out", "n", "--method", name, *args]
    return prepare


def _plugin_rows() -> list[Row]:
    rows = [
        ("step_size_fields a string, not a tuple", _plug("stepstr", "StepStr"), {}),
        ("step_size_fields empty, with --step-probe 3", _plug("stepempty", "StepEmpty", "--step-probe", "3"),
         {"must": "step"}),
        ("step_size_fields naming a bool field", _plug("stepbool", "StepBool"), {"must": "stepbool"}),
        ("early_stop_metric None, --early-stop-patience 2", _plug("metricnone", "MetricNone",
                                                                  "--early-stop-patience", "2"), {}),
        ("early_stop_metric a number", _plug("metricnum", "MetricNum", "--early-stop-patience", "2"), {}),
        ("name empty", _plug("noname", "NoName"), {}),
        # a registry key is any text: the method runs by its name
        ("name with a space", _plug("two words", "Spaced"), {"expect": "accept"}),
        ("config_cls dict", _plug("cfgnot", "CfgNot"), {}),
        ("objective's loss a vector", _plug("lossvec", "LossVec"), {"must": "lossvec"}),
        ("objective's loss an int", _plug("lossint", "LossInt"), {"must": "lossint"}),
        ("objective returns None", _plug("lossnone", "LossNone"), {"must": "lossnone"}),
        ("objective's extra term a string", _plug("extrastr", "ExtraStr"), {"must": "extrastr"}),
        ("objective infinite", _plug("infloss", "Inf"), {"must": "infloss"}),
        ("objective complex", _plug("complexloss", "Complex"), {"must": "real floating-point"}),
        ("entry point name differs from the class's name", _plug("alias", "Inv",
                                                                 ep="[datarecon.attacks]\nalias = hostile7:Inv\n"), {}),
        ("working plug-in --runs 2 --group-weight 1 --step-probe 3", _plug("inv", "Inv", "--runs", "2",
                                                                           "--group-weight", "1", "--step-probe",
                                                                           "3"), {"expect": "accept"}),
        # a plug-in on AttackConfig has no TV prior (its fields are named), but the box prior and retries
        ("working plug-in --tv-weight 1", _plug("inv", "Inv", "--tv-weight", "1"), {"must": "does not apply"}),
        ("working plug-in --box-weight 2 --retry-diverged 1", _plug("inv", "Inv", "--box-weight", "2",
                                                                    "--retry-diverged", "1"), {"expect": "accept"}),
        ("working plug-in --known-labels restored without --known-init", _plug("inv", "Inv", "--known-labels",
                                                                               "restored"),
         {"must": "--known-init"}),
    ]
    return [("seventh-plugins", n, p, {**kw, "warn": True}) for n, p, kw in rows]


# -- membership ------------------------------------------------------------------------------------------------------

OWN = ["membership", "--model", "nets:make", "--weights", "net.safetensors", "--input-shape", "1,8,8", "--no-progress",
       "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors"]
OWN_R = [*OWN, "--recipe", "rec:train"]
MC = ["membership", "--model", "mc", "--evaluate", "--nonmembers", "50", "--no-progress"]


def _membership_rows() -> list[Row]:
    rows: list[tuple[str, Callable, dict]] = [
        ("own model --recipe rec:train --references 2", _x(*OWN_R, "--references", "2", "--out", "m"),
         {"expect": "accept"}),
        ("own model --recipe --references 0 (recipe unused)", _x(*OWN_R, "--references", "0", "--out", "m"), {}),
        ("own model --recipe --references -1", _x(*OWN_R, "--references", "-1", "--out", "m"), {}),
        ("own model --recipe --references 1", _x(*OWN_R, "--references", "1", "--out", "m"), {}),
        ("own model --recipe --references 2.5", _x(*OWN_R, "--references", "2.5", "--out", "m"), {}),
        ("own model --recipe --references 10**7", _x(*OWN_R, "--references", "10000000", "--out", "m"), {}),
        ("own model --recipe --references auto --budget-minutes 0", _x(
            *OWN_R, "--references", "auto", "--budget-minutes", "0", "--out", "m"), {}),
        ("own model --recipe --references auto --budget-minutes -1", _x(
            *OWN_R, "--references", "auto", "--budget-minutes", "-1", "--out", "m"), {}),
        ("own model --recipe --references auto --budget-minutes nan", _x(
            *OWN_R, "--references", "auto", "--budget-minutes", "nan", "--out", "m"), {}),
        ("own model --recipe --references auto --budget-minutes inf", _x(
            *OWN_R, "--references", "auto", "--budget-minutes", "inf", "--out", "m"), {}),
        ("own model --recipe --references 2 --budget-minutes 1 (a budget with a count)", _x(
            *OWN_R, "--references", "2", "--budget-minutes", "1", "--out", "m"), {}),
        ("own model --recipe --reference-seed -1", _x(*OWN_R, "--references", "2", "--reference-seed", "-1",
                                                      "--out", "m"), {}),
        ("own model --recipe --reference-seed 2**63", _x(*OWN_R, "--references", "2", "--reference-seed",
                                                         str(2**63), "--out", "m"), {}),
        ("own model --recipe --reference-seed abc", _x(*OWN_R, "--references", "2", "--reference-seed", "abc",
                                                       "--out", "m"), {}),
        ("own model --population 10 (no population source)", _x(*OWN_R, "--references", "2", "--population", "10",
                                                                "--out", "m"), {}),
        ("own model --population -1", _x(*OWN_R, "--references", "2", "--population", "-1", "--out", "m"), {}),
        ("own model --nonmembers 50 (drawn from where?)", _x(*OWN_R, "--references", "2", "--nonmembers", "50",
                                                             "--out", "m"), {}),
        ("own model --recipe rec:nan (NaN reference models)", _x(*OWN, "--recipe", "rec:nan", "--references", "2",
                                                                 "--out", "m"), {"must": "rec:nan returned a network "
                                                                                          "with non-finite weights"}),
        ("own model --recipe rec:other (another architecture)", _x(*OWN, "--recipe", "rec:other", "--references",
                                                                   "2", "--out", "m"),
         {"must": "rec:other returned a network that is not --model's architecture"}),
        ("own model --recipe rec:none (returns None)", _x(*OWN, "--recipe", "rec:none", "--references", "2",
                                                          "--out", "m"), {"must": "rec:none"}),
        ("own model --recipe rec: (no function)", _x(*OWN, "--recipe", "rec:", "--references", "2", "--out", "m"),
         {}),
        ("own model --recipe rec:train with a model directory", _x(*MC, "--recipe", "rec:train", "--references",
                                                                   "2", "--out", "m"), {"must": "--recipe"}),
        ("own model --recipe --references 2, then --reference-seed 1 into it", lambda ws: [
            *OWN_R, "--references", "2", "--reference-seed", "1", "--out", "m"] if _ok(
            ws, *OWN_R, "--references", "2", "--out", "m") is None else [], {"must": "--reference-seed"}),
        ("own model --recipe --references 2, then --recipe rec:nan into it", lambda ws: [
            *OWN, "--recipe", "rec:nan", "--references", "2", "--out", "m"] if _ok(
            ws, *OWN_R, "--references", "2", "--out", "m") is None else [], {}),
        ("own model --recipe --references 2, then the same again (reused)", lambda ws: [
            *OWN_R, "--references", "2", "--out", "m"] if _ok(ws, *OWN_R, "--references", "2", "--out", "m") is None
         else [], {"expect": "accept", "out": "m"}),
        ("mc --references 2 --reference-seed 1 into memdir (seed 0's models)", _x(
            *MC, "--references", "2", "--reference-seed", "1", "--out", "memdir"), {"must": "--reference-seed"}),
        ("mc --references 4 into memdir (2 more, reused 2)", _x(*MC, "--references", "4", "--out", "memdir"),
         {"expect": "accept", "out": "memdir"}),
        ("mc --references 2 --population 10 into memdir (another population)", _x(
            *MC, "--references", "2", "--population", "10", "--out", "memdir"), {}),
        ("mc --references 2 --population 0", _x(*MC, "--references", "2", "--population", "0", "--out", "m"), {}),
        # capped at what the test split holds, as the non-members are: membership.json records count and available
        ("mc --references 2 --population 10**9", _x(*MC, "--references", "2", "--population", "1000000000", "--out",
                                                    "m"), {"expect": "accept"}),
        ("mc --references auto --budget-minutes 1e-9", _x(*MC, "--references", "auto", "--budget-minutes", "1e-9",
                                                          "--out", "m"), {"expect": "accept"}),
        ("mc --budget-minutes 1 without --references auto", _x(*MC, "--references", "2", "--budget-minutes", "1",
                                                               "--out", "m"), {}),
        ("mc --references AUTO", _x(*MC, "--references", "AUTO", "--out", "m"), {}),
        ("mc --images --no-reference-keep-weights --references 2 (settings --images does not read)", lambda ws: [
            "membership", "--model", "mc", "--images", "members.safetensors", "--references", "2",
            "--no-reference-keep-weights", "--no-progress", "--out", "m"], {}),
        ("mc --references 2 killed in the first reference model's training, rerun", *_mem_killed(0, 2)),
        ("mc --references 3 killed in the third reference model's training, rerun", *_mem_killed(2, 1)),
        ("mc --references 2 interrupted (SIGINT) in the second model, rerun", *_mem_killed(1, 1, sig="INT")),
        ("mc killed, then rerun with --reference-seed 1", lambda ws: [
            *MC, "--references", "2", "--reference-seed", "1", "--out", "m"] if _killed(
            ws, *MC, "--references", "2", "--out", "m", env={STEP_ENV: "2:KILL:1"}) is None else [],
         {"must": "--reference-seed"}),
        ("mc killed, then rerun with --population 20", lambda ws: [
            *MC, "--references", "2", "--population", "20", "--out", "m"] if _killed(
            ws, *MC, "--references", "2", "--out", "m", env={STEP_ENV: "2:KILL:1"}) is None else [], {}),
    ]
    return [("seventh-membership", n, p, kw) for n, p, kw in rows]


def _mem_killed(loop: int, step: int, *, args: list[str] | None = None, sig: str = "KILL",
                check: bool = True) -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    """Membership with reference models killed at ``step`` of its ``loop``-th training, rerun; the check compares
    it with an uninterrupted call (all but the counts of reused and trained models)."""
    base = args or [*MC, "--references", "3" if loop >= 2 else "2"]

    def prepare(ws: Path) -> list[str]:
        _ok(ws, *base, "--out", "n")
        (ws / "n").rename(ws / "ref")
        _killed(ws, *base, "--out", "n", env={STEP_ENV: f"{step}:{sig}:{loop}"})
        return [*base, "--out", "n"]

    def same(ws: Path) -> str | None:
        msg = _same("ref", "n", skip=("membership.json",))(ws)
        if msg:
            return msg
        want, got = (json.loads((ws / d / "membership.json").read_text()) for d in ("ref", "n"))
        for record in (want, got):
            record.pop("wall_time_s", None)
            for key in ("reused", "trained", "wall_time_s"):
                record.get("references", {}).pop(key, None)
        return None if want == got else "membership.json differs beyond the counts of reused and trained models"
    return prepare, {"expect": "accept", "check": same if check else None}


# -- leakage-map targets and audit --------------------------------------------------------------------------------

SWEEP_T2 = "model_dir: t2\nsteps: 4\ncandidates: 4\nsearch: {grid: {attack.lr_x: [0.01, 0.1]}}\n"


def _target_rows() -> list[Row]:
    rows: list[tuple[str, Callable, dict]] = [
        *[(f"train --n-train {v} on the pretrained head", _x(*FT_MC, "--n-train", v, "--out", "m"), {})
          for v in ("0", "-1", "13", "1.5", "nan", "abc", "", str(10**10))],
        *[(f"train --train-indices {v}", _x(*FT_MC, "--train-indices", v, "--out", "m"), {})
          for v in ("0,0", "99999", "-1", "3", "0,,1", "a,b", "0;1", "1e3", ",", str(2**70))],
        ("train --n-train 12 (the whole pool)", _x(*FT_MC, "--n-train", "12", "--out", "m"), {"expect": "accept"}),
        ("train --n-train 1", _x(*FT_MC, "--n-train", "1", "--out", "m"), {"expect": "accept"}),
        ("train --train-indices 22,0 (out of order)", _x(*FT_MC, "--train-indices", "22,0", "--out", "m"),
         {"expect": "accept"}),
        ("train --n-train 2 --train-indices 0,1 (not the draw)", _x(*FT_MC, "--n-train", "2", "--train-indices",
                                                                     "0,1", "--out", "m"), {}),
        ("train --n-train 3 --train-indices 0,1", _x(*FT_MC, "--n-train", "3", "--train-indices", "0,1", "--out",
                                                     "m"), {}),
        ("train --n-train 2 --batch-size 4 (batch beyond n)", _x(*FT_MC, "--n-train", "2", "--batch-size", "4",
                                                                 "--out", "m"), {}),
        ("train --n-train 2 --dp-batch-size 4 --dp-noise 1 (DP batch beyond n)", _x(
            *FT_MC, "--n-train", "2", "--dp-noise", "1", "--dp-batch-size", "4", "--out", "m"), {}),
        # a random pool of the fine-tuning overlaps mc's pretraining images: refused as such
        ("train --n-train 2 --selection random --data-seed 3", _x(*FT_MC, "--n-train", "2", "--selection",
                                                                  "random", "--data-seed", "3", "--out", "m"),
         {"must": "pretrained model"}),
        # valid: n of the pool from scratch too; quoted numbers are read as numbers, as in every config
        ("train --n-train 2 without --pretrained (from scratch)", _x(
            "train", *FT, "--hidden", "8", "--no-bias", "--epochs", "2", "--n-train", "2", "--out", "m"),
         {"expect": "accept"}),
        ("train config: data.n_train '2' (text)", lambda ws: [
            "train", "--config", _w(ws, "t.yaml", "data: {n_train: '2'}\n"), *FT_MC[1:], "--out", "m"],
         {"expect": "accept"}),
        ("train config: data.train_indices a mapping", lambda ws: [
            "train", "--config", _w(ws, "t.yaml", "data: {train_indices: {a: 1}}\n"), *FT_MC[1:], "--out", "m"], {}),
        ("train config: data.n_train 2.0", lambda ws: [
            "train", "--config", _w(ws, "t.yaml", "data: {n_train: 2.0}\n"), *FT_MC[1:], "--out", "m"],
         {"expect": "accept"}),
        ("train config: data.n_train 2.5", lambda ws: [
            "train", "--config", _w(ws, "t.yaml", "data: {n_train: 2.5}\n"), *FT_MC[1:], "--out", "m"], {}),
        # an attack that loads no data does not read the indices (accepted); every reader of the images refuses
        ("model.json of t2 with train_indices changed (not its draw), reconstruct", lambda ws: [
            *REC, "--steps", "2", "--model", "t2", "--out", "n"] if _json(
            ws, "t2/model.json", lambda m: m["data"].update(train_indices=[0, 1])) is None else [],
         {"expect": "accept"}),
        ("model.json of t2 with train_indices changed (not its draw), identifiability", lambda ws: [
            "identifiability", "t2", "--out", "m.json"] if _json(
            ws, "t2/model.json", lambda m: m["data"].update(train_indices=[0, 1])) is None else [],
         {"must": "changed after its training"}),
        ("model.json of t2 with train_indices changed (not its draw), membership", lambda ws: [
            "membership", "--model", "t2", "--evaluate", "--references", "0", "--nonmembers", "50", "--no-progress",
            "--out", "m"] if _json(ws, "t2/model.json", lambda m: m["data"].update(train_indices=[0, 1])) is None
            else [], {"must": "changed after its training"}),
        ("model.json of t2 with n_train 5 (indices of 2)", lambda ws: [
            *REC, "--steps", "2", "--model", "t2", "--out", "n"] if _json(
            ws, "t2/model.json", lambda m: m["data"].update(n_train=5)) is None else [], {}),
        ("model.json of t2 with n_train 0", lambda ws: [
            *REC, "--steps", "2", "--model", "t2", "--out", "n"] if _json(
            ws, "t2/model.json", lambda m: m["data"].update(n_train=0)) is None else [], {}),
        # the draw of n_train gives the same images again
        ("model.json of t2 with train_indices removed", lambda ws: [
            *REC, "--steps", "2", "--model", "t2", "--out", "n"] if _json(
            ws, "t2/model.json", lambda m: m["data"].pop("train_indices")) is None else [], {"expect": "accept"}),
        ("reconstruct the n-train target --runs 2", _rc("--runs", "2", model="t2"), {"expect": "accept"}),
        ("reconstruct the n-train target --known-n 12 (the pool, not n)", _rc("--known-n", "12", model="t2"),
         {"must": "n_train"}),
        ("reconstruct the n-train target --known-n 2", _rc("--known-n", "2", model="t2"), {"expect": "accept"}),
        ("reconstruct the indices target --init ground-truth (m = 3)", lambda ws: [
            "reconstruct", "--steps", "2", "--no-progress", "--model", "ti", "--init", "ground-truth", "--out", "n"],
         {"expect": "accept"}),
        ("reconstruct the n-train target --init ground-truth --candidates 5", _rc(
            "--init", "ground-truth", "--candidates", "5", model="t2"), {}),
        ("evaluate a run of the n-train target", lambda ws: ["evaluate", "n", "--no-progress"] if _ok(
            ws, *REC, "--steps", "2", "--model", "t2", "--out", "n") is None else [],
         {"expect": "accept", "out": "n"}),
        ("membership of the n-train target --references 0", _x(
            "membership", "--model", "t2", "--evaluate", "--references", "0", "--nonmembers", "50", "--no-progress",
            "--out", "m"), {"expect": "accept"}),
        ("identifiability of the n-train target", _x("identifiability", "t2", "--out", "m.json"),
         {"expect": "accept", "out": "m.json"}),
        ("sweep on the n-train target", lambda ws: ["sweep", "--config", _w(ws, "s.yaml", SWEEP_T2), "--out", "n",
                                                    "--no-progress"], {"expect": "accept"}),
        ("sweep grid over candidates [1, 2, 40] on the n-train target", lambda ws: [
            "sweep", "--config", _w(ws, "s.yaml", "model_dir: t2\nsteps: 2\nsearch: {grid: {candidates: [1, 2, 40]}}"
                                    "\n"), "--out", "n", "--no-progress"], {"expect": "accept"}),
        ("sweep with knowledge n 12 on the n-train target", lambda ws: [
            "sweep", "--config", _w(ws, "s.yaml", "model_dir: t2\nsteps: 2\ncandidates: 4\nknowledge: {n: 12}\n"),
            "--out", "n", "--no-progress"], {}),
        ("sweep on the n-train target killed in its second run, rerun", *_sweep_killed()),
        ("run (experiment) training --n-train 2 on a pretrained head", lambda ws: [
            "run", _w(ws, "e.yaml", "train: {data: {dataset: digits, task: 'classes:0,1,2', n_per_class: 4, "
                      "n_train: 2, normalisation: unit}, arch: {name: mlp, hidden: [8], bias: false}, loss: "
                      "cross-entropy, epochs: 2, pretrained: mc}\n"), "--out", "e", "--no-progress"],
         {"expect": "accept"}),
        ("run (experiment) training n_train 40", lambda ws: [
            "run", _w(ws, "e.yaml", "train: {data: {dataset: digits, task: 'classes:0,1,2', n_per_class: 4, "
                      "n_train: 40, normalisation: unit}, arch: {name: mlp, hidden: [8], bias: false}, loss: "
                      "cross-entropy, epochs: 2, pretrained: mc}\n"), "--out", "e", "--no-progress"], {}),
    ]
    return [("seventh-targets", n, p, kw) for n, p, kw in rows]


def _sweep_killed() -> tuple[Callable[[Path], list[str]], dict[str, Any]]:
    def prepare(ws: Path) -> list[str]:
        _w(ws, "s.yaml", SWEEP_T2.replace("steps: 4", "steps: 6"))
        args = ["sweep", "--config", "s.yaml", "--no-progress"]
        _ok(ws, *args, "--out", "n")
        (ws / "n").rename(ws / "ref")
        _killed(ws, *args, "--out", "n", env={STEP_ENV: "3:KILL:1"})
        return [*args, "--out", "n"]
    # a run's .claim names the worker process that took it (as tests/faults/test_sweep_faults.py, not compared)
    return prepare, {"expect": "accept", "check": _same("ref", "n", skip=("index.sqlite", "task.json", ".claim"))}


def _audit_rows() -> list[Row]:
    rows: list[tuple[str, Callable, dict]] = [
        ("audit --model bnft (fine-tuned batch-norm ResNet) --scale smoke --references 2", _x(
            "audit", "--model", "bnft", "--scale", "smoke", "--references", "2", "--out", "a", "--no-progress"),
         {"expect": "accept"}),
        ("audit --model bnft --references 0", _x("audit", "--model", "bnft", "--scale", "smoke", "--references",
                                                 "0", "--out", "a", "--no-progress"), {"expect": "accept"}),
        ("audit --model bnft --references -2", _x("audit", "--model", "bnft", "--scale", "smoke", "--references",
                                                  "-2", "--out", "a"), {}),
        ("audit --model bnft --budget-minutes -1", _x("audit", "--model", "bnft", "--scale", "smoke",
                                                      "--budget-minutes", "-1", "--out", "a"), {}),
        ("audit --model bnft --budget-minutes 1 --references 2", _x(
            "audit", "--model", "bnft", "--scale", "smoke", "--budget-minutes", "1", "--references", "2", "--out",
            "a"), {}),
        ("audit --budget-minutes 1 without --model", _x("audit", "--scale", "smoke", "--budget-minutes", "1", "--out",
                                                        "a"), {"must": "--model"}),
        ("audit --references 2 without --model", _x("audit", "--scale", "smoke", "--references", "2", "--out", "a"),
         {"must": "--model"}),
        ("audit --model t2 (the n-train target) --scale smoke", _x(
            "audit", "--model", "t2", "--scale", "smoke", "--out", "a", "--no-progress"), {"expect": "accept"}),
        # --resume continues what is there and starts what is not, as every command's --resume does
        ("audit --model bnft --references 0 --resume into nothing", _x(
            "audit", "--model", "bnft", "--scale", "smoke", "--references", "0", "--resume", "--out", "a",
            "--no-progress"), {"expect": "accept"}),
        ("audit --model bnft with its weights flipped", lambda ws: [
            "audit", "--model", "bnft", "--scale", "smoke", "--out", "a"] if _flip("weights.safetensors")(
            ws / "bnft") is None else [], {"must": "weights"}),
        ("audit --model bnft whose pretrained start was retrained", lambda ws: [
            "audit", "--model", "bnft", "--scale", "smoke", "--out", "a"] if _ok(
            ws, "train", *FT, "--arch", "resnet8", "--batch-norm", "--epochs", "1", "--seed", "3", "--out", "bn",
            "--overwrite") is None else [], {"must": "bn"}),
        ("audit --model bnft --scale small --config with references: 2", lambda ws: [
            "audit", "--model", "bnft", "--scale", "smoke", "--config", _w(ws, "a.yaml", "references: 2\n"),
            "--out", "a"], {}),
    ]
    return [("seventh-audit", n, p, kw) for n, p, kw in rows]


def rows() -> list[Row]:
    """Every row of the seventh trial."""
    return [*_attack_rows(), *_plugin_rows(), *_resume_rows(), *_membership_rows(), *_target_rows(), *_audit_rows()]
