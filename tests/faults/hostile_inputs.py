"""A catalogue of hostile inputs, run through the real command line and counted: the third, fifth and seventh
adversarial trials (docs/RELIABILITY.md, "Adversarial trials").

    python tests/faults/hostile_inputs.py                     # the current source (several minutes)
    python tests/faults/hostile_inputs.py --only fifth        # the fifth trial (its groups start with "fifth")
    python tests/faults/hostile_inputs.py --only interface    # issue 49's options and issue 50's plug-in faults
    python tests/faults/hostile_inputs.py --only seventh --fork  # the seventh trial (tests/faults/seventh_trial.py)
    python tests/faults/hostile_inputs.py --src /old/src      # another source tree, e.g. before a fix
    python tests/faults/hostile_inputs.py --only perm         # the trials whose group starts with "perm"
    python tests/faults/hostile_inputs.py --name manifest     # the trials whose name contains "manifest"
    python tests/faults/hostile_inputs.py --fork              # each command forked from one warm process (fast)

Every trial starts from a fresh copy of a small workspace (a trained digits model, a finished run, an
evaluated run, a sweep store, a user's own model package; ``adversarial_trials.build_workspace``),
changes it as the trial needs and runs one command in a subprocess. The ``permission`` trials run as
an unprivileged user (``runuser -u datarecon-trial``, created when absent) on a workspace that user
owns, with folders made read-only or files unreadable. Outcomes:

* ``clean``: exit 2 and one ``error: ...`` line, no file of the workspace changed;
* ``accepted as it should``: a valid (if unusual) input that ran, exit 0;
* ``data lost``: a file of the workspace outside the command's own output changed or vanished;
* ``internal error``: exit 1 "internal error", a traceback, or another exit code;
* ``wrongly accepted``: an input that must be refused ran (exit 0, or still running after the limit);
* ``refused a valid input``: exit 2 on an input that should run;
* ``resume changed files``: a resumed run that ran but differs from the uninterrupted one (a trial's ``check``).

With ``--fork`` each command runs in a child forked from this process once it has imported datarecon (its
command modules and PyTorch), with the trial's working directory first on ``sys.path`` as ``python -m`` puts
it: the same ``main(argv)`` in a fresh process image, without the interpreter's start-up and imports (about
3 s of CPU per trial otherwise). The trials that need a process of their own still get one: those run as
another user, and the plug-in trials (entry points are read once per process; the parent has read them).
``tests/faults/test_hostile_inputs.py`` runs the catalogue this way and checks each trial's expectation.

Each line printed names the trial, its outcome and the message, so the messages can be read for
``misleading`` ones (a line that names the wrong problem or a fix that would not work); ``must``
pins the words a trial's message has to contain, and a clean refusal without them is counted as
``misleading``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import adversarial_trials  # noqa: E402
import seventh_trial  # noqa: E402
from adversarial_trials import DIGITS, build_workspace  # noqa: E402

ENV: dict[str, str] = {}
#: the unprivileged user of the permission trials
USER = "datarecon-trial"
#: a hostile input is refused in seconds; one still running after this long was accepted
TIMEOUT_S = 120.0
#: outputs a command may create (a trial's ``out`` adds its own)
NEW = ("n", "m", "r", "e", "a", "s", "d", "own", "r.html", "t.csv", "p", "mem.json")

REC = ["reconstruct", "--steps", "2", "--candidates", "4", "--no-progress"]
TRAIN = ["train", *DIGITS, "--hidden", "4", "--no-bias", "--epochs", "2", "--no-progress"]
OWN = ["reconstruct", "--input-shape", "1,8,8", "--candidates", "4", "--steps", "2", "--no-progress", "--out", "own"]
EXP_TRAIN = ("train: {data: {dataset: digits, task: odd-even, n_per_class: 5}, arch: {name: mlp, hidden: [4], "
             "bias: false}, epochs: 2}\n")
SWEEP = "model_dir: model\nsteps: 2\ncandidates: 4\n"


@dataclass(frozen=True)
class Trial:
    """One hostile input: ``prepare(ws)`` changes the workspace and returns the command line.

    Attributes:
        group: what kind of input (paths, files, options, configs, ...).
        name: what was tried.
        prepare: builds the input in the workspace ``ws`` and returns the arguments of ``datarecon``.
        expect: ``refuse`` (exit 2, one line) or ``accept`` (a valid input that must run).
        must: words the refusal must contain (else it is counted ``misleading``).
        user: run as the unprivileged :data:`USER` (the permission trials).
        out: a further path the command may create or change.
        warn: ``warning: ...`` lines may come before the outcome (a broken plug-in is named in one and skipped).
        check: after a command that ran, ``check(ws)`` returns None or what differs (the seventh trial's resumes
            compared with an uninterrupted run: ``resume changed files``).
    """

    group: str
    name: str
    prepare: Callable[[Path], list[str]]
    expect: str = "refuse"
    must: str | None = None
    user: bool = False
    out: str | None = None
    warn: bool = False
    check: Callable[[Path], str | None] | None = None


def _w(ws: Path, rel: str, data: str | bytes) -> str:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return rel


def _json(ws: Path, rel: str, change: Callable[[dict], object]) -> str:
    path = ws / rel
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return str(Path(rel).parent)


def _meta(ws: Path, change: Callable[[dict], object]) -> str:
    return _json(ws, "model/model.json", change)


def _tensors(ws: Path, rel: str, change: Callable[[dict], object], *, rehash: bool = True) -> str:
    """Change a safetensors file of the workspace (and, for the model's, record its new hash)."""
    import hashlib

    import torch  # noqa: F401  (safetensors' torch backend)
    from safetensors.torch import load_file, save_file

    path = ws / rel
    tensors = load_file(str(path))
    change(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    if rehash and rel.startswith("model/"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        _meta(ws, lambda m: m["sha256"].__setitem__(path.name, digest))
    return str(Path(rel).parent)


def _link(ws: Path, rel: str, target: str) -> str:
    (ws / rel).symlink_to(target)
    return rel


def _fifo(ws: Path, rel: str) -> str:
    os.mkfifo(ws / rel)
    return rel


def _sparse(ws: Path, rel: str, size: int) -> str:
    with open(ws / rel, "wb") as fh:
        fh.truncate(size)
    return rel


def _mode(ws: Path, rel: str, mode: int) -> str:
    os.chmod(ws / rel, mode)
    return rel


def _yaml(ws: Path, rel: str, text: str) -> str:
    return _w(ws, rel, text)


def _bomb() -> str:
    lines = ["model: model", "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _evaluate_run(ws: Path) -> list[str]:
    """``evaluate run`` of a run whose record names this workspace's model (the copy a trial changed)."""
    _json(ws, "run/run.json", lambda r: r.update(model_dir=str(ws / "model")))
    return ["evaluate", "run", "--no-progress"]


def _rec(ws: Path, *args: str, model: str = "model", out: str = "n") -> list[str]:
    return [*REC, "--model", model, "--out", out, *args]


PATHS = [
    Trial("paths", "reconstruct --out is a symlink to the model folder",
          lambda ws: _rec(ws, out=_link(ws, "lnk", "model")), must="model directory"),
    Trial("paths", "reconstruct --out is a symlink loop", lambda ws: _rec(ws, out=_link(ws, "loop", "loop"))),
    Trial("paths", "reconstruct --out /dev/null", lambda ws: _rec(ws, out="/dev/null"), must="existing file"),
    Trial("paths", "reconstruct --out is a fifo", lambda ws: _rec(ws, out=_fifo(ws, "fifo"))),
    Trial("paths", "train --out inside a run folder", lambda ws: [*TRAIN, "--out", "run/m2"], must="lies inside"),
    Trial("paths", "sweep --out inside a model folder",
          lambda ws: ["sweep", "--config", _yaml(ws, "s.yaml", SWEEP), "--out", "model/s", "--no-progress"],
          must="lies inside"),
    Trial("paths", "demo --out inside a model folder", lambda ws: ["demo", "--out", "model/d", "--no-progress"],
          must="lies inside"),
    Trial("paths", "reproduce --out inside a run", lambda ws: ["reproduce", "haim2022", "--scale", "smoke", "--out",
                                                               "run/r"], must="lies inside"),
    Trial("paths", "audit --out inside a store", lambda ws: ["audit", "--scale", "smoke", "--out", "store/a"],
          must="lies inside"),
    Trial("paths", "run (experiment) --out inside a model",
          lambda ws: ["run", _yaml(ws, "e.yaml", EXP_TRAIN), "--out", "model/e", "--no-progress"], must="lies inside"),
    Trial("paths", "sweep pool --out into a model folder", lambda ws: ["sweep", "pool", "store", "--out", "model/p"],
          must="lies inside"),
    Trial("paths", "sweep pool --out is the store itself", lambda ws: ["sweep", "pool", "store", "--out", "store"]),
    Trial("paths", "report --out /dev/null", lambda ws: ["report", "evaluated", "--out", "/dev/null"],
          must="not a regular file"),
    Trial("paths", "report --out under a file", lambda ws: ["report", "evaluated", "--out",
                                                            _w(ws, "f.txt", "x") + "/r.html"]),
    Trial("paths", "report --out is a run's metrics.json", lambda ws: ["report", "evaluated", "--out",
                                                                       "evaluated/metrics.json", "--overwrite"],
          must="lies inside"),
    Trial("paths", "report --out is the run folder", lambda ws: ["report", "evaluated", "--out", "evaluated"],
          must="is a folder"),
    Trial("paths", "store export --out .txt", lambda ws: ["store", "export", "store", "--out", "t.txt"],
          must=".csv or .parquet"),
    Trial("paths", "store export --out over a user's CSV", lambda ws: ["store", "export", "store", "--out",
                                                                        _w(ws, "mine.csv", "a,b\n1,2\n"),
                                                                        "--overwrite"],
          must="not a store export datarecon wrote"),
    Trial("paths", "membership --out over the run's run.json", lambda ws: ["membership", "--model", "model",
                                                                            "--evaluate", "--out", "run/run.json",
                                                                            "--overwrite"], must="lies inside"),
    Trial("paths", "reconstruct --model is the output folder too", lambda ws: _rec(ws, out="model"),
          must="model directory"),
    Trial("paths", "--model a symlink loop", lambda ws: _rec(ws, model=_link(ws, "mloop", "mloop"))),
    Trial("paths", "--config a symlink to /dev/zero", lambda ws: _rec(ws, "--config", _link(ws, "z.yaml", "/dev/zero")),
          must="not a regular file"),
    Trial("paths", "--config of 100 MB", lambda ws: _rec(ws, "--config", _sparse(ws, "big.yaml", 100 * 2**20)),
          must="MB"),
    Trial("paths", "--config a fifo", lambda ws: _rec(ws, "--config", _fifo(ws, "c.yaml")), must="not a regular file"),
    Trial("paths", "--data-dir a symlink loop", lambda ws: ["train", "--dataset", "mnist", "--task", "odd-even",
                                                             "--n-per-class", "5", "--data-dir",
                                                             _link(ws, "dloop", "dloop"), "--out", "m"]),
    Trial("paths", "--data-dir an empty folder", lambda ws: ["train", "--dataset", "mnist", "--task", "odd-even",
                                                              "--n-per-class", "5", "--data-dir",
                                                              str(Path(_w(ws, "empty/.keep", "")).parent), "--out",
                                                              "m"], must="MNIST not found"),
    Trial("paths", "membership --images missing", lambda ws: ["membership", "--model", "model", "--images", "nope"]),
    Trial("paths", "membership --images a garbage file", lambda ws: ["membership", "--model", "model", "--images",
                                                                      _w(ws, "x.npz", b"garbage" * 10)]),
    Trial("paths", "membership --images an empty folder", lambda ws: ["membership", "--model", "model", "--images",
                                                                       str(Path(_w(ws, "imgs/.keep", "")).parent)]),
    Trial("paths", "membership --images a folder of non-images",
          lambda ws: ["membership", "--model", "model", "--images", str(Path(_w(ws, "imgs/a.png", "not a png")).parent)]),
]

FILES = [
    Trial("files", "model.json: hidden as text", lambda ws: _rec(ws, model=_meta(ws, lambda m: m["arch"].update(
        hidden=["8"])))),
    Trial("files", "model.json: sha256 of the weights removed (weights changed)",
          lambda ws: _rec(ws, model=_tensors(ws, "model/weights.safetensors", lambda t: t.update(
              {k: v * 2 for k, v in t.items()}), rehash=False) and _meta(ws, lambda m: m["sha256"].pop(
                  "weights.safetensors"))), must="records no hash"),
    Trial("files", "model.json: sha256 names /dev/zero", lambda ws: _rec(ws, model=_meta(
        ws, lambda m: m["sha256"].__setitem__("/dev/zero", "0" * 64))), must="no file of a model directory"),
    Trial("files", "model.json: format missing", lambda ws: _rec(ws, model=_meta(ws, lambda m: m.pop("format")))),
    Trial("files", "model.json: unknown dataset", lambda ws: _evaluate_run(ws)
          if _meta(ws, lambda m: m["data"].update(dataset="imagenet")) else []),
    Trial("files", "model.json: n_per_class -1", lambda ws: _rec(ws, model=_meta(
        ws, lambda m: m["data"].update(n_per_class=-1)))),
    Trial("files", "model.json: unknown normalisation", lambda ws: _rec(ws, model=_meta(
        ws, lambda m: m.update(normalisation="zscore")))),
    Trial("files", "model.json: {}", lambda ws: _rec(ws, model=str(Path(_w(ws, "model/model.json", "{}")).parent))),
    Trial("files", "model.json: a list", lambda ws: _rec(ws, model=str(Path(_w(ws, "model/model.json", "[]")).parent))),
    Trial("files", "model.json: empty", lambda ws: _rec(ws, model=str(Path(_w(ws, "model/model.json", "")).parent))),
    Trial("files", "model.json: NaN literal weight decay", lambda ws: _rec(ws, model=str(Path(_w(
        ws, "model/model.json", (ws / "model/model.json").read_text().replace('"weight_decay": 0.0',
                                                                             '"weight_decay": NaN'))).parent))),
    Trial("files", "weights.safetensors missing", lambda ws: _rec(ws) if (ws / "model/weights.safetensors").unlink()
          is None else []),
    Trial("files", "extras.safetensors missing", lambda ws: _rec(ws) if (ws / "model/extras.safetensors").unlink()
          is None else []),
    Trial("files", "weights: an extra tensor", lambda ws: _rec(ws, model=_tensors(
        ws, "model/weights.safetensors", lambda t: t.update(extra=t["1.weight"][:1].clone())))),
    Trial("files", "weights: integers", lambda ws: _rec(ws, model=_tensors(
        ws, "model/weights.safetensors", lambda t: t.update({k: v.long() for k, v in t.items()})))),
    Trial("files", "weights: float64 in a float32 model", lambda ws: _rec(ws, model=_tensors(
        ws, "model/weights.safetensors", lambda t: t.update({k: v.double() for k, v in t.items()}))),
          must="trained in float32"),
    Trial("files", "extras: input_mean NaN", lambda ws: _rec(ws, model=_tensors(
        ws, "model/extras.safetensors", lambda t: t["input_mean"].fill_(float("nan"))))),
    Trial("files", "extras: train indices out of range", lambda ws: _evaluate_run(ws)
          if _tensors(ws, "model/extras.safetensors", lambda t: t["train_indices"].fill_(10**9)) else []),
    Trial("files", "run.json: status bogus", lambda ws: ["evaluate", _json(ws, "run/run.json", lambda r: r.update(
        status="bogus")), "--no-progress"]),
    Trial("files", "run.json: model_dir missing", lambda ws: ["evaluate", _json(ws, "run/run.json", lambda r: r.pop(
        "model_dir")), "--no-progress"]),
    Trial("files", "run.json: model_dir nonexistent", lambda ws: ["evaluate", _json(ws, "run/run.json", lambda r: r.update(
        model_dir="/nowhere")), "--no-progress"]),
    Trial("files", "run.json: steps_done text", lambda ws: ["evaluate", _json(ws, "run/run.json", lambda r: r.update(
        steps_done="x")), "--no-progress"]),
    Trial("files", "candidates: x of another shape", lambda ws: ["evaluate", _tensors(
        ws, "run/candidates.safetensors", lambda t: t.update(x=t["x"].reshape(t["x"].shape[0], -1))), "--no-progress"]),
    Trial("files", "candidates: x NaN", lambda ws: ["evaluate", _tensors(
        ws, "run/candidates.safetensors", lambda t: t["x"].fill_(float("nan"))), "--no-progress"],
          must="NaN"),
    Trial("files", "candidates: labels of another length", lambda ws: ["evaluate", _tensors(
        ws, "run/candidates.safetensors", lambda t: t.update(labels=t["labels"][:1].clone())), "--no-progress"]),
    Trial("files", "candidates: x float16", lambda ws: ["evaluate", _tensors(
        ws, "run/candidates.safetensors", lambda t: t.update(x=t["x"].half())), "--no-progress"],
          expect="accept"),
    Trial("files", "candidates: a pickle", lambda ws: ["evaluate", str(Path(_w(ws, "run/candidates.safetensors",
                                                                             b"\x80\x04pickle")).parent),
                                                        "--no-progress"], must="pickle"),
    Trial("files", "checkpoint state changed, then --resume", lambda ws: _rec(
        ws, "--resume", out=_tensors(ws, "run/checkpoint/state.safetensors", lambda t: t.update(
            {k: v + 1 if v.is_floating_point() else v for k, v in t.items()}), rehash=False).split("/")[0])),
    Trial("files", "checkpoint progress.json garbage, then --resume", lambda ws: _rec(
        ws, "--resume", "--steps", "4", out=_w(ws, "run/checkpoint/progress.json", "{garbage").split("/")[0]),
          expect="accept"),
    # a line that is not JSON is a killed writer's torn line, dropped; a row of the wrong types is damage (issue 50:
    # every record report reads is checked, and the report used to draw a step "x" as a step)
    Trial("files", "history.jsonl garbage, then report", lambda ws: ["report", str(Path(_w(
        ws, "evaluated/history.jsonl", "not json\n{\"step\": 1}\n")).parent), "--out", "r.html"],
          expect="accept"),
    Trial("files", "history.jsonl: a row whose step is text, then report", lambda ws: ["report", str(Path(_w(
        ws, "evaluated/history.jsonl", "not json\n{\"step\": \"x\"}\n")).parent), "--out", "r.html"],
          must="history.jsonl is damaged or was changed by hand"),
    Trial("files", "metrics.json: count negative, then report", lambda ws: ["report", _json(
        ws, "evaluated/metrics.json", lambda m: m["headline"].update(count=-3)), "--out", "r.html"],
          must="headline.count"),
    Trial("files", "metrics.json: nearest a list, then report", lambda ws: ["report", _json(
        ws, "evaluated/metrics.json", lambda m: m.update(nearest=[])), "--out", "r.html"]),
    Trial("files", "metrics.json: threshold 5, then report", lambda ws: ["report", _json(
        ws, "evaluated/metrics.json", lambda m: m["headline"].update(threshold=5)), "--out", "r.html"]),
    Trial("files", "metrics.json: AUC -1, then report", lambda ws: ["report", _json(
        ws, "evaluated/metrics.json", lambda m: [v.update(auc=-1.0) for v in m["privacy"]["scores"].values()]),
        "--out", "r.html"]),
    Trial("files", "neighbours.safetensors garbage, then report", lambda ws: ["report", str(Path(_w(
        ws, "evaluated/neighbours.safetensors", b"garbage")).parent), "--out", "r.html"]),
    Trial("files", "subspace.safetensors garbage, then report", lambda ws: ["report", str(Path(_w(
        ws, "evaluated/subspace.safetensors", b"garbage")).parent), "--out", "r.html"]),
    Trial("files", "index.sqlite is a folder, then store list", lambda ws: ["store", "list", "store"]
          if (ws / "store/index.sqlite").unlink() is None and (ws / "store/index.sqlite").mkdir() is None else []),
    Trial("files", "a store run's run.json garbage, then store rebuild", lambda ws: ["store", "rebuild", "store"]
          if _w(ws, str(next(d for d in (ws / "store/runs").iterdir() if d.is_dir()).relative_to(ws) / "run.json"),
                "{garbage") else [],
          expect="accept"),
    Trial("files", "a sweep record garbage, then store rebuild", lambda ws: ["store", "rebuild", "store"]
          if _w(ws, str(next(p for p in (ws / "store/sweeps").iterdir() if p.suffix == ".json").relative_to(ws)),
                "{garbage") else [],
          expect="accept"),
    Trial("files", "experiment.json garbage, then the experiment again", lambda ws: ["run", _yaml(
        ws, "e.yaml", EXP_TRAIN), "--out", str(Path(_w(ws, "ex/experiment.json", "{garbage")).parent),
        "--no-progress"]),
]

OPTIONS = [
    Trial("options", "--steps -1", lambda ws: _rec(ws, "--steps", "-1")),
    Trial("options", "--steps 1.5", lambda ws: _rec(ws, "--steps", "1.5")),
    Trial("options", "--candidates -3", lambda ws: _rec(ws, "--candidates", "-3")),
    Trial("options", "--seed -1", lambda ws: _rec(ws, "--seed", "-1")),
    Trial("options", "--lr-x 0", lambda ws: _rec(ws, "--lr-x", "0")),
    Trial("options", "--lr-x nan", lambda ws: _rec(ws, "--lr-x", "nan")),
    Trial("options", "--lr-x inf", lambda ws: _rec(ws, "--lr-x", "inf")),
    Trial("options", "--lambda-min -1", lambda ws: _rec(ws, "--lambda-min", "-1")),
    Trial("options", "--alpha 0", lambda ws: _rec(ws, "--alpha", "0")),
    Trial("options", "--init-scale -1", lambda ws: _rec(ws, "--init-scale", "-1")),
    Trial("options", "--init-scale nan", lambda ws: _rec(ws, "--init-scale", "nan")),
    Trial("options", "train --dtype float16", lambda ws: [*TRAIN, "--dtype", "float16", "--out", "m"]),
    Trial("options", "train --epochs -5", lambda ws: [*TRAIN, "--epochs", "-5", "--out", "m"]),
    Trial("options", "train --n-per-class 0", lambda ws: ["train", "--dataset", "digits", "--task", "odd-even",
                                                          "--n-per-class", "0", "--out", "m"]),
    Trial("options", "train --n-per-class 100000 (digits has fewer)",
          lambda ws: ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "100000", "--out", "m"]),
    Trial("options", "train --hidden 0", lambda ws: [*TRAIN, "--hidden", "0", "--out", "m"]),
    Trial("options", "train --hidden 8,,8", lambda ws: [*TRAIN, "--hidden", "8,,8", "--out", "m"]),
    Trial("options", "train --hidden 1e3", lambda ws: [*TRAIN, "--hidden", "1e3", "--out", "m"]),
    Trial("options", "train --task classes:0,0", lambda ws: ["train", "--dataset", "digits", "--task", "classes:0,0",
                                                             "--n-per-class", "5", "--out", "m"]),
    Trial("options", "train --task classes:0,99", lambda ws: ["train", "--dataset", "digits", "--task",
                                                              "classes:0,99", "--n-per-class", "5", "--out", "m"]),
    Trial("options", "train --loss cross-entropy on a binary task", lambda ws: [*TRAIN, "--loss", "cross-entropy",
                                                                              "--out", "m"]),
    Trial("options", "train --weight-decay -1", lambda ws: [*TRAIN, "--weight-decay", "-1", "--out", "m"]),
    Trial("options", "train --momentum 1", lambda ws: [*TRAIN, "--momentum", "1", "--out", "m"]),
    Trial("options", "train --optimizer bogus", lambda ws: [*TRAIN, "--optimizer", "bogus", "--out", "m"]),
    Trial("options", "train --schedule bogus", lambda ws: [*TRAIN, "--schedule", "bogus", "--out", "m"]),
    Trial("options", "train --max-lr-factor 0.5", lambda ws: [*TRAIN, "--max-lr-factor", "0.5", "--out", "m"]),
    Trial("options", "train --max-lr-factor abc", lambda ws: [*TRAIN, "--max-lr-factor", "abc", "--out", "m"]),
    Trial("options", "train --batch-size 0", lambda ws: [*TRAIN, "--batch-size", "0", "--out", "m"]),
    Trial("options", "train --batch-size 1000 (n = 10)", lambda ws: [*TRAIN, "--batch-size", "1000", "--out", "m"],
          must="batch"),
    Trial("options", "train --checkpoint-every -1", lambda ws: [*TRAIN, "--checkpoint-every", "-1", "--out", "m"]),
    Trial("options", "train --log-every 0", lambda ws: [*TRAIN, "--log-every", "0", "--out", "m"]),
    Trial("options", "--runs 0", lambda ws: _rec(ws, "--runs", "0")),
    Trial("options", "--runs -2", lambda ws: _rec(ws, "--runs", "-2")),
    Trial("options", "--runs 1000000", lambda ws: _rec(ws, "--runs", "1000000")),
    Trial("options", "--batch-mode bogus --runs 2", lambda ws: _rec(ws, "--runs", "2", "--batch-mode", "bogus")),
    Trial("options", "evaluate --sweep --top 0", lambda ws: ["evaluate", "--sweep", "store", "--top", "0",
                                                             "--no-progress"]),
    Trial("options", "evaluate --exact-up-to -1", lambda ws: ["evaluate", "run", "--exact-up-to", "-1",
                                                              "--no-progress"]),
    Trial("options", "evaluate --top-k 0", lambda ws: ["evaluate", "run", "--top-k", "0", "--no-progress"]),
    Trial("options", "evaluate --metric bogus", lambda ws: ["evaluate", "run", "--metric", "bogus", "--no-progress"]),
    Trial("options", "evaluate --window bogus", lambda ws: ["evaluate", "run", "--window", "bogus", "--no-progress"]),
    Trial("options", "evaluate --assignment bogus", lambda ws: ["evaluate", "run", "--assignment", "bogus",
                                                                "--no-progress"]),
    Trial("options", "evaluate --against train,,noise", lambda ws: ["evaluate", "run", "--against", "train,,noise",
                                                                    "--no-progress"], expect="accept"),
    Trial("options", "evaluate --against ,", lambda ws: ["evaluate", "run", "--against", ",", "--no-progress"]),
    Trial("options", "membership --fpr 0", lambda ws: ["membership", "--model", "model", "--images",
                                                       "model/extras.safetensors", "--fpr", "0"]),
    Trial("options", "membership --fpr 1.5", lambda ws: ["membership", "--model", "model", "--evaluate", "--fpr",
                                                         "1.5"]),
    Trial("options", "membership --fpr nan", lambda ws: ["membership", "--model", "model", "--evaluate", "--fpr",
                                                         "nan"]),
    Trial("options", "membership --known-n 0", lambda ws: ["membership", "--model", "model", "--evaluate",
                                                           "--known-n", "0"]),
    Trial("options", "membership --known-n 10000000", lambda ws: ["membership", "--model", "model", "--evaluate",
                                                                  "--known-n", "10000000"]),
    Trial("options", "--known-init seed:-1", lambda ws: _rec(ws, "--known-init", "seed:-1")),
    Trial("options", "--known-init seed:abc", lambda ws: _rec(ws, "--known-init", "seed:abc")),
    Trial("options", "--known-init a missing file", lambda ws: _rec(ws, "--known-init", "nope.safetensors")),
    Trial("options", "--known-init seed:1 (the model was trained from seed 0)",
          lambda ws: _rec(ws, "--known-init", "seed:1"), must="not"),
    Trial("options", "--known-recipe bogus", lambda ws: _rec(ws, "--method", "dynamics", "--known-recipe", "bogus")),
    Trial("options", "sweep --workers 0", lambda ws: ["sweep", "--config", _yaml(ws, "s.yaml", SWEEP), "--out", "s",
                                                      "--workers", "0"]),
    Trial("options", "sweep --backend bogus", lambda ws: ["sweep", "--config", _yaml(ws, "s.yaml", SWEEP), "--out",
                                                          "s", "--backend", "bogus"]),
    Trial("options", "reproduce an unknown paper", lambda ws: ["reproduce", "nobody2030", "--out", "r"]),
    Trial("options", "reproduce --scale bogus", lambda ws: ["reproduce", "haim2022", "--scale", "bogus", "--out", "r"]),
    Trial("options", "audit --scale bogus", lambda ws: ["audit", "--scale", "bogus", "--out", "a"]),
    Trial("options", "audit --threads 100000", lambda ws: ["audit", "--scale", "smoke", "--threads", "100000",
                                                           "--out", "a"]),
    Trial("options", "demo --steps 0", lambda ws: ["demo", "--steps", "0", "--out", "d"]),
    Trial("options", "demo --seed -1", lambda ws: ["demo", "--seed", "-1", "--out", "d"]),
    Trial("options", "examples: an unknown name", lambda ws: ["examples", "nope.yaml"]),
    Trial("options", "data download: an unknown dataset", lambda ws: ["data", "download", "imagenet"]),
    Trial("options", "store list --limit 0", lambda ws: ["store", "list", "store", "--limit", "0"]),
    Trial("options", "store list --sort with SQL", lambda ws: ["store", "list", "store", "--sort", "key; DROP TABLE"]),
    Trial("options", "report with no runs", lambda ws: ["report", "--out", "r.html"]),
    Trial("options", "--set attack.=1", lambda ws: _rec(ws, "--set", "attack.=1")),
    Trial("options", "--set init.name=bogus", lambda ws: _rec(ws, "--set", "init.name=bogus")),
    Trial("options", "--set lr_x=[1,2]", lambda ws: _rec(ws, "--set", "lr_x=[1,2]")),
    Trial("options", "--set with a YAML python tag", lambda ws: _rec(ws, "--set", "lr_x=!!python/object/apply:os.getpid []")),
    Trial("options", "--seed 2**63", lambda ws: _rec(ws, "--seed", str(2**63))),
    Trial("options", "reproduce --threads -5", lambda ws: ["reproduce", "haim2022", "--threads", "-5", "--out", "r"]),
    Trial("options", "--device cuda:0 without a GPU", lambda ws: _rec(ws, "--device", "cuda:0")),
    Trial("options", "--device cuda:abc", lambda ws: _rec(ws, "--device", "cuda:abc")),
    Trial("options", "--device CPU", lambda ws: _rec(ws, "--device", "CPU")),
    Trial("options", "own model: os:getcwd as the factory", lambda ws: [*OWN, "--model", "os:getcwd", "--weights",
                                                                       "net.safetensors"]),
    Trial("options", "own model: a missing package", lambda ws: [*OWN, "--model", "nopkg_xyz:make", "--weights",
                                                                "net.safetensors"]),
    Trial("options", "own model: the factory is not callable", lambda ws: [*OWN, "--model", "nets:sys", "--weights",
                                                                          "net.safetensors"]),
    Trial("options", "own model: --input-shape 0,8,8", lambda ws: [*OWN, "--model", "nets:make", "--weights",
                                                                  "net.safetensors", "--input-shape", "0,8,8"]),
    Trial("options", "own model: --input-shape a,b", lambda ws: [*OWN, "--model", "nets:make", "--weights",
                                                                "net.safetensors", "--input-shape", "a,b"]),
    Trial("options", "own model: --value-range 1,0", lambda ws: [*OWN, "--model", "nets:make", "--weights",
                                                                "net.safetensors", "--value-range", "1,0"]),
    Trial("options", "own model: --weights a folder", lambda ws: [*OWN, "--model", "nets:make", "--weights", "model"]),
    Trial("options", "own model: --loss bogus", lambda ws: [*OWN, "--model", "nets:make", "--weights",
                                                           "net.safetensors", "--loss", "bogus"]),
    # a model directory's weights of the factory's own shapes fit it: nothing can tell them apart, so it runs
    Trial("options", "own model: weights of another model of the same shapes",
          lambda ws: [*OWN, "--model", "nets:make", "--weights", "model/weights.safetensors"], expect="accept"),
]

CONFIGS = [
    Trial("configs", "run file: a key given twice", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\nseed: 1\nseed: 2\n"), "--out", "n"], must="given twice"),
    Trial("configs", "run file: an attack key given twice", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\nattack:\n  steps: 100\n  steps: 2\n"), "--out", "n"], must="given twice"),
    Trial("configs", "run file: YAML alias bomb", lambda ws: ["reconstruct", "--config", _yaml(ws, "c.yaml", _bomb()),
                                                             "--out", "n"], must="expands to more than"),
    Trial("configs", "run file: .json suffix", lambda ws: ["reconstruct", "--config", _yaml(ws, "c.json", "{}"),
                                                          "--out", "n"]),
    Trial("configs", "run file: empty", lambda ws: ["reconstruct", "--config", _yaml(ws, "c.yaml", ""), "--out", "n"],
          must="--model"),
    Trial("configs", "run file: a list", lambda ws: ["reconstruct", "--config", _yaml(ws, "c.yaml", "- a\n"),
                                                    "--out", "n"]),
    Trial("configs", "run file: TOML that does not parse", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.toml", "model = \n"), "--out", "n"]),
    Trial("configs", "run file: model is a run", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: run\n"), "--out", "n"], must="run directory"),
    Trial("configs", "run file: attack.method bogus", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\nattack: {method: bogus}\n"), "--out", "n"]),
    Trial("configs", "run file: init not a mapping", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\ninit: gaussian\n"), "--out", "n"]),
    Trial("configs", "run file: candidates true", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\ncandidates: true\n"), "--out", "n"], must="true/false"),
    Trial("configs", "run file: seed 1.5", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\nseed: 1.5\n"), "--out", "n"]),
    Trial("configs", "run file: non-string keys", lambda ws: ["reconstruct", "--config", _yaml(
        ws, "c.yaml", "model: model\n1: 2\n"), "--out", "n"]),
    Trial("configs", "experiment: model a file", lambda ws: ["run", _yaml(ws, "e.yaml", f"model: {_w(ws, 'f.txt', 'x')}\n"
                                                                          "attack: {attack: {method: kkt, steps: 2}}\n"),
                                                              "--out", "e", "--no-progress"]),
    Trial("configs", "experiment: train and model both", lambda ws: ["run", _yaml(
        ws, "e.yaml", EXP_TRAIN + "model: model\n"), "--out", "e", "--no-progress"]),
    Trial("configs", "experiment: report without evaluate", lambda ws: ["run", _yaml(
        ws, "e.yaml", EXP_TRAIN + "evaluate: null\n"), "--out", "e", "--no-progress"]),
    Trial("configs", "experiment: epochs true", lambda ws: ["run", _yaml(
        ws, "e.yaml", EXP_TRAIN.replace("epochs: 2", "epochs: true")), "--out", "e", "--no-progress"],
          must="true/false"),
    Trial("configs", "experiment: a rerun with another file into the same folder", lambda ws: ["run", _yaml(
        ws, "e2.yaml", EXP_TRAIN.replace("epochs: 2", "epochs: 3")), "--out", "ex", "--no-progress"]
        if _w(ws, "ex/experiment.json", json.dumps({"config_hash": "other", "stages": {}})) else []),
    Trial("configs", "sweep: budget 0", lambda ws: ["sweep", "--config", _yaml(ws, "s.yaml", SWEEP + "budget: 0\n"),
                                                   "--out", "s"]),
    Trial("configs", "sweep: seeds 0", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "search: {seeds: 0}\n"), "--out", "s"]),
    Trial("configs", "sweep: unknown distribution", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "search: {random: {attack.lr_x: {dist: gamma}}}\n"), "--out", "s"]),
    Trial("configs", "sweep: grid key of no section", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "search: {grid: {foo.bar: [1, 2]}}\n"), "--out", "s"]),
    Trial("configs", "sweep: empty grid list", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "search: {grid: {attack.lr_x: []}}\n"), "--out", "s"]),
    Trial("configs", "sweep: max_retries -1", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "max_retries: -1\n"), "--out", "s"]),
    Trial("configs", "sweep: num_cpus 0", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "resources: {num_cpus: 0}\n"), "--out", "s"]),
    Trial("configs", "sweep: model_dir a run", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP.replace("model_dir: model", "model_dir: run")), "--out", "s"], must="run directory"),
    Trial("configs", "sweep: grid of 10^5 x 10 (one million runs)", lambda ws: ["sweep", "--config", _yaml(
        ws, "s.yaml", SWEEP + "search:\n  grid:\n    attack.lr_x: [" + ", ".join(str(1e-3 + i * 1e-9) for i in range(
            100_000)) + "]\n    attack.alpha: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"), "--out", "s"],
          must="expands to"),
    Trial("configs", "audit: an unknown key", lambda ws: ["audit", "--scale", "smoke", "--out", "a", "--config",
                                                         _yaml(ws, "a.yaml", "bogus: 1\n")]),
    Trial("configs", "demo: a config with an unknown key", lambda ws: ["demo", "--out", "d", "--config",
                                                                      _yaml(ws, "d.yaml", "bogus: 1\n")]),
    Trial("configs", "train: a config key given twice", lambda ws: ["train", "--out", "m", "--config", _yaml(
        ws, "t.yaml", "data: {dataset: digits, task: odd-even, n_per_class: 5}\nepochs: 3\nepochs: 4\n")],
          must="given twice"),
]

