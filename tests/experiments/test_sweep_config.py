"""Sweep configs: deterministic expansion by seed, grid/random/seeds, validation messages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from datarecon.config import load_config_file
from datarecon.experiments.sweep import SweepConfig, expand
from datarecon.experiments.sweep.config import draw_random

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SPACE = {
    "grid": {"attack.momentum": [0.0, 0.9]},
    "random": {
        "init.scale": {"dist": "log-uniform", "low": 1e-6, "high": 0.1},
        "attack.lr_x": {"dist": "log-uniform", "low": 1e-5, "high": 1.0},
        "attack.lambda_min": {"dist": "uniform", "low": 0.01, "high": 0.5},
        "attack.optimizer": {"dist": "choice", "values": ["sgd", "adam"]},
    },
    "samples": 5,
    "seeds": 2,
}


def _cfg(**kw) -> SweepConfig:
    return SweepConfig(model_dir="m", steps=10, search=kw.pop("search", SPACE), **kw)


def test_same_seed_same_expansion_other_seed_other_draws():
    a, b, c = expand(_cfg(seed=3)), expand(_cfg(seed=3)), expand(_cfg(seed=4))
    assert [s.model_dump() for s in a] == [s.model_dump() for s in b]
    assert len(a) == 5 * 2 * 2
    assert [s.params for s in a] != [s.params for s in c]


def test_order_grid_and_seeds_inside_samples_and_values_applied():
    specs = expand(_cfg())
    first = specs[:4]  # sample 0: 2 grid points x 2 seeds
    assert [s.params["attack.momentum"] for s in first] == [0.0, 0.0, 0.9, 0.9]
    assert [s.seed for s in first] == [0, 1, 0, 1]
    assert len({s.params["init.scale"] for s in first}) == 1
    for s in specs:
        assert s.attack["momentum"] == s.params["attack.momentum"]
        assert s.init == {"name": "gaussian", "scale": s.params["init.scale"]}
        assert 1e-6 <= s.init["scale"] <= 0.1 and 1e-5 <= s.attack["lr_x"] <= 1.0
        assert 0.01 <= s.attack["lambda_min"] <= 0.5 and s.attack["optimizer"] in ("sgd", "adam")
    assert [s.index for s in specs] == list(range(len(specs)))


def test_more_samples_keep_earlier_draws_and_budget_truncates_tail():
    small = expand(_cfg(search={**SPACE, "samples": 2}))
    big = expand(_cfg(search={**SPACE, "samples": 6}))
    assert [s.params for s in big[: len(small)]] == [s.params for s in small]
    capped = expand(_cfg(budget=7))
    assert [s.params for s in capped] == [s.params for s in expand(_cfg())[:7]]


def test_budget_sets_samples_for_random_search():
    cfg = SweepConfig(model_dir="m", search={"random": {"init.scale": {"dist": "uniform", "low": 0, "high": 1}}},
                      budget=9)
    assert len(expand(cfg)) == 9


def test_log_uniform_is_uniform_in_log_space():
    from datarecon.experiments.sweep.config import Dist

    space = {"x": Dist(dist="log-uniform", low=1e-6, high=1e-1)}
    logs = [math.log10(draw_random(space, seed=0, sample=i)["x"]) for i in range(2000)]
    assert min(logs) >= -6 and max(logs) <= -1
    assert abs(sum(logs) / len(logs) - (-3.5)) < 0.1  # mean of U(-6, -1)
    below = sum(v < -3.5 for v in logs) / len(logs)
    assert 0.45 < below < 0.55


@pytest.mark.parametrize("search, message", [
    ({"grid": {"lr_x": [1]}}, "not sweepable"),
    ({"random": {"attack.lr_x": {"dist": "log-uniform", "low": 0, "high": 1}}}, "low > 0"),
    ({"random": {"attack.lr_x": {"dist": "gamma", "low": 0, "high": 1}}}, "valid names"),
    ({"random": {"attack.x": {"dist": "choice"}}}, "non-empty 'values'"),
    ({"grid": {"attack.x": [1]}, "random": {"attack.x": {"dist": "choice", "values": [1]}}}, "both in grid"),
], ids=["bare-key", "log-zero", "unknown-dist", "choice-empty", "grid-and-random"])
def test_bad_search_spaces_are_refused(search, message):
    with pytest.raises((ValidationError, Exception), match=message):
        SweepConfig(model_dir="m", search=search)


def test_example_files_load_and_match_reference_ranges():
    ref = load_config_file(EXAMPLES / "sweep-haim-reference.yaml", SweepConfig)
    r = ref.search.random
    assert (r["init.scale"].dist, r["init.scale"].low, r["init.scale"].high) == ("log-uniform", 1e-6, 0.1)
    assert (r["attack.lr_x"].dist, r["attack.lr_x"].low, r["attack.lr_x"].high) == ("log-uniform", 1e-5, 1.0)
    assert (r["attack.lambda_min"].dist, r["attack.lambda_min"].low, r["attack.lambda_min"].high) == \
        ("uniform", 0.01, 0.5)
    assert (r["attack.alpha"].dist, r["attack.alpha"].low, r["attack.alpha"].high) == ("uniform", 10.0, 500.0)
    assert ref.steps == 50000 and ref.dtype == "float64" and ref.selection.criterion == "relative_residual"
    assert len(expand(load_config_file(EXAMPLES / "sweep-tiny.yaml", SweepConfig))) == 4


def test_ray_missing_gives_install_hint(monkeypatch):
    import sys

    from datarecon.errors import DataReconError
    from datarecon.experiments.backends import BACKENDS, import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(DataReconError, match=r"pip install 'datarecon\[ray\]'"):
        import_ray()
    assert {"local", "ray"} <= set(BACKENDS.names())


@pytest.mark.parametrize(("method", "dtype", "expected"), [
    ("kkt", None, "float32"), ("decoreco", None, "float32"), ("bilevel", None, "float64"), ("kkt", "float64", "float64"),
])
def test_dtype_defaults_to_the_methods(method, dtype, expected):
    specs = expand(SweepConfig(model_dir="m", method=method, steps=2, dtype=dtype))
    assert {s.dtype for s in specs} == {expected}


def test_a_huge_search_is_refused_from_its_sizes_and_a_budget_expands_lazily():
    """Three 1000-value grid keys are 10⁹ runs: refused before anything is built; with a budget the
    expansion stops at the budget without building the product (it built all 10⁹ points first)."""
    import time

    from datarecon.errors import DataReconError
    from datarecon.experiments.sweep.config import MAX_RUNS

    grid = {f"attack.{k}": [1.0 + i for i in range(1000)] for k in ("lr_x", "lr_lambda", "alpha")}
    with pytest.raises(DataReconError, match=r"expands to 1,000,000,000 runs \(1000 x 1000 x 1000 grid values\)"):
        _cfg(search={"grid": grid})
    with pytest.raises(DataReconError, match=r"1,000,000,000 runs \(1000000000 random samples\)"):
        _cfg(search={"random": {"init.scale": {"dist": "uniform", "low": 0, "high": 1}}, "samples": 10**9})
    with pytest.raises(DataReconError, match=r"\(1000 x 1000 x 1000 grid values, 3 seeds\)"):
        _cfg(search={"grid": grid, "seeds": 3})
    t0 = time.perf_counter()
    specs = expand(_cfg(search={"grid": grid}, budget=3))
    assert len(specs) == 3 and time.perf_counter() - t0 < 5
    assert [(s.params["attack.alpha"], s.params["attack.lr_x"]) for s in specs] == [(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]
    specs = expand(_cfg(search={"random": {"init.scale": {"dist": "uniform", "low": 0, "high": 1}},
                                "samples": 10**9}, budget=2))
    assert len(specs) == 2
    with pytest.raises(ValidationError):
        _cfg(budget=MAX_RUNS + 1)
