"""Dynamics matching: SimuDy's quality metric on finished runs, and the attack's cost.

Two modes:

``table RUN [RUN ...]`` — for each finished run directory (any method) of a model directory: the
mean best SSIM of SimuDy's evaluation (training images and candidates paired greedily, one to
one, by decreasing SSIM; the mean over the n training images) with its 95 % percentile-bootstrap
interval (training images resampled), the headline count of ``datarecon evaluate`` (its
``metrics.json``; evaluate the run first), and the same SimuDy metric for the nulls: m held-out
images (a seeded draw, with its interval, and the interval of the paired difference attack − null)
and m uniform-noise images used as candidates.
SSIM is datarecon's (scikit-image's Gaussian-window SSIM, data range 1, on display images in
[0, 1]); SimuDy's own script takes the data range of each normalised image instead.

    python benchmarks/bench_dynamics.py table RUN1 RUN2 --out results.json

``cost`` — seconds and peak memory (the process's max RSS on the CPU, the CUDA allocator's peak
on a GPU; one subprocess per point) of one outer step of the dynamics attack on CIFAR-sized inputs,
against n (= m, full batch) and the number of simulated steps T, with the whole unroll kept
(segment 0) and recomputed in segments of ⌈√T⌉, beside the attack's own memory estimate:

    python benchmarks/bench_dynamics.py cost --threads 1 --out cost.json            # the MLP
    python benchmarks/bench_dynamics.py cost --arch resnet18 --device cuda --n 20,50 --T 4,16
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch


def greedy_best_ssims(cands: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """SimuDy's pairing: pairs (training image, candidate) taken by decreasing SSIM, each used once; the
    SSIM of each training image's pair, (n,) (0 for a training image left without a candidate when m < n)."""
    from datarecon.evaluation.similarity import ssim_matrix

    sim = ssim_matrix(cands.clamp(0, 1).double(), train.double()).clone()  # (m, n)
    best = torch.zeros(train.shape[0], dtype=torch.float64)
    for _ in range(min(sim.shape)):
        flat = int(torch.argmax(sim))
        i, j = divmod(flat, sim.shape[1])
        best[j] = sim[i, j]
        sim[i, :] = -math.inf
        sim[:, j] = -math.inf
    return best


def greedy_mean_best_ssim(cands: torch.Tensor, train: torch.Tensor) -> float:
    """SimuDy's metric: the mean over the n training images of :func:`greedy_best_ssims`."""
    return float(greedy_best_ssims(cands, train).sum()) / train.shape[0]


#: bootstrap resamples of the training images and the seed of their draw
BOOTSTRAP, BOOTSTRAP_SEED = 10_000, 0


