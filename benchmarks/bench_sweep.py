"""Benchmark of sweep backends: 16 small KKT runs on 8x8 digits with 1 vs 2 local workers and on Ray.

Reports per backend: wall time, throughput (runs/s), speed-up over one in-process worker, the
summed in-run time (``run.json`` wall_time_s) and the overhead per run
``(wall · workers − Σ run time) / runs`` (process start-up, imports, model loading, scheduling,
store writes). Writes ``benchmarks/results/sweep.json``; exits non-zero on any error or failed run.

    python benchmarks/bench_sweep.py            # 16 runs x 1000 steps
    python benchmarks/bench_sweep.py --quick    # 16 runs x 20 steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "sweep.json"


def train_model(out: Path, *, hidden: int) -> Path:
    from datarecon.training.target import build_train_config, train_target

    cfg = build_train_config({"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 10},
                              "arch": {"name": "mlp", "hidden": [hidden], "bias": False},
                              "lr": 0.5, "epochs": 300, "seed": 0})
    train_target(cfg, out=out, overwrite=True, progress=False)
    return out


def sweep_config(model_dir: Path, *, runs: int, steps: int):
    from datarecon.experiments.sweep import SweepConfig

    return SweepConfig(model_dir=str(model_dir), method="kkt", steps=steps, candidates=40,
                       attack={"lr_lambda": 1e-3},
                       search={"random": {"init.scale": {"dist": "log-uniform", "low": 1e-4, "high": 0.1},
                                          "attack.lr_x": {"dist": "log-uniform", "low": 1e-3, "high": 0.3}},
                               "samples": runs}, seed=0)


def bench(name: str, cfg, out: Path, *, backend: str, workers: int, **opts) -> dict:
    from datarecon.experiments.store import Store
    from datarecon.experiments.execution import Execution
    from datarecon.experiments.sweep import run_sweep

    t0 = time.perf_counter()
    res = run_sweep(cfg, out, execution=Execution(backend=backend, workers=workers, options=opts), progress=False)
    wall = time.perf_counter() - t0
    if res.failed or res.completed != res.total:
        raise RuntimeError(f"{name}: {res.failed} failed, {res.completed}/{res.total} completed: {res.failures}")
    rows = [r for r in Store(out).rows() if r["kind"] == "run"]
    run_time = sum(float(r["wall_time_s"] or 0.0) for r in rows)
    n = len(rows)
    w = int(res.backend.get("workers", workers))
    return {"backend": backend, "workers": w, "runs": n, "wall_s": wall, "throughput_runs_per_s": n / wall,
            "sum_run_time_s": run_time, "mean_run_time_s": run_time / n,
            "overhead_per_run_s": (wall * w - run_time) / n, "best_score": res.best_score,
            "best_key": res.best_key, "finals": {r["key"]: r["final"].get("loss") for r in rows}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 steps per run instead of 1000")
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    steps = 20 if args.quick else 1000
    results: dict = {"runs": args.runs, "steps": steps, "candidates": 40, "model": "digits 64-64-1 bias-free MLP",
                     "cpu_count": os.cpu_count(), "python": platform.python_version(),
                     "torch": torch.__version__, "backends": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            model = train_model(tmp / "model", hidden=64)
            cfg = sweep_config(model, runs=args.runs, steps=steps)
            b = results["backends"]
            b["local-1"] = bench("local-1", cfg, tmp / "l1", backend="local", workers=1)
            b["local-2"] = bench("local-2", cfg, tmp / "l2", backend="local", workers=2)
            if not args.no_ray:
                try:
                    import ray  # noqa: F401
                except ImportError:
                    results["ray_skipped"] = "ray not installed (pip install 'datarecon[ray]')"
                else:
                    b["ray-2"] = bench("ray-2", cfg, tmp / "r2", backend="ray", workers=2, num_cpus=2)
            base = b["local-1"]
            for k, v in b.items():
                v["speedup_vs_local_1"] = v["throughput_runs_per_s"] / base["throughput_runs_per_s"]
                v["same_results_as_local_1"] = v.pop("finals") == base.get("finals", v.get("finals")) \
                    if k != "local-1" else True
            base.pop("finals", None)
            bad = [k for k, v in b.items() if not v["same_results_as_local_1"]]
            if bad:
                raise RuntimeError(f"backends {bad} gave different final losses than local-1")
    except Exception:
        traceback.print_exc()
        results["error"] = traceback.format_exc().splitlines()[-1]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'backend':10s} {'workers':>7s} {'wall s':>8s} {'runs/s':>8s} {'speedup':>8s} {'run s':>7s} "
          f"{'overhead/run s':>15s}")
    for k, v in results["backends"].items():
        print(f"{k:10s} {v['workers']:7d} {v['wall_s']:8.2f} {v['throughput_runs_per_s']:8.2f} "
              f"{v['speedup_vs_local_1']:8.2f} {v['mean_run_time_s']:7.3f} {v['overhead_per_run_s']:15.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
