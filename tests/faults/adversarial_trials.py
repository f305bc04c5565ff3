"""The adversarial trials of issue 25, counted: bad inputs, faults and concurrent commands, each run
through the real command line in a subprocess, and what each gives.

    python tests/faults/adversarial_trials.py                    # the current source (a few minutes)
    python tests/faults/adversarial_trials.py --src /old/src     # another source tree, e.g. before a fix

Every trial starts from a fresh copy of a small workspace (a trained digits model, a finished run,
an evaluated run, a sweep store, a user's own model package). Outcomes:

* ``clean``: exit 2 and one line ``error: ...`` on stderr, no file of the workspace changed and the
  command's own output folder not created; ``clean, changed files`` when something did change,
  ``clean, but after writing its output folder`` when the refusal came after work (late validation);
* ``accepted``: exit 0 (the command ran on the bad input);
* ``internal error``: exit 1 with "internal error"; ``traceback``: a Python traceback;
* for faults: ``bit-identical`` when the resumed result equals an uninterrupted run's in every file
  (``faultlib.assert_same_tree``), else ``differs``; the exit code of the faulted command is
  checked too (130 after Ctrl-C, 143 after SIGTERM, never SIGABRT);
* for concurrent commands: ``refused, naming the holder`` when the second command exits 2 with the
  first one's pid, else what it did.

The output is the markdown table docs/RELIABILITY.md shows. The catalogue is this file; the same
inputs are pinned one by one in tests/cli/test_bad_input.py, tests/cli/test_locks.py and
tests/faults/test_batch_resume.py, which the test suite runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from faultlib import assert_same_tree  # noqa: E402
from own_nets import NETS  # noqa: E402

ENV: dict[str, str] = {}
#: a bad input is refused in seconds; one still running after this long was accepted
INPUT_TIMEOUT_S = 120.0
DIGITS = ["--dataset", "digits", "--task", "odd-even", "--n-per-class", "5"]


def cli(*args: str, cwd: Path | None = None, extra_env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """``datarecon ARGS`` in a subprocess (one torch thread, the chosen source tree)."""
    return subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, env={**ENV, **(extra_env or {})}, timeout=timeout)


def build_workspace(root: Path) -> Path:
    """The pristine workspace every trial copies."""
    ws = root / "pristine"
    ws.mkdir()
    steps = [
        ["train", *DIGITS, "--n-heldout-per-class", "5", "--n-partition-per-class", "5", "--hidden", "8",
         "--no-bias", "--init-scale", "1e-2", "--epochs", "20", "--no-progress", "--out", "model"],
        ["reconstruct", "--model", "model", "--steps", "3", "--candidates", "4", "--no-progress", "--out", "run"],
        ["reconstruct", "--model", "model", "--steps", "3", "--candidates", "4", "--no-progress", "--out", "evaluated"],
        ["evaluate", "evaluated", "--no-progress"],
    ]
    (ws / "sweep.yaml").write_text("model_dir: model\nsteps: 2\ncandidates: 4\n")
    steps.append(["sweep", "--config", "sweep.yaml", "--out", "store", "--no-progress"])
    for args in steps:
        res = cli(*args, cwd=ws)
        assert res.returncode == 0, (args, res.stderr[-2000:])
    (ws / "nets").mkdir()
    (ws / "nets" / "__init__.py").write_text(NETS)
    code = ("import torch, sys; sys.path.insert(0, '.'); from nets import make; from safetensors.torch import "
            "save_file; torch.manual_seed(0); n = make(); sd = {k: v.contiguous() for k, v in n.state_dict().items()};"
            " save_file(sd, 'net.safetensors'); sd['1.weight'][0, 0] = float('nan'); save_file(sd, 'nan.safetensors')")
    subprocess.run([sys.executable, "-c", code], cwd=ws, check=True, env=ENV)
    return ws


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@dataclass(frozen=True)
class Input:
    """A bad input: ``prepare(ws)`` tampers the workspace and returns the command line; ``out`` is the
    one new folder the command may create."""

    group: str
    name: str
    prepare: Callable[[Path], list[str]]
    out: str | None = None


def _w(ws: Path, rel: str, text: str | bytes) -> str:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return rel


def _meta(ws: Path, change: Callable[[dict], None]) -> str:
    meta = json.loads((ws / "model" / "model.json").read_text())
    change(meta)
    (ws / "model" / "model.json").write_text(json.dumps(meta))
    return "model"


REC = ["reconstruct", "--steps", "3", "--candidates", "4", "--no-progress"]
TRAIN = ["train", *DIGITS, "--hidden", "4", "--no-bias", "--epochs", "2", "--no-progress"]
OWN = ["reconstruct", "--weights", "net.safetensors", "--input-shape", "1,8,8", "--candidates", "4", "--steps", "2",
       "--no-progress", "--out", "own"]
EXP = ("train: {data: {dataset: digits, task: odd-even, n_per_class: 5}, arch: {name: mlp, hidden: [4], bias: false}, "
       "epochs: 2}\nattack: {attack: {method: kkt, steps: 2}}\n")

INPUTS: list[Input] = [
    # -- issue 25 item 23: ended in "internal error" before ----------------------------------------
    Input("23 internal error", "config not UTF-8",
          lambda ws: [*REC, "--model", "model", "--config", _w(ws, "c.yaml", b"steps: 3\n\xff\xfe\n"), "--out", "n"]),
    Input("23 internal error", "--out not writable (/sys)", lambda ws: [*REC, "--model", "model", "--out", "/sys/dr-x"]),
    Input("23 internal error", "--out name too long", lambda ws: [*REC, "--model", "model", "--out", "a" * 300]),
    Input("23 internal error", "--out under a file",
          lambda ws: [*REC, "--model", "model", "--out", _w(ws, "f.txt", "x") + "/run"]),
    Input("23 internal error", "factory raises", lambda ws: [*OWN, "--model", "nets:boom"]),
    Input("23 internal error", "--candidates 1e10", lambda ws: [*REC, "--model", "model", "--candidates", "10000000000",
                                                               "--out", "n"]),
    Input("23 internal error", "--hidden 1e11", lambda ws: [*TRAIN, "--hidden", "100000000000", "--out", "m"]),
    Input("23 internal error", "--seed 1e20", lambda ws: [*REC, "--model", "model", "--seed", "99999999999999999999",
                                                         "--out", "n"]),
    Input("23 internal error", "damaged index.sqlite",
          lambda ws: ["store", "list", str(Path(_w(ws, "store/index.sqlite", b"garbage" * 300)).parent)]),
    # -- item 19 -------------------------------------------------------------------------------------
    Input("19 own model", "factory calls sys.exit", lambda ws: [*OWN, "--model", "nets:bye"]),
    Input("19 own model", "NaN weights", lambda ws: [*OWN, "--model", "nets:make", "--weights", "nan.safetensors"]),
    Input("19 own model", "--weight-decay nan", lambda ws: [*OWN, "--model", "nets:make", "--weight-decay", "nan"]),
    Input("19 own model", "--weight-decay inf", lambda ws: [*OWN, "--model", "nets:make", "--weight-decay", "inf"]),
    # -- item 22: wrongly accepted -------------------------------------------------------------------
    Input("22 wrongly accepted", "reproduce --resume --overwrite",
          lambda ws: ["reproduce", "haim2022", "--out", "r", "--resume", "--overwrite"]),
    Input("22 wrongly accepted", "DP batch size > n", lambda ws: [*TRAIN, "--dp-noise", "1", "--dp-batch-size", "100",
                                                                 "--out", "m"]),
    Input("22 wrongly accepted", "uniform init low > high",
          lambda ws: [*REC, "--model", "model", "--init", "uniform", "--set", "init.low=1", "--set", "init.high=0",
                      "--out", "n"]),
    Input("22 wrongly accepted", "report from {} metrics",
          lambda ws: ["report", str(Path(_w(ws, "run/metrics.json", "{}")).parent), "--out", "r.html"]),
    Input("22 wrongly accepted", "--epochs 1e23", lambda ws: [*TRAIN, "--epochs", "1" + "0" * 23, "--out", "m"]),
    Input("22 wrongly accepted", "epochs: 1e18 in a config",
          lambda ws: ["train", "--no-progress", "--out", "m", "--config",
                      _w(ws, "t.yaml", "data: {dataset: digits, task: odd-even, n_per_class: 5}\nepochs: 1.0e+18\n")]),
    Input("22 wrongly accepted", "resume with fewer --steps",
          lambda ws: [*REC, "--model", "model", "--out", "run", "--resume", "--steps", "2"]),
    # -- item 16: validation before any work ----------------------------------------------------------
    Input("16 late validation", "experiment: evaluate against 'test'",
          lambda ws: ["run", _w(ws, "e.yaml", EXP + "evaluate: {against: [test]}\n"), "--out", "e", "--no-progress"]),
    Input("16 late validation", "experiment: evaluate metric 'psnr'",
          lambda ws: ["run", _w(ws, "e.yaml", EXP + "evaluate: {metric: psnr}\n"), "--out", "e", "--no-progress"]),
    Input("16 late validation", "audit seeds [-1]",
          lambda ws: ["audit", "--scale", "smoke", "--out", "a", "--config", _w(ws, "a.yaml", "seeds: [-1]\n")]),
    # -- items 12 and 14: deleting or overwriting what datarecon did not write -------------------------
    Input("12 overwrite", "reconstruct --overwrite, user file in checkpoint/",
          lambda ws: [*REC, "--model", "model", "--out", "run", "--overwrite"]
          if _w(ws, "run/checkpoint/notes.txt", "mine") else []),
    Input("12 overwrite", "train --overwrite, user file in checkpoint/",
          lambda ws: [*TRAIN, "--out", "model", "--overwrite"] if _w(ws, "model/checkpoint/mine.pt", "mine") else []),
    Input("14 write over", "sweep pool --out over a user's run.json",
          lambda ws: ["sweep", "pool", "store", "--out", str(Path(_w(ws, "mine/run.json", "{}")).parent)]),
    Input("14 write over", "report --out over a user's file",
          lambda ws: ["report", "evaluated", "--out", _w(ws, "notes.html", "mine")]),
    Input("14 write over", "store export --out over a user's file",
          lambda ws: ["store", "export", "store", "--out", _w(ws, "table.csv", "mine")]),
    Input("14 write over", "sweep into a folder with a runs/ sub-folder",
          lambda ws: ["sweep", "--config", "sweep.yaml", "--out",
                      str(Path(_w(ws, "proj/runs/notes.txt", "mine")).parent.parent), "--no-progress"]),
    Input("14 write over", "reconstruct --runs --resume into a foreign folder",
          lambda ws: [*REC, "--model", "model", "--runs", "2", "--resume", "--out",
                      str(Path(_w(ws, "home/.bashrc", "x")).parent)]),
    # -- earlier categories (kept) ---------------------------------------------------------------------
    Input("earlier", "model.json hidden -5", lambda ws: [*REC, "--model", _meta(ws, lambda m: m["arch"].update(
        hidden=[-5])), "--out", "n"]),
    Input("earlier", "model.json weight decay inf", lambda ws: [*REC, "--model", _meta(
        ws, lambda m: m.update(weight_decay=float("inf"))), "--out", "n"]),
    Input("earlier", "weights not safetensors", lambda ws: [*REC, "--model", str(Path(_w(
        ws, "model/weights.safetensors", b"\x80\x04pickle")).parent), "--out", "n"]),
    Input("earlier", "--steps 0", lambda ws: [*REC, "--model", "model", "--steps", "0", "--out", "n"]),
    Input("earlier", "unknown method", lambda ws: [*REC, "--model", "model", "--method", "nope", "--out", "n"]),
    Input("earlier", "resume against another model", lambda ws: [*REC, "--model", "evaluated", "--out", "run",
                                                                 "--resume"]),
    Input("earlier", "evaluate an unfinished run", lambda ws: ["evaluate", _w(ws, "u/run.json", json.dumps(
        {"status": "running"})).split("/")[0], "--no-progress"]),
    Input("earlier", "unknown option", lambda ws: [*TRAIN, "--out", "m", "--epoch", "3"]),
]


def run_input(pristine: Path, trial: Input, scratch: Path) -> str:
    ws = scratch / "ws"
    if ws.exists():
        shutil.rmtree(ws)
    shutil.copytree(pristine, ws)
    argv = trial.prepare(ws)
    new = ("n", "m", "r", "e", "a", "own", "r.html")  # output folders a command may create
    before = snapshot(ws, skip=new)
    try:
        res = cli(*argv, cwd=ws, timeout=INPUT_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a bad input accepted and running (--epochs 1e23)
        return f"accepted (still running after {INPUT_TIMEOUT_S:.0f} s)"
    after = snapshot(ws, skip=new)
    lines = res.stderr.strip().splitlines()
    if "Traceback" in res.stderr:
        return "traceback"
    if res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        if after != before:
            return "clean, changed files"
        if any((ws / x).exists() for x in new):  # refused only after work: its output folder was written
            return "clean, but after writing its output folder"
        return "clean"
    if res.returncode == 0:
        return "accepted"
    if res.returncode == 1 and "internal error" in res.stderr:
        return "internal error"
    return f"exit {res.returncode}"


def fault_trials(root: Path) -> list[tuple[str, str, str]]:
    """``reconstruct --runs 3`` with a fault right after run j's checkpoint at step s; resume; compare."""
    model = root / "mnist-model"
    res = cli("train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "10", "--hidden", "100",
              "--no-bias", "--init-scale", "1e-3", "--lr", "0.5", "--epochs", "200", "--no-progress",
              "--out", str(model))
    assert res.returncode == 0, res.stderr[-2000:]
    args = ["reconstruct", "--model", str(model), "--runs", "3", "--batch-mode", "batched", "--candidates", "17",
            "--steps", "100", "--checkpoint-every", "10", "--no-progress", "--out", str(root / "runs")]
    assert cli(*args).returncode == 0
    ref = root / "runs.reference"
    (root / "runs").rename(ref)
    out = []
    expect = {"KILL": -9, "INT": 130, "TERM": 143}
    for sig in ("KILL", "INT", "TERM"):
        for j in range(3):
            for step in (20, 50, 80):
                res = cli(*args, extra_env={"DATARECON_FAULT_AFTER_CHECKPOINT": f"run{j}:{step}:{sig}"})
                code_ok = res.returncode == expect[sig]
                again = cli(*args, "--resume")
                try:
                    same = again.returncode == 0 and assert_same_tree(ref, root / "runs") > 0
                except AssertionError:
                    same = False
                what = ("bit-identical" if same else "differs") + ("" if code_ok else f", exit {res.returncode}")
                if not code_ok:  # keep the evidence: what the faulted process printed last
                    print(f"run{j}:{step}:{sig} exit {res.returncode}: {res.stderr[-3000:]}", file=sys.stderr)
                out.append(("15 --runs 3 resume", f"SIG{sig} after run{j}'s checkpoint at step {step}", what))
                shutil.rmtree(root / "runs")
    return out


