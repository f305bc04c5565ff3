"""The defence audit on the Ray backend (embedded local Ray) gives the same table as in-process."""

from __future__ import annotations

import csv

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'datarecon[ray]'); Ray backend untested")
pytest.importorskip("opacus", reason="the dp extra (pip install 'datarecon[dp]') is installed by make test / CI")

from datarecon.experiments.audit import load_audit_config, run_audit  # noqa: E402
from datarecon.experiments.execution import Execution  # noqa: E402
from datarecon.experiments.reproduce import Runtime  # noqa: E402


def _table(path):
    with open(path / "tables" / "audit.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_audit_on_ray_matches_in_process(tmp_path, data_dir):
    cfg = load_audit_config(scale="smoke", overrides={"weight_decays": [], "epochs": [], "seeds": [0, 1],
                                                       "dp": {"target_epsilons": [10.0]}})
    run_audit(cfg, out=tmp_path / "local", runtime=Runtime(data_dir=data_dir), log=lambda _: None)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_audit(cfg, out=tmp_path / "ray", runtime=Runtime(data_dir=data_dir),
                  execution=Execution(backend="ray", workers=2, threads=1), log=lambda _: None)
    finally:
        ray.shutdown()
    assert _table(tmp_path / "ray") == _table(tmp_path / "local")  # same numbers, DP noise included
