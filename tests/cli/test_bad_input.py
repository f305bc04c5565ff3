"""Bad input, table-driven: every case exits 2 with one ``error:`` line, no traceback, and changes
nothing outside the command's own output folder (and, where the command is refused, not even that).

Each case builds its input in a fresh workspace (copies of a pristine model directory and of a
finished run, tampered as the case needs), snapshots every file of the workspace, runs the command
in-process and compares the snapshot afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from own_nets import NETS

from datarecon.attacks import ATTACKS
from datarecon.attacks.base import Attack, check_attack
from datarecon.cli.main import main
from datarecon.utils.io import load_tensors, save_tensors, sha256_file

#: the real data (as tests/conftest.py finds it): ../shared/data beside the checkout, or $DATARECON_DATA
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "4", "--no-bias",
         "--epochs", "2", "--no-progress"]


def _model(out: Path, seed: int) -> Path:
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import ModelDescription, TrainingRecord, save_model_dir
    from datarecon.models.spec import ArchSpec, build_model

    spec = DataSpec(dataset="digits", task="odd-even", n_per_class=5, n_partition_per_class=5, n_heldout_per_class=5)
    task = load_task(spec)
    arch = ArchSpec(name="mlp", input_shape=(1, 8, 8), hidden=(8,), bias=False, init_scale=1e-2)
    model = build_model(arch, generator=torch.Generator().manual_seed(seed))
    save_model_dir(out, model=model, description=ModelDescription(
        arch=arch, loss="logistic", weight_decay=0.0, data=spec.model_dump(mode="json"),
        normalisation=spec.normalisation, training={}, seed=seed,
    ), record=TrainingRecord(input_mean=task.normalisation.mean,
                             indices={"train": task.train.indices, "partition": task.partition.indices,
                                      "heldout": task.heldout.indices}))
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """Two model directories (different weights, same architecture) and a finished 3-step kkt run on the first."""
    root = tmp_path_factory.mktemp("pristine")
    a, b = _model(root / "model", 0), _model(root / "other-model", 1)
    assert main(["reconstruct", "--no-progress", "--model", str(a), "--steps", "3", "--candidates", "4",
                 "--out", str(root / "run")]) == 0
    shutil.copytree(root / "run", root / "evaluated")
    assert main(["evaluate", "--no-progress", str(root / "evaluated")]) == 0
    (root / "sweep.yaml").write_text(f"model_dir: {a}\nsteps: 2\ncandidates: 4\n")
    assert main(["sweep", "--no-progress", "--config", str(root / "sweep.yaml"), "--out", str(root / "store")]) == 0
    return {"model": a, "other": b, "run": root / "run", "evaluated": root / "evaluated", "store": root / "store"}


@dataclass
class Workspace:
    """A scratch folder with fresh copies of the pristine artefacts."""

    root: Path
    model: Path
    other: Path
    run: Path
    evaluated: Path
    store: Path

    def edit_meta(self, change: Callable[[dict], None]) -> Path:
        meta = json.loads((self.model / "model.json").read_text())
        change(meta)
        (self.model / "model.json").write_text(json.dumps(meta))
        return self.model

    def rewrite(self, name: str, data: bytes) -> Path:
        """Replace a tensor file and record its new hash, as a careful tamperer would."""
        (self.model / name).write_bytes(data)
        self.edit_meta(lambda m: m["sha256"].__setitem__(name, sha256_file(self.model / name)))
        return self.model

    def tensors(self, name: str, change: Callable[[dict], None]) -> Path:
        t = load_tensors(self.model / name)
        change(t)
        tmp = self.root / "t.safetensors"
        save_tensors(tmp, t)
        data = tmp.read_bytes()
        tmp.unlink()
        return self.rewrite(name, data)


@dataclass(frozen=True)
class Case:
    """``argv(ws)`` builds the input and returns the command line; ``out(ws)`` is the one folder the
    command may change (None: none); ``message`` must appear in the error line."""

    argv: Callable[[Workspace], list[str]]
    message: str
    out: Callable[[Workspace], Path] | None = None
    patch: Callable[[pytest.MonkeyPatch], None] | None = None


def _rec(ws: Workspace, *args: str, model: Path | None = None, out: str = "new-run") -> list[str]:
    return ["reconstruct", "--no-progress", "--model", str(model or ws.model), "--steps", "3", "--candidates", "4",
            "--out", str(ws.root / out), *args]


def _new_run(ws: Workspace) -> Path:
    return ws.root / "new-run"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _foreign(ws: Workspace) -> Path:
    (ws.root / "u" / "important").mkdir(parents=True, exist_ok=True)
    (ws.root / "u" / "important" / "thesis.txt").write_text("years of work")
    return ws.root / "u"


def _pickle(ws: Workspace) -> Path:
    import io

    buf = io.BytesIO()
    torch.save({"1.weight": torch.zeros(8, 64)}, buf)
    return ws.rewrite("weights.safetensors", buf.getvalue())


def _disk_full(mp: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    mp.setattr("datarecon.utils.io.os.fsync", fsync)


def _sweep(ws: Workspace, extra: str = "") -> Path:
    return _write(ws.root / "sweep.yaml", f"model_dir: {ws.model}\nsteps: 2\ncandidates: 4\n{extra}")


def _running(ws: Workspace) -> Path:
    meta = json.loads((ws.run / "run.json").read_text())
    (ws.run / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    return ws.run


def _cwd_with_files(ws: Workspace) -> list[str]:
    """``--out . --overwrite`` in a working directory that holds the user's files."""
    (ws.root / "project").mkdir()
    (ws.root / "project" / "notes.txt").write_text("mine")
    os.chdir(ws.root / "project")  # the test's monkeypatch.chdir restores the original directory
    return [*TRAIN, "--out", ".", "--overwrite"]


CASES: dict[str, Case] = {
    # -- tampered or broken model directories (reconstruct reads them) -------------------------------
    "model-hidden-negative": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["arch"].update(hidden=[-5]))),
                                  "hidden widths must be positive"),
    "model-hidden-petabytes": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["arch"].update(hidden=[10**12]))),
                                   "does not fit architecture mlp"),
    "model-no-loss": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.pop("loss"))), "loss: Field required"),
    "model-wd-text": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(weight_decay="abc"))),
                          "weight_decay"),
    "model-wd-negative": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(weight_decay=-1))),
                              "weight_decay: Input should be greater than or equal to 0"),
    "model-wd-infinite": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(weight_decay=float("inf")))),
                              "weight_decay: Input should be a finite number"),
    "model-loss-unknown": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(loss="hinge-xyz"))),
                               "unknown loss 'hinge-xyz'"),
    "model-format": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(format="other/1"))),
                         "is not a datarecon model file"),
    "model-arch-unknown": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["arch"].update(name="resnet"))),
                               "unknown architecture 'resnet'"),
    "model-input-shape-zero": Case(
        lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["arch"].update(input_shape=[0, 8, 8]))),
        "input_shape must be positive sizes"),
    "model-json-garbage": Case(lambda ws: _rec(ws, model=_write(ws.model / "model.json", "{not json").parent),
                               "is not valid JSON"),
    "weights-nan": Case(lambda ws: _rec(ws, model=ws.tensors("weights.safetensors",
                                                             lambda t: t["1.weight"].__setitem__((0, 0), float("nan")))),
                        "NaN or infinite values in 1.weight"),
    "weights-pickle": Case(lambda ws: _rec(ws, model=_pickle(ws)), "pickles can execute code"),
    "weights-truncated": Case(lambda ws: _rec(ws, model=ws.rewrite(
        "weights.safetensors", (ws.model / "weights.safetensors").read_bytes()[:100])), "not a valid safetensors file"),
    "weights-tampered": Case(lambda ws: _rec(ws, model=_write(ws.model / "weights.safetensors", "x").parent),
                             "does not match the hash"),
    "extras-no-mean": Case(lambda ws: _rec(ws, model=ws.tensors("extras.safetensors", lambda t: t.pop("input_mean"))),
                           "has no input_mean"),
    "extras-mean-shape": Case(lambda ws: _rec(ws, model=ws.tensors(
        "extras.safetensors", lambda t: t.__setitem__("input_mean", torch.zeros(3, 8, 8)))), "input_mean has shape"),
    "model-missing": Case(lambda ws: _rec(ws, model=ws.root / "nowhere"), "not found"),
    "model-is-a-run": Case(lambda ws: _rec(ws, model=ws.run), "is a run directory, not a model directory"),
    # -- reconstruct options and output folders ------------------------------------------------------
    "out-is-a-file": Case(lambda ws: _rec(ws, out=_write(ws.root / "f.txt", "x").name), "is an existing file"),
    "steps-zero": Case(lambda ws: [*_rec(ws), "--steps", "0"], "steps must be at least 1"),
    "candidates-zero": Case(lambda ws: [*_rec(ws), "--candidates", "0"], "candidate count must be at least 1"),
    "method-unknown": Case(lambda ws: _rec(ws, "--method", "nope"), "unknown attack method 'nope'"),
    "init-unknown": Case(lambda ws: _rec(ws, "--init", "zeros"), "unknown initialisation 'zeros'"),
    "dtype-unknown": Case(lambda ws: _rec(ws, "--dtype", "float16"), "dtype"),
    "device-unknown": Case(lambda ws: _rec(ws, "--device", "warp"), "unknown device 'warp'"),
    "lr-negative": Case(lambda ws: _rec(ws, "--lr-x", "-1"), "lr_x: Input should be greater than 0"),
    "set-unknown-field": Case(lambda ws: _rec(ws, "--set", "bogus=1"), "bogus"),
    "formulation-unknown": Case(lambda ws: _rec(ws, "--formulation", "hinge"), "unknown formulation 'hinge'"),
    "checkpoint-every-zero": Case(lambda ws: _rec(ws, "--checkpoint-every", "0"), "--checkpoint-every"),
    "config-missing": Case(lambda ws: _rec(ws, "--config", str(ws.root / "none.yaml")), "not found"),
    "config-not-mapping": Case(lambda ws: _rec(ws, "--config", str(_write(ws.root / "c.yaml", "- 1\n- 2\n"))),
                               "must hold a mapping"),
    "resume-other-model": Case(lambda ws: _rec(ws, "--resume", model=ws.other, out="run"),
                               "was run against another model"),
    "resume-into-model-dir": Case(lambda ws: _rec(ws, "--resume", out="model"),
                                  "is a datarecon model directory, not a run directory"),
    "overwrite-foreign-folder": Case(lambda ws: _rec(ws, "--overwrite", out=_foreign(ws).name),
                                     "refusing to --overwrite"),
    "resume-and-overwrite": Case(lambda ws: _rec(ws, "--resume", "--overwrite", out="run"), "not both"),
    "disk-full": Case(lambda ws: _rec(ws), "no space left on device writing", out=_new_run, patch=_disk_full),
    # -- train ---------------------------------------------------------------------------------------
    "train-wd-infinite": Case(lambda ws: ["train", "--no-progress", "--out", str(ws.root / "m"), "--config", str(_write(
        ws.root / "t.yaml", "data: {dataset: digits, task: odd-even, n_per_class: 5}\nweight_decay: .inf\n"))],
        "weight_decay: Input should be a finite number"),
    "train-lr-infinite": Case(lambda ws: [*TRAIN, "--lr", "inf", "--out", str(ws.root / "m")], "lr: Input should be"),
    "train-overwrite-foreign": Case(lambda ws: [*TRAIN, "--out", str(_foreign(ws)), "--overwrite"],
                                    "refusing to --overwrite"),
    "train-overwrite-project": Case(_cwd_with_files, "it holds 'notes.txt'"),
    "train-pair-one-class": Case(lambda ws: [*TRAIN[:4], "pair:3", *TRAIN[5:], "--out", str(ws.root / "m")],
                                 "needs at least two comma-separated classes"),
    "train-pair-three": Case(lambda ws: [*TRAIN[:4], "pair:1,2,3", *TRAIN[5:], "--out", str(ws.root / "m")],
                             "takes exactly two classes"),
    "train-dataset-unknown": Case(lambda ws: ["train", "--dataset", "imagenet", "--task", "all", "--n-per-class", "5",
                                              "--out", str(ws.root / "m")], "unknown dataset 'imagenet'"),
    "train-hidden-negative": Case(lambda ws: [*TRAIN, "--hidden", "-5", "--out", str(ws.root / "m")],
                                  "hidden widths must be positive"),
    "train-epochs-zero": Case(lambda ws: [*TRAIN, "--epochs", "0", "--out", str(ws.root / "m")], "epochs"),
    "train-no-data": Case(lambda ws: ["train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "5",
                                      "--data-dir", str(ws.root / "nowhere"), "--out", str(ws.root / "m")],
                          "MNIST not found"),
    # -- evaluate ------------------------------------------------------------------------------------
    "evaluate-model-dir": Case(lambda ws: ["evaluate", "--no-progress", str(ws.model)],
                               "is a model directory, not a run directory"),
    "evaluate-unfinished": Case(lambda ws: ["evaluate", "--no-progress", str(_running(ws))], "--allow-incomplete"),
    "evaluate-missing": Case(lambda ws: ["evaluate", "--no-progress", str(ws.root / "none")], "not found"),
    "evaluate-against-unknown": Case(lambda ws: ["evaluate", "--no-progress", "--against", "test", str(ws.run)],
                                     "unknown reference set"),
    # -- sweeps, stores, reports, reproductions, demo -------------------------------------------------
    "sweep-into-a-run": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)), "--out", str(ws.run)],
                             "is a datarecon run directory, not a results store"),
    "sweep-into-foreign": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)),
                                           "--out", str(_foreign(ws))], "is not a results store"),
    "sweep-bad-attack-field": Case(lambda ws: ["sweep", "--no-progress", "--config",
                                               str(_sweep(ws, "attack: {lr_x: -1}\n")), "--out", str(ws.root / "s")],
                                   "sweep run 0: invalid kkt config: lr_x"),
    "store-sort-unknown": Case(lambda ws: ["store", "list", str(ws.root), "--sort", "nonexistent"],
                               "unknown --sort 'nonexistent'"),
    "store-missing": Case(lambda ws: ["store", "list", str(ws.root / "none")], "no results index"),
    "report-unevaluated": Case(lambda ws: ["report", str(ws.run), "--out", str(ws.root / "r.html")], "metrics.json"),
    "reproduce-overwrite-foreign": Case(lambda ws: ["reproduce", "haim2022", "--out", str(_foreign(ws)),
                                                    "--overwrite"], "refusing to --overwrite"),
    "demo-overwrite-foreign": Case(lambda ws: ["demo", "--no-progress", "--out", str(_foreign(ws)), "--overwrite"],
                                   "refusing to --overwrite"),
    # usage errors (click's own words, on one line, with where the options are listed)
    "usage-unknown-option": Case(lambda ws: [*TRAIN, "--out", str(ws.root / "m"), "--epoch", "3"],
                                 "No such option: --epoch (Possible options: --arch, --epochs)"),
    "usage-missing-option": Case(lambda ws: TRAIN, "Missing option '--out'. See 'datarecon train --help'."),
    "usage-bad-value-type": Case(lambda ws: _rec(ws, "--seed", "abc"), "Invalid value for '--seed'"),
    "usage-unknown-command": Case(lambda ws: ["reconstrut", "--model", str(ws.model)],
                                  "No such command 'reconstrut'. Did you mean 'reconstruct', 'report'? See 'datarecon --help'."),
}


