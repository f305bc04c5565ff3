"""The built wheel installs beside the user's torch and runs the demo from another folder.

A fresh virtual environment gets torch==2.13.0 first (the local CPU file, as a user's own build
would be there already) and numpy 1.26 (the declared floor), then the wheel; pip must keep that
torch, and ``datarecon demo`` must run from an unrelated folder with only what the wheel ships.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
NUMPY_FLOOR = "numpy==1.26.4"


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: int = 900) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def _clean_env() -> dict[str, str]:
    """The environment without this checkout on the path (so only the installed wheel is seen)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATARECON_DATA", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # build from a copy: an in-tree build leaves build/ and *.egg-info beside the sources
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
         cwd=out, env=_clean_env())
    (whl,) = out.glob("datarecon-*.whl")
    return whl


def test_wheel_ships_py_typed_presets_and_examples(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "datarecon/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names
    assert any(n.startswith("datarecon/experiments/presets/") and n.endswith(".yaml") for n in names)
    shipped = {Path(n).name for n in names if n.startswith("datarecon/examples/")}
    assert shipped == {p.name for p in (ROOT / "src" / "datarecon" / "examples").glob("*.yaml")}
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert not any(r.startswith("pytorch-msssim") for r in requires)
    torch_req = next(r for r in requires if r.startswith("torch"))
    assert "==" not in torch_req and ">=2.13" in torch_req, torch_req


@pytest.mark.slow
def test_wheel_installs_beside_torch_and_runs_the_demo(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = _clean_env()
    env["DATARECON_DATA"] = str(tmp_path / "no-data")  # the demo needs no data files
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(pip + [TORCH, NUMPY_FLOOR], cwd=tmp_path, env=env)
    log = _run(pip + [str(wheel)], cwd=tmp_path, env=env)
    versions = json.loads(_run([str(py), "-c", "import json, numpy, torch; print(json.dumps("
                                "[torch.__version__, numpy.__version__]))"], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert versions[0].startswith("2.13.0"), f"pip replaced the installed torch: {versions} {log[-500:]}"
    assert versions[1] == "1.26.4", versions

    # the CIFAR pickle layout decodes with numpy 1.x (numpy.core) and refuses foreign globals
    code = ("import numpy, pickle, sys; from datarecon.data.formats import restricted_unpickle; "
            "a = numpy.arange(6, dtype=numpy.uint8).reshape(2, 3); "
            "out = restricted_unpickle(pickle.dumps({'x': a}, protocol=2)); assert (out['x'] == a).all(); print('ok')")
    assert _run([str(py), "-c", code], cwd=tmp_path, env=env).strip().endswith("ok")

    work = tmp_path / "elsewhere"
    work.mkdir()
    exe = str(env_dir / "bin" / "datarecon")
    out = _run([exe, "demo", "--out", "demo-out"], cwd=work, env=env)
    assert "reconstructed" in out and "held-out" in out, out[-2000:]
    assert "\r" not in out  # stderr is a pipe: plain progress lines
    for f in ("report.html", "reconstructions.png", "run/metrics.json", "model/weights.safetensors"):
        assert (work / "demo-out" / f).is_file(), f
    listing = _run([exe, "examples"], cwd=work, env=env)
    assert "sweep-tiny.yaml" in listing
    _run([exe, "examples", "sweep-tiny.yaml"], cwd=work, env=env)
    assert (work / "sweep-tiny.yaml").read_bytes() == (ROOT / "examples" / "sweep-tiny.yaml").read_bytes()
    typed = _run([str(py), "-c", "import importlib.resources as r; print(r.files('datarecon').joinpath('py.typed').is_file())"],
                 cwd=work, env=env)
    assert typed.strip().endswith("True")


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("bash") is None, reason="needs make and bash")
def test_activating_the_environment_exports_the_data_folder_make_used(tmp_path: Path) -> None:
    """`make` records its data folder in `.venv/bin/activate` (issue 50: after `make demo` and `source
    .venv/bin/activate` the README's MNIST commands found no data, make having set DATARECON_DATA for its own
    commands only); a shell's own DATARECON_DATA wins, and a second `make` leaves one such line."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text("# the activate script python -m venv writes\n")
    console = tmp_path / ".venv" / "bin" / "datarecon"
    console.write_text("")
    os.utime(console, (os.stat(tmp_path / "pyproject.toml").st_mtime + 10,) * 2)  # set up already: nothing to build
    env = {k: v for k, v in os.environ.items() if k not in ("DATARECON_DATA", "MAKEFLAGS", "MAKELEVEL")}
    for _ in range(2):
        subprocess.run(["make", "venv", "DATARECON_DATA=/data/here"], cwd=tmp_path, env=env, check=True,
                       capture_output=True)
    activate = (tmp_path / ".venv" / "bin" / "activate").read_text()
    assert activate.count("DATARECON_DATA") == 2 and activate.startswith("# the activate script")  # one line

    def exported(shell_value: str | None) -> str:
        pre = f"DATARECON_DATA={shell_value}; " if shell_value else ""
        return subprocess.run(["bash", "-c", f"{pre}source .venv/bin/activate; echo $DATARECON_DATA"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert exported(None) == "/data/here" and exported("/mine") == "/mine"