def bootstrap_ci(values: torch.Tensor, *, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (n,), the training images resampled with
    replacement (:data:`BOOTSTRAP` draws, seeded)."""
    g = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    idx = torch.randint(0, values.shape[0], (BOOTSTRAP, values.shape[0]), generator=g)
    means = values.double()[idx].mean(dim=1)
    lo, hi = torch.quantile(means, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(lo), float(hi)


def _images(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    from datarecon.data import DataSpec, Normalisation, load_task
    from datarecon.models.checkpoint import load_model_dir
    from datarecon.utils.io import load_tensors, read_json

    meta = read_json(run_dir / "run.json")
    bundle = load_model_dir(meta["model_dir"])
    task = load_task(DataSpec.model_validate(bundle.data))
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    cands = norm.to_display(load_tensors(run_dir / "candidates.safetensors")["x"].float())
    return cands, task.train.x, task.heldout.x, meta


def table(runs: list[Path]) -> list[dict]:
    rows = []
    for run in runs:
        cands, train, heldout, meta = _images(run)
        m = cands.shape[0]
        g = torch.Generator().manual_seed(0)
        null = heldout[torch.randperm(heldout.shape[0], generator=g)[:m]]
        noise = torch.rand((m, *train.shape[1:]), generator=g)
        metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else {}
        head = metrics.get("headline", {})
        best, best_null = greedy_best_ssims(cands, train), greedy_best_ssims(null, train)
        rows.append({
            "run": str(run), "method": meta.get("method"), "steps": meta.get("steps_done"),
            "wall_time_s": meta.get("wall_time_s"), "knowledge": (meta.get("knowledge") or {}).get("summary"),
            "m": m, "n": int(train.shape[0]),
            "mean_best_ssim": float(best.mean()), "mean_best_ssim_ci95": bootstrap_ci(best),
            "mean_best_ssim_heldout_null": float(best_null.mean()),
            "mean_best_ssim_heldout_null_ci95": bootstrap_ci(best_null),
            "mean_best_ssim_minus_null_ci95": bootstrap_ci(best - best_null),
            "mean_best_ssim_noise_null": greedy_mean_best_ssim(noise, train),
            "best_ssims": best.tolist(), "selection": meta.get("selection"),
            "headline": {k: head.get(k) for k in ("count", "heldout", "noise", "threshold", "n_train")},
        })
        r = rows[-1]
        lo, hi = r["mean_best_ssim_ci95"]
        print(f"{run.name:12s} {r['method']:9s} mean best SSIM {r['mean_best_ssim']:.3f} [{lo:.3f}, {hi:.3f}] "
              f"(held-out null {r['mean_best_ssim_heldout_null']:.3f}, noise {r['mean_best_ssim_noise_null']:.3f}); "
              f"headline {r['headline']['count']}/{r['n']} vs held-out {r['headline']['heldout']}", flush=True)
    return rows


def _one_cost(n: int, steps: int, segment: int, width: int, threads: int, arch: str = "mlp",
              device: str = "cpu") -> dict:
    """Time two outer steps (the second measured) of a full-batch replay of ``steps`` steps; the peak
    memory (the process's max RSS on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA) beside the
    attack's own estimate (:func:`datarecon.attacks.dynamics.memory_estimate`, what it refuses on)."""
    torch.set_num_threads(threads)
    from datarecon.attacks.base import AttackerPrior, Target
    from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig, memory_estimate
    from datarecon.attacks.knowledge import KnownInit, KnownRecipe
    from datarecon.kernel.step import TrainingRecipe
    from datarecon.models.spec import ArchSpec, build_model

    dev = torch.device(device)
    spec = ArchSpec(name=arch, input_shape=(3, 32, 32), num_outputs=10, bias=False,
                    hidden=(width, width) if arch == "mlp" else None)
    model = build_model(spec, generator=torch.Generator().manual_seed(0)).to(dev)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in init.items()}
    target = Target(model=model, params=params, loss="cross-entropy", weight_decay=0.0, input_shape=(3, 32, 32),
                    num_outputs=10)
    recipe = KnownRecipe(TrainingRecipe(loss="cross-entropy", lr=0.01, epochs=steps, batch_size=n, seed=0),
                         n=n, known=("lr", "momentum", "batch_size", "epochs", "order"))
    prior = AttackerPrior(labels=(torch.arange(n) % 10).to(dev), input_shape=(3, 32, 32), lower=-0.5, upper=0.5,
                          known_init=KnownInit(params=init, sha256="bench", source="bench"), recipe=recipe)
    attack = DynamicsAttack(DynamicsConfig(segment=segment))
    estimate = memory_estimate(target, m=n, batch_size=n, steps=steps, segment=segment, dtype=torch.float32)
    state = attack.init_state(target, prior, x0=torch.rand(n, 3, 32, 32, device=dev) - 0.5,
                              generator=torch.Generator())
    attack.step(target, prior, state, 0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    attack.step(target, prior, state, 1)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    wall = time.perf_counter() - t0
    return {"arch": arch, "device": device, "n": n, "steps": steps, "segment": segment, "width": width,
            "s_per_outer_step": wall, "peak_bytes": peak, "peak_kind": "cuda allocated" if dev.type == "cuda"
            else "max RSS", "estimate_bytes": estimate,
            "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None}


def cost(threads: int, width: int, *, arch: str = "mlp", device: str = "cpu", ns: tuple[int, ...] = (10, 20, 40),
         ts: tuple[int, ...] = (4, 16, 64)) -> list[dict]:
    rows = []
    for n in ns:
        for steps in ts:
            for segment in (0, math.isqrt(steps - 1) + 1):
                res = subprocess.run([sys.executable, __file__, "_one", str(n), str(steps), str(segment), str(width),
                                      str(threads), "--arch", arch, "--device", device],
                                     capture_output=True, text=True)
                if res.returncode != 0:  # out of memory, say: recorded, the sweep goes on
                    row = {"arch": arch, "device": device, "n": n, "steps": steps, "segment": segment,
                           "error": (res.stderr.strip().splitlines() or ["?"])[-1][:300]}
                    print(f"n {n:3d} T {steps:3d} segment {segment:2d}: {row['error']}", flush=True)
                else:
                    row = json.loads(res.stdout.strip().splitlines()[-1])
                    print(f"n {n:3d} T {steps:3d} segment {segment:2d}: {row['s_per_outer_step']:.3f} s/step, peak "
                          f"{row['peak_bytes'] / 2**20:.0f} MiB ({row['peak_kind']}), estimate "
                          f"{row['estimate_bytes'] / 2**20:.0f} MiB", flush=True)
                rows.append(row)
    return rows


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("table")
    t.add_argument("runs", nargs="+", type=Path)
    t.add_argument("--out", type=Path)
    c = sub.add_parser("cost")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--width", type=int, default=1000, help="the MLP's hidden width")
    c.add_argument("--arch", default="mlp", help="mlp | cnn | resnet8 | resnet18 (CIFAR-10 inputs, 10 classes)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--n", type=_ints, default=(10, 20, 40), help="comma-separated n (= m, full batch)")
    c.add_argument("--T", type=_ints, default=(4, 16, 64), help="comma-separated simulated steps")
    c.add_argument("--out", type=Path)
    one = sub.add_parser("_one")
    for name in ("n", "steps", "segment", "width", "threads"):
        one.add_argument(name, type=int)
    one.add_argument("--arch", default="mlp")
    one.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.mode == "_one":
        print(json.dumps(_one_cost(args.n, args.steps, args.segment, args.width, args.threads, args.arch,
                                   args.device)))
        return 0
    rows = (table(args.runs) if args.mode == "table" else
            cost(args.threads, args.width, arch=args.arch, device=args.device, ns=args.n, ts=args.T))
    if args.out:
        args.out.write_text(json.dumps({"date": str(date.today()), "machine": platform.platform(),
                                        "cpus": torch.get_num_threads(), "torch": torch.__version__,
                                        "mode": args.mode, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