# -- issue 25: inputs that ended in "internal error", were wrongly accepted, or would overwrite ------


def _own(ws: Workspace, factory: str, *args: str, weights: str = "ok") -> list[str]:
    """``reconstruct --model dr_issue25_nets:<factory> --weights ...`` (a package in the workspace)."""
    pkg = ws.root / "dr_issue25_nets"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(NETS)  # a package name no other test reuses
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8, bias=False), torch.nn.ReLU(),
                              torch.nn.Linear(8, 1, bias=False))
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    if weights != "ok":
        state["1.weight"][0, 0] = float(weights)
    save_file(state, str(ws.root / "net.safetensors"))
    return ["reconstruct", "--no-progress", "--model", f"dr_issue25_nets:{factory}", "--weights",
            str(ws.root / "net.safetensors"), "--input-shape", "1,8,8", "--candidates", "4", "--steps", "2",
            "--out", str(ws.root / "own"), *args]


def _sqlite_full(mp: pytest.MonkeyPatch) -> None:
    import sqlite3

    def connect(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    mp.setattr("datarecon.experiments.store.sqlite3.connect", connect)


def _exp(ws: Workspace, extra: str) -> Path:
    return _write(ws.root / "exp.yaml", "train: {data: {dataset: digits, task: odd-even, n_per_class: 5}, "
                  "arch: {name: mlp, hidden: [4], bias: false}, epochs: 2}\n"
                  f"attack: {{attack: {{method: kkt, steps: 2}}}}\n{extra}")


def _with_file(folder: Path, rel: str, text: str = "mine") -> Path:
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_text(text)
    return folder


CASES.update({
    "config-not-utf8": Case(lambda ws: _rec(ws, "--config", str(_write(ws.root / "c.yaml", "steps: 3\n") and
                                                                 _bytes(ws.root / "c.yaml", b"steps: 3\n\xff\xfe\n"))),
                            "is not UTF-8 text (byte 0xff at position 9); save it as UTF-8"),
    "out-not-writable": Case(lambda ws: _rec(ws, out="/sys/datarecon-issue25"), "cannot write /sys"),
    "out-name-too-long": Case(lambda ws: _rec(ws, out="a" * 300), "is too long for the filesystem"),
    "out-under-a-file": Case(lambda ws: _rec(ws, out=f"{_write(ws.root / 'f.txt', 'x').name}/run"),
                             "a part of this path is a file, not a folder"),
    "own-factory-raises": Case(lambda ws: _own(ws, "boom"), "dr_issue25_nets:boom() raised ValueError: bad width"),
    "own-factory-exits": Case(lambda ws: _own(ws, "bye"), "called sys.exit(3) instead of returning a model"),
    "own-weights-nan": Case(lambda ws: _own(ws, "make", weights="nan"), "holds 1 NaN or infinite value(s)"),
    "own-weights-inf": Case(lambda ws: _own(ws, "make", weights="inf"), "holds 1 NaN or infinite value(s)"),
    "own-weight-decay-nan": Case(lambda ws: _own(ws, "make", "--weight-decay", "nan"),
                                 "weight_decay must be a finite number >= 0"),
    "own-weight-decay-inf": Case(lambda ws: _own(ws, "make", "--weight-decay", "inf"),
                                 "weight_decay must be a finite number >= 0"),
    "candidates-absurd": Case(lambda ws: _rec(ws, "--candidates", "10000000000"), "not enough memory"),
    "train-hidden-absurd": Case(lambda ws: [*TRAIN, "--hidden", "100000000000", "--out", str(ws.root / "m")],
                                "not enough memory"),
    "seed-above-int64": Case(lambda ws: _rec(ws, "--seed", "99999999999999999999"),
                             "seed: Input should be less than or equal to 9223372036854775807"),
    "train-epochs-absurd": Case(lambda ws: [*TRAIN, "--epochs", "100000000000000000000000", "--out", str(ws.root / "m")],
                                "epochs: Input should be less than or equal to 1000000000"),
    "train-epochs-float-config": Case(lambda ws: ["train", "--no-progress", "--out", str(ws.root / "m"), "--config", str(
        _write(ws.root / "t.yaml", "data: {dataset: digits, task: odd-even, n_per_class: 5}\nepochs: 1.0e+18\n"))],
        "epochs: Input should be less than or equal to 1000000000"),
    "steps-absurd": Case(lambda ws: [*_rec(ws), "--steps", "100000000000000000000000"],
                         "steps: Input should be less than or equal to 1000000000"),
    "store-index-damaged": Case(lambda ws: ["store", "list", str(_bytes(ws.store / "index.sqlite", b"not sqlite" * 200)
                                                                 .parent)], "the results index is damaged"),
    "sweep-sqlite-disk-full": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)),
                                               "--out", str(ws.root / "s")],
                                   "no space left on device", out=lambda ws: ws.root / "s", patch=_sqlite_full),
    "reproduce-resume-and-overwrite": Case(lambda ws: ["reproduce", "haim2022", "--out", str(ws.root / "r"),
                                                       "--resume", "--overwrite"], "not both"),
    "train-dp-batch-above-n": Case(lambda ws: [*TRAIN, "--dp-noise", "1", "--dp-batch-size", "100",
                                               "--out", str(ws.root / "m")],
                                   "dp batch_size 100 exceeds the 10 training examples"),
    "uniform-low-above-high": Case(lambda ws: _rec(ws, "--init", "uniform", "--set", "init.low=1",
                                                   "--set", "init.high=0"), "low (1) must be below high (0)"),
    "report-empty-metrics": Case(lambda ws: ["report", str(_write(ws.run / "metrics.json", "{}").parent),
                                             "--out", str(ws.root / "r.html")],
                                 "is not an evaluation by datarecon (no nearest, metric)"),
    "resume-with-fewer-steps": Case(lambda ws: [*_rec(ws, "--resume", out="run"), "--steps", "2"],
                                    "has already done 3 steps, more than the 2 asked for"),
    # --overwrite and files datarecon did not write (items 12 and 14)
    "overwrite-user-file-in-checkpoint": Case(
        lambda ws: _rec(ws, "--overwrite", out=_with_file(ws.run, "checkpoint/notes.txt").name),
        "it holds 'checkpoint/notes.txt', which datarecon did not write"),
    "train-overwrite-user-file-in-checkpoint": Case(
        lambda ws: [*TRAIN, "--out", str(_with_file(ws.model, "checkpoint/mine.pt")), "--overwrite"],
        "it holds 'checkpoint/mine.pt', which datarecon did not write"),
    "runs-resume-into-foreign": Case(lambda ws: _rec(ws, "--runs", "2", "--resume", out=_foreign(ws).name),
                                     "is not a run directory datarecon wrote"),
    "runs-into-home-like-folder": Case(lambda ws: _rec(ws, "--runs", "2", out=_foreign(ws).name),
                                       "exists; pass --overwrite"),
    "pool-over-user-run-json": Case(lambda ws: ["sweep", "pool", str(ws.store), "--out",
                                                str(_with_file(ws.root / "mine", "run.json", "{}"))],
                                    "exists; pass --overwrite"),
    "report-over-user-file": Case(lambda ws: ["report", str(ws.evaluated), "--out",
                                              str(_write(ws.root / "notes.html", "mine"))],
                                  "exists and is not a report datarecon wrote"),
    "export-over-user-file": Case(lambda ws: ["store", "export", str(ws.store), "--out",
                                              str(_write(ws.root / "table.csv", "mine"))],
                                  "exists and is not a store export datarecon wrote"),
    "sweep-into-folder-with-runs": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)), "--out",
                                                    str(_with_file(ws.root / "proj", "runs/notes.txt"))],
                                        "is not a results store"),
    # validation of a whole file before any work (item 16)
    "experiment-bad-evaluate": Case(lambda ws: ["run", str(_exp(ws, "evaluate: {against: [test]}\n")), "--out",
                                                str(ws.root / "e"), "--no-progress"], "unknown reference set"),
    "experiment-bad-metric": Case(lambda ws: ["run", str(_exp(ws, "evaluate: {metric: psnr}\n")), "--out",
                                              str(ws.root / "e"), "--no-progress"], "unknown similarity metric 'psnr'"),
    "audit-negative-seed": Case(lambda ws: ["audit", "--scale", "smoke", "--out", str(ws.root / "a"), "--config",
                                            str(_write(ws.root / "a.yaml", "seeds: [-1]\n"))],
                                "seeds.0: Input should be greater than or equal to 0"),
    "audit-ray-address-without-ray": Case(lambda ws: ["audit", "--scale", "smoke", "--out", str(ws.root / "a"),
                                                      "--backend", "local", "--ray-address", "auto"],
                                          "--ray-address needs --backend ray"),
    # fine-tuning (issue 35, item 5): refused before the model folder is written
    "train-pretrained-missing": Case(lambda ws: [*TRAIN, "--pretrained", str(ws.root / "nowhere"), "--out",
                                                 str(ws.root / "m")], "nowhere not found"),
    "train-pretrained-run-dir": Case(lambda ws: [*TRAIN, "--pretrained", str(ws.run), "--out", str(ws.root / "m")],
                                     "is a run directory, not a model directory"),
    "train-pretrained-sha256-malformed": Case(lambda ws: [*TRAIN, "--pretrained", str(ws.model), "--pretrained-sha256",
                                                          "abc", "--out", str(ws.root / "m")],
                                              "sha256 must be 64 lower-case hex digits"),
    "train-pretrained-other-weights": Case(lambda ws: [*TRAIN, "--hidden", "8", "--pretrained", str(ws.model),
                                                       "--pretrained-sha256", "0" * 64, "--out", str(ws.root / "m")],
                                           "is not the one the config names"),
    "train-pretrained-other-widths": Case(lambda ws: [*TRAIN, "--pretrained", str(ws.model), "--out",
                                                      str(ws.root / "m")],
                                          "the pretrained model has widths 8, the fine-tuning 4; pass --hidden 8"),
    "train-pretrained-mean-normalised": Case(lambda ws: [*TRAIN, "--hidden", "8", "--pretrained", str(ws.model),
                                                         "--out", str(ws.root / "m")],
                                             "pretrain and fine-tune with --normalisation unit"),
    "train-batch-norm-cnn": Case(lambda ws: [*TRAIN, "--arch", "cnn", "--batch-norm", "--out", str(ws.root / "m")],
                                 "batch_norm applies to the ResNets"),
    "train-skip-negative": Case(lambda ws: [*TRAIN, "--skip-per-class", "-1", "--out", str(ws.root / "m")],
                                "skip_per_class"),
    "train-skip-too-many": Case(lambda ws: [*TRAIN, "--skip-per-class", "140", "--out", str(ws.root / "m")],
                                "after the first 140 per class"),
    "reconstruct-known-pretrained-not-finetuned": Case(lambda ws: _rec(ws, "--known-init", "pretrained"),
                                                       "this model was not fine-tuned from a pretrained model"),
    "reconstruct-known-pretrained-empty": Case(lambda ws: _rec(ws, "--known-init", "pretrained:"),
                                               "names no directory"),
    # hints that named options a command does not have (item 20)
    "evaluate-disk-full-hint": Case(lambda ws: ["evaluate", "--no-progress", str(ws.run)],
                                    "free some space and rerun the same command", out=lambda ws: ws.run,
                                    patch=_disk_full),
})