def lock_trials(pristine: Path, root: Path) -> list[tuple[str, str, str]]:
    """A second command on a folder (or store) that a running command holds."""
    ws = root / "locks"
    shutil.copytree(pristine, ws)
    long_run = [*REC, "--model", "model", "--steps", "1000000", "--checkpoint-every", "10", "--out", "busy"]
    (ws / "long.yaml").write_text("model_dir: model\nsteps: 1000000\ncandidates: 4\n")
    holders = {
        "reconstruct": (long_run, ws / "busy", [
            ("the same command", long_run), ("a double --resume", [*long_run, "--resume"]),
            ("--overwrite while it runs", [*long_run, "--overwrite"])]),
        "sweep": (["sweep", "--config", "long.yaml", "--out", "busystore", "--no-progress", "--checkpoint-every", "10"],
                  ws / "busystore", [
                      ("a second sweep on the store", ["sweep", "--config", "sweep.yaml", "--out", "busystore",
                                                       "--no-progress"]),
                      ("store rebuild", ["store", "rebuild", "busystore"])]),
    }
    out = []
    for name, (argv, folder, seconds) in holders.items():
        proc = subprocess.Popen([sys.executable, "-m", "datarecon.cli.main", *argv], cwd=ws, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            t0 = time.monotonic()
            while not list(folder.rglob("progress.json")):
                assert proc.poll() is None and time.monotonic() - t0 < 300, "the holder did not start"
                time.sleep(0.05)
            for what, second in seconds:
                res = cli(*second, cwd=ws)
                named = res.returncode == 2 and f"(pid {proc.pid}," in res.stderr
                out.append(("13 concurrent", f"{name} running, then {what}",
                            "refused, naming the holder" if named else f"exit {res.returncode}"))
        finally:
            proc.kill()
            proc.communicate(timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="source tree to test (default: the installed datarecon)")
    parser.add_argument("--skip-faults", action="store_true", help="only the inputs and the concurrent commands")
    parser.add_argument("--only-faults", action="store_true", help="only the --runs fault trials")
    parser.add_argument("--only-inputs", action="store_true", help="only the bad inputs (a source tree without "
                        "locks would run the concurrent commands to their end; one without the fault hook ignores "
                        "the faults)")
    opts = parser.parse_args()
    ENV.update({**os.environ, "OMP_NUM_THREADS": "1"})
    if opts.src:
        ENV["PYTHONPATH"] = str(Path(opts.src).resolve())
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not opts.only_faults:
            pristine = build_workspace(root)
            for trial in INPUTS:
                rows.append((trial.group, trial.name, run_input(pristine, trial, root)))
                print(f"{trial.group:<22} {trial.name:<55} {rows[-1][2]}", file=sys.stderr, flush=True)
            if not opts.only_inputs:
                rows += lock_trials(pristine, root)
        if not (opts.skip_faults or opts.only_inputs):
            rows += fault_trials(root)
    counts = Counter((g, what) for g, _, what in rows)
    print("| group | trials | outcome |\n|---|---|---|")
    for (group, what), n in sorted(counts.items()):
        print(f"| {group} | {n} | {what} |")
    print(f"\n{len(rows)} trials: " + ", ".join(f"{n} {w}" for w, n in Counter(w for _, _, w in rows).most_common()))
    bad = [r for r in rows if r[2] not in ("clean", "bit-identical", "refused, naming the holder")]
    for group, name, what in bad:
        print(f"- {group}: {name}: {what}")


if __name__ == "__main__":
    main()