STATE = [
    Trial("state", "train --overwrite a model with a run inside it (from an earlier version)",
          lambda ws: [*TRAIN, "--out", "model", "--overwrite"] if (shutil.copytree(ws / "run", ws / "model/sub")
                                                                     and _w(ws, "model/.datarecon-manifest", (
                                                                         ws / "model/.datarecon-manifest").read_text()
                                                                         + "sub\n")) else [],
          must="it holds 'sub', which another datarecon command wrote there"),
    Trial("state", "reconstruct --overwrite a folder holding a user's .tmp-named file",
          lambda ws: _rec(ws, "--overwrite", out=str(Path(_w(ws, "run/.run.json.backup1.tmp", "mine")).parent)),
          must="which datarecon did not write"),
    Trial("state", "evaluate a run and a model (validated first)", lambda ws: ["evaluate", "evaluated", "model",
                                                                              "--no-progress"],
          must="model directory"),
    Trial("state", "report a run twice via a symlink", lambda ws: ["report", "evaluated", _link(ws, "ev2", "evaluated"),
                                                                  "--out", "r.html"], must="given twice"),
    Trial("state", "resume a finished run with a larger --steps", lambda ws: _rec(ws, "--resume", "--steps", "4",
                                                                                 out="run"), expect="accept"),
    Trial("state", "resume a run against another model's copy", lambda ws: _rec(
        ws, "--resume", out="run", model=_meta(ws, lambda m: m.update(weight_decay=0.5)))),
    Trial("state", "store rebuild of a user's folder", lambda ws: ["store", "rebuild", str(Path(_w(
        ws, "home/notes.txt", "mine")).parent)], must="not a results store"),
    Trial("state", "evaluate --sweep of a user's folder", lambda ws: ["evaluate", "--sweep", str(Path(_w(
        ws, "home/notes.txt", "mine")).parent), "--no-progress"], must="not a results store"),
    Trial("state", "sweep pool of a store with no finished run", lambda ws: ["sweep", "pool", str(Path(_w(
        ws, "s0/runs/.keep", "")).parent.parent)]),
    Trial("state", "train --out . in a folder holding a model", lambda ws: [*TRAIN, "--out", ".", "--overwrite"]),
]