# -- issue 36: the third adversarial trial ---------------------------------------------------------


def _metrics(ws: Workspace, change: Callable[[dict], None]) -> Path:
    """The evaluated run with its metrics.json changed by hand."""
    m = json.loads((ws.evaluated / "metrics.json").read_text())
    change(m)
    (ws.evaluated / "metrics.json").write_text(json.dumps(m))
    return ws.evaluated


def _nested(ws: Workspace) -> Path:
    (ws.model / "model.json").write_text("[" * 100_000 + "]" * 100_000)
    return ws.model


def _grid(keys: int) -> str:
    """A sweep search of ``keys`` grid keys with 1000 values each."""
    names = ("attack.lr_x", "attack.lr_lambda", "attack.alpha")[:keys]
    return "search:\n  grid:\n" + "".join(f"    {k}: [{', '.join(str(1 + i) for i in range(1000))}]\n" for k in names)


_EXP_TRAIN = ("train: {data: {dataset: digits, task: odd-even, n_per_class: 5}, arch: {name: mlp, hidden: [4], "
              "bias: false}, epochs: 2}\n")


def _member(ws: Workspace, out: Path, *args: str, model: Path | None = None) -> list[str]:
    return ["membership", "--model", str(model or ws.model), "--evaluate", "--out", str(out), *args]


