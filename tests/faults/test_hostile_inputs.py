"""The catalogue of hostile inputs (``tests/faults/hostile_inputs.py``) holds against the code: every trial gives
the outcome it expects (a clean one-line refusal with its ``must`` words, or a valid input that runs), so the
catalogue cannot drift from the code (issue 50: two of its rows still expected acceptance of what the code had
come to refuse).

The catalogue runs in a process of its own, each command forked from it once it has imported datarecon
(``--fork``; the plug-in and permission trials get processes of their own). The fast suite runs a sample: the
first trial of every group that needs no more than the base workspace, and the rows this file was written for;
``make test-slow`` runs the whole catalogue.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "hostile_inputs.py"
#: the outcomes a trial may have when it holds
EXPECTED = ("clean", "accepted as it should")


def run_catalogue(tmp_path: Path, data_dir: Path, *args: str, timeout: float) -> list[dict]:
    """The catalogue's rows (group, name, outcome, message) of ``hostile_inputs.py --fork ARGS``.

    Its workspaces go to a folder of their own in the system's temporary folder, removed after: pytest's
    ``tmp_path`` lies under a folder only its owner may enter, so the permission trials' user could not reach them
    (every such trial then failed on "cannot write ...: permission denied")."""
    log = tmp_path / "trials.jsonl"
    log.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="datarecon-hostile-"))
    work.chmod(0o711)  # the permission trials' user passes through to the workspaces the catalogue hands it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(work), "DATARECON_DATA": str(data_dir)}
    try:
        res = subprocess.run([sys.executable, str(SCRIPT), "--fork", "--log", str(log), *args], capture_output=True,
                             text=True, env=env, timeout=timeout)
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def failures(rows: list[dict]) -> list[str]:
    return [f"{r['group']}: {r['name']}: {r['outcome']}: {r['message']}" for r in rows if r["outcome"] not in EXPECTED]


def test_a_sample_of_the_catalogue_holds(tmp_path: Path, data_dir: Path) -> None:
    """The first trial of each group on the base workspace, and the fifth trial's two probe rows that expected the
    probe of an attack without step sizes to run (it is refused: 'has no step sizes to probe')."""
    rows = run_catalogue(tmp_path, data_dir, "--sample", "--base-only", "--also", "--step-probe 3 --method",
                         timeout=600)
    groups = {r["group"] for r in rows}
    assert {"paths", "files", "options", "configs", "state", "fifth-probe", "fifth-ascent"} <= groups, groups
    assert not failures(rows), "\n".join(failures(rows))
    probe = {r["name"]: r for r in rows if r["name"].startswith("--step-probe 3 --method")}
    assert set(probe) == {"--step-probe 3 --method bilevel", "--step-probe 3 --method dynamics"}
    assert all(r["outcome"] == "clean" and "has no step sizes to probe" in r["message"] for r in probe.values())


@pytest.mark.slow
def test_the_whole_catalogue_holds(tmp_path: Path, data_dir: Path) -> None:
    """Every trial of the catalogue (the permission trials where a user of their own can be made: run as root)."""
    rows = run_catalogue(tmp_path, data_dir, timeout=3600)
    from hostile_inputs import TRIALS  # noqa: E402 - the catalogue itself, for its size

    assert len(rows) >= len([t for t in TRIALS if not t.user]), len(rows)
    assert not failures(rows), "\n".join(failures(rows))
