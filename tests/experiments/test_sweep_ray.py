"""The Ray backend on an embedded local Ray instance gives the same results as the local backend."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'datarecon[ray]'); Ray backend untested")

from datarecon.experiments.backends import RayBackend  # noqa: E402
from datarecon.experiments.execution import Execution  # noqa: E402
from datarecon.experiments.store import Store  # noqa: E402
from datarecon.experiments.sweep import run_sweep  # noqa: E402
from datarecon.experiments.sweep.driver import FAULTS_ENV  # noqa: E402

from test_sweep_local import finals, tiny_config, train_tiny  # noqa: E402

# long end-to-end/science tests: `make test-slow` (CI) runs them, `make test` does not
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("model") / "digits-tiny")


@pytest.fixture(scope="module")
def embedded_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_matches_local_and_retries_a_killed_worker(model_dir, embedded_ray, tmp_path, monkeypatch):
    local = tmp_path / "local"
    run_sweep(tiny_config(model_dir), local, execution=Execution(workers=1), progress=False)
    out = tmp_path / "ray"
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"2": {"attempts": 1, "at_step": 5}}))
    result = run_sweep(tiny_config(model_dir), out, execution=Execution(backend="ray"), progress=False, checkpoint_every=2)
    assert result.backend["backend"] == "ray" and result.backend["workers"] == 2
    assert (result.total, result.completed, result.failed, result.retries) == (4, 4, 0, 1)
    assert finals(out) == finals(local)  # same final metrics, bit for bit
    assert sorted(r["attempts"] for r in Store(out).rows()) == [1, 1, 1, 2]
    monkeypatch.delenv(FAULTS_ENV)
    again = run_sweep(tiny_config(model_dir), out, execution=Execution(backend="ray"), progress=False)
    assert (again.skipped, again.completed) == (4, 0)


def test_ray_backend_reports_worker_exceptions(embedded_ray):
    from datarecon.experiments.backends import Task
    from datarecon.experiments.sweep.worker import execute_task

    with RayBackend(execute_task, workers=1) as be:
        be.submit(Task(key="k", payload={"key": "k"}))  # no run_dir: the worker raises KeyError
        (oc,) = be.wait()
    assert not oc.ok and "KeyError" in oc.error and "run_dir" in oc.error
    assert oc.retryable and not oc.crashed