CASES.update({
    # data lost: every command that writes a file takes the one output rule (kernel.outdir)
    "membership-out-over-user-file": Case(lambda ws: _member(ws, _write(ws.root / "notes.txt", "mine")),
                                          "is an existing file; choose a directory for --out"),
    "membership-out-over-user-file-overwrite": Case(
        lambda ws: _member(ws, _write(ws.root / "notes.txt", "mine"), "--overwrite"),
        "is an existing file; choose a directory for --out"),
    "membership-out-into-model": Case(lambda ws: _member(ws, ws.model / "sub"), "lies inside"),
    # a file of another datarecon folder is named as lying inside it, not as "an existing file" (third trial, run 3)
    "membership-out-over-model-json": Case(lambda ws: _member(ws, ws.model / "model.json", "--overwrite"),
                                           "lies inside"),
    "membership-out-is-a-model": Case(lambda ws: _member(ws, ws.model, "--overwrite"), "not a membership folder"),
    "membership-out-is-a-users-folder": Case(lambda ws: _member(ws, ws.root), "not a membership folder"),
    "reconstruct-into-a-model": Case(lambda ws: _rec(ws, out="model/sub"), "lies inside"),
    "reconstruct-into-a-run": Case(lambda ws: _rec(ws, "--overwrite", out="run/checkpoint/x"), "lies inside"),
    "train-into-a-store": Case(lambda ws: [*TRAIN, "--out", str(ws.store / "runs" / "m")], "a datarecon results store"),
    "report-over-model-weights": Case(lambda ws: ["report", str(ws.evaluated), "--out",
                                                  str(ws.model / "weights.safetensors"), "--overwrite"], "lies inside"),
    "report-into-model": Case(lambda ws: ["report", str(ws.evaluated), "--out", str(ws.model / "model.json")],
                              "lies inside"),
    "export-into-model": Case(lambda ws: ["store", "export", str(ws.store), "--out", str(ws.model / "model.json")],
                              "lies inside"),
    "overwrite-keeps-a-user-file-named-like-a-temp": Case(
        lambda ws: _rec(ws, "--overwrite", out=_with_file(ws.run, ".run.json.abc123.tmp").name),
        "it holds '.run.json.abc123.tmp', which datarecon did not write"),
    # internal errors
    "train-lr-beyond-float32": Case(lambda ws: [*TRAIN, "--lr", "1e308", "--out", str(ws.root / "m")],
                                    "lr 1e+308 is beyond the range of float32"),
    "device-mps": Case(lambda ws: _rec(ws, "--device", "mps"), "device 'mps' is not supported; use cpu, cuda"),
    "model-json-nested-deeply": Case(lambda ws: _rec(ws, model=_nested(ws)), "is nested too deeply"),
    "info-model-json-nested-deeply": Case(lambda ws: ["info", str(_nested(ws))], "is nested too deeply"),
    "report-metrics-count-text": Case(lambda ws: ["report", str(_metrics(ws, lambda m: m["headline"].update(
        count="NaN"))), "--out", str(ws.root / "e.html")], "headline.count: Input should be a valid integer"),
    # wrongly accepted
    "train-epochs-true": Case(lambda ws: ["train", "--no-progress", "--out", str(ws.root / "m"), "--config", str(
        _write(ws.root / "t.yaml", "data: {dataset: digits, task: odd-even, n_per_class: 5}\nepochs: true\n"))],
        "epochs: a number is needed, not true/false"),
    "store-rebuild-a-model": Case(lambda ws: ["store", "rebuild", str(ws.model)],
                                  "is a datarecon model directory, not a results store"),
    "report-metrics-count-above-n": Case(lambda ws: ["report", str(_metrics(ws, lambda m: m["headline"].update(
        count=1e308))), "--out", str(ws.root / "e.html")], "headline.count"),
    "report-metrics-count-above-n-train": Case(lambda ws: ["report", str(_metrics(ws, lambda m: m["headline"].update(
        count=11))), "--out", str(ws.root / "e.html")], "count 11 exceeds the 10 training images"),
    "report-the-same-run-twice": Case(lambda ws: ["report", str(ws.evaluated), str(ws.root / "." / "evaluated"),
                                                  "--out", str(ws.root / "e.html")], "is given twice"),
    "sweep-grid-of-a-billion": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws, _grid(3))),
                                                "--out", str(ws.root / "s")], "expands to 1,000,000,000 runs"),
    "sweep-samples-of-a-billion": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(
        ws, "search: {random: {attack.lr_x: {dist: log-uniform, low: 1.0e-4, high: 0.1}}, samples: 1000000000}\n")),
        "--out", str(ws.root / "s")], "expands to 1,000,000,000 runs (1000000000 random samples)"),
    "candidates-three-million": Case(lambda ws: _rec(ws, "--candidates", "3000000"), "not enough memory"),
    "weights-all-zero": Case(lambda ws: _rec(ws, model=ws.tensors(
        "weights.safetensors", lambda t: t.update({k: torch.zeros_like(v) for k, v in t.items()}))), "holds only zeros"),
    "weights-float16": Case(lambda ws: _rec(ws, model=ws.tensors(
        "weights.safetensors", lambda t: t.update({k: v.half() for k, v in t.items()}))), "holds float16 weights"),
    "weights-scaled-by-1e30": Case(lambda ws: _rec(ws, model=ws.tensors(
        "weights.safetensors", lambda t: t.update({k: v * 1e30 for k, v in t.items()}))),
        "is beyond the range of float32"),
    "model-json-unknown-key": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m.update(bogus=1))),
                                   "bogus: unknown key"),
    "experiment-attack-with-its-own-model": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN + (
        f"attack: {{model: {ws.run}, attack: {{method: kkt, steps: 2}}}}\n"))), "--out", str(ws.root / "e"),
        "--no-progress"], "attack: model: the attack's target is the experiment's own"),
    "experiment-against-twice": Case(lambda ws: ["run", str(_exp(ws, "evaluate: {against: [train, train]}\n")),
                                                 "--out", str(ws.root / "e"), "--no-progress"],
                                     "reference set(s) train given more than once"),
    "evaluate-against-twice": Case(lambda ws: ["evaluate", "--no-progress", "--against", "train,train", str(ws.run)],
                                   "reference set(s) train given more than once"),
    "batch-mode-without-runs": Case(lambda ws: _rec(ws, "--batch-mode", "batched"), "applies to --runs K"),
    "threads-absurd": Case(lambda ws: [*TRAIN, "--threads", "10000", "--out", str(ws.root / "m")],
                           "--threads 10000 exceeds the"),
    "demo-threads-absurd": Case(lambda ws: ["demo", "--threads", "10000", "--out", str(ws.root / "d")],
                                "--threads 10000 exceeds the"),
    # misleading messages
    "out-empty": Case(lambda ws: ["reconstruct", "--model", str(ws.model), "--steps", "3", "--out", ""],
                      "an empty argument was given after --out"),
    "out-empty-equals": Case(lambda ws: ["reconstruct", "--model", str(ws.model), "--steps", "3", "--out="],
                             "an empty value was given for --out"),
    "store-list-a-model": Case(lambda ws: ["store", "list", str(ws.model)],
                               "is a datarecon model directory, not a results store"),
    "data-dir-is-a-file": Case(lambda ws: ["train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "5",
                                           "--data-dir", str(_write(ws.root / "f.txt", "x")), "--out",
                                           str(ws.root / "m")], "(which is a file, not a folder)"),
    "config-is-a-folder": Case(lambda ws: _rec(ws, "--config", str(ws.model)), "is a folder; pass a .yaml"),
    "config-is-a-device": Case(lambda ws: _rec(ws, "--config", "/dev/zero"), "is not a regular file"),
    "model-is-its-model-json": Case(lambda ws: _rec(ws, model=ws.model / "model.json"),
                                    "is the model's record file; pass the model directory that holds it"),
    "model-is-a-device": Case(lambda ws: _rec(ws, model=Path("/dev/null")), "is a file, not a model directory"),
    "model-is-a-plain-folder": Case(lambda ws: _rec(ws, model=_foreign(ws)),
                                    "is not a model directory (it has no model.json)"),
    "evaluate-sweep-of-a-run": Case(lambda ws: ["evaluate", "--no-progress", "--sweep", str(ws.evaluated)],
                                    "is a datarecon run directory, not a results store"),
    "set-empty-field": Case(lambda ws: _rec(ws, "--set", "=1"), "the field name '' is empty"),
    "set-a-run-field": Case(lambda ws: ["reconstruct", "--no-progress", "--steps", "3", "--set",
                                        f"model={_foreign(ws)}", "--out", str(ws.root / "new-run")],
                            "is not a model directory (it has no model.json)"),
    "run-file-only-unknown-keys": Case(lambda ws: ["reconstruct", "--no-progress", "--config", str(_write(
        ws.root / "r.yaml", "bogus: 1\nfoo: 2\n")), "--out", str(ws.root / "new-run")], "bogus, foo: unknown keys"),
    "evaluate-checks-every-run-first": Case(lambda ws: ["evaluate", "--no-progress", str(ws.run), str(ws.model)],
                                            "is a model directory, not a run directory"),
    "evaluate-the-same-run-twice": Case(lambda ws: ["evaluate", "--no-progress", str(ws.run), str(ws.root / "."
                                                                                                   / "run")],
                                        "is given twice"),
})


# -- the third adversarial trial's own findings (tests/faults/hostile_inputs.py) ---------------------


def _loop(ws: Workspace, name: str) -> str:
    (ws.root / name).symlink_to(name)
    return name


def _own_with(ws: Workspace, option: str, value: str) -> list[str]:
    argv = _own(ws, "make")
    argv[argv.index(option) + 1] = value
    return argv


def _damaged_experiment(ws: Workspace) -> list[str]:
    _write(ws.root / "ex" / "experiment.json", "{garbage") if (ws.root / "ex").mkdir() is None else None
    return ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN)), "--out", str(ws.root / "ex"), "--no-progress"]


CASES.update({
    "model-json-hidden-as-text": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["arch"].update(
        hidden=["8"]))), "arch.hidden.0: Input should be a valid integer"),
    "model-json-data-spec-negative": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["data"].update(
        n_per_class=-1))), "invalid data spec of"),
    "model-json-data-spec-unknown-dataset": Case(lambda ws: _rec(ws, model=ws.edit_meta(lambda m: m["data"].update(
        dataset="imagenet"))), "model.json: unknown dataset 'imagenet'"),
    "runs-a-million": Case(lambda ws: _rec(ws, "--runs", "1000000"), "more than 10,000 runs of one target"),
    "membership-evaluate-with-fpr": Case(lambda ws: ["membership", "--model", str(ws.model), "--evaluate", "--fpr",
                                                     "1.5"], "set the member call of --images"),
    "run-file-init-not-a-mapping": Case(lambda ws: ["reconstruct", "--no-progress", "--config", str(_write(
        ws.root / "r.yaml", f"model: {ws.model}\ninit: gaussian\n")), "--out", str(ws.root / "new-run")],
        "init: must be a mapping like {name: gaussian"),
    "out-symlink-loop": Case(lambda ws: _rec(ws, out=_loop(ws, "loop")), "is a symbolic link that leads nowhere"),
    "model-symlink-loop": Case(lambda ws: _rec(ws, model=ws.root / _loop(ws, "mloop")),
                               "is a symbolic link that leads nowhere"),
    "report-out-under-a-file": Case(lambda ws: ["report", str(ws.evaluated), "--out",
                                                str(_write(ws.root / "f.txt", "x")) + "/r.html"],
                                    "a part of this path is a file, not a folder"),
    "store-index-is-a-folder": Case(lambda ws: ["store", "list", str(ws.store)] if (ws.store / "index.sqlite").unlink()
                                    is None and (ws.store / "index.sqlite").mkdir() is None else [],
                                    "index.sqlite is not a file (a folder or a device)"),
    "steps-negative": Case(lambda ws: [*_rec(ws), "--steps", "-1"], "steps must be at least 1, got -1"),
    "evaluate-status-unknown": Case(lambda ws: ["evaluate", "--no-progress", str(_write(ws.run / "run.json", json.dumps(
        {**json.loads((ws.run / "run.json").read_text()), "status": "bogus"})).parent)], "status: unknown status"),
    "experiment-record-damaged": Case(_damaged_experiment, "rerun with --overwrite to start the experiment afresh"),
    "own-weights-a-folder": Case(lambda ws: _own_with(ws, "--weights", str(ws.model)),
                                 "is a folder where a safetensors file is expected"),
    "experiment-model-a-file": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", (
        f"model: {_write(ws.root / 'f.txt', 'x')}\nattack: {{attack: {{method: kkt, steps: 2}}}}\n"))), "--out",
        str(ws.root / "e"), "--no-progress"], "is a file, not a model directory"),
    "train-overwrite-a-workspace": Case(lambda ws: [*TRAIN, "--out", ".", "--overwrite"],
                                        "is not a datarecon model directory"),
    "sweep-model-dir-a-run": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_write(
        ws.root / "sweep.yaml", f"model_dir: {ws.run}\nsteps: 2\n")), "--out", str(ws.root / "s")],
        "set model_dir to the model directory the run attacked: "),
})


# -- issue 46: the fourth adversarial trial (membership with reference models, fine-tuning, run files) ------


def _members_of_other(ws: Workspace) -> Path:
    """A membership folder of the other model (its result, no reference models: K = 0)."""
    out = ws.root / "mof"
    assert main(["membership", "--model", str(ws.other), "--evaluate", "--nonmembers", "50", "--population", "10",
                 "--no-progress", "--out", str(out)]) == 0
    return out


def _npz(ws: Workspace) -> Path:
    import numpy as np

    np.savez(ws.root / "mine.npz", x=np.zeros((2, 1, 8, 8)))
    return ws.root / "mine.npz"


def _fine_tuned_from(ws: Workspace, model: Path, start: Path, digest: str | None = None) -> Path:
    """``model``'s model.json made to record ``start`` as its pretrained model (weights hash ``digest``; default
    the start's own), as a fine-tuning writes it."""
    meta = json.loads((model / "model.json").read_text())
    start_meta = json.loads((start / "model.json").read_text())
    meta["pretrained"] = {"path": str(start.resolve()), "weights_sha256": digest or start_meta["sha256"][
        "weights.safetensors"], "head": "pretrained", "data": start_meta["data"], "config_hash": None}
    (model / "model.json").write_text(json.dumps(meta))
    return model


def _symlink(ws: Workspace, target: Path, name: str) -> Path:
    (ws.root / name).symlink_to(target)
    return ws.root / name


_EXP_ZERO_SHA = "0" * 64


