"""Shared test fixtures: the real data directory, a deterministic torch, a simulated kill."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (../shared/data or $DATARECON_DATA)."""
    env = os.environ.get("DATARECON_DATA")
    path = Path(env) if env else SHARED_DATA
    if not (path / "mnist").is_dir():
        message = f"real data not found at {path}; set DATARECON_DATA to the shared data folder"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has ../shared/data: a skip would hide a broken set-up
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def haim_smoke(tmp_path_factory, data_dir):
    """``datarecon reproduce haim2022 --scale smoke`` once per session: (out folder, its config)."""
    from datarecon.experiments.reproduce import Runtime, load_config, reproduce

    out = tmp_path_factory.mktemp("haim2022")
    reproduce("haim2022", scale="smoke", out=out, runtime=Runtime(data_dir=data_dir), log=lambda s: None)
    return out, load_config("haim2022", scale="smoke")


@pytest.fixture
def kill_after():
    """A loop hook factory: ``kill_after(at)`` raises KeyboardInterrupt once ``at`` steps (epochs)
    are done, as a killed process stops; whatever the loop had checkpointed stays."""
    from datarecon.kernel.engine import BaseHook

    class KillAfter(BaseHook):
        def __init__(self, at: int) -> None:
            self.at = at

        def after_step(self, state):
            if state.step == self.at:
                raise KeyboardInterrupt

    return KillAfter


@pytest.fixture
def hard_kill():
    """``hard_kill(train, at)``: run ``train(hooks=[...])`` (a training loop: fit, fit_dp) and end it after
    ``at`` epochs as a SIGKILL would: no final checkpoint, only the periodic ones survive. The final
    save is switched off for that call only, so a later resumed call checkpoints normally."""
    from datarecon.kernel.engine import BaseHook, Checkpoint

    class HardKill(BaseHook):
        def __init__(self, at: int) -> None:
            self.at = at

        def after_step(self, state):
            if state.step == self.at:
                raise SystemExit(9)

    def call(train, at: int) -> None:
        orig = Checkpoint.after_run
        Checkpoint.after_run = lambda self, state: None
        try:
            with pytest.raises(SystemExit):
                train(hooks=[HardKill(at)])
        finally:
            Checkpoint.after_run = orig

    return call