def _perm(name: str, prepare: Callable[[Path], list[str]], must: str | None = None,
          expect: str = "refuse", out: str | None = None) -> Trial:
    return Trial("permission", name, prepare, expect=expect, must=must, user=True, out=out)


PERMISSIONS = [
    _perm("--out in a read-only folder", lambda ws: _rec(ws, out=_mode(ws, "ro", 0o555) + "/x")
          if (ws / "ro").mkdir() is None else [], must="cannot write"),
    _perm("model.json unreadable", lambda ws: _rec(ws) if _mode(ws, "model/model.json", 0) else [],
          must="model.json"),
    _perm("the model folder unreadable", lambda ws: _rec(ws) if _mode(ws, "model", 0) else [], must="model"),
    _perm("weights unreadable", lambda ws: _rec(ws) if _mode(ws, "model/weights.safetensors", 0) else [],
          must="weights.safetensors"),
    _perm("--config unreadable", lambda ws: _rec(ws, "--config", _mode(ws, _yaml(ws, "c.yaml", "seed: 1\n"), 0)),
          must="c.yaml"),
    _perm("report --out in a read-only folder", lambda ws: ["report", "evaluated", "--out",
                                                            _mode(ws, str(Path(_w(ws, "ro/.keep", "")).parent),
                                                                  0o555) + "/r.html"], must="cannot write"),
    _perm("evaluate a read-only run folder", lambda ws: ["evaluate", _mode(ws, "run", 0o555), "--no-progress"],
          must="cannot write"),
    _perm("--resume a run whose checkpoint folder is read-only",
          lambda ws: _rec(ws, "--resume", "--steps", "4", out="run") if _mode(ws, "run/checkpoint", 0o555) else [],
          must="cannot write"),
    _perm("store list of an unreadable store", lambda ws: ["store", "list", _mode(ws, "store", 0)]),
    _perm("DATARECON_DATA unreadable", lambda ws: ["train", "--dataset", "mnist", "--task", "odd-even",
                                                   "--n-per-class", "5", "--data-dir",
                                                   _mode(ws, str(Path(_w(ws, "data/mnist/x", "x")).parent.parent),
                                                         0), "--out", "m"]),
    _perm("--overwrite a run folder the user cannot change", lambda ws: _rec(ws, "--overwrite", out=_mode(
        ws, "run", 0o555)), must="cannot"),
    _perm("train into a nested path under a read-only folder", lambda ws: [*TRAIN, "--out", _mode(
        ws, str(Path(_w(ws, "ro/.keep", "")).parent), 0o555) + "/a/b/c"], must="cannot write"),
    _perm("sweep into a read-only store", lambda ws: ["sweep", "--config", _yaml(ws, "s.yaml", SWEEP), "--out",
                                                      _mode(ws, "store", 0o555), "--no-progress"], must="cannot"),
    _perm("membership --out in a read-only folder", lambda ws: ["membership", "--model", "model", "--evaluate",
                                                                "--out", _mode(ws, str(Path(_w(
                                                                    ws, "ro/.keep", "")).parent), 0o555) + "/m.json"],
          must="cannot write"),
    _perm("a lock file the user cannot open", lambda ws: _rec(ws, "--resume", "--steps", "4", out="run")
          if _mode(ws, _w(ws, "run/.datarecon-lock", "{}"), 0o400) else []),
    _perm("history.jsonl read-only, then --resume", lambda ws: _rec(ws, "--resume", "--steps", "4", out="run")
          if _mode(ws, "run/history.jsonl", 0o444) else [], expect="accept"),
    # --overwrite of datarecon's own run replaces it (its files are the command's output), manifest or not
    _perm("the manifest read-only, then --overwrite", lambda ws: _rec(ws, "--overwrite", out="run")
          if _mode(ws, "run/.datarecon-manifest", 0o444) else [], expect="accept", out="run"),
    _perm("an unreadable user file inside a run, then --overwrite", lambda ws: _rec(ws, "--overwrite", out="run")
          if _mode(ws, _w(ws, "run/secret.txt", "mine"), 0) else [], must="secret.txt"),
]

