"""Helpers of the fault trials: real processes killed (SIGKILL) or interrupted (SIGINT) at random points.

Every trial runs the ``datarecon`` command line in a subprocess, exactly as a user would. The kill
point is drawn from a seeded generator: ``DATARECON_FAULT_SEED`` fixes it (to replay a failure);
otherwise each session draws a new seed, printed with every trial, so CI explores new points.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from datarecon.kernel import checkpoint
from datarecon.utils.io import strip_timing

SESSION_SEED = int(os.environ.get("DATARECON_FAULT_SEED") or secrets.randbelow(2**31))
#: files whose content is wall time by design (docs/RELIABILITY.md): not compared
TIMING_FILES = ("timings.json", "report.html")
POLL_S = 0.005


def command(*args: str) -> list[str]:
    """The ``datarecon`` command line run by this interpreter (one torch thread, as CI does)."""
    return [sys.executable, "-m", "datarecon.cli.main", *args]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_ok(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run to completion; fail the test with its stderr unless it exits 0."""
    res = subprocess.run(command(*args), capture_output=True, text=True, timeout=timeout, env=env())
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def run_faulted(*args: str, step: int, loop: int = 0, sig: str = "KILL",
                timeout: float = 300) -> subprocess.CompletedProcess:
    """Run until the test-only step hook (:data:`datarecon.kernel.engine.FAULT_STEP_ENV`) signals the
    process right after step ``step`` of its ``loop``-th loop: a fault at an exact, replayable point."""
    from datarecon.kernel.engine import FAULT_STEP_ENV

    return subprocess.run(command(*args), capture_output=True, text=True, timeout=timeout,
                          env={**env(), FAULT_STEP_ENV: f"{step}:{sig}:{loop}"}, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    # a shell without job control starts background jobs with SIGINT ignored, and an ignored signal
    # stays ignored across exec: Python would then never raise KeyboardInterrupt. A terminal's Ctrl-C
    # reaches a command started the normal way, so the child gets the default disposition back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            start_new_session=new_session, preexec_fn=_default_sigint)


def read_json_or_none(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], *, timeout: float = 300) -> None:
    """Block until ``ready()``; fail if the process ends first (the fault would come too late)."""
    t0 = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process finished (exit {proc.returncode}) before the fault point: {err[-2000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("fault point not reached in time")
        time.sleep(POLL_S)


def kill_at(proc: subprocess.Popen, ready: Callable[[], bool], rng: random.Random, *, jitter_s: float = 0.05,
            sig: int = signal.SIGKILL, group: bool = False) -> str:
    """When ``ready()``, wait a random 0..``jitter_s`` s (mid-step, mid-write, ...) and send ``sig``
    (to the process group with ``group``, as a terminal's Ctrl-C does); returns the process's stderr."""
    wait_for(proc, ready)
    time.sleep(rng.uniform(0.0, jitter_s))
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err


def progress_at_least(path: Path, key: str, n: int) -> Callable[[], bool]:
    """``ready`` once the JSON file ``path`` holds ``key >= n`` (a checkpoint's step or epoch)."""
    def ready() -> bool:
        d = read_json_or_none(path)
        return d is not None and int(d.get(key, -1)) >= n
    return ready


def set_aside(path: Path) -> Path:
    """Move a finished reference run out of the way, so the trial writes the very same paths."""
    ref = path.with_name(path.name + ".reference")
    path.rename(ref)
    return ref


def is_temp(p: Path) -> bool:
    return p.name.startswith(".") and p.name.endswith(".tmp")


#: datarecon's bookkeeping files: a lock a kill left behind (taken over by the next run), and the
#: manifest of what datarecon wrote, whose lines are in write order (compared as a set)
LOCK, MANIFEST = ".datarecon-lock", ".datarecon-manifest"


def assert_same_tree(ref: Path, got: Path, *, skip: tuple[str, ...] = ()) -> int:
    """The two folders hold the same artefacts, bit for bit.

    Tensor files compare byte for byte (checkpoints by value, their metadata without the timing
    fields: it records wall time); JSON files compare without :data:`~datarecon.utils.io.TIMING_FIELDS`; every other file
    byte for byte. Temporary files a kill left behind, ``TIMING_FILES`` and names in ``skip`` are
    ignored. Returns the number of files compared.
    """
    def listing(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and not is_temp(p) and p.name not in TIMING_FILES + skip + (LOCK,)}

    names = listing(ref)
    assert listing(got) == names, (sorted(listing(got) ^ names))
    for name in sorted(names):
        a, b = ref / name, got / name
        if Path(name).name == MANIFEST:
            assert set(a.read_text().splitlines()) == set(b.read_text().splitlines()), name
        elif name.endswith(".json") or name.endswith(".jsonl"):
            parse = (lambda t: [json.loads(x) for x in t.splitlines()]) if name.endswith(".jsonl") else json.loads
            assert strip_timing(parse(b.read_text())) == strip_timing(parse(a.read_text())), name
        elif name.endswith(".safetensors") and a.parent.name.startswith(checkpoint.FOLDER):
            kind = checkpoint.kind_of(a.parent)
            (ta, ma), (tb, mb) = checkpoint.load(a.parent, kind=kind), checkpoint.load(b.parent, kind=kind)
            assert list(ta) == list(tb) and all(torch.equal(ta[k], tb[k]) for k in ta), name
            assert strip_timing(ma) == strip_timing(mb), name
        else:
            assert a.read_bytes() == b.read_bytes(), name
    return len(names)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"
