"""One CPU-thread default for the command line and the Python API, stated once (utils/threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from datarecon.cli._common import DEFAULT_THREADS as CLI_DEFAULT
from datarecon.utils import threads


def _threads_after(code: str, **env: str) -> int:
    """torch's thread count in a fresh interpreter after ``code`` ran."""
    full = {k: v for k, v in os.environ.items() if k != threads.ENV_VAR} | env
    res = subprocess.run([sys.executable, "-c", f"{code}\nimport torch\nprint(torch.get_num_threads())"],
                         capture_output=True, text=True, env=full, timeout=120)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().splitlines()[-1])


def test_the_command_line_and_the_python_api_share_one_default() -> None:
    assert CLI_DEFAULT == threads.DEFAULT_THREADS == 1


@pytest.mark.parametrize("module", ["datarecon.training.target", "datarecon.experiments.reconstruct",
                                    "datarecon.evaluation", "datarecon.experiments.membership.evaluate"])
def test_importing_the_python_api_applies_the_default(module) -> None:
    assert _threads_after(f"import {module}") == threads.DEFAULT_THREADS


def test_the_environment_replaces_the_default_and_zero_keeps_pytorchs() -> None:
    plain = _threads_after("pass")
    assert _threads_after("import datarecon.training.target", DATARECON_THREADS="0") == plain
    if os.cpu_count() and os.cpu_count() >= 2:
        assert _threads_after("import datarecon.training.target", DATARECON_THREADS="2") == 2


def test_a_bad_environment_value_is_one_line(monkeypatch) -> None:
    from datarecon.errors import DataReconError

    monkeypatch.setenv(threads.ENV_VAR, "many")
    with pytest.raises(DataReconError, match="DATARECON_THREADS must be a thread count >= 0"):
        threads.default_threads()


def test_threads_zero_restores_pytorchs_default_after_the_import_applied_one() -> None:
    plain = _threads_after("pass")
    assert _threads_after("import datarecon.kernel\nfrom datarecon.cli._common import set_threads\nset_threads(0)") == plain
    assert _threads_after("import datarecon.kernel\nfrom datarecon.utils.threads import set_threads\nset_threads(0)") == plain


def test_set_threads_in_process() -> None:
    before = torch.get_num_threads()
    try:
        threads.set_threads(1)
        assert torch.get_num_threads() == 1
        threads.set_threads(0)
        assert torch.get_num_threads() == threads.TORCH_DEFAULT
        threads.set_threads(None)
        assert torch.get_num_threads() == threads.TORCH_DEFAULT
    finally:
        torch.set_num_threads(before)