# -- the fifth trial (issue 46 item 3): priors, labels, the probe, train-mode batch norm, the membership
# package and plug-ins. Its trials use the extra models of :func:`build_fifth_extras` (a multiclass MLP ``mc``
# and its fine-tuning ``ft``, a ResNet-8 with batch norm ``bn`` and its fine-tuning ``bnft``, a membership
# folder ``memdir`` of ``mc`` with two reference models).
FT_DATA = ["--dataset", "digits", "--task", "classes:0,1,2", "--n-per-class", "4", "--loss", "cross-entropy",
           "--normalisation", "unit", "--no-progress"]
TRAIN_BN = ["train", *FT_DATA, "--arch", "resnet8", "--batch-norm", "--epochs", "1"]
TRAIN_MC = ["train", *FT_DATA, "--hidden", "8", "--no-bias", "--epochs", "2"]
MEM = ["membership", "--model", "mc", "--evaluate", "--references", "0", "--nonmembers", "50", "--no-progress"]
OWN_MEM = ["membership", "--model", "nets:make", "--weights", "net.safetensors", "--input-shape", "1,8,8",
           "--no-progress"]


def build_fifth_extras(ws: Path) -> None:
    """The fifth trial's models and membership folder, added to the pristine workspace."""
    steps = [
        ["train", *FT_DATA, "--hidden", "8", "--no-bias", "--epochs", "5", "--skip-per-class", "10", "--out", "mc"],
        ["train", *FT_DATA, "--hidden", "8", "--no-bias", "--epochs", "5", "--pretrained", "mc", "--out", "ft"],
        ["train", *FT_DATA, "--arch", "resnet8", "--batch-norm", "--epochs", "2", "--skip-per-class", "10", "--out",
         "bn"],
        ["train", *FT_DATA, "--arch", "resnet8", "--batch-norm", "--epochs", "2", "--pretrained", "bn", "--out",
         "bnft"],
        ["membership", "--model", "mc", "--evaluate", "--references", "2", "--nonmembers", "50", "--no-progress",
         "--out", "memdir"],
        ["report", "memdir", "--out", "memdir.html"],
    ]
    for args in steps:
        res = adversarial_trials.cli(*args, cwd=ws)
        assert res.returncode == 0, (args, res.stderr[-2000:])
    code = ("import torch; from safetensors.torch import load_file, save_file; torch.manual_seed(0); "
            "save_file({'x': torch.rand(6, 1, 8, 8), 'y': torch.tensor([0., 1, 0, 1, 0, 1])}, 'members.safetensors'); "
            "save_file({'x': torch.rand(6, 1, 8, 8), 'y': torch.tensor([0., 1, 0, 1, 0, 1])}, 'others.safetensors'); "
            "save_file({'x': torch.rand(6, 64), 'y': torch.tensor([0., 1, 0, 1, 0, 1])}, 'flat.safetensors'); "
            "save_file({'x': torch.rand(6, 1, 8, 8), 'y': torch.tensor([0., 1])}, 'short.safetensors'); "
            "m = load_file('members.safetensors'); o = load_file('others.safetensors'); "
            "save_file({'x': torch.cat([m['x'][:3], o['x'][3:]]), 'y': torch.cat([m['y'][:3], o['y'][3:]])}, "
            "'mixed.safetensors')")
    subprocess.run([sys.executable, "-c", code], cwd=ws, check=True, env=ENV)


def _rc(*args: str, model: str = "model", out: str = "n") -> Callable[[Path], list[str]]:
    """A reconstruct trial's command (steps 2, candidates 4) on ``model``."""
    return lambda ws: [*REC, "--model", model, "--out", out, *args]


def _cfg(text: str, *args: str, name: str = "c.yaml") -> Callable[[Path], list[str]]:
    """``reconstruct --config FILE`` of a run file holding ``text``."""
    return lambda ws: ["reconstruct", "--config", _yaml(ws, name, text), "--out", "n", "--no-progress", "--steps", "2",
                       "--candidates", "4", *args]


def _x(*argv: str) -> Callable[[Path], list[str]]:
    return lambda ws: list(argv)


def _plugin(ws: Path, entry_points: str, code: str = "", *, name: str = "hostile_plugin") -> None:
    """A plug-in package in the working directory (on the command's sys.path): ``NAME.py`` holding ``code`` and
    an installed distribution's metadata declaring ``entry_points`` (entry_points.txt text)."""
    _w(ws, f"{name}.py", code)
    _w(ws, f"{name}-0.1.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    _w(ws, f"{name}-0.1.dist-info/entry_points.txt", entry_points)


def _plug(entry_points: str, code: str, argv: list[str]) -> Callable[[Path], list[str]]:
    def prepare(ws: Path) -> list[str]:
        _plugin(ws, entry_points, code)
        return argv
    prepare.plugin = True  # type: ignore[attr-defined]  (entry points are read once per process: :func:`_needs_a_process`)
    return prepare


PLUG_ATTACK = """from typing import ClassVar
import torch.nn.functional as F
from datarecon.attacks.base import Attack, AttackConfig


class Inv(Attack):
    name: ClassVar[str] = "inv"
    config_cls: ClassVar[type] = AttackConfig

    def objective(self, target, prior, x):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean()}


class Wrong(Inv):
    name: ClassVar[str] = "other"


class Boom(Inv):
    name: ClassVar[str] = "boom"

    def objective(self, target, prior, x):
        raise RuntimeError("the plug-in's objective failed")


class Nan(Inv):
    name: ClassVar[str] = "nanloss"

    def objective(self, target, prior, x):
        return {"loss": (x * float("nan")).sum()}
"""
PLUG_SIGNAL = """import torch
from datarecon.attacks.mia import SignalDef


def _boom(view):
    raise RuntimeError("the plug-in's score failed")


BOOM = SignalDef("black-box", "raises", score=_boom)
SHORT = SignalDef("black-box", "one score too few", score=lambda v: torch.zeros(max(len(v.y) - 1, 0)))
NAN = SignalDef("black-box", "NaN scores", score=lambda v: torch.full((len(v.y),), float("nan")))
NOSCORE = SignalDef("black-box", "no score")
NOTDEF = 42
"""
REC_MODEL = [*REC, "--model", "model", "--out", "n"]


def _t(group: str, name: str, prepare: Callable[[Path], list[str]], **kw) -> Trial:
    return Trial("fifth-" + group, name, prepare, **kw)


FIFTH_PRIORS = [
    _t("priors", "--feature-stats-weight -1", _rc("--feature-stats-weight", "-1", model="bn")),
    _t("priors", "--feature-stats-weight nan", _rc("--feature-stats-weight", "nan", model="bn")),
    _t("priors", "--feature-stats-weight inf", _rc("--feature-stats-weight", "inf", model="bn")),
    _t("priors", "--feature-stats-weight abc", _rc("--feature-stats-weight", "abc", model="bn")),
    _t("priors", "--feature-stats-weight '' ", _rc("--feature-stats-weight", "", model="bn")),
    _t("priors", "--feature-stats-weight 1 on an MLP (no batch norm)", _rc("--feature-stats-weight", "1"),
       must="batch-norm"),
    _t("priors", "--feature-stats-weight 1 on a ResNet without batch norm... of your own (nets:make)",
       lambda ws: [*OWN, "--model", "nets:make", "--weights", "net.safetensors", "--feature-stats-weight", "1"],
       must="batch-norm"),
    _t("priors", "--feature-stats-weight 1 on a ResNet with batch norm", _rc("--feature-stats-weight", "1",
                                                                             model="bn"), expect="accept"),
    _t("priors", "--feature-stats-weight 0 on an MLP", _rc("--feature-stats-weight", "0"), expect="accept"),
    _t("priors", "--feature-stats-weight 1e300 on batch norm", _rc("--feature-stats-weight", "1e300", model="bn"),
       must="beyond the range of float32"),
    _t("priors", "--box-weight 1e300", _rc("--box-weight", "1e300"), must="beyond the range of float32"),
    _t("priors", "--tv-weight 1e39", _rc("--tv-weight", "1e39"), must="beyond the range of float32"),
    _t("priors", "--group-weight 1e300 --runs 2", _rc("--group-weight", "1e300", "--runs", "2"),
       must="beyond the range of float32"),
    _t("priors", "--box-weight 1e300 --dtype float64 (in its range)", _rc("--box-weight", "1e300", "--dtype", "float64"),
       must="diverged"),
    # since issue 49 bilevel weighs the feature statistics (its config is an AttackConfig): this is refused for the
    # target's missing weight decay, and the interface row with --weight-decay-override runs
    _t("priors", "--feature-stats-weight 1 --method bilevel", _rc("--feature-stats-weight", "1", "--method",
                                                                  "bilevel", model="bn"), must="bilevel"),
    # accepted since issue 49: gradnorm's priors are the interface's, so the feature statistics are added (on d8472df
    # it ran with the loss unchanged and no feature_stats metric: accepted, but silently)
    _t("priors", "--feature-stats-weight 1 --method gradnorm on batch norm",
       _rc("--feature-stats-weight", "1", "--method", "gradnorm", model="bn"), expect="accept"),
    _t("priors", "--feature-stats-weight 1 --method decoreco on the fine-tuned ResNet",
       _rc("--feature-stats-weight", "1", "--method", "decoreco", model="bnft"), expect="accept"),
    _t("priors", "--feature-stats-weight 1 --method dynamics, known start, on the fine-tuned ResNet",
       _rc("--feature-stats-weight", "1", "--method", "dynamics", "--known-init", "pretrained", "--known-recipe",
           "model", "--candidates", "12", model="bnft"),
       expect="accept"),
    _t("priors", "--group-weight 1 without --runs", _rc("--group-weight", "1"), must="--runs"),
    _t("priors", "--group-weight 1 --runs 1", _rc("--group-weight", "1", "--runs", "1"), must="--runs"),
    _t("priors", "--group-weight 1 --runs 2", _rc("--group-weight", "1", "--runs", "2"), expect="accept"),
    _t("priors", "--group-weight 1 --runs 2 --batch-mode looped", _rc("--group-weight", "1", "--runs", "2",
                                                                      "--batch-mode", "looped"), must="looped"),
    _t("priors", "--group-weight 1 --runs 2 --batch-mode batched", _rc("--group-weight", "1", "--runs", "2",
                                                                       "--batch-mode", "batched"), expect="accept"),
    _t("priors", "--group-weight -1 --runs 2", _rc("--group-weight", "-1", "--runs", "2")),
    _t("priors", "--group-weight nan --runs 2", _rc("--group-weight", "nan", "--runs", "2")),
    _t("priors", "--group-weight inf --runs 2", _rc("--group-weight", "inf", "--runs", "2")),
    _t("priors", "--group-weight one --runs 2", _rc("--group-weight", "one", "--runs", "2")),
    _t("priors", "--group-weight 1e-300 --runs 2", _rc("--group-weight", "1e-300", "--runs", "2"), expect="accept"),
    _t("priors", "--group-weight 1 --runs 2 --method bilevel", _rc("--group-weight", "1", "--runs", "2", "--method",
                                                                   "bilevel"), must="bilevel"),
    _t("priors", "--group-weight 1 --runs 2 on batch norm with the feature prior",
       _rc("--group-weight", "1", "--feature-stats-weight", "1", "--runs", "2", model="bn"), expect="accept"),
    _t("priors", "--group-weight 1 --runs 2 --resume of a single run", _rc("--group-weight", "1", "--runs", "2",
                                                                           "--resume", out="run"),
       must="holds a single kkt run"),
    _t("priors", "--runs 2 --resume of a single run (its candidates replaced by a pool)", _rc(
        "--runs", "2", "--resume", out="run"), must="holds a single kkt run"),
    _t("priors", "--group-weight 1 --runs 2 --overwrite of a user's folder", lambda ws: [
        *REC, "--model", "model", "--group-weight", "1", "--runs", "2", "--overwrite", "--out",
        str(Path(_w(ws, "mine/notes.txt", "mine")).parent)], must="not a datarecon run directory"),
    _t("priors", "--tv-weight -1", _rc("--tv-weight", "-1")),
    _t("priors", "--tv-weight nan", _rc("--tv-weight", "nan")),
    _t("priors", "--tv-weight 1 --method gradnorm", _rc("--tv-weight", "1", "--method", "gradnorm"),
       must="gradnorm"),
    _t("priors", "--tv-weight 1 with the feature prior on batch norm",
       _rc("--tv-weight", "1", "--feature-stats-weight", "1", model="bn"), expect="accept"),
    _t("priors", "--box-weight -1", _rc("--box-weight", "-1")),
    _t("priors", "--box-weight inf", _rc("--box-weight", "inf")),
    _t("priors", "run file: feature_stats_weight -1", _cfg("model: bn\nattack: {feature_stats_weight: -1}\n")),
    _t("priors", "run file: group_weight .nan", _cfg("model: model\nattack: {group_weight: .nan}\n", "--runs", "2")),
    # a quoted number is read as the number, as in every numeric field of a run file
    _t("priors", "run file: group_weight '1' (a string)", _cfg("model: model\nattack: {group_weight: '1'}\n",
                                                               "--runs", "2"), expect="accept"),
    _t("priors", "run file: group_weight 1 without --runs", _cfg("model: model\nattack: {group_weight: 1}\n"),
       must="--runs"),
    _t("priors", "run file: feature_stats_weight 1 on an MLP", _cfg("model: model\nattack: {feature_stats_weight: 1}\n"),
       must="batch-norm"),
    _t("priors", "run file: feature_stats_weight true", _cfg("model: bn\nattack: {feature_stats_weight: true}\n"),
       must="true/false"),
    _t("priors", "run file: group_weight [1, 2]", _cfg("model: model\nattack: {group_weight: [1, 2]}\n", "--runs", "2")),
    _t("priors", "run file: group_weight for bilevel", _cfg("model: model\nattack: {method: bilevel, group_weight: 1}\n",
                                                            "--runs", "2")),
    _t("priors", "--set attack.group_weight=-1", _rc("--set", "attack.group_weight=-1", "--runs", "2")),
    _t("priors", "--set attack.feature_stats_weight=inf", _rc("--set", "attack.feature_stats_weight=inf", model="bn")),
    _t("priors", "--set attack.group_weight=1 --runs 2", _rc("--set", "attack.group_weight=1", "--runs", "2"),
       expect="accept"),
    _t("priors", "sweep: group_weight 1 (a sweep's runs are single)", lambda ws: [
        "sweep", "--config", _yaml(ws, "s.yaml", SWEEP + "attack: {group_weight: 1}\n"), "--out", "s",
        "--no-progress"], must="group_weight"),
    _t("priors", "sweep: grid of feature_stats_weight on an MLP", lambda ws: [
        "sweep", "--config", _yaml(ws, "s.yaml", SWEEP + "search: {grid: {attack.feature_stats_weight: [0, 1]}}\n"),
        "--out", "s", "--no-progress"], must="batch-norm"),
    _t("priors", "sweep: grid of group_weight with a negative value", lambda ws: [
        "sweep", "--config", _yaml(ws, "s.yaml", SWEEP + "search: {grid: {attack.group_weight: [0, -1]}}\n"),
        "--out", "s", "--no-progress"]),
    _t("priors", "experiment: group_weight 1 (runs single)", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN + "attack: {attack: {method: kkt, steps: 2, group_weight: 1}}\n"),
        "--out", "e", "--no-progress"], must="group_weight"),
    _t("priors", "experiment: feature_stats_weight 1 on an MLP it trains", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN + "attack: {attack: {method: kkt, steps: 2, feature_stats_weight: 1}}\n"),
        "--out", "e", "--no-progress"], must="batch-norm"),
]

