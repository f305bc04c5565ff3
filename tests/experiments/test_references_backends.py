"""Reference models on the sweep backends: a local process pool and embedded Ray train the same models, bit for bit,
as training them in the driver process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from datarecon.experiments.execution import Execution
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.reference_store import load_statistics
from datarecon.experiments.membership.settings import MembershipSettings, ReferenceSettings, Runtime
from datarecon.kernel.outdir import claim_out_dir

pytestmark = [pytest.mark.slow]

SETTINGS = MembershipSettings(nonmembers=200, population=50, references=ReferenceSettings(count=10, seed=2))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("refs") / "model"
    train_target(TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=5, n_heldout_per_class=5),
                             arch=ArchConfig(name="mlp", hidden=(32,), bias=False), loss="logistic", lr=0.5, epochs=100,
                             batch_size=5), out=out, progress=False)
    return out


def _run(model: Path, out: Path, execution: Execution) -> dict:
    with claim_out_dir(out, kind="membership", resume=True) as claim:
        return evaluate_membership(model, settings=SETTINGS, out=claim,
                                   runtime=Runtime(execution=execution, log=lambda _: None))


def test_a_process_pool_and_ray_train_the_same_reference_models(model, tmp_path):
    here = _run(model, tmp_path / "here", Execution(workers=1))
    pool = _run(model, tmp_path / "pool", Execution(workers=2, threads=1))
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'datarecon[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = _run(model, tmp_path / "ray", Execution(backend="ray", workers=2, threads=1))
    finally:
        ray.shutdown()
    base = load_statistics(tmp_path / "here", 10)
    for name in ("pool", "ray"):
        other = load_statistics(tmp_path / name, 10)
        assert torch.equal(base.confidence, other.confidence) and torch.equal(base.inside, other.inside), name
    assert here["signals"]["lira-online"]["report"] == pool["signals"]["lira-online"]["report"] \
        == remote["signals"]["lira-online"]["report"]
    assert pool["references"]["trained"] == remote["references"]["trained"] == 10
