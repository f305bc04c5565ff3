"""K DecoReco runs against one target: batched (one vmapped gradient) vs looped vs K runs alone.

For each size (``--sizes``, default a small and a medium one: D-256-256-1 with m = 40 and
D-1000-1000-1 with m = 100, both bias-free ReLU MLPs at CIFAR's 3x32x32 input shape, random
weights; the step's cost does not depend on training) and each K (``--runs``, default 5 and 25),
three ways of doing the same K runs of ``--steps`` steps (DecoReco defaults, ``--dtype``):

* ``batched``: :func:`datarecon.attacks.batched.run_batched` with ``mode="batched"``;
* ``looped``: the same with ``mode="looped"`` (each run's own step in turn, through the one attack loop);
* ``alone``: K calls of :func:`datarecon.attacks.runner.run_attack`, one after the other.

No run writes files (``out=None``). The three are timed *interleaved* (batched, looped, alone,
batched, ...; the order rotates each repeat) so that machine load hits all alike; the ratios
``batched / alone`` and ``looped / alone`` of the medians are the result. Also checks that the
batched runs end where the runs alone end (max relative difference of x).

Usage::

    python benchmarks/bench_batched_runs.py --threads 1              # → results/batched_runs.json
    python benchmarks/bench_batched_runs.py --quick --threads 1      # tiny sizes, a few seconds

Exits non-zero on any error.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from dataclasses import replace

import torch
from _common import base_parser, results_path, write_results

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.loop import ATTACK_LOOP

SIZES = {"small": (256, 40), "medium": (1000, 100), "tiny": (32, 8)}


def make_target(width: int, *, dtype: torch.dtype, seed: int = 0):
    from torch import nn

    from datarecon.attacks.base import Target

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width, bias=False), nn.ReLU(),
                          nn.Linear(width, width, bias=False), nn.ReLU(), nn.Linear(width, 1, bias=False)).to(dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    return Target(model=model, params=params, loss="logistic", weight_decay=0.0, input_shape=(3, 32, 32),
                  num_outputs=1, homogeneous=True)


def members(target, *, k: int, m: int, steps: int, dtype: str):
    from datarecon.attacks.base import AttackerPrior
    from datarecon.attacks.batched import BatchMember
    from datarecon.attacks.init import CandidateSpec, make_init
    from datarecon.attacks.kkt import DecoRecoAttack, DecoRecoConfig

    prior = AttackerPrior.balanced(m=m, num_outputs=1, input_shape=(3, 32, 32), lower=-0.5, upper=0.5)
    cfg = DecoRecoConfig(steps=steps, dtype=dtype, lr_x=0.555, alpha=19.1, lambda_min=0.498)
    return [BatchMember(attack=DecoRecoAttack(cfg), prior=prior,
                        x0=make_init("gaussian", CandidateSpec(m=m, input_shape=(3, 32, 32)),
                                     generator=torch.Generator().manual_seed(j), scale=8.86e-4),
                        generator=torch.Generator().manual_seed(j), seed=j) for j in range(k)]


def run(way: str, target, mem) -> tuple[float, list[torch.Tensor]]:
    from datarecon.attacks.batched import run_batched
    from datarecon.attacks.runner import run_attack

    t0 = time.perf_counter()
    if way == "alone":
        recs = [run_attack(b.attack, AttackSetup(target, b.prior, b.x0, b.generator),
                           loop=replace(ATTACK_LOOP, progress=False)) for b in mem]
    else:
        recs = run_batched(mem, target, mode=way, loop=replace(ATTACK_LOOP, progress=False))
    return time.perf_counter() - t0, [r.x for r in recs]


def main(argv: list[str] | None = None) -> int:
    ap = base_parser(__doc__, quick_help="tiny sizes and K (seconds)", repeats_help="interleaved repeats (default 2)")
    ap.add_argument("--sizes", default=None, help=f"comma-separated of {sorted(SIZES)} (default small,medium)")
    ap.add_argument("--runs", default=None, help="comma-separated K values (default 5,25)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 16)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = (args.sizes or ("tiny" if args.quick else "small,medium")).split(",")
    ks = [int(k) for k in (args.runs or ("3" if args.quick else "5,25")).split(",")]
    steps = args.steps or (3 if args.quick else 16)
    repeats = args.repeats or 2
    dt = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    ways = ("batched", "looped", "alone")
    rows = []
    for size in sizes:
        width, m = SIZES[size]
        target = make_target(width, dtype=dt)
        for k in ks:
            times: dict[str, list[float]] = {w: [] for w in ways}
            finals: dict[str, list[torch.Tensor]] = {}
            run("batched", target, members(target, k=k, m=m, steps=1, dtype=args.dtype))  # warm-up
            for rep in range(repeats):
                order = ways[rep % 3:] + ways[:rep % 3]
                for way in order:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t, xs = run(way, target, members(target, k=k, m=m, steps=steps, dtype=args.dtype))
                    times[way].append(t)
                    finals[way] = xs
            med = {w: statistics.median(v) for w, v in times.items()}
            diff = max(float((b - a).abs().max() / a.abs().max().clamp_min(1e-30))
                       for b, a in zip(finals["batched"], finals["alone"], strict=True))
            row = {"size": size, "width": width, "m": m, "K": k, "steps": steps, "dtype": args.dtype,
                   "seconds": times, "median_s": med, "ms_per_run_step": {w: 1e3 * v / (k * steps) for w, v in med.items()},
                   "batched_over_alone": med["batched"] / med["alone"], "looped_over_alone": med["looped"] / med["alone"],
                   "max_rel_diff_x_batched_vs_alone": diff}
            rows.append(row)
            print(f"{size} (D-{width}-{width}-1, m={m}) K={k}: batched {med['batched']:.2f} s, looped "
                  f"{med['looped']:.2f} s, alone {med['alone']:.2f} s; batched/alone {row['batched_over_alone']:.3f}, "
                  f"looped/alone {row['looped_over_alone']:.3f}; max rel diff of x {diff:.1e}", flush=True)
    write_results(results_path("batched_runs", quick=args.quick, out=args.out), benchmark="batched_runs",
                  quick=args.quick, repeats=repeats, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