FIFTH_LABELS = [
    _t("labels", "--known-labels bogus", _rc("--known-labels", "bogus"), must="balanced"),
    _t("labels", "--known-labels ''", _rc("--known-labels", "")),
    _t("labels", "--known-labels RESTORED", _rc("--known-labels", "RESTORED", "--known-init", "pretrained",
                                                model="ft")),
    _t("labels", "--known-labels restored without a known start", _rc("--known-labels", "restored", model="ft"),
       must="--known-init"),
    _t("labels", "--known-labels restored on a binary model", _rc("--known-labels", "restored", "--known-init",
                                                                  "seed:0"), must="--known-labels balanced"),
    _t("labels", "--known-labels restored, the pretrained start, a fine-tuned model",
       _rc("--known-labels", "restored", "--known-init", "pretrained", model="ft"), expect="accept"),
    _t("labels", "--known-labels restored --known-init pretrained on a model not fine-tuned",
       _rc("--known-labels", "restored", "--known-init", "pretrained", model="mc"), must="not fine-tuned"),
    _t("labels", "--known-labels restored --known-init seed:0 (trained from seed 0)",
       _rc("--known-labels", "restored", "--known-init", "seed:0", model="mc"), expect="accept"),
    _t("labels", "--known-labels restored --known-init seed:0 on a fine-tuned model",
       _rc("--known-labels", "restored", "--known-init", "seed:0", model="ft"), must="--known-init pretrained"),
    _t("labels", "--known-labels restored --known-init pretrained:mc", _rc(
        "--known-labels", "restored", "--known-init", "pretrained:mc", model="ft"), expect="accept"),
    _t("labels", "--known-labels restored --known-init pretrained:bn (another start)", _rc(
        "--known-labels", "restored", "--known-init", "pretrained:bn", model="ft")),
    _t("labels", "--known-labels restored --known-init the ResNet's weights file", _rc(
        "--known-labels", "restored", "--known-init", "bn/weights.safetensors", model="ft")),
    _t("labels", "--known-labels restored on the fine-tuned ResNet", _rc(
        "--known-labels", "restored", "--known-init", "pretrained", model="bnft"), expect="accept"),
    _t("labels", "--known-labels restored --candidates 1", lambda ws: [
        "reconstruct", "--steps", "2", "--candidates", "1", "--no-progress", "--model", "ft", "--out", "n",
        "--known-labels", "restored", "--known-init", "pretrained"], expect="accept"),
    _t("labels", "--known-labels restored --known-n 0", _rc("--known-labels", "restored", "--known-init",
                                                            "pretrained", "--known-n", "0", model="ft")),
    _t("labels", "--known-labels restored --known-n 1000", _rc("--known-labels", "restored", "--known-init",
                                                               "pretrained", "--known-n", "1000", model="ft")),
    _t("labels", "--known-labels restored --init ground-truth", _rc(
        "--known-labels", "restored", "--known-init", "pretrained", "--init", "ground-truth", model="ft")),
    _t("labels", "--known-labels restored --init ground-truth --runs 2", _rc(
        "--known-labels", "restored", "--known-init", "pretrained", "--init", "ground-truth", "--runs", "2",
        model="ft"), must="ground-truth images"),
    _t("labels", "--known-labels restored --runs 2", _rc("--known-labels", "restored", "--known-init", "pretrained",
                                                         "--runs", "2", model="ft"), expect="accept"),
    _t("labels", "--known-labels restored on your own model", lambda ws: [
        *OWN, "--model", "nets:make", "--weights", "net.safetensors", "--known-labels", "restored", "--known-init",
        "seed:0"]),
    _t("labels", "--known-labels restored --method bilevel", _rc("--known-labels", "restored", "--known-init",
                                                                 "pretrained", "--method", "bilevel", model="ft")),
    _t("labels", "run file: knowledge.labels restored without known_init",
       _cfg("model: ft\nknowledge: {labels: restored}\n"), must="known"),
    _t("labels", "run file: knowledge.labels 1", _cfg("model: ft\nknowledge: {labels: 1}\n")),
    _t("labels", "run file: knowledge.labels null", _cfg("model: ft\nknowledge: {labels: null}\n")),
    _t("labels", "run file: knowledge.labels [restored]", _cfg("model: ft\nknowledge: {labels: [restored]}\n")),
    _t("labels", "--set knowledge.labels=restored without known init",
       _rc("--set", "knowledge.labels=restored", model="ft"), must="known"),
    _t("labels", "--set knowledge.labels=bogus", _rc("--set", "knowledge.labels=bogus", model="ft")),
    _t("labels", "membership --labels bogus", _x(*MEM, "--labels", "bogus", "--out", "m")),
    _t("labels", "membership --labels restored without a known start", _x(*MEM, "--labels", "restored", "--out", "m"),
       must="known"),
    _t("labels", "experiment: knowledge labels restored, not fine-tuned", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN + "attack: {attack: {method: kkt, steps: 2}, knowledge: {labels: "
                     "restored}}\n"), "--out", "e", "--no-progress"], must="known"),
    _t("labels", "sweep: knowledge labels restored without known init", lambda ws: [
        "sweep", "--config", _yaml(ws, "s.yaml", SWEEP.replace("model_dir: model", "model_dir: ft") +
                                   "knowledge: {labels: restored}\n"), "--out", "s", "--no-progress"], must="known"),
]

#: what each method needs to run on the workspace's model (n = 10 training images)
DYNAMICS = ["--known-init", "seed:0", "--known-recipe", "model", "--candidates", "10"]
METHODS = {"kkt": [], "decoreco": [], "gradnorm": [], "bilevel": ["--weight-decay-override", "0.01"],
           "loo": ["--known-init", "seed:0"], "dynamics": DYNAMICS}

FIFTH_PROBE = [
    _t("probe", "--step-probe -1", _rc("--step-probe", "-1")),
    _t("probe", "--step-probe nan", _rc("--step-probe", "nan")),
    _t("probe", "--step-probe 1.5", _rc("--step-probe", "1.5")),
    _t("probe", "--step-probe abc", _rc("--step-probe", "abc")),
    _t("probe", "--step-probe 10**9 + 1", _rc("--step-probe", str(10**9 + 1))),
    _t("probe", "--step-probe 10**30", _rc("--step-probe", str(10**30))),
    _t("probe", "--step-probe 0", _rc("--step-probe", "0"), expect="accept"),
    _t("probe", "--step-probe 1000000 with --steps 2", _rc("--step-probe", "1000000"), expect="accept"),
    # refused since the probe was found to do nothing for the attacks that choose or bound their own step
    _t("probe", "--step-probe 3 --method bilevel", _rc("--step-probe", "3", "--method", "bilevel",
                                                       *METHODS["bilevel"]), must="has no step sizes to probe"),
    _t("probe", "--step-probe 3 --method dynamics", _rc("--step-probe", "3", "--method", "dynamics", *DYNAMICS),
       must="has no step sizes to probe"),
    _t("probe", "--step-probe 3 --runs 2", _rc("--step-probe", "3", "--runs", "2"), expect="accept"),
    _t("probe", "--step-probe 3 --runs 2 with group consistency", _rc("--step-probe", "3", "--runs", "2",
                                                                      "--group-weight", "1"), expect="accept"),
    _t("probe", "--step-probe 3 with --lr-x 1e30", _rc("--step-probe", "3", "--lr-x", "1e30")),
    _t("probe", "--step-probe 7 --resume of a finished run", _rc("--step-probe", "7", "--resume", out="run")),
    _t("probe", "run file: step_probe -5", _cfg("model: model\nstep_probe: -5\n")),
    _t("probe", "run file: step_probe true", _cfg("model: model\nstep_probe: true\n"), must="true/false"),
    _t("probe", "run file: step_probe '50'", _cfg("model: model\nstep_probe: '50'\n"), expect="accept"),
    _t("probe", "run file: step_probe 1e3", _cfg("model: model\nstep_probe: 1e3\n")),
    _t("probe", "--set step_probe=-1", _rc("--set", "step_probe=-1")),
    _t("probe", "--set step_probe=x", _rc("--set", "step_probe=x")),
    _t("probe", "sweep: step_probe -1", lambda ws: [
        "sweep", "--config", _yaml(ws, "s.yaml", SWEEP + "step_probe: -1\n"), "--out", "s", "--no-progress"]),
    _t("probe", "experiment: step_probe -1", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN + "attack: {attack: {method: kkt, steps: 2}, step_probe: -1}\n"),
        "--out", "e", "--no-progress"], must="step_probe"),
    *[_t("probe", f"--early-stop-patience -1 --method {m}", _rc("--early-stop-patience", "-1", "--method", m, *extra))
      for m, extra in METHODS.items()],
    *[_t("probe", f"--early-stop-patience 1 --method {m}", _rc("--early-stop-patience", "1", "--method", m, *extra,
                                                                "--steps", "5"), expect="accept")
      for m, extra in METHODS.items()],
    _t("probe", "--early-stop-patience 0 --method dynamics", _rc("--early-stop-patience", "0", "--method", "dynamics",
                                                                 *DYNAMICS), expect="accept"),
    _t("probe", "--early-stop-patience 10**10", _rc("--early-stop-patience", str(10**10))),
    _t("probe", "--early-stop-patience 2.5", _rc("--early-stop-patience", "2.5")),
    _t("probe", "--early-stop-tol 0", _rc("--early-stop-patience", "1", "--early-stop-tol", "0")),
    _t("probe", "--early-stop-tol nan", _rc("--early-stop-patience", "1", "--early-stop-tol", "nan")),
    _t("probe", "--early-stop-tol -1", _rc("--early-stop-patience", "1", "--early-stop-tol", "-1")),
    _t("probe", "--early-stop-tol inf", _rc("--early-stop-patience", "1", "--early-stop-tol", "inf")),
    _t("probe", "run file: early_stop_patience -1", _cfg("model: model\nearly_stop_patience: -1\n")),
    _t("probe", "--early-stop-patience 1 --runs 2 (batched)", _rc("--early-stop-patience", "1", "--runs", "2",
                                                                  "--batch-mode", "batched", "--steps", "5"),
       expect="accept"),
]