def _run_exp(ws: Workspace, attack: str) -> list[str]:
    """``datarecon run`` of an experiment that trains a small target and attacks it as ``attack`` says."""
    return ["run", str(_write(ws.root / "exp.yaml", f"{_EXP_TRAIN}{attack}\n")), "--out", str(ws.root / "e"),
            "--no-progress"]


def _read_only_dir(ws: Workspace) -> Path:
    (ws.root / "ro").mkdir()
    return ws.root / "ro"


def _deny_writes_in(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The permission check of a user who may not write the folder ``name`` (the tests run as root, who may)."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        real = os.access

        def access(path, mode, *args, **kwargs):
            return False if Path(path).name == name and mode & os.W_OK else real(path, mode, *args, **kwargs)

        mp.setattr("datarecon.kernel.outdir.os.access", access)

    return patch


def _manifest_full(mp: pytest.MonkeyPatch) -> None:
    def append(*args, **kwargs) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    mp.setattr("datarecon.utils.manifest._append_line", append)


def _unnamed_full(mp: pytest.MonkeyPatch) -> None:
    """A write deep in a library fails on a full disk without a file name (here: the first checkpoint)."""
    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    mp.setattr("datarecon.kernel.checkpoint.save", save)

CASES.update({
    # data lost: another model's membership folder (its result, its reference models) is refused, whatever K
    "membership-into-another-models-folder": Case(lambda ws: _member(ws, _members_of_other(ws)),
                                                  "is the membership folder of another model"),
    "membership-images-into-another-models-folder": Case(
        lambda ws: ["membership", "--model", str(ws.model), "--images", str(_npz(ws)), "--out",
                    str(_members_of_other(ws))], "is the membership folder of another model"),
    # wrongly accepted 1: --pretrained never equal to (or a cycle through) --out
    "train-pretrained-is-out": Case(lambda ws: [*TRAIN, "--pretrained", str(ws.model), "--out", str(ws.model),
                                                "--overwrite"], "is the pretrained model --pretrained"),
    "train-pretrained-is-out-through-a-symlink": Case(
        lambda ws: [*TRAIN, "--pretrained", str(_symlink(ws, ws.model, "start")), "--out", str(ws.model),
                    "--overwrite"], "would replace the weights the fine-tuning starts from"),
    "train-pretrained-cycle": Case(lambda ws: [*TRAIN, "--pretrained", str(_fine_tuned_from(ws, ws.other, ws.model)),
                                               "--out", str(ws.model), "--overwrite"],
                                   "is a pretrained start of --pretrained"),
    # wrongly accepted 2: membership checks the recorded hash of a fine-tuned model's pretrained start
    "membership-pretrained-retrained": Case(
        lambda ws: _member(ws, ws.root / "m", model=_fine_tuned_from(ws, ws.model, ws.other, _EXP_ZERO_SHA)),
        "is not the pretrained model this model was fine-tuned from"),
    # wrongly accepted 6: an experiment is validated before its folder is written
    "experiment-attack-needs-known-init": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN + (
        "attack: {attack: {method: loo, steps: 2}}\n"))), "--out", str(ws.root / "e"), "--no-progress"],
        "attack: this attack needs the initialisation θ_init: set knowledge: {known_init: seed}"),
    "experiment-known-init-pretrained-not-fine-tuned": Case(lambda ws: ["run", str(_write(
        ws.root / "exp.yaml", _EXP_TRAIN + "attack: {attack: {method: kkt, steps: 2}, knowledge: {known_init: "
        "pretrained}}\n")), "--out", str(ws.root / "e"), "--no-progress"],
        "this model was not fine-tuned from a pretrained model"),
    "experiment-pretrained-missing": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN.replace(
        "epochs: 2}", f"epochs: 2, pretrained: {{path: {ws.root / 'nowhere'}}}}}") + (
        "attack: {attack: {method: kkt, steps: 2}}\n"))), "--out", str(ws.root / "e"), "--no-progress"],
        "train: pretrained.path"),
    "experiment-pretrained-other-sha256": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN.replace(
        "epochs: 2}", f"epochs: 2, pretrained: {{path: {ws.model}, sha256: '{_EXP_ZERO_SHA}'}}}}") + (
        "attack: {attack: {method: kkt, steps: 2}}\n"))), "--out", str(ws.root / "e"), "--no-progress"],
        "train: the pretrained model in"),
    "experiment-steps-zero": Case(lambda ws: _run_exp(ws, "attack: {attack: {method: kkt, steps: 0}}"),
                                  "attack: steps must be at least 1, got 0; set attack.steps"),
    "experiment-device-unknown": Case(lambda ws: _run_exp(ws, "attack: {attack: {method: kkt, steps: 2}, device: warp}"),
                                      "attack: unknown device 'warp'"),
    "experiment-known-n-false": Case(lambda ws: _run_exp(ws, "attack: {attack: {method: kkt, steps: 2}, knowledge: "
                                                             "{n: 3}}"),
                                     "known n = 3 is not this model's training-set size"),
    "experiment-candidates-absurd": Case(lambda ws: _run_exp(ws, "attack: {attack: {method: kkt, steps: 2}, candidates: "
                                                                 "10000000000}"), "reduce candidates: (its default"),
    # wrongly accepted 8: a field given by a flag and by --set
    "reconstruct-set-model-and-model": Case(lambda ws: _rec(ws, "--set", f"model={ws.other}"),
                                            "model is given twice, by --model"),
    # wrongly accepted 9: a Ray address that does not answer fails in one line within seconds, before any work
    "membership-ray-address-unanswered": Case(lambda ws: [*_member(ws, ws.root / "m"), "--backend", "ray",
                                                          "--ray-address", "127.0.0.1:1"],
                                              "cannot reach the Ray cluster at '127.0.0.1:1'"),
    # a model factory without its weights (membership and identifiability take a user's model as reconstruct does)
    "membership-of-a-model-factory": Case(lambda ws: ["membership", "--model", "mypkg.nets:make_mlp", "--evaluate"],
                                          "--model mypkg.nets:make_mlp needs --weights FILE.safetensors"),
    "identifiability-of-a-model-factory": Case(lambda ws: ["identifiability", "mypkg.nets:make_mlp"],
                                               "--model mypkg.nets:make_mlp needs --weights FILE.safetensors"),
    # misleading: a dataset of another image size named as one (not "train with the pretrained architecture")
    "train-pretrained-of-another-image-size": Case(lambda ws: [
        "train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "5", "--hidden", "8", "--no-bias",
        "--data-dir", os.environ.get("DATARECON_DATA", str(SHARED_DATA)), "--pretrained", str(ws.model), "--out",
        str(ws.root / "m")], "was trained on digits images of shape (1, 8, 8), the fine-tuning's mnist images have "
        "shape (1, 28, 28)"),
    # misleading: --pretrained-sha256 alone (not "pretrained.path: Field required"); a YAML null: key
    "train-pretrained-sha256-alone": Case(lambda ws: [*TRAIN, "--pretrained-sha256", _EXP_ZERO_SHA, "--out",
                                                      str(ws.root / "m")], "pass --pretrained DIR too"),
    "config-null-key": Case(lambda ws: _rec(ws, "--config", str(_write(ws.root / "r.yaml", "steps: 3\nnull: 1\n"))),
                            "the key 'null' on line 2 is read as null (no name), not as a field name"),
    # misleading: a full disk names the file (or at least the folder), never "writing a file"
    "disk-full-in-the-manifest": Case(lambda ws: _rec(ws), "new-run/.datarecon-manifest; files are replaced "
                                      "atomically", out=_new_run, patch=_manifest_full),
    "disk-full-in-the-results-index": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)), "--out",
                                                       "s"], "no space left on device writing the results index in s",
                                           out=lambda ws: ws.root / "s", patch=_sqlite_full),
    "disk-full-unnamed": Case(lambda ws: _rec(ws), "no space left on device writing a file in", out=_new_run,
                              patch=_unnamed_full),
    # misleading: a read-only --out is refused before the work, naming the folder (not the temporary file after it)
    "identifiability-out-read-only": Case(lambda ws: ["identifiability", str(ws.model), "--out",
                                                      str(_read_only_dir(ws) / "i.json")],
                                          "the folder", patch=_deny_writes_in("ro")),
    "report-out-read-only": Case(lambda ws: ["report", str(ws.evaluated), "--out", str(_read_only_dir(ws) / "r.html")],
                                 "is not writable for this user; choose an --out in a folder you can write",
                                 patch=_deny_writes_in("ro")),
    "sweep-ray-address-unanswered": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(ws)), "--out",
                                                     str(ws.root / "s"), "--backend", "ray", "--ray-address",
                                                     "127.0.0.1:1"], "cannot reach the Ray cluster at '127.0.0.1:1'"),
})


# -- issue 46 item 3: the fifth adversarial trial (priors, labels, the probe, train-mode batch norm, the membership
# package and plug-ins): each row fails on the source before its fix


def _own_membership(ws: Workspace, heldout: str) -> list[str]:
    """``membership`` of a user's model (the package of :func:`_own`) with its members as ``--train`` and ``heldout``
    (``same``: the members again; ``mixed``: half of them; ``new``: other examples) as ``--heldout``."""
    from safetensors.torch import save_file

    _own(ws, "make")
    x, y = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0., 1] * 3)
    save_file({"x": x, "y": y}, str(ws.root / "members.safetensors"))
    others = torch.cat([x[:3], torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))])
    fresh = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    save_file({"x": {"same": x, "mixed": others, "new": fresh}[heldout], "y": y}, str(ws.root / "heldout.safetensors"))
    return ["membership", "--model", "dr_issue25_nets:make", "--weights", str(ws.root / "net.safetensors"),
            "--input-shape", "1,8,8", "--evaluate", "--train", str(ws.root / "members.safetensors"), "--heldout",
            str(ws.root / "heldout.safetensors"), "--no-progress", "--out", str(ws.root / "m")]


def _damaged_membership(ws: Workspace, change: Callable[[dict], None]) -> Path:
    folder = _members_of_other(ws)
    result = json.loads((folder / "membership.json").read_text())
    change(result)
    (folder / "membership.json").write_text(json.dumps(result))
    return folder


