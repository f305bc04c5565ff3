"""Plug-ins by entry point: a package that declares an attack under ``datarecon.attacks`` and a membership signal
under ``datarecon.membership_signals`` is installed (offline, with pip, into a folder of its own: the test venv is
left as it was) and its attack is a ``--method`` of ``datarecon reconstruct`` from the shell, its signal a row of
``datarecon membership``; a plug-in that cannot be imported is named in one warning line and skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "datarecon_inversion"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plug-in package built and installed by pip, offline, into a folder that only these subprocesses see."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "source"
    shutil.copytree(PLUGIN, source)  # pip builds in the source folder: keep the checkout clean
    target = root / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation",
                          "--no-deps", "--target", str(target), str(source)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert (target / "datarecon_inversion-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


def _datarecon(args: list[str], *, path: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    """``datarecon ARGS`` in a fresh interpreter whose path holds ``path`` (the installed plug-ins) before the
    caller's own PYTHONPATH (the source tree under test, where one is given)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "from datarecon.cli.main import entry; entry()", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from datarecon.cli.main import main

    out = tmp_path_factory.mktemp("plugin-model") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "10", "--hidden", "32",
                 "--no-bias", "--epochs", "200", "--dtype", "float64", "--no-progress", "--out", str(out)]) == 0
    return out


def test_an_installed_attack_is_a_method_of_the_shell_command(installed, model, tmp_path):
    res = _datarecon(["reconstruct", "--model", str(model), "--method", "inversion", "--steps", "20", "--lr-x", "0.05",
                      "--no-progress", "--out", "run"], path=[installed], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "inversion: complete after 20 steps" in res.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["method"] == "inversion"
    helped = _datarecon(["reconstruct", "--help"], path=[installed], cwd=tmp_path)
    assert "inversion" in helped.stdout.split("--method", 1)[1].split("--", 1)[0]
    evaluated = _datarecon(["evaluate", "run", "--no-progress"], path=[installed], cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    # without the package the method is unknown, and the error names the installed ones
    bare = _datarecon(["reconstruct", "--model", str(model), "--method", "inversion", "--out", "run2"], path=[],
                      cwd=tmp_path)
    assert bare.returncode == 2 and "unknown attack method 'inversion'" in bare.stderr


def test_an_installed_membership_signal_is_measured_beside_the_others(installed, model, tmp_path):
    res = _datarecon(["membership", "--model", str(model), "--evaluate", "--references", "0", "--nonmembers", "300",
                      "--no-progress", "--out", "m"], path=[installed], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.strip().startswith("margin "))
    assert "black-box" in row and "AUC" in row
    result = json.loads((tmp_path / "m" / "membership.json").read_text())
    assert result["signals"]["margin"]["report"]["n_nonmembers"] == 300


def test_a_broken_plugin_is_named_and_skipped(tmp_path, model):
    """An entry point whose module is missing: one warning line naming it; the command still runs."""
    site = tmp_path / "site"
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[datarecon.attacks]\nbroken = no_such_module:Attack\n")
    res = _datarecon(["reconstruct", "--model", str(model), "--steps", "2", "--no-progress", "--out", "run"],
                     path=[site], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning: plug-in 'broken'")]
    assert len(warned) == 1 and "package broken-plugin" in warned[0] and "importing it failed" in warned[0], res.stderr


def _hand_installed(site: Path, entry_points: str, code: str) -> Path:
    """A plug-in package written by hand into ``site`` (its module ``hostile_plugin`` and its distribution's metadata)."""
    info = site / "hostile_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    (site / "hostile_plugin.py").write_text(code)
    return site


_FAILING = """from typing import ClassVar
import torch
from datarecon.attacks.base import Attack, AttackConfig
from datarecon.attacks.mia import SignalDef


class Boom(Attack):
    name: ClassVar[str] = "boom"
    config_cls: ClassVar[type] = AttackConfig

    def objective(self, target, prior, x):
        raise RuntimeError("the plug-in's objective failed")


def _boom(view):
    raise RuntimeError("the plug-in's score failed")


BOOM = SignalDef("black-box", "raises", score=_boom)
SHORT = SignalDef("black-box", "one score too few", score=lambda v: torch.zeros(len(v.y) - 1))
"""


def test_a_plugin_that_exits_at_import_is_named_and_skipped(tmp_path, model):
    """A plug-in module calling sys.exit when imported: one warning line; the command runs (it exited 3 silently)."""
    site = _hand_installed(tmp_path / "site", "[datarecon.attacks]\nbye = hostile_plugin:X\n", "import sys\nsys.exit(3)\n")
    res = _datarecon(["reconstruct", "--model", str(model), "--steps", "2", "--no-progress", "--out", "run"],
                     path=[site], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning: plug-in 'bye'" in res.stderr and "importing it failed (SystemExit: 3)" in res.stderr


@pytest.mark.parametrize("entry, argv, words", [
    ("[datarecon.attacks]\nboom = hostile_plugin:Boom\n", ["reconstruct", "--method", "boom", "--steps", "2"],
     "error: the plug-in module hostile_plugin (package hostile-plugin: datarecon.attacks 'boom') failed: "
     "RuntimeError: the plug-in's objective failed; fix the plug-in, or uninstall its package"),
    ("[datarecon.membership_signals]\nboom = hostile_plugin:BOOM\n", ["membership", "--evaluate", "--references",
                                                                       "0", "--nonmembers", "50"],
     "error: the plug-in module hostile_plugin (package hostile-plugin: datarecon.membership_signals 'boom') failed"),
    ("[datarecon.membership_signals]\nshort = hostile_plugin:SHORT\n", ["membership", "--evaluate", "--references",
                                                                         "0", "--nonmembers", "50"],
     "error: membership signal 'short' returned ("),
], ids=["attack-raises", "signal-raises", "signal-of-another-shape"])
def test_a_plugin_that_fails_is_named_in_one_line(tmp_path, model, entry, argv, words):
    """A plug-in's own code failing (its objective, its score function, scores of another shape) is refused in one
    line naming the plug-in, exit 2: it was an internal error (exit 1) that blamed datarecon."""
    site = _hand_installed(tmp_path / "site", entry, _FAILING)
    res = _datarecon([*argv, "--model", str(model), "--no-progress", "--out", "out"], path=[site], cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(words), res.stderr


def test_damaged_installed_metadata_is_named_in_one_line(tmp_path, model):
    """An installed package whose entry_points.txt is not UTF-8 stops PyTorch loading (it reads every package's
    entry points): one line naming the package's metadata folder, exit 2 (it was a traceback)."""
    site = _hand_installed(tmp_path / "site", "", "")
    (site / "hostile_plugin-1.0.dist-info" / "entry_points.txt").write_bytes(b"[datarecon.attacks]\nx\xff = y:Z\n")
    res = _datarecon(["reconstruct", "--model", str(model), "--steps", "2", "--no-progress", "--out", "run"],
                     path=[site], cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "hostile_plugin-1.0.dist-info cannot be read (UnicodeDecodeError" in lines[0]
    assert lines[0].endswith("reinstall or remove that package")