FIFTH_NORM = [
    _t("norm", "train --norm-mode bogus", _x(*TRAIN_BN, "--norm-mode", "bogus", "--out", "m"), must="auto"),
    _t("norm", "train --norm-mode ''", _x(*TRAIN_BN, "--norm-mode", "", "--out", "m")),
    _t("norm", "train --norm-mode TRAIN", _x(*TRAIN_BN, "--norm-mode", "TRAIN", "--out", "m")),
    _t("norm", "train --norm-mode 1", _x(*TRAIN_BN, "--norm-mode", "1", "--out", "m")),
    _t("norm", "train --norm-mode train on an MLP (no batch norm)", _x(*TRAIN_MC, "--norm-mode", "train", "--out",
                                                                       "m"), must="batch norm"),
    _t("norm", "train --norm-mode eval on an MLP (no batch norm)", _x(*TRAIN_MC, "--norm-mode", "eval", "--out", "m"),
       must="batch norm"),
    _t("norm", "train --norm-mode train --pretrained an MLP", _x(*TRAIN_MC, "--norm-mode", "train", "--pretrained",
                                                                 "mc", "--out", "m"), must="batch norm"),
    _t("norm", "train --norm-mode train on a ResNet without batch norm", _x(
        "train", *FT_DATA, "--arch", "resnet8", "--epochs", "1", "--norm-mode", "train", "--out", "m"),
       must="batch norm"),
    _t("norm", "train --norm-mode auto on an MLP", _x(*TRAIN_MC, "--norm-mode", "auto", "--out", "m"),
       expect="accept"),
    _t("norm", "train --norm-mode train, batch norm from scratch", _x(*TRAIN_BN, "--norm-mode", "train", "--out",
                                                                      "m"), expect="accept"),
    # eval from scratch: the running statistics stay at their start (mean 0, variance 1), the affine weights train
    _t("norm", "train --norm-mode eval, batch norm from scratch", _x(*TRAIN_BN, "--norm-mode", "eval", "--out", "m"),
       expect="accept"),
    _t("norm", "train --norm-mode train --pretrained bn", _x(*TRAIN_BN, "--norm-mode", "train", "--pretrained", "bn",
                                                             "--out", "m"), expect="accept"),
    _t("norm", "train --norm-mode eval --pretrained bn", _x(*TRAIN_BN, "--norm-mode", "eval", "--pretrained", "bn",
                                                            "--out", "m"), expect="accept"),
    _t("norm", "train --norm-mode train --pretrained bn with DP-SGD", _x(
        *TRAIN_BN, "--norm-mode", "train", "--pretrained", "bn", "--dp-noise", "1", "--out", "m")),
    _t("norm", "train --norm-mode train --batch-norm on an MLP", _x(*TRAIN_MC, "--batch-norm", "--norm-mode", "train",
                                                                    "--out", "m"), must="batch_norm"),
    _t("norm", "train --batch-norm --arch cnn", _x("train", *FT_DATA, "--arch", "cnn", "--batch-norm", "--epochs", "1",
                                                   "--out", "m"), must="batch_norm"),
    _t("norm", "train config: norm_mode bogus", lambda ws: [
        "train", "--config", _yaml(ws, "t.yaml", "norm_mode: bogus\n"), *FT_DATA, "--arch", "resnet8",
        "--batch-norm", "--epochs", "1", "--out", "m"]),
    _t("norm", "train config: norm_mode null", lambda ws: [
        "train", "--config", _yaml(ws, "t.yaml", "norm_mode: null\n"), *FT_DATA, "--arch", "resnet8",
        "--batch-norm", "--epochs", "1", "--out", "m"]),
    _t("norm", "experiment: train norm_mode train on an MLP", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN.replace("epochs: 2", "epochs: 2, norm_mode: train")),
        "--out", "e", "--no-progress"], must="batch norm"),
    _t("norm", "--known-init pretrained on a ResNet trained from scratch", _rc("--known-init", "pretrained",
                                                                              model="bn"), must="not fine-tuned"),
    _t("norm", "--known-init seed:0 on the fine-tuned ResNet", _rc("--known-init", "seed:0", model="bnft"),
       must="--known-init pretrained"),
    _t("norm", "--method dynamics without a known start on the fine-tuned ResNet", _rc("--method", "dynamics",
                                                                                       model="bnft"),
       must="known"),
    _t("norm", "--method dynamics --known-init pretrained --known-recipe model:-lr on the fine-tuned ResNet",
       _rc("--method", "dynamics", "--known-init", "pretrained", "--known-recipe", "model:-lr", "--candidates", "12",
           model="bnft"), expect="accept"),
    _t("norm", "--method dynamics --known-recipe model:-bogus", _rc("--method", "dynamics", "--known-init",
                                                                    "pretrained", "--known-recipe", "model:-bogus",
                                                                    model="bnft"), must="model:-lr"),
    _t("norm", "--known-recipe model on your own model", lambda ws: [
        *OWN, "--model", "nets:make", "--weights", "net.safetensors", "--method", "dynamics", "--known-recipe",
        "model"], must="a model of your own records none"),
    # knowledge is the threat model's statement: recorded in run.json whether or not the method reads it
    _t("norm", "--known-recipe model --method kkt (not read by it)", _rc("--known-recipe", "model"), expect="accept"),
    _t("norm", "model.json: norm_mode bogus in the recorded training", lambda ws: _rc(
        "--method", "dynamics", "--known-init", "pretrained", "--known-recipe", "model", "--candidates", "12", model=_json(
            ws, "bnft/model.json", lambda m: m["training"].update(norm_mode="bogus")))(ws)),
    _t("norm", "train --margin-ascent-steps -1", _x(*TRAIN, "--margin-ascent-steps", "-1", "--out", "m")),
    _t("norm", "train --margin-ascent-steps 5 with weight decay", _x(*TRAIN, "--margin-ascent-steps", "5",
                                                                      "--weight-decay", "0.1", "--out", "m"),
       must="weight decay"),
    _t("norm", "train --margin-ascent-step-size nan", _x(*TRAIN, "--margin-ascent-steps", "5",
                                                         "--margin-ascent-step-size", "nan", "--out", "m"),
       must="finite"),
    _t("norm", "train --margin-ascent-min-step above the max step", _x(
        *TRAIN, "--margin-ascent-steps", "5", "--margin-ascent-min-step", "1", "--margin-ascent-max-step", "0.1",
        "--out", "m")),
    _t("norm", "train --margin-ascent-growth 0.5", _x(*TRAIN, "--margin-ascent-steps", "5", "--margin-ascent-growth",
                                                      "0.5", "--out", "m")),
    _t("norm", "train --margin-rtol nan", _x(*TRAIN, "--margin-patience", "2", "--margin-rtol", "nan", "--out", "m")),
    _t("norm", "train --margin-patience -1", _x(*TRAIN, "--margin-patience", "-1", "--out", "m")),
    # the stage runs where the data are separated (a warning says when they are not): a valid recipe
    _t("norm", "train --margin-ascent-steps 3 on the ResNet with batch norm", _x(
        *TRAIN_BN, "--margin-ascent-steps", "3", "--out", "m"), expect="accept"),
]

FIFTH_MEMBERSHIP = [
    _t("membership", "--fpr 0 --evaluate", _x(*MEM, "--fpr", "0", "--out", "m")),
    *[_t("membership", f"--fpr {v} --images", _x("membership", "--model", "mc", "--images", "members.safetensors",
                                                   "--fpr", v, "--no-progress", "--out", "m"),
         must="fpr") for v in ("0", "-0.1", "inf")],
    _t("membership", "--fpr -0.1", _x(*MEM, "--fpr", "-0.1", "--out", "m")),
    _t("membership", "--fpr 1", _x(*MEM, "--fpr", "1", "--out", "m")),
    _t("membership", "--fpr inf", _x(*MEM, "--fpr", "inf", "--out", "m")),
    _t("membership", "--fpr abc", _x(*MEM, "--fpr", "abc", "--out", "m")),
    _t("membership", "--references -1", _x(*MEM, "--references", "-1", "--out", "m")),
    _t("membership", "--references abc", _x(*MEM, "--references", "abc", "--out", "m")),
    _t("membership", "--references 1.5", _x(*MEM, "--references", "1.5", "--out", "m")),
    _t("membership", "--references 1000000", _x(*MEM, "--references", "1000000", "--out", "m")),
    _t("membership", "--references auto --budget-minutes 0", _x(*MEM, "--references", "auto", "--budget-minutes", "0",
                                                                "--out", "m")),
    _t("membership", "--budget-minutes -1", _x(*MEM, "--references", "auto", "--budget-minutes", "-1", "--out", "m")),
    _t("membership", "--budget-minutes nan", _x(*MEM, "--references", "auto", "--budget-minutes", "nan", "--out",
                                                "m")),
    _t("membership", "--budget-minutes inf", _x(*MEM, "--references", "auto", "--budget-minutes", "inf", "--out",
                                                "m")),
    _t("membership", "--nonmembers 0", _x(*MEM, "--nonmembers", "0", "--out", "m")),
    _t("membership", "--nonmembers -5", _x(*MEM, "--nonmembers", "-5", "--out", "m")),
    _t("membership", "--population 0 with reference models", _x(*MEM, "--references", "2", "--population", "0",
                                                                 "--out", "m")),
    # 0: no calibration part; the strongest signal is then the rule fixed in advance (a valid choice)
    _t("membership", "--calibration-fraction 0", _x(*MEM, "--calibration-fraction", "0", "--out", "m"),
       expect="accept"),
    _t("membership", "--calibration-fraction 1", _x(*MEM, "--calibration-fraction", "1", "--out", "m")),
    _t("membership", "--calibration-fraction nan", _x(*MEM, "--calibration-fraction", "nan", "--out", "m")),
    _t("membership", "--variance-prior -1", _x(*MEM, "--variance-prior", "-1", "--out", "m")),
    _t("membership", "--variance-prior nan", _x(*MEM, "--variance-prior", "nan", "--out", "m")),
    _t("membership", "--rmia-a 2", _x(*MEM, "--rmia-a", "2", "--out", "m")),
    _t("membership", "--rmia-gamma 0", _x(*MEM, "--rmia-gamma", "0", "--out", "m")),
    _t("membership", "--rmia-gamma nan", _x(*MEM, "--rmia-gamma", "nan", "--out", "m")),
    _t("membership", "--signal bogus", _x(*MEM, "--signal", "bogus", "--out", "m")),
    _t("membership", "--signal lira-online --images without reference models", lambda ws: [
        "membership", "--model", "mc", "--images", "members.safetensors", "--signal",
        "lira-online", "--no-progress", "--out", "m"]),
    _t("membership", "--draw-seed -1", _x(*MEM, "--draw-seed", "-1", "--out", "m")),
    _t("membership", "--reference-seed -1", _x(*MEM, "--reference-seed", "-1", "--out", "m")),
    _t("membership", "--workers 0", _x(*MEM, "--workers", "0", "--out", "m")),
    _t("membership", "--backend bogus", _x(*MEM, "--backend", "bogus", "--out", "m")),
    _t("membership", "--threads -1", _x(*MEM, "--threads", "-1", "--out", "m")),
    _t("membership", "--images and --evaluate", _x(*MEM, "--images", "members.safetensors", "--out", "m")),
    _t("membership", "neither --images nor --evaluate", _x("membership", "--model", "mc", "--no-progress")),
    _t("membership", "--out a user's file", lambda ws: [*MEM, "--out", _w(ws, "mine.json", "{}")]),
    _t("membership", "--out a user's folder", lambda ws: [*MEM, "--out", str(Path(_w(ws, "mine/a.txt", "a")).parent)],
       must="not a membership folder datarecon wrote"),
    _t("membership", "--out a user's folder --overwrite", lambda ws: [
        *MEM, "--overwrite", "--out", str(Path(_w(ws, "mine/a.txt", "a")).parent)],
       must="not a datarecon membership folder"),
    _t("membership", "--out the membership folder of the same model (a rerun)", _x(
        "membership", "--model", "mc", "--evaluate", "--references", "2", "--nonmembers", "50", "--no-progress",
        "--out", "memdir"), expect="accept", out="memdir"),
    _t("membership", "--out the membership folder of another model", _x(
        "membership", "--model", "ft", "--evaluate", "--references", "0", "--nonmembers", "50", "--no-progress",
        "--out", "memdir"), must="another model"),
    _t("membership", "--out a run folder", _x(*MEM, "--out", "run"), must="run"),
    _t("membership", "--out a model folder", _x(*MEM, "--out", "mc"), must="model"),
    _t("membership", "--out a store", _x(*MEM, "--out", "store")),
    _t("membership", "--out the report of a membership folder", _x(*MEM, "--out", "memdir.html")),
    _t("membership", "--out inside the reference models", _x(*MEM, "--out", "memdir/references/x")),
    _t("membership", "--config with an unknown key", lambda ws: [*MEM, "--config", _yaml(ws, "m.yaml", "bogus: 1\n"),
                                                                 "--out", "m"]),
    _t("membership", "--config references -1", lambda ws: [
        "membership", "--model", "mc", "--evaluate", "--no-progress", "--config",
        _yaml(ws, "m.yaml", "references: {count: -1}\n"), "--out", "m"]),
    _t("membership", "--config fpr .nan", lambda ws: [*MEM, "--config", _yaml(ws, "m.yaml", "fpr: .nan\n"),
                                                      "--out", "m"]),
    _t("membership", "--config a list", lambda ws: [*MEM, "--config", _yaml(ws, "m.yaml", "- 1\n"), "--out", "m"]),
    _t("membership", "--known-init pretrained on a model not fine-tuned", _x(*MEM, "--known-init", "pretrained",
                                                                             "--out", "m"), must="not fine-tuned"),
    _t("membership", "--weights with a model directory", _x(*MEM, "--weights", "net.safetensors", "--out", "m"),
       must="drop --weights"),
    _t("membership", "--train with a model directory", _x(*MEM, "--train", "members.safetensors", "--out", "m")),
    _t("membership", "own model: --evaluate without --train", _x(*OWN_MEM, "--evaluate", "--out", "m"),
       must="--train"),
    _t("membership", "own model: --train missing", _x(*OWN_MEM, "--evaluate", "--train", "nope.safetensors",
                                                      "--heldout", "others.safetensors", "--out", "m")),
    _t("membership", "own model: --train a garbage file", lambda ws: [
        *OWN_MEM, "--evaluate", "--train", _w(ws, "g.safetensors", b"garbage" * 9), "--heldout",
        "others.safetensors", "--out", "m"]),
    _t("membership", "own model: --train of another input shape", _x(*OWN_MEM, "--evaluate", "--train",
                                                                     "flat.safetensors", "--heldout",
                                                                     "others.safetensors", "--out", "m")),
    _t("membership", "own model: --train labels of another length", _x(*OWN_MEM, "--evaluate", "--train",
                                                                       "short.safetensors", "--heldout",
                                                                       "others.safetensors", "--out", "m")),
    _t("membership", "own model: --evaluate without --heldout", _x(*OWN_MEM, "--evaluate", "--train",
                                                                   "members.safetensors", "--out", "m")),
    _t("membership", "own model: --train and --heldout the same file", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "members.safetensors", "--out", "m")),
    _t("membership", "own model: --heldout sharing examples with --train", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "mixed.safetensors", "--out", "m"),
       must="are also --train examples"),
    _t("membership", "own model: --recipe of a missing package", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "2", "--recipe", "nopkg_xyz:train", "--out", "m")),
    _t("membership", "own model: --recipe not callable", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "2", "--recipe", "nets:sys", "--out", "m")),
    _t("membership", "own model: --recipe that raises", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "2", "--recipe", "nets:boom", "--out", "m")),
    _t("membership", "own model: reference models without --recipe", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "2", "--out", "m"), must="--recipe"),
    _t("membership", "own model: NaN weights", lambda ws: [
        "membership", "--model", "nets:make", "--weights", "nan.safetensors", "--input-shape", "1,8,8",
        "--no-progress", "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--out",
        "m"]),
    _t("membership", "own model: a valid evaluation", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "0", "--out", "m"), expect="accept"),
    _t("membership", "own model: --out the membership folder of a model directory", _x(
        *OWN_MEM, "--evaluate", "--train", "members.safetensors", "--heldout", "others.safetensors", "--references",
        "0", "--out", "memdir"), must="another model"),
    _t("membership", "report of a membership folder into it", _x("report", "memdir", "--out", "memdir/r.html"),
       must="lies inside"),
    _t("membership", "report over a user's file", lambda ws: ["report", "memdir", "--out",
                                                              _w(ws, "mine.html", "<p>mine</p>"), "--overwrite"],
       must="datarecon"),
    _t("membership", "report over its own earlier report without --overwrite", _x("report", "memdir", "--out",
                                                                                  "memdir.html"), must="--overwrite"),
    _t("membership", "report over its own earlier report with --overwrite", _x("report", "memdir", "--out",
                                                                               "memdir.html", "--overwrite"),
       expect="accept", out="memdir.html"),
    _t("membership", "report of a membership folder with membership.json garbage", lambda ws: [
        "report", str(Path(_w(ws, "memdir/membership.json", "{garbage")).parent), "--out", "r.html"],
       must="membership.json"),
    _t("membership", "report of a membership folder with membership.json {}", lambda ws: [
        "report", str(Path(_w(ws, "memdir/membership.json", "{}")).parent), "--out", "r.html"]),
    _t("membership", "report of a membership folder without scores", lambda ws: [
        "report", "memdir", "--out", "r.html"] if (ws / "memdir/scores.safetensors").unlink() is None else []),
    _t("membership", "report of a membership folder with exposed.safetensors garbage", lambda ws: [
        "report", str(Path(_w(ws, "memdir/exposed.safetensors", b"garbage")).parent), "--out", "r.html"]),
    # a report shows runs and membership folders side by side (report --help)
    _t("membership", "report of a membership folder and a run together", _x("report", "memdir", "evaluated", "--out",
                                                                            "r.html"), expect="accept"),
    _t("membership", "report of a membership folder whose AUC is 7", lambda ws: [
        "report", _json(ws, "memdir/membership.json", lambda m: [s["report"].update(auc=7.0) for s in m[
            "signals"].values() if isinstance(s, dict) and isinstance(s.get("report"), dict)]), "--out", "r.html"]),
    _t("membership", "evaluate --membership of another model's folder", _x(
        "evaluate", "evaluated", "--membership", "memdir", "--no-progress"), must="the model this run attacked"),
    _t("membership", "evaluate --membership a run folder", _x("evaluate", "evaluated", "--membership", "run",
                                                              "--no-progress"), must="--out DIR"),
    _t("membership", "evaluate --membership of a damaged membership.json", lambda ws: [
        "evaluate", "evaluated", "--membership", "memmodel", "--no-progress"] if adversarial_trials.cli(
        *MEM[:2], "model", *MEM[3:], "--out", "memmodel", cwd=ws).returncode == 0 and _json(
        ws, "memmodel/membership.json", lambda m: m.update(signals=[])) else [], must="membership.json"),
    _t("membership", "evaluate --membership missing", _x("evaluate", "evaluated", "--membership", "nowhere",
                                                         "--no-progress")),
    _t("membership", "audit --model a run folder", _x("audit", "--model", "run", "--scale", "smoke", "--out", "a"),
       must="run"),
    _t("membership", "audit --model missing", _x("audit", "--model", "nowhere", "--scale", "smoke", "--out", "a")),
    _t("membership", "audit --model mc --out its membership folder", _x("audit", "--model", "mc", "--scale", "smoke",
                                                                        "--out", "memdir")),
    _t("membership", "audit --model mc --out the model folder", _x("audit", "--model", "mc", "--scale", "smoke",
                                                                   "--out", "mc")),
    _t("membership", "audit --model of your own (a factory)", _x("audit", "--model", "nets:make", "--scale", "smoke",
                                                                 "--out", "a")),
    _t("membership", "audit --model mc --scale bogus", _x("audit", "--model", "mc", "--scale", "bogus", "--out", "a")),
]