CASES.update({
    # internal error: a prior weight beyond the attack dtype's range (weight x gradient overflowed in the step)
    "reconstruct-prior-weight-beyond-float32": Case(lambda ws: _rec(ws, "--box-weight", "1e300"),
                                                    "box_weight 1e+300 is beyond the range of float32"),
    # internal errors: a sweep's runs failed one by one (exit 1) where the sweep file could be refused at once
    "sweep-group-weight": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(
        ws, "attack: {group_weight: 1}\n")), "--out", str(ws.root / "s")], "this run is stepped alone; set "
        "group_weight to 0 in the sweep file"),
    "sweep-feature-stats-without-batch-norm": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(
        ws, "search: {grid: {attack.feature_stats_weight: [0, 1]}}\n")), "--out", str(ws.root / "s")],
        "the feature-statistics prior reads batch-norm layers and the target has none"),
    "sweep-restored-labels-without-known-init": Case(lambda ws: ["sweep", "--no-progress", "--config", str(_sweep(
        ws, "knowledge: {labels: restored}\n")), "--out", str(ws.root / "s")],
        "labels restored from the weights read the read-out's change"),
    # late validation: an experiment's group consistency refused only after it trained (its folder written)
    "experiment-group-weight": Case(lambda ws: _run_exp(ws, "attack: {attack: {method: kkt, steps: 2, group_weight: "
                                                            "1}}"), "this run is stepped alone"),
    # internal errors: a membership.json without signals, a plug-in's failure (tests/attacks/test_entry_point_plugins)
    "report-membership-json-without-signals": Case(lambda ws: ["report", str(_damaged_membership(
        ws, lambda r: r.pop("signals"))), "--out", str(ws.root / "r.html")], "membership.json is damaged"),
    # one line: the data-dependent initialisation's note came before the refusal
    "reconstruct-ground-truth-count-one-line": Case(lambda ws: _rec(ws, "--init", "ground-truth"),
                                                    "4 candidates but 10 ground-truth images"),
    # wrongly accepted
    "train-norm-mode-without-batch-norm": Case(lambda ws: [*TRAIN, "--norm-mode", "train", "--out",
                                                           str(ws.root / "m")],
                                               "this mlp has no batch norm; drop --norm-mode"),
    "train-margin-ascent-min-step-above-step-size": Case(lambda ws: [
        *TRAIN, "--margin-ascent-steps", "5", "--margin-ascent-min-step", "1", "--out", str(ws.root / "m")],
        "margin_ascent min_step 1 is not below step_size 0.01"),
    "reconstruct-early-stop-patience-beyond-step-limit": Case(lambda ws: _rec(ws, "--early-stop-patience",
                                                                              "10000000000"),
                                                              "early_stop.patience: Input should be less than or "
                                                              "equal to 1000000000"),
    # options that did nothing for the methods without step sizes (found in the review of 2026-11-28)
    "reconstruct-retry-diverged-for-bilevel": Case(lambda ws: _rec(ws, "--method", "bilevel", "--retry-diverged", "2"),
                                                   "has no step sizes a retry could lower"),
    "reconstruct-step-probe-for-bilevel": Case(lambda ws: _rec(ws, "--method", "bilevel", "--step-probe", "10"),
                                               "has no step sizes to probe"),
    "reconstruct-runs-resume-of-a-single-run": Case(lambda ws: _rec(ws, "--runs", "2", "--resume", out="run"),
                                                    "holds a single kkt run, not the folder of --runs K"),
    "membership-own-heldout-is-train": Case(lambda ws: _own_membership(ws, "same"),
                                            "6 of the 6 --heldout examples"),
    "membership-own-heldout-shares-train": Case(lambda ws: _own_membership(ws, "mixed"),
                                                "3 of the 6 --heldout examples"),
    "report-membership-auc-beyond-one": Case(lambda ws: ["report", str(_damaged_membership(
        ws, lambda r: r["signals"]["loss"]["report"].update(auc=7.0))), "--out", str(ws.root / "r.html")],
        "signals.loss.report.auc"),
    # misleading
    "reconstruct-restored-labels-binary-names-the-flag": Case(lambda ws: _rec(
        ws, "--known-labels", "restored", "--known-init", "seed:0"), "reconstruct --known-labels balanced"),
    "reconstruct-restored-labels-without-init-names-the-flag": Case(lambda ws: _rec(ws, "--known-labels", "restored"),
                                                                    "reconstruct --known-labels balanced"),
    "reconstruct-known-init-seed-of-a-fine-tuned-model": Case(lambda ws: _rec(
        ws, "--known-init", "seed:0", model=_fine_tuned_from(ws, ws.model, ws.other) and ws.edit_meta(
            lambda m: m.update(init_sha256=_EXP_ZERO_SHA))), "was fine-tuned from the pretrained model in"),
    "reconstruct-dynamics-of-an-own-model": Case(lambda ws: _own(ws, "make", "--method", "dynamics", "--known-recipe",
                                                                 "model"),
                                                 "a model of your own records none; attack a model directory"),
    "evaluate-membership-of-another-model": Case(lambda ws: ["evaluate", "--no-progress", str(ws.evaluated),
                                                             "--membership", str(_members_of_other(ws))],
                                                 "not of", out=lambda ws: ws.root / "mof"),
    "membership-weights-with-a-model-directory": Case(lambda ws: _member(ws, ws.root / "m", "--weights",
                                                                         str(ws.model / "weights.safetensors")),
                                                      "is a folder, and --weights goes with --model "
                                                      "package.module:factory"),
    "train-margin-ascent-step-size-nan": Case(lambda ws: [*TRAIN, "--margin-ascent-steps", "5",
                                                          "--margin-ascent-step-size", "nan", "--out",
                                                          str(ws.root / "m")],
                                              "margin_ascent.step_size: Input should be a finite number"),
    "evaluate-membership-a-run-folder": Case(lambda ws: ["evaluate", "--no-progress", str(ws.evaluated),
                                                         "--membership", str(ws.run)],
                                             "holds no membership.json; run `datarecon membership --model"),
})


# -- issue 50: the sixth trial's membership findings (data loss, an own model's recipe, audit --model's reference
# models, a budget that did nothing): each row fails on the source before its fix


def _trained_with_references(ws: Workspace, *args: str) -> Path:
    """A trained model (it records its recipe) and its membership folder with 2 finished reference models of
    ``--reference-seed 0``; returns the folder."""
    model, out = ws.root / "trained", ws.root / "refs"
    assert main([*TRAIN, "--out", str(model)]) == 0
    assert main(["membership", "--model", str(model), "--evaluate", "--references", "2", "--nonmembers", "50",
                 "--population", "10", "--no-progress", "--out", str(out), *args]) == 0
    return out


def _refs_again(ws: Workspace, *args: str) -> list[str]:
    out = _trained_with_references(ws)
    return ["membership", "--model", str(ws.root / "trained"), "--evaluate", "--references", "2", "--nonmembers",
            "50", "--population", "10", "--no-progress", "--out", str(out), *args]


def _own_recipe(ws: Workspace, recipe: str) -> list[str]:
    """``membership`` of a user's model with reference models trained by ``dr_issue25_nets:<recipe>``."""
    return [*_own_membership(ws, "new"), "--references", "2", "--recipe", f"dr_issue25_nets:{recipe}"]


CASES.update({
    # data lost: the finished reference models of another --reference-seed were trained over without --overwrite;
    # the table's snapshot checks that the refused call changes no file, the folder's included
    "membership-references-of-another-seed": Case(lambda ws: _refs_again(ws, "--reference-seed", "1"),
                                                  "holds 2 finished reference models made with --reference-seed 0"),
    # misleading: a recipe's failure was "N reference-model tasks failed" (first: a task key and a bare error)
    "membership-own-recipe-raises": Case(lambda ws: _own_recipe(ws, "boom"),
                                         "your training function dr_issue25_nets:boom failed on reference model 0",
                                         out=lambda ws: ws.root / "m"),
    # wrongly accepted: a budget that sets nothing (the count is fixed), and audit --model's reference models
    "membership-budget-with-fixed-references": Case(lambda ws: _member(ws, ws.root / "m", "--references", "4",
                                                                       "--budget-minutes", "1"),
                                                    "--budget-minutes sets how many reference models --references "
                                                    "auto trains"),
    "audit-references-without-model": Case(lambda ws: ["audit", "--scale", "smoke", "--references", "4", "--out",
                                                        str(ws.root / "a")],
                                           "set the reference models of audit --model's membership"),
    "audit-model-budget-with-fixed-references": Case(
        lambda ws: ["audit", "--scale", "smoke", "--model", str(ws.model), "--references", "4", "--budget-minutes",
                    "1", "--out", str(ws.root / "a")], "--budget-minutes sets how many reference models"),
    "audit-model-references-bogus": Case(lambda ws: ["audit", "--scale", "smoke", "--model", str(ws.model),
                                                     "--references", "many", "--out", str(ws.root / "a")],
                                         "--references takes auto or a number of reference models"),
    "audit-model-budget-negative": Case(lambda ws: ["audit", "--scale", "smoke", "--model", str(ws.model),
                                                    "--budget-minutes", "-1", "--out", str(ws.root / "a")],
                                        "budget_minutes"),
})


# -- issue 49 (options that did nothing) and issue 50's plug-in internal errors: on d8472df each was accepted or an
# internal error, but bilevel's group weight (refused there because bilevel's config had no such field; it has now)


class _PlugInversion(Attack):
    """A plug-in registered in the process (as tests/attacks/test_attack_plugin.py does): model inversion."""

    name: ClassVar[str] = "bad-input-inversion"

    def objective(self, target, prior, x, **variables):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean()}


class _PlugNoLoss(_PlugInversion):
    name: ClassVar[str] = "bad-input-no-loss"

    def objective(self, target, prior, x, **variables):
        return {"margin": target.forward(x).sum()}


class _PlugConstant(_PlugInversion):
    name: ClassVar[str] = "bad-input-constant"

    def objective(self, target, prior, x, **variables):
        return {"loss": torch.tensor(1.0)}


class _PlugUnlogged(_PlugInversion):
    name: ClassVar[str] = "bad-input-unlogged"
    early_stop_metric: ClassVar[str | None] = "never_logged"


