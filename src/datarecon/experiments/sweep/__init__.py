"""Hyper-parameter sweeps of attacks: typed config, deterministic expansion, fan-out to a backend,
resumable runs in a results store, pooled candidates of the best runs (docs/SWEEPS.md)."""

from datarecon.experiments.sweep.config import (
    DISTRIBUTIONS,
    Dist,
    Resources,
    RunSpec,
    SearchSpace,
    Selection,
    SweepConfig,
    expand,
)
from datarecon.experiments.pool import criterion_mode, score_of
from datarecon.experiments.sweep.driver import SweepResult, plan, run_sweep
from datarecon.experiments.sweep.pool import pool_candidates, rank_runs

__all__ = ["DISTRIBUTIONS", "Dist", "Resources", "RunSpec", "SearchSpace", "Selection", "SweepConfig",
           "SweepResult", "criterion_mode", "expand", "plan", "pool_candidates", "rank_runs", "run_sweep",
           "score_of"]