BROKEN = "[datarecon.attacks]\nbroken = nopkg_hostile_xyz:Attack\n"
FIFTH_PLUGINS = [
    _t("plugins", "an attack plug-in that cannot be imported; reconstruct --method kkt",
       _plug(BROKEN, "", REC_MODEL), expect="accept"),
    _t("plugins", "an attack plug-in that cannot be imported; --method of it", _plug(BROKEN, "", [
        *REC_MODEL, "--method", "broken"]), must="broken"),
    _t("plugins", "an attack plug-in whose module exits at import", _plug(
        "[datarecon.attacks]\nbye = hostile_plugin:X\n", "import sys\nsys.exit(3)\n", REC_MODEL), expect="accept"),
    _t("plugins", "an attack plug-in that is not an Attack", _plug(
        "[datarecon.attacks]\nnotattack = hostile_plugin:X\n", "X = 42\n", [*REC_MODEL, "--method", "notattack"]),
       must="notattack"),
    _t("plugins", "an attack plug-in whose class declares another name", _plug(
        "[datarecon.attacks]\nwrongname = hostile_plugin:Wrong\n", PLUG_ATTACK, [*REC_MODEL, "--method",
                                                                                   "wrongname"]), must="wrongname"),
    _t("plugins", "an attack plug-in named kkt (a built-in name)", _plug(
        "[datarecon.attacks]\nkkt = hostile_plugin:Inv\n", PLUG_ATTACK, REC_MODEL), expect="accept"),
    _t("plugins", "an entry point without an attribute", _plug(
        "[datarecon.attacks]\nnoattr = hostile_plugin\n", PLUG_ATTACK, REC_MODEL), expect="accept"),
    _t("plugins", "an entry point value that is not a name", _plug(
        "[datarecon.attacks]\nbad = ::: not a name\n", PLUG_ATTACK, REC_MODEL), expect="accept"),
    _t("plugins", "entry_points.txt that does not parse", _plug("[datarecon.attacks\nx = = y\n", PLUG_ATTACK,
                                                                REC_MODEL), expect="accept"),
    _t("plugins", "entry_points.txt not UTF-8", lambda ws: REC_MODEL if _plug("", PLUG_ATTACK, [])(ws) is not None
       and _w(ws, "hostile_plugin-0.1.dist-info/entry_points.txt", b"[datarecon.attacks]\nx\xff = hostile_plugin:Inv\n")
       else [], must="cannot be read"),
    _t("plugins", "a working attack plug-in (inv)", _plug("[datarecon.attacks]\ninv = hostile_plugin:Inv\n",
                                                          PLUG_ATTACK, [*REC_MODEL, "--method", "inv"]),
       expect="accept"),
    _t("plugins", "an attack plug-in whose objective raises", _plug(
        "[datarecon.attacks]\nboom = hostile_plugin:Boom\n", PLUG_ATTACK, [*REC_MODEL, "--method", "boom"]),
       must="boom"),
    _t("plugins", "an attack plug-in whose loss is NaN", _plug(
        "[datarecon.attacks]\nnanloss = hostile_plugin:Nan\n", PLUG_ATTACK, [*REC_MODEL, "--method", "nanloss"])),
    _t("plugins", "a plug-in attack with --feature-stats-weight", _plug(
        "[datarecon.attacks]\ninv = hostile_plugin:Inv\n", PLUG_ATTACK, [*REC_MODEL, "--method", "inv",
                                                                         "--feature-stats-weight", "1"])),
    # the base Attack's step splits into gradient and update, so a plug-in's runs couple like the built-in ones
    _t("plugins", "a plug-in attack with --group-weight --runs 2", _plug(
        "[datarecon.attacks]\ninv = hostile_plugin:Inv\n", PLUG_ATTACK, [*REC_MODEL, "--method", "inv",
                                                                         "--group-weight", "1", "--runs", "2"]),
       expect="accept"),
    _t("plugins", "a plug-in attack with --early-stop-patience -1", _plug(
        "[datarecon.attacks]\ninv = hostile_plugin:Inv\n", PLUG_ATTACK, [*REC_MODEL, "--method", "inv",
                                                                         "--early-stop-patience", "-1"])),
    _t("plugins", "a membership signal that raises", _plug(
        "[datarecon.membership_signals]\nboom = hostile_plugin:BOOM\n", PLUG_SIGNAL, [*MEM, "--out", "m"]),
       must="boom"),
    _t("plugins", "a membership signal of one score too few", _plug(
        "[datarecon.membership_signals]\nshort = hostile_plugin:SHORT\n", PLUG_SIGNAL, [*MEM, "--out", "m"]),
       must="short"),
    _t("plugins", "a membership signal of NaN scores", _plug(
        "[datarecon.membership_signals]\nnans = hostile_plugin:NAN\n", PLUG_SIGNAL, [*MEM, "--out", "m"])),
    _t("plugins", "a membership signal without a score", _plug(
        "[datarecon.membership_signals]\nnoscore = hostile_plugin:NOSCORE\n", PLUG_SIGNAL, [*MEM, "--out", "m"]),
       expect="accept"),
    _t("plugins", "a membership signal that is not a SignalDef", _plug(
        "[datarecon.membership_signals]\nnotdef = hostile_plugin:NOTDEF\n", PLUG_SIGNAL, [*MEM, "--out", "m"]),
       expect="accept"),
    _t("plugins", "a membership signal named loss (a built-in name)", _plug(
        "[datarecon.membership_signals]\nloss = hostile_plugin:NAN\n", PLUG_SIGNAL, [*MEM, "--out", "m"]),
       expect="accept"),
    _t("plugins", "--signal of a broken plug-in signal", _plug(
        "[datarecon.membership_signals]\nbroken = nopkg_hostile_xyz:S\n", "", [
            "membership", "--model", "mc", "--images", "members.safetensors", "--signal",
            "broken", "--no-progress", "--out", "m"]), must="broken"),
    _t("plugins", "reconstruct --help with a broken plug-in", _plug(BROKEN, "", ["reconstruct", "--help"]),
       expect="accept"),
]

FIFTH_PLUGINS = [dataclasses.replace(t, warn=True) for t in FIFTH_PLUGINS]
#: margin ascent to convergence and the retry of a diverged run (issue 44's options, merged after the trial's
#: first runs): their own group
ASC = [*TRAIN, "--margin-ascent-steps", "4"]
FIFTH_ASCENT = [
    *[_t("ascent", f"train --margin-ascent-rtol {v}", _x(*ASC, "--margin-ascent-window", "2", "--margin-ascent-rtol",
                                                         v, "--out", "m")) for v in ("0", "-0.1", "1", "1.5", "nan",
                                                                                    "inf", "abc", "")],
    *[_t("ascent", f"train --margin-ascent-window {v}", _x(*ASC, "--margin-ascent-rtol", "0.01",
                                                           "--margin-ascent-window", v, "--out", "m"))
      for v in ("0", "-1", "2.5", "nan", "1e12")],
    _t("ascent", "train --margin-ascent-rtol without a budget (steps 0)", _x(
        *TRAIN, "--margin-ascent-rtol", "0.01", "--out", "m"), must="--margin-ascent-steps"),
    _t("ascent", "train --margin-ascent-rtol with a budget below one window", _x(
        *ASC, "--margin-ascent-rtol", "0.01", "--margin-ascent-window", "10", "--out", "m"), must="window"),
    _t("ascent", "train config: margin_ascent.rtol nan", lambda ws: [
        "train", "--config", _yaml(ws, "t.yaml", "margin_ascent: {steps: 4, window: 2, rtol: .nan}\n"),
        *TRAIN[1:], "--out", "m"]),
    _t("ascent", "train config: margin_ascent.window a string", lambda ws: [
        "train", "--config", _yaml(ws, "t.yaml", "margin_ascent: {steps: 4, window: two, rtol: 0.01}\n"),
        *TRAIN[1:], "--out", "m"]),
    _t("ascent", "experiment: margin_ascent rtol 2", lambda ws: [
        "run", _yaml(ws, "e.yaml", EXP_TRAIN.replace("epochs: 2", "epochs: 2, margin_ascent: {steps: 4, window: 2, "
                                                     "rtol: 2}")), "--out", "e", "--no-progress"]),
    # valid: a stop rule within its budget, and a window without a stop rule (the curve's spacing)
    _t("ascent", "train --margin-ascent-rtol 0.01 --margin-ascent-window 2 --margin-ascent-steps 4", _x(
        *ASC, "--margin-ascent-rtol", "0.01", "--margin-ascent-window", "2", "--out", "m"), expect="accept"),
    _t("ascent", "train --margin-ascent-window 2 without --margin-ascent-rtol", _x(
        *ASC, "--margin-ascent-window", "2", "--out", "m"), expect="accept"),
    *[_t("ascent", f"reconstruct --retry-diverged {v}", _rc("--retry-diverged", v)) for v in ("-1", "7", "nan",
                                                                                              "abc", "1.5")],
    _t("ascent", "reconstruct --retry-diverged 2 (a run that does not diverge)", _rc("--retry-diverged", "2"),
       expect="accept"),
    _t("ascent", "run file: retry_diverged -3", _cfg("model: model\nretry_diverged: -3\n")),
    _t("ascent", "run file: retry_diverged 'two'", _cfg("model: model\nretry_diverged: two\n")),
]
FIFTH = [*FIFTH_PRIORS, *FIFTH_LABELS, *FIFTH_PROBE, *FIFTH_NORM, *FIFTH_MEMBERSHIP, *FIFTH_PLUGINS, *FIFTH_ASCENT]

# -- issue 49 (every attack through the interface; options that did nothing) and issue 50's plug-in internal errors.
# Group ``interface``: on d8472df the plug-in rows were internal errors (AttributeError, KeyError 'loss', "does not
# require grad") or wrongly accepted (an integer step size scaled to 0.5, an early-stop metric never logged), and the
# option rows wrongly accepted.
PLUG_DECLARED = """from typing import ClassVar
import torch
import torch.nn.functional as F
from datarecon.attacks.base import Attack


class Inv(Attack):
    name: ClassVar[str] = "inv"

    def objective(self, target, prior, x):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean()}


class BogusStep(Inv):
    name: ClassVar[str] = "bogusstep"
    step_size_fields: ClassVar[tuple] = ("lr_bogus",)


class IntStep(Inv):
    name: ClassVar[str] = "intstep"
    step_size_fields: ClassVar[tuple] = ("steps",)


class NoLoss(Inv):
    name: ClassVar[str] = "noloss"

    def objective(self, target, prior, x):
        return {"margin": target.forward(x).sum()}


class Constant(Inv):
    name: ClassVar[str] = "constant"

    def objective(self, target, prior, x):
        return {"loss": torch.tensor(1.0)}


class Unlogged(Inv):
    name: ClassVar[str] = "unlogged"
    early_stop_metric: ClassVar[str] = "never_logged"
"""


def _declared(name: str, cls: str, *args: str) -> Callable[[Path], list[str]]:
    return _plug(f"[datarecon.attacks]\n{name} = hostile_plugin:{cls}\n", PLUG_DECLARED,
                 [*REC_MODEL, "--method", name, *args])