def _plugged(cls: type) -> Callable[[pytest.MonkeyPatch], None]:
    """Register ``cls`` for one case (its declarations checked as a registration checks them; undone after)."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        assert check_attack(cls.name, cls) == ""
        mp.setitem(ATTACKS._items, cls.name, cls)
    return patch


CASES.update({
    "reconstruct-early-stop-tol-without-patience": Case(lambda ws: _rec(ws, "--early-stop-tol", "0.5"),
                                                        "early_stop.rel_tol 0.5 does nothing without "
                                                        "early_stop.patience; pass --early-stop-patience N"),
    "reconstruct-early-stop-tol-with-patience-0": Case(lambda ws: _rec(ws, "--early-stop-patience", "0",
                                                                       "--early-stop-tol", "0.5"),
                                                       "does nothing without early_stop.patience"),
    "reconstruct-early-stop-tol-5": Case(lambda ws: _rec(ws, "--early-stop-patience", "3", "--early-stop-tol", "5"),
                                         "pass --early-stop-tol in (0, 1)"),
    "train-margin-ascent-window-without-steps": Case(lambda ws: [*TRAIN, "--margin-ascent-window", "10", "--out",
                                                                 str(ws.root / "m")],
                                                     "margin_ascent window 10 (--margin-ascent-window) does nothing "
                                                     "without ascent steps"),
    "reconstruct-momentum-with-adam": Case(lambda ws: _rec(ws, "--optimizer", "adam", "--momentum", "0.5"),
                                           "momentum 0.5 is a constant of optimizer 'sgd'"),
    "reconstruct-nesterov-without-momentum": Case(lambda ws: _rec(ws, "--momentum", "0", "--nesterov"),
                                                  "nesterov without momentum"),
    "reconstruct-split-fraction-without-split-every": Case(lambda ws: _rec(ws, "--split-fraction", "0.2"),
                                                           "does nothing without sample splitting: pass --split-every"),
    "reconstruct-init-coefficient-without-known-init": Case(lambda ws: _rec(ws, "--init-coefficient", "0.5"),
                                                            "does nothing without a known initialisation"),
    "reconstruct-bilevel-group-weight-line-search": Case(lambda ws: _rec(ws, "--method", "bilevel", "--group-weight",
                                                                         "1", "--runs", "2"),
                                                         "bilevel's problem-derived step"),
    "reconstruct-plugin-objective-without-loss": Case(lambda ws: _rec(ws, "--method", _PlugNoLoss.name),
                                                      f"attack {_PlugNoLoss.name!r} (", patch=_plugged(_PlugNoLoss)),
    "reconstruct-plugin-constant-objective": Case(lambda ws: _rec(ws, "--method", _PlugConstant.name),
                                                  "its objective's 'loss' does not depend on the candidates x",
                                                  patch=_plugged(_PlugConstant)),
    "reconstruct-plugin-early-stop-metric-never-logged": Case(
        lambda ws: _rec(ws, "--method", _PlugUnlogged.name, "--early-stop-patience", "2"),
        "declares early_stop_metric 'never_logged', which its steps do not log", out=_new_run,
        patch=_plugged(_PlugUnlogged)),
})


# -- issue 50: records checked when read (model.json's metrics and margin-ascent curve), messages --------------


def _ascent_meta(meta: dict) -> None:
    """A margin ascent of 40 steps, window 20, as `train --margin-ascent-steps 40 --margin-ascent-window 20
    --kkt-score` records it (its curve probed at the start, 1 window and the end)."""
    meta["training"]["margin_ascent"] = {"steps": 40, "window": 20, "rtol": 0.01, "step_size": 0.01}
    meta["metrics"].update(margin_ascent_steps=40, margin_ascent_status="complete", margin_ascent_stop_reason="completed",
                           margin_ascent_wall_time_s=0.03, normalised_margin_before_ascent=0.015,
                           normalised_margin=0.044, margin_ascent_curve=[
                               {"step": s, "normalised_margin": m, "kkt_truth": 0.9, "kkt_best_fake": 0.95,
                                "kkt_gap": 0.05} for s, m in ((0, 0.015), (20, 0.053), (40, 0.044))])


def _info_ascent(ws: Workspace, change: Callable[[dict], object]) -> list[str]:
    """``datarecon info`` of the model with a margin-ascent record (:func:`_ascent_meta`), changed by ``change``."""
    def edit(meta: dict) -> None:
        _ascent_meta(meta)
        change(meta["metrics"])
    return ["info", str(ws.edit_meta(edit))]


def _point(i: int, **values: object) -> Callable[[dict], object]:
    return lambda m: m["margin_ascent_curve"][i].update(values)


def _edit_json(path: Path, change: Callable[[dict], object]) -> Path:
    """``path`` (a JSON file) changed by ``change``; returns its folder."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path.parent


def _append(path: Path, text: str) -> Path:
    path.write_text(path.read_text() + text)
    return path.parent


def _drop_tensor(path: Path, name: str, *, keep: int = 0) -> Path:
    """``path`` (safetensors) without the tensor ``name``, or with only its first ``keep`` values."""
    tensors = load_tensors(path)
    tensors[name] = tensors[name][:keep]
    if not keep:
        del tensors[name]
    save_tensors(path, tensors)
    return path


def _report(ws: Workspace, folder: Path) -> list[str]:
    return ["report", str(folder), "--out", str(ws.root / "r.html")]


CASES.update({
    # wrongly accepted: `datarecon info` printed a damaged model.json as if it were real (7 cases of the trial)
    "info-ascent-curve-a-string": Case(lambda ws: _info_ascent(ws, lambda m: m.update(margin_ascent_curve="curve")),
                                       "metrics.margin_ascent_curve: Input should be a valid array"),
    "info-ascent-margin-nan": Case(lambda ws: _info_ascent(ws, _point(1, normalised_margin=float("nan"))),
                                   "metrics.margin_ascent_curve.1.normalised_margin: Input should be a finite number"),
    "info-ascent-step-negative": Case(lambda ws: _info_ascent(ws, _point(1, step=-5)),
                                      "metrics.margin_ascent_curve.1.step: Input should be greater than or equal to 0"),
    "info-ascent-curve-repeated": Case(lambda ws: _info_ascent(ws, lambda m: m.update(
        margin_ascent_curve=m["margin_ascent_curve"] * 20_000)), "point 3 is at step 0, not after the step 40"),
    "info-ascent-gap-not-a-number": Case(lambda ws: _info_ascent(ws, _point(1, kkt_gap="wide")),
                                         "metrics.margin_ascent_curve.1.kkt_gap: Input should be a valid number"),
    "info-ascent-stop-reason-a-number": Case(lambda ws: _info_ascent(ws, lambda m: m.update(
        margin_ascent_stop_reason=42)), "metrics.margin_ascent_stop_reason: Input should be a valid string"),
    "info-ascent-empty-point": Case(lambda ws: _info_ascent(ws, lambda m: m["margin_ascent_curve"].append({})),
                                    "metrics.margin_ascent_curve.3.step: Field required"),
    # and what else the card and the readers of model.json take from it
    "info-ascent-more-points-than-windows": Case(lambda ws: _info_ascent(ws, lambda m: m.update(margin_ascent_curve=[
        {"step": s, "normalised_margin": 0.1} for s in range(0, 41, 5)])), "more than the 4 an ascent of 40 steps"),
    "info-ascent-curve-beyond-its-steps": Case(lambda ws: _info_ascent(ws, lambda m: m.update(margin_ascent_steps=20)),
                                               "reaches step 40, beyond the ascent's 20 steps"),
    "info-ascent-probe-value-not-a-number": Case(lambda ws: _info_ascent(ws, _point(0, other_probe=[1])),
                                                 "other_probe [1] is not a number"),
    "info-metrics-status-unknown": Case(lambda ws: ["info", str(ws.edit_meta(lambda m: m["metrics"].update(
        status="fine")))], "metrics.status: unknown status"),
    "info-metrics-accuracy-beyond-one": Case(lambda ws: ["info", str(ws.edit_meta(lambda m: m["metrics"].update(
        train_accuracy=1.5)))], "metrics.train_accuracy: Input should be less than or equal to 1"),
    "info-training-lr-text": Case(lambda ws: ["info", str(ws.edit_meta(lambda m: m["training"].update(lr="fast")))],
                                  "training.lr: Input should be a valid number"),
    # the other records evaluate and report read (internal errors or printed as if real before)
    "evaluate-run-json-restored-label-counts-text": Case(lambda ws: ["evaluate", "--no-progress", str(_edit_json(
        ws.run / "run.json", lambda r: r["knowledge"].update(labels={"counts": ["a"], "source": "restored"})))],
        "knowledge.labels.counts.0: Input should be a valid integer"),
    "evaluate-run-json-param-distance-text": Case(lambda ws: ["evaluate", "--no-progress", str(_edit_json(
        ws.run / "run.json", lambda r: r["extra"].update(param_distance="far")))],
        "extra.param_distance: Input should be a valid number"),
    "evaluate-run-json-init-name-a-number": Case(lambda ws: ["evaluate", "--no-progress", str(_edit_json(
        ws.run / "run.json", lambda r: r["init"].update(name=5)))], "init.name: Input should be a valid string"),
    "evaluate-run-json-own-value-range-empty": Case(lambda ws: ["evaluate", "--no-progress", str(_edit_json(
        ws.run / "run.json", lambda r: r.update(own_model={"value_range": [1, 1]}, model_dir=None)))],
        "value_range [1.0, 1.0] is not an interval lo < hi"),
    "report-run-json-subspace-rank-text": Case(lambda ws: _report(ws, _edit_json(
        ws.evaluated / "run.json", lambda r: r["subspace"].update(rank="x"))), "subspace.rank: Input should be an object"),
    "report-history-metric-text": Case(lambda ws: _report(ws, _append(
        ws.evaluated / "history.jsonl", '{"step": 99, "rel_residual": "low"}\n')), "rel_residual 'low' is not a number"),
    "report-neighbours-without-candidates": Case(lambda ws: _report(ws, _drop_tensor(
        ws.evaluated / "neighbours.safetensors", "candidates").parent), "no 'candidates' tensor of images"),
    "report-metrics-identifiability-text": Case(lambda ws: _report(ws, _edit_json(
        ws.evaluated / "metrics.json", lambda m: m.update(identifiability="x"))),
        "identifiability: Input should be an object"),
    "report-metrics-run-data-a-number": Case(lambda ws: _report(ws, _edit_json(
        ws.evaluated / "metrics.json", lambda m: m.update(run={**m["run"], "data": 5}))),
        "run.data: Input should be an object"),
    "report-metrics-count-as-text": Case(lambda ws: _report(ws, _edit_json(
        ws.evaluated / "metrics.json", lambda m: m["headline"].update(count="3"))),
        "headline.count: Input should be a valid integer"),
    "report-membership-strongest-a-name": Case(lambda ws: _report(ws, _damaged_membership(
        ws, lambda r: r.update(strongest="loss"))), "strongest: Input should be an object"),
    "report-membership-tpr-interval-text": Case(lambda ws: _report(ws, _damaged_membership(
        ws, lambda r: r["signals"]["loss"]["report"].update(tpr_ci={"0.01": "x"}))),
        "signals.loss.report.tpr_ci.0.01: Input should be a valid array"),
    "report-membership-scores-short": Case(lambda ws: _report(ws, _drop_tensor(
        _members_of_other(ws) / "scores.safetensors", "score.loss", keep=5).parent),
        "'score.loss' is not 60 numbers, one per candidate"),
    # misleading: doubled braces answered with PyYAML's internals and a quoting fix that does not fix them
    "train-config-doubled-braces": Case(lambda ws: ["train", "--config", str(_write(
        ws.root / "t.yaml", "data: {{dataset: digits, task: odd-even, n_per_class: 5}}\n")), "--out", str(ws.root / "m")],
        "write single braces: `data: {dataset: digits, task: odd-even, n_per_class: 5}`"),
    "reconstruct-config-doubled-braces": Case(lambda ws: ["reconstruct", "--config", str(_write(
        ws.root / "r.yaml", f"model: {ws.model}\nattack: {{{{method: kkt, steps: 40}}}}\n")), "--out",
        str(ws.root / "new-run")], "line 2 (`attack: {{method: kkt, steps: 40}}`) has a mapping {...} where a field "
        "name should be: YAML reads doubled braces as a mapping whose key is the inner mapping; write single braces: "
        "`attack: {method: kkt, steps: 40}`"),
    "run-doubled-braces": Case(lambda ws: ["run", str(_write(ws.root / "exp.yaml", _EXP_TRAIN + "attack: {{attack: "
                                                              "{method: kkt, steps: 2}}}\n")), "--out",
                                           str(ws.root / "e"), "--no-progress"],
                               "write single braces: `attack: {attack: {method: kkt, steps: 2}}`"),
    "reconstruct-config-doubled-braces-of-a-placeholder": Case(lambda ws: ["reconstruct", "--config", str(_write(
        ws.root / "r.yaml", f"model: {ws.model}\nattack: {{method: kkt, steps: {{{{40}}}}}}\n")), "--out",
        str(ws.root / "new-run")], "fill in a template's {{ placeholder }} before the file is read"),
    "reconstruct-config-list-as-key": Case(lambda ws: ["reconstruct", "--config", str(_write(
        ws.root / "r.yaml", f"model: {ws.model}\n[steps, 40]: 3\n")), "--out", str(ws.root / "new-run")],
        "has a list [...] where a field name should be; a key is a field name: write `name: value`"),
    # misleading: the "got" list left out the margin ascent that caused the refusal
    "train-batch-size-with-margin-ascent": Case(lambda ws: [*TRAIN, "--margin-ascent-steps", "20", "--batch-size", "4",
                                                            "--out", str(ws.root / "m")],
                                                "got margin_ascent steps 20 (--margin-ascent-steps): drop it or "
                                                "batch_size (--batch-size)"),
    "train-dp-with-a-stop-rule": Case(lambda ws: [*TRAIN, "--margin-patience", "5", "--dp-epsilon", "3",
                                                  "--dp-batch-size", "4", "--out", str(ws.root / "m")],
                                      "got stop.margin_patience 5 (--margin-patience): drop it or the dp settings"),
    # misleading: info takes a folder, not --model; name the model directory the run attacked
    "info-of-a-run": Case(lambda ws: ["info", str(ws.run)], "is a run directory, not a model directory; pass the model "
                                                            "directory the run attacked: "),
    "reconstruct-pretrained-head-unknown": Case(lambda ws: _rec(ws, model=_fine_tuned_from(
        ws, ws.model, ws.other) and ws.edit_meta(lambda m: m["pretrained"].update(head="both"))),
        "pretrained.head: Input should be 'pretrained' or 'new'"),
})

