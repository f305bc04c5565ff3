"""How often the n estimate of the subspace analysis holds the true n, on planted and trained layers.

    python benchmarks/bench_rank_coverage.py --out benchmarks/results/rank_coverage.json

Planted: W = s·G + A·U with U the n training images of the layer (MNIST, mean removed), G i.i.d.
N(0, 1) (the initialisation, std s) and A (h × n) Gaussian with column scales log-uniform over
[10⁻², 1] (training directions of unequal strength, as gradient descent leaves them). Trained:
bias-free MLPs trained by ``train_target`` on digits, MNIST and CIFAR-10 at a known n. Each layer is
analysed as the attacks analyse it (:func:`datarecon.attacks.subspace.analyse`), from the weights
alone and with W_init known, and the table says whether n lies in the estimate's range
[low, high] and how far the point estimate n̂ is from n.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from datarecon.attacks.base import Target
from datarecon.attacks.subspace import analyse
from datarecon.data import DataSpec, load_task
from datarecon.training.target import TrainConfig, train_target


def _planted(n: int, *, s: float, h: int, seed: int) -> tuple[torch.nn.Module, dict, dict, float]:
    task = load_task(DataSpec(dataset="mnist", task="odd-even", n_per_class=n // 2, n_heldout_per_class=1,
                              n_partition_per_class=1, seed=seed))
    u = task.normalisation.to_model(task.train.x).reshape(n, -1).double()
    g = torch.Generator().manual_seed(seed)
    scales = torch.exp(torch.empty(n, dtype=torch.float64).uniform_(math.log(1e-2), 0.0, generator=g))
    a = torch.randn(h, n, dtype=torch.float64, generator=g) * scales / math.sqrt(n)
    init = s * torch.randn(h, u.shape[1], dtype=torch.float64, generator=g)
    w = init + a @ u
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(u.shape[1], h, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(h, 1, bias=False)).double()
    head = torch.randn(1, h, dtype=torch.float64, generator=g)
    return model, {"1.weight": w, "3.weight": head}, {"1.weight": init, "3.weight": head}, s


def _trained(work: Path, name: str, data: dict, *, hidden: int, init_scale: float | None, epochs: int,
             lr: float) -> tuple[torch.nn.Module, dict, dict, float | None]:
    arch = {"name": "mlp", "hidden": [hidden], "bias": False}
    if init_scale is not None:
        arch["init_scale"] = init_scale
    cfg = TrainConfig.model_validate({"data": data, "arch": arch, "lr": lr, "epochs": epochs, "dtype": "float64",
                                      "seed": 0})
    out = work / name
    if not (out / "model.json").is_file():
        train_target(cfg, out=out, progress=False)
    target = Target.from_model_dir(out)
    from datarecon.models.spec import build_model

    init_model = build_model(cfg.arch_spec(), generator=torch.Generator().manual_seed(cfg.seed), dtype=torch.float64)
    init = {k: v.detach() for k, v in init_model.named_parameters()}
    w0 = init["1.weight"]
    return target.model, dict(target.params), init, float(w0.std())


def _row(kind: str, name: str, n: int, model, params, init, std) -> list[dict]:
    rows = []
    for known in (False, True):
        t0 = time.perf_counter()
        a = analyse(model, params, known_init=init if known else None, init_std=None if known else std,
                    generator=torch.Generator().manual_seed(0))
        r = a.rank
        rows.append({"kind": kind, "name": name, "n": n, "known_init": known, "n_hat": r.n_hat, "low": r.low,
                     "high": r.high, "above_noise": r.above_noise, "k": a.k, "searched": r.searched,
                     "covered": r.low <= n <= r.high, "error": r.n_hat - n, "s": round(time.perf_counter() - t0, 3)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None, help="folder for the trained models (kept)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict] = []
    for n in (10, 20, 50, 100):
        for s in (1e-4, 1e-2):
            for seed in (0, 1, 2):
                model, params, init, std = _planted(n, s=s, h=200, seed=seed)
                rows += _row("planted", f"mnist h=200 s={s:g} seed={seed}", n, model, params, init, std)
    work = args.work or Path(tempfile.mkdtemp(prefix="rank-coverage-"))
    work.mkdir(parents=True, exist_ok=True)
    trained = [
        ("digits-demo", {"dataset": "digits", "task": "odd-even", "n_per_class": 10}, 1000, 1e-3, 2000, 0.5, 20),
        ("mnist-h100-n20", {"dataset": "mnist", "task": "odd-even", "n_per_class": 10}, 100, 1e-3, 2000, 0.5, 20),
        ("mnist-h1000-n100", {"dataset": "mnist", "task": "odd-even", "n_per_class": 50}, 1000, 1e-3, 1000, 0.5, 100),
        ("mnist-h1000-n100-default-init", {"dataset": "mnist", "task": "odd-even", "n_per_class": 50}, 1000, None,
         1000, 0.05, 100),
        ("cifar-h1000-n100", {"dataset": "cifar10", "task": "vehicles-animals", "n_per_class": 50}, 1000, 1e-3,
         1000, 0.1, 100),
    ]
    for name, data, hidden, scale, epochs, lr, n in trained:
        model, params, init, std = _trained(work, name, data, hidden=hidden, init_scale=scale, epochs=epochs, lr=lr)
        rows += _row("trained", name, n, model, params, init, std)
    summary = {}
    for kind in ("planted", "trained"):
        for known in (False, True):
            sel = [r for r in rows if r["kind"] == kind and r["known_init"] == known]
            summary[f"{kind}, {'W - W_init' if known else 'weights only'}"] = {
                "layers": len(sel), "covered": sum(r["covered"] for r in sel),
                "n_hat below n": sum(r["error"] < 0 for r in sel), "median |n_hat - n| / n": sorted(
                    abs(r["error"]) / r["n"] for r in sel)[len(sel) // 2] if sel else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