INTERFACE = [Trial("interface", name, prepare, **kw) for name, prepare, kw in [
    ("a plug-in whose step_size_fields names a field its config lacks", _declared("bogusstep", "BogusStep"),
     {"must": "bogusstep", "warn": True}),
    ("a plug-in whose step_size_fields names the integer field steps", _declared("intstep", "IntStep"),
     {"must": "intstep", "warn": True}),
    ("a plug-in whose objective has no 'loss'", _declared("noloss", "NoLoss"), {"must": "noloss", "warn": True}),
    ("a plug-in whose objective is a constant", _declared("constant", "Constant"),
     {"must": "does not depend on the candidates", "warn": True}),
    ("a plug-in whose early_stop_metric is never logged, --early-stop-patience 2",
     _declared("unlogged", "Unlogged", "--early-stop-patience", "2"), {"must": "never_logged", "warn": True}),
    ("a working plug-in with --early-stop-patience 2", _declared("inv", "Inv", "--early-stop-patience", "2"),
     {"expect": "accept", "warn": True}),
    ("--early-stop-tol 0.5 without --early-stop-patience", _rc("--early-stop-tol", "0.5"),
     {"must": "--early-stop-patience"}),
    ("--early-stop-patience 0 --early-stop-tol 0.5", _rc("--early-stop-patience", "0", "--early-stop-tol", "0.5"),
     {"must": "--early-stop-patience"}),
    ("--early-stop-patience 3 --early-stop-tol 5", _rc("--early-stop-patience", "3", "--early-stop-tol", "5"),
     {"must": "--early-stop-tol"}),
    ("--early-stop-patience 3 --early-stop-tol 1", _rc("--early-stop-patience", "3", "--early-stop-tol", "1"),
     {"must": "--early-stop-tol"}),
    ("--early-stop-patience 3 --early-stop-tol 0.99", _rc("--early-stop-patience", "3", "--early-stop-tol", "0.99"),
     {"expect": "accept"}),
    ("train --margin-ascent-window 10 without --margin-ascent-steps", _x(*TRAIN, "--margin-ascent-window", "10",
                                                                       "--out", "m"),
     {"must": "--margin-ascent-steps"}),
    ("train --margin-ascent-rtol 0.01 without --margin-ascent-steps", _x(*TRAIN, "--margin-ascent-rtol", "0.01",
                                                                        "--out", "m"),
     {"must": "--margin-ascent-steps"}),
    ("--method gradnorm --group-weight 1 --runs 2", _rc("--method", "gradnorm", "--group-weight", "1", "--runs", "2"),
     {"expect": "accept"}),
    ("--method gradnorm --tv-weight 1", _rc("--method", "gradnorm", "--tv-weight", "1"), {"must": "tv"}),
    ("--optimizer adam --momentum 0.5", _rc("--optimizer", "adam", "--momentum", "0.5"), {"must": "momentum"}),
    ("--optimizer sgd --adam-beta1 0.5", _rc("--adam-beta1", "0.5"), {"must": "--optimizer adam"}),
    ("--momentum 0 --nesterov", _rc("--momentum", "0", "--nesterov"), {"must": "nesterov"}),
    ("--method dynamics --optimizer sgd (its default is Adam)", _rc("--method", "dynamics", *DYNAMICS, "--optimizer",
                                                                    "sgd", "--lr-x", "1e-3"), {"expect": "accept"}),
    ("--method bilevel --feature-stats-weight 1 --weight-decay-override 0.01 on batch norm", _rc(
        "--method", "bilevel", "--feature-stats-weight", "1", "--weight-decay-override", "0.01", "--set",
        "inner_max_iter_first=50", model="bn"), {"expect": "accept"}),
    ("--method bilevel --momentum 0.5 without --lr-x", _rc("--method", "bilevel", *METHODS["bilevel"], "--momentum",
                                                           "0.5"), {"must": "--lr-x"}),
    ("--method bilevel --group-weight 1 --runs 2 --lr-x 0.01 --batch-mode batched", _rc(
        "--method", "bilevel", *METHODS["bilevel"], "--group-weight", "1", "--runs", "2", "--lr-x", "0.01",
        "--batch-mode", "batched"), {"expect": "accept"}),
]]

# -- the seventh trial (issue 50 item 5): tests/faults/seventh_trial.py, groups ``seventh-*``
SEVENTH = [Trial(group, name, prepare, **kw) for group, name, prepare, kw in seventh_trial.rows()]

TRIALS: list[Trial] = [*PATHS, *FILES, *OPTIONS, *CONFIGS, *STATE, *PERMISSIONS, *FIFTH, *INTERFACE, *SEVENTH]
#: the groups whose trials need no more than the base workspace (the others: :func:`build_fifth_extras` too)
BASE_GROUPS = ("paths", "files", "options", "configs", "state", "permission", "fifth-probe", "fifth-ascent")


def ensure_user() -> bool:
    """The unprivileged user of the permission trials exists (created when root); False when not possible."""
    try:
        pwd.getpwnam(USER)
        return True
    except KeyError:
        pass
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return False
    return subprocess.run(["useradd", "--system", "--no-create-home", USER], capture_output=True).returncode == 0


@functools.cache
def _user_python() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) the unprivileged user can run: this interpreter when the user may
    execute it, else the system's python of the same version with this environment's packages
    (a pyenv interpreter under /root is not reachable by another user)."""
    import site
    import sysconfig

    import datarecon

    src = str(Path(datarecon.__file__).resolve().parents[1])
    packages = os.pathsep.join([src, *site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        probe = subprocess.run(["runuser", "-u", USER, "--", python, "-c", "pass"], capture_output=True)
        if probe.returncode == 0:
            return python, packages
    raise SystemExit(f"no python {version} the user {USER} may run; the permission trials need one")


def _command(trial: Trial, argv: list[str]) -> list[str]:
    if trial.user:
        python, packages = _user_python()
        if ENV.get("PYTHONPATH"):  # --src: that tree first
            packages = ENV["PYTHONPATH"] + os.pathsep + packages
        env = [f"{k}={ENV[k]}" for k in ("DATARECON_DATA", "OMP_NUM_THREADS") if k in ENV]
        return ["runuser", "-u", USER, "--", "env", "HOME=/tmp", f"PYTHONPATH={packages}", *env, python, "-m",
                "datarecon.cli.main", *argv]
    return [sys.executable, "-m", "datarecon.cli.main", *argv]


#: run commands forked from this process (``--fork``; :func:`warm_up` imports what they need first)
FORK = {"on": False}


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit code and what it printed (as :func:`subprocess.run` gives them)."""

    returncode: int
    stdout: str
    stderr: str


def warm_up() -> None:
    """Import datarecon's command modules (and so PyTorch) once, before the first fork; one torch thread."""
    import importlib

    from datarecon.cli.main import _COMMAND_MODULES

    for name in _COMMAND_MODULES:
        importlib.import_module(f"datarecon.cli.{name}")


def forked(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float, scratch: Path) -> Ran:
    """``python -m datarecon.cli.main ARGV`` in ``cwd`` with ``env``, as a child forked from this process.

    Raises:
        subprocess.TimeoutExpired: the child still ran after ``timeout`` seconds (it is killed).
    """
    import signal
    import time

    out, err = scratch / "stdout.txt", scratch / "stderr.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the command, then exit with its code, never returning into the caller
        code = 1
        try:
            # a terminal's Ctrl-C reaches a command with Python's handler, also when this process was started with
            # SIGINT ignored (a background job of a shell without job control); the fault hooks send SIGINT
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.path.insert(0, str(cwd))
            sys.argv = ["datarecon", *argv]
            from datarecon.cli.main import main

            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - shown as the interpreter would show it
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(argv, timeout)
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    return Ran(code, out.read_text(errors="replace"), err.read_text(errors="replace"))


def _forked_cli(*args: str, cwd: Path | None = None, extra_env: dict[str, str] | None = None,
                timeout: float = 600) -> Ran:
    """:func:`adversarial_trials.cli` (the workspace's commands), forked."""
    scratch = Path(tempfile.mkdtemp(prefix="fork-"))
    try:
        return forked(list(args), cwd=cwd or Path.cwd(), env={**ENV, **(extra_env or {})}, timeout=timeout,
                      scratch=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _needs_a_process(trial: Trial) -> bool:
    """Run as another user, or a plug-in trial (its prepare installs entry points, :func:`_plug`): a process of its
    own even with ``--fork``."""
    return trial.user or trial.group.startswith(("fifth-plugins", "seventh-plugins")) or getattr(trial.prepare, "plugin", False)


def run_command(trial: Trial, argv: list[str], *, ws: Path, scratch: Path) -> Ran | subprocess.CompletedProcess:
    """The trial's command in the workspace: forked from this process, or a fresh interpreter."""
    if FORK["on"] and not _needs_a_process(trial):
        return forked(argv, cwd=ws, env=ENV, timeout=TIMEOUT_S, scratch=scratch)
    return subprocess.run(_command(trial, argv), capture_output=True, text=True, cwd=ws, env=ENV, timeout=TIMEOUT_S)


def run_trial(pristine: Path, trial: Trial, scratch: Path) -> tuple[str, str]:
    """(outcome, message) of one trial in a fresh copy of the workspace."""
    ws = scratch / "ws"
    if ws.exists():
        subprocess.run(["chmod", "-R", "u+rwX", str(ws)], check=False)
        shutil.rmtree(ws)
    shutil.copytree(pristine, ws, symlinks=True)
    if trial.user:
        shutil.chown(scratch, USER)
        subprocess.run(["chown", "-R", USER, str(ws)], check=True)
    try:
        argv = trial.prepare(ws)
    except Exception as exc:  # noqa: BLE001 - a trial whose set-up failed is the catalogue's, shown as such
        return "trial not built", f"{type(exc).__name__}: {str(exc)[-400:]}"
    skip = NEW + ((trial.out,) if trial.out else ()) + own_outputs(argv)
    before = snapshot_safe(ws, skip)
    try:
        res = run_command(trial, argv, ws=ws, scratch=scratch)
    except subprocess.TimeoutExpired:
        return ("wrongly accepted" if trial.expect == "refuse" else "accepted as it should"), \
            f"still running after {TIMEOUT_S:.0f} s"
    after = snapshot_safe(ws, skip)
    lines = res.stderr.strip().splitlines()
    if trial.warn:  # each warning one line, then the outcome
        lines = [line for line in lines if not line.startswith("warning: ")]
    message = lines[-1] if lines else res.stdout.strip().splitlines()[-1:] and res.stdout.strip().splitlines()[-1]
    lost = [k for k, v in before.items() if after.get(k) != v]
    if lost:
        return "data lost", f"{lost[:3]} changed or vanished; {message}"
    if "Traceback" in res.stderr or (res.returncode == 1 and "internal error" in res.stderr):
        return "internal error", message or ""
    if res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        if trial.expect == "accept":
            return "refused a valid input", message
        if trial.must is not None and trial.must not in message:
            return "misleading", message
        differs = trial.check(ws) if trial.check is not None else None
        return ("resume changed files", differs) if differs else ("clean", message)
    if res.returncode == 0:
        if trial.expect == "refuse":
            return "wrongly accepted", message or ""
        differs = trial.check(ws) if trial.check is not None else None
        return ("resume changed files", differs) if differs else ("accepted as it should", message or "")
    return "internal error", f"exit {res.returncode}: {message}"


def own_outputs(argv: list[str]) -> tuple[str, ...]:
    """What a command may change besides new outputs: the runs ``evaluate`` writes its metrics into,
    and the folder ``--resume`` continues (``--overwrite`` trials stay strict: a user's file must stay)."""
    own: list[str] = []
    if argv[:1] == ["evaluate"]:
        own += [a.rstrip("/") for a in argv[1:] if not a.startswith("-") and "/" not in a.rstrip("/")]
    if argv[:2] == ["store", "rebuild"] and len(argv) > 2:  # its output is the store's index
        own.append(argv[2])
    if "--resume" in argv and "--out" in argv:
        own.append(argv[argv.index("--out") + 1])
    return tuple(own)


def snapshot_safe(root: Path, skip: tuple[str, ...]) -> dict[str, str]:
    """Every file of ``root`` with a hash of its content (unreadable files and links recorded as such)."""
    out = {}
    for p in sorted(root.rglob("*")) if os.access(root, os.R_OK) else []:
        rel = str(p.relative_to(root))
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        if p.is_symlink() or not p.exists():
            out[rel] = "link"
        elif p.is_file():
            try:
                out[rel] = snapshot_file(p)
            except OSError:
                out[rel] = "unreadable"
        else:
            out[rel] = "dir"
    return out


def snapshot_file(path: Path) -> str:
    import hashlib

    if not path.is_file() or path.stat().st_size > 50 * 2**20:
        return f"size {path.stat().st_size}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="source tree to test (default: the installed datarecon)")
    parser.add_argument("--only", default="", help="only the trials whose group starts with this (several: comma-separated)")
    parser.add_argument("--name", default="", help="only the trials whose name contains this")
    parser.add_argument("--log", type=Path, help="write each trial's outcome and message here (JSON lines)")
    parser.add_argument("--fork", action="store_true", help="fork each command from this process (see above)")
    parser.add_argument("--sample", action="store_true", help="only the first trial of every group (and those of "
                        "--also)")
    parser.add_argument("--also", action="append", default=[], help="with --sample: the trials whose name contains "
                        "this too (repeatable)")
    parser.add_argument("--base-only", action="store_true", help="only the groups the base workspace serves (no "
                        "fifth-trial models, no other user)")
    opts = parser.parse_args()
    ENV.update({**os.environ, "OMP_NUM_THREADS": "1"})
    if opts.src:
        ENV["PYTHONPATH"] = str(Path(opts.src).resolve())
        if opts.fork:
            raise SystemExit("--fork runs the source this interpreter imports; for --src put it first on PYTHONPATH")
    if opts.fork:
        FORK["on"] = True
        warm_up()
        adversarial_trials.cli = _forked_cli  # the workspace's commands too
    adversarial_trials.ENV.update(ENV)  # the workspace is built with the same source and environment
    only = tuple(opts.only.split(","))  # several prefixes, comma-separated
    trials = [t for t in TRIALS if t.group.startswith(only) and opts.name in t.name
              and not (opts.base_only and (t.user or t.group not in BASE_GROUPS))]
    if opts.sample:
        trials = [t for i, t in enumerate(trials) if i == 0 or trials[i - 1].group != t.group
                  or any(also in t.name for also in opts.also)]
    has_user = ensure_user()
    if not has_user:
        print(f"note: no user {USER} (not root, or no useradd): the permission trials are left out", file=sys.stderr)
        trials = [t for t in trials if not t.user]
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        pristine = build_workspace(root)
        if any(t.group not in BASE_GROUPS for t in trials):
            build_fifth_extras(pristine)
        if any(t.group.startswith("seventh") for t in trials):
            seventh_trial.build_seventh_extras(pristine)
        for trial in trials:
            scratch = root / "scratch"
            scratch.mkdir(exist_ok=True)
            outcome, message = run_trial(pristine, trial, scratch)
            rows.append((trial.group, trial.name, outcome, message))
            print(f"{trial.group:<11} {trial.name:<62} {outcome:<22} {message}", file=sys.stderr, flush=True)
            if opts.log:
                with open(opts.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"group": trial.group, "name": trial.name, "outcome": outcome,
                                         "message": message}) + "\n")
        subprocess.run(["chmod", "-R", "u+rwX", str(root)], check=False)
    counts = Counter((g, what) for g, _, what, _ in rows)
    print("| group | outcome | trials |\n|---|---|---|")
    for (group, what), n in sorted(counts.items()):
        print(f"| {group} | {what} | {n} |")
    print(f"\n{len(rows)} trials: " + ", ".join(f"{n} {w}" for w, n in Counter(w for _, _, w, _ in rows).most_common()))
    for group, name, what, message in rows:
        if what not in ("clean", "accepted as it should"):
            print(f"- {group}: {name}: {what}: {message}")


if __name__ == "__main__":
    main()