# -- issue 49: membership options that would do nothing (tests/cli/test_membership_options.py has the whole matrix)
#    and the training's margin-stop tolerance without the margin stop
_NO_REFS = ["--references", "0", "--nonmembers", "40"]
CASES.update({
    "membership-no-references-reference-seed": Case(lambda ws: [*_member(ws, ws.root / "m", *_NO_REFS),
                                                                "--reference-seed", "2"],
                                                    "--reference-seed acts on reference models and --references is 0"),
    "membership-no-references-keep-weights": Case(
        lambda ws: [*_member(ws, ws.root / "m", *_NO_REFS), "--no-reference-keep-weights"],
        "--no-reference-keep-weights acts on reference models"),
    "membership-no-references-rmia-a": Case(lambda ws: [*_member(ws, ws.root / "m", *_NO_REFS), "--rmia-a", "0.5"],
                                            "--rmia-a acts on reference models"),
    "membership-no-references-workers": Case(lambda ws: [*_member(ws, ws.root / "m", *_NO_REFS), "-j", "2"],
                                             "--workers acts on reference models"),
    "membership-no-references-budget": Case(lambda ws: [*_member(ws, ws.root / "m", *_NO_REFS), "--budget-minutes",
                                                        "1"], "--budget-minutes sets how many reference models"),
    "membership-images-with-nonmembers": Case(
        lambda ws: ["membership", "--model", str(ws.model), "--images", str(_npz(ws)), "--nonmembers", "40"],
        "--nonmembers sets what --evaluate measures"),
    "membership-images-with-references": Case(
        lambda ws: ["membership", "--model", str(ws.model), "--images", str(_npz(ws)), "--references", "4"],
        "--references sets what --evaluate measures"),
    "membership-images-variance-prior-no-out": Case(
        lambda ws: ["membership", "--model", str(ws.model), "--images", str(_npz(ws)), "--variance-prior", "2"],
        "--variance-prior sets the reference attacks"),
    # wrongly accepted (the ref branch's review): a cap of a learning rate that a constant schedule never raises
    # wrongly accepted (the seventh trial): counts of a model directory's draws given for a user's own model, whose
    # non-members and population are its --heldout and --public files (recorded, changing nothing)
    "membership-own-model-nonmembers-count": Case(lambda ws: [*_own_membership(ws, "new"), "--nonmembers", "40"],
                                                  "your own model's non-members are --heldout FILE",
                                                  out=lambda ws: ws.root / "m"),
    "membership-own-model-population-count": Case(lambda ws: [*_own_membership(ws, "new"), "--population", "40"],
                                                  "its population samples --public FILE: drop --population",
                                                  out=lambda ws: ws.root / "m"),
    "train-max-lr-factor-with-constant-schedule": Case(lambda ws: [*TRAIN, "--max-lr-factor", "10", "--out",
                                                                   str(ws.root / "m")],
                                                       "schedule constant never grows: pass --schedule loss-normalised"),
    "train-margin-stable-rtol-without-patience": Case(lambda ws: [*TRAIN, "--margin-stable-rtol", "0.01", "--out",
                                                                  str(ws.root / "m")], "pass --margin-patience N"),
    "membership-keep-weights-no-out": Case(
        lambda ws: ["membership", "--model", str(ws.model), "--evaluate", "--no-reference-keep-weights"],
        "without --out the reference models are deleted"),
})

# -- issue 50 item 5: the seventh adversarial trial's findings (tests/faults/seventh_trial.py) -----------------------
def _checkpoint_a_file(ws: Workspace) -> list[str]:
    shutil.rmtree(ws.run / "checkpoint")
    (ws.run / "checkpoint").write_text("x")
    return _rec(ws, "--resume", out="run")


CASES.update({
    # internal error: an index beyond int64 reached NumPy ("OverflowError: Python int too large to convert to C long")
    "train-indices-beyond-int64": Case(lambda ws: [*TRAIN, "--train-indices", str(2**70), "--out",
                                                   str(ws.root / "m")], "less than or equal to 9223372036854775807"),
    # misleading: a model.json whose recorded images are not its n_train's draw was told to "pass train_indices alone
    # to train on the recorded images" by identifiability, membership and evaluate, which train nothing
    "identifiability-recorded-images-not-the-draw": Case(lambda ws: [
        "identifiability", str(ws.edit_meta(lambda m: m["data"].update(n_train=2, train_indices=[0, 2]))), "--out",
        str(ws.root / "i.json")], "changed after its training: train the model again"),
    # misleading: a user's training function that returned NaN weights was answered "a reference model's statistics
    # are not finite; retrain the reference models", one of another architecture "mat1 and mat2 shapes cannot be
    # multiplied"
    "membership-own-recipe-returns-nan-weights": Case(lambda ws: _own_recipe(ws, "nan_recipe"),
                                                      "dr_issue25_nets:nan_recipe returned a network with non-finite "
                                                      "weights", out=lambda ws: ws.root / "m"),
    "membership-own-recipe-returns-another-architecture": Case(lambda ws: _own_recipe(ws, "other_recipe"),
                                                               "dr_issue25_nets:other_recipe returned a network that is "
                                                               "not --model's architecture", out=lambda ws: ws.root / "m"),
    # wrongly accepted: a resume whose history.jsonl was removed recorded a history without the rows before its
    # checkpoint (the file is written before the first checkpoint, so only a damaged folder lacks it)
    "resume-history-removed": Case(lambda ws: _rec(ws, "--resume", out="run") if (ws.run / "history.jsonl").unlink()
                                   is None else [], "history.jsonl is missing, yet the run's checkpoint is at step 3"),
    # misleading: "File exists: run/checkpoint; check the path and the disk"
    "resume-checkpoint-folder-a-file": Case(_checkpoint_a_file, "checkpoint is not a folder, where the checkpoint "
                                            "folder belongs; move it away"),
})

def _bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _snapshot(root: Path, *, skip: Path | None) -> dict[str, str]:
    """Every file and folder under ``root`` (except under ``skip``) with a hash of its content."""
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def test_the_table_keeps_its_cases() -> None:
    assert len(CASES) >= 98  # 63 before issue 25, 35 added by it
    assert len(CASES) >= 165  # and 67 more by issue 36 (17 of them its adversarial trial's findings)
    assert len(CASES) >= 205  # and 27 more by the fourth adversarial trial's findings (issue 46)
    assert len(CASES) >= 227  # and 22 more by the fifth's (issue 46 item 3)
    assert len(CASES) >= 234  # and 7 more by the sixth's membership findings (issue 50)
    assert len(CASES) >= 246  # and 12 more for issue 49's silent options and issue 50's plug-in errors
    assert len(CASES) >= 283  # and 37 more for issue 50's records checked when read and its misleading messages
    assert len(CASES) >= 293  # and 10 more for issue 49's membership and training options that would do nothing
    assert len(CASES) >= 299  # and 6 more by the seventh trial's findings (issue 50 item 5)
    assert len(CASES) >= 302  # and --max-lr-factor with a constant schedule, an own model's draw counts


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, pristine, tmp_path: Path, capsys, monkeypatch) -> None:
    case = CASES[name]
    ws = Workspace(root=tmp_path, model=tmp_path / "model", other=tmp_path / "other-model", run=tmp_path / "run",
                   evaluated=tmp_path / "evaluated", store=tmp_path / "store")
    for key, dst in (("model", ws.model), ("other", ws.other), ("run", ws.run), ("evaluated", ws.evaluated),
                     ("store", ws.store)):
        shutil.copytree(pristine[key], dst)
    monkeypatch.chdir(tmp_path)
    argv = case.argv(ws)
    allowed = case.out(ws) if case.out is not None else None
    before = _snapshot(tmp_path, skip=allowed)
    if case.patch is not None:
        case.patch(monkeypatch)
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (code, captured.out, captured.err)
    assert "Traceback" not in captured.out + captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert case.message in lines[0], lines[0]
    assert _snapshot(tmp_path, skip=allowed) == before, "files outside the run folder changed"
