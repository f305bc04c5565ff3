"""Per-outer-step cost of the bilevel attack at a given width, and the cost model behind ``--dry-run``.

For a one-hidden ReLU target (CIFAR shape 3×32×32, width ``--width``, m = ``--n`` candidates;
weights random, not trained: the cost of a step does not depend on them) it times, interleaved over
``--repeats`` rounds:

* ``eval``  one energy value + gradient (forward + backward; the unit of the inner L-BFGS);
* ``graph`` building the create-graph gradient the Hessian products share;
* ``hvp``   one Hessian-vector product (double backward);
* ``mixed`` the mixed product ∇_x⟨∇_θE, p⟩;
* ``twoloop`` one L-BFGS two-loop recursion over 10 pairs, ``axpy`` one P-vector update;
* a training epoch (``gd``, ``lbfgs``) ÷ one plain forward+backward pass, interleaved;

then runs ``--steps`` real outer steps of the attack with the one-hidden settings of the runkel2024
preset ``--scale`` (its inner and linear-solve caps; the first inner solve capped at
``--first-iters`` so the benchmark does not spend its time there) and reports, per step, the wall
time, the counts (evaluations, HVPs, line-search trials) and two models of it: Σ counts × the unit
times above, and ``datarecon.experiments.reproduce.cost`` (passes × FLOPs at the CPU figures,
plus vector operations). Besides wall time it records the CPU time of this thread
(``time.process_time``): throughput per CPU second does not depend on how many other jobs share
the machine, which is what the cost model's ``cpu`` figures are (the eval, a plain float32 pass
and a vector update are measured that way here). CPU time ÷ cost model checks the model; wall ÷
CPU time is the share of a core this run got.

    python benchmarks/bench_bilevel_cost.py --quick                          # width 1024, n = 100
    python benchmarks/bench_bilevel_cost.py --width 6144 --n 500 --scale paper   # the paper's width and n

Writes benchmarks/results/bilevel_cost[_quick].json; exits non-zero on error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import base_parser, results_path, write_results
from torch import nn

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.bilevel import BilevelAttack, FlatLayout, HessianOperator, make_energy
from datarecon.attacks.bilevel.lbfgs import two_loop
from datarecon.attacks.bilevel.problem import value_and_grad
from datarecon.experiments.reproduce import cost, load_config
from datarecon.training.target import ArchConfig

SHAPE = (3, 32, 32)


def step_model(unit: dict[str, float], *, iterations: int, evaluations: int, hvps: int, trials: float) -> float:
    """Seconds of one outer step from unit times: the formula runkel2024's estimates use.

    Inner L-BFGS: an evaluation per function value, a two-loop recursion and ~10 P-vector updates
    per iteration; linear solve: the shared graph, each HVP plus ~4 vector updates, the mixed
    product; line search: ~4 vector updates per trial.
    """
    return (evaluations * unit["eval"] + iterations * (unit["twoloop"] + 10 * unit["axpy"]) + unit["graph"]
            + hvps * (unit["hvp"] + 4 * unit["axpy"]) + unit["mixed"] + trials * 4 * unit["axpy"])


def train_epoch_ratios(width: int, n: int, *, repeats: int, dtype: torch.dtype, epochs: int = 10) -> dict[str, float]:
    """Epoch time of full-batch training (``datarecon.training.fit``) ÷ one plain forward+backward, per
    optimiser, interleaved (pass, epochs, pass, epochs, ...): the cost model's passes per epoch."""
    from datarecon.training.fit import FitRecipe, fit
    from datarecon.kernel.losses import LOSSES

    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, *SHAPE, generator=g, dtype=dtype) - 0.5
    y = torch.cat([torch.ones(n - n // 2), -torch.ones(n // 2)]).to(dtype)
    out = {}
    for opt, lr in (("gd", 0.01), ("lbfgs", 1.0)):
        model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU(), nn.Linear(width, 1)).to(dtype)
        ratios = []
        for _ in range(repeats):
            t = time.perf_counter()
            model.zero_grad()
            LOSSES.get("logistic")(model(x), y).backward()
            one_pass = time.perf_counter() - t
            t = time.perf_counter()
            fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=1e-2, optimizer=opt, lr=lr, epochs=epochs))
            ratios.append((time.perf_counter() - t) / epochs / one_pass)
        out[opt] = statistics.median(ratios)
    return out


def main(argv=None) -> int:
    ap = base_parser(__doc__, quick_help="width 1024, n = 100", repeats_help="interleaved rounds (default 3)")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--scale", default="medium", help="runkel2024 preset whose one-hidden bilevel settings run")
    ap.add_argument("--steps", type=int, default=3, help="outer steps timed after the first")
    ap.add_argument("--first-iters", type=int, default=10, help="cap of the first inner solve (not timed)")
    ap.add_argument("--train-ratio", action=argparse.BooleanOptionalAction, default=None,
                    help="also measure training epoch ÷ pass (default: with --quick only; 10 L-BFGS epochs "
                         "× repeats take minutes at the paper's width)")
    args = ap.parse_args(argv)
    args.train_ratio = args.quick if args.train_ratio is None else args.train_ratio
    args.width = args.width or 1024
    args.n = args.n or 100
    repeats = args.repeats or 3
    torch.set_num_threads(args.threads or 1)
    bcfg = load_config("runkel2024", scale=args.scale).bilevel_one_hidden.model_copy(
        update={"inner_max_iter_first": args.first_iters, "theta0": "target", "steps": args.steps + 1})
    args.dtype = bcfg.dtype
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    t_start = time.perf_counter()
    try:
        g = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, args.width), nn.ReLU(), nn.Linear(args.width, 1))
        model = model.to(dtype)
        params = {k: v.detach() for k, v in model.named_parameters()}
        layout = FlatLayout(params)
        y = torch.cat([torch.ones(args.n - args.n // 2), -torch.ones(args.n // 2)]).to(dtype)
        x = torch.rand(args.n, *SHAPE, generator=g, dtype=dtype) - 0.5
        energy = make_energy(model, layout, y, loss="logistic", weight_decay=1e-2)
        theta = layout.flatten(params)
        v = torch.randn(layout.size, generator=g, dtype=dtype)
        fun = value_and_grad(energy, x)
        times: dict[str, list[float]] = {"eval": [], "graph": [], "hvp": [], "mixed": [], "twoloop": [], "axpy": []}
        cpu: dict[str, list[float]] = {"eval": [], "axpy": [], "pass_float32": []}  # CPU seconds of this thread
        model32 = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, args.width), nn.ReLU(), nn.Linear(args.width, 1))
        x32 = x.float()

        def plain32(inputs: torch.Tensor) -> None:  # plain float32 forward + backward (KKT-family dtype)
            model32.zero_grad()
            torch.nn.functional.softplus(-model32(inputs)).mean().backward()
        pairs = [(torch.randn(layout.size, generator=g, dtype=dtype), torch.randn(layout.size, generator=g, dtype=dtype))
                 for _ in range(10)]
        for _ in range(repeats):
            t = time.perf_counter()
            c = time.process_time()
            fun(theta)
            times["eval"].append(time.perf_counter() - t)
            cpu["eval"].append(time.process_time() - c)
            t = time.perf_counter()
            op = HessianOperator(energy, x, theta)
            times["graph"].append(time.perf_counter() - t)
            t = time.perf_counter()
            op(v)
            times["hvp"].append(time.perf_counter() - t)
            t = time.perf_counter()
            op.mixed(v)
            times["mixed"].append(time.perf_counter() - t)
            del op
            t = time.perf_counter()
            two_loop(pairs, v)
            times["twoloop"].append(time.perf_counter() - t)
            t, c = time.perf_counter(), time.process_time()
            for _ in range(10):
                v.add_(theta, alpha=1e-12)
            times["axpy"].append((time.perf_counter() - t) / 10)
            cpu["axpy"].append((time.process_time() - c) / 10)
            c = time.process_time()
            plain32(x32)
            cpu["pass_float32"].append(time.process_time() - c)
        unit = {k: statistics.median(vs) for k, vs in times.items()}
        unit_cpu = {k: statistics.median(vs) for k, vs in cpu.items()}
        epoch_ratios = train_epoch_ratios(args.width, args.n, repeats=repeats, dtype=dtype) if args.train_ratio else {}
        arch = ArchConfig(name="one-hidden", hidden=(args.width,))
        flops = 6.0 * args.n * cost.macs_per_input(arch)
        vector_bytes = 3.0 * layout.size * cost.ITEMSIZE[args.dtype]
        # real outer steps with capped inner solves
        target = Target(model=model, params=params, loss="logistic", weight_decay=1e-2, input_shape=SHAPE,
                        num_outputs=1)
        prior = AttackerPrior(labels=y, input_shape=SHAPE, lower=-0.5, upper=0.5)
        attack = BilevelAttack(bcfg)
        x0 = torch.rand(args.n, *SHAPE, generator=g, dtype=dtype) - 0.5
        state = attack.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
        steps = []
        for i in range(args.steps + 1):
            before = state["bilevel.counts"].clone()
            t, c = time.perf_counter(), time.process_time()
            m = attack.step(target, prior, state, i)
            wall, cpu_s = time.perf_counter() - t, time.process_time() - c
            d = (state["bilevel.counts"] - before).tolist()
            iters, evals, hvps = d[1], d[2], d[3]
            model_s = step_model(unit, iterations=iters, evaluations=evals, hvps=hvps, trials=m.get("ls_trials", 0))
            work = cost.Work(evals + hvps + 2.0, iters * (10 * bcfg.lbfgs_history + cost.VECTOR_OPS_PER_ITERATION)
                             + cost.VECTOR_OPS_PER_HVP * hvps)  # the counts measured, the formula of cost.py
            cost_s = cost.work_seconds(work, device="cpu", flops_per_pass=flops, vector_bytes=vector_bytes,
                                       dtype=args.dtype)
            steps.append({"step": i, "wall_s": wall, "inner_iterations": iters, "inner_evaluations": evals, "hvps": hvps,
                          "ls_trials": m.get("ls_trials", 0), "model_s": model_s, "wall_over_model": wall / model_s,
                          "cost_model_s": cost_s, "wall_over_cost_model": wall / cost_s, "cpu_s": cpu_s,
                          "cpu_over_cost_model": cpu_s / cost_s})
    except Exception as exc:  # noqa: BLE001 — report and fail
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"one-hidden width {args.width}, m = {args.n}, {args.dtype}, {torch.get_num_threads()} thread(s): "
          f"P = {layout.size}, fwd+bwd {flops / 1e9:.1f} GFLOP")
    for k, s in unit.items():
        print(f"  {k:>5}: {1e3 * s:9.1f} ms  ({s / unit['eval']:.2f} × eval)")
    gflops_cpu = flops / unit_cpu["eval"] / 1e9
    gflops32_cpu = flops / unit_cpu["pass_float32"] / 1e9
    bandwidth_cpu = vector_bytes / unit_cpu["axpy"] / 1e9
    print(f"  effective throughput of eval: {flops / unit['eval'] / 1e9:.1f} GFLOP/s of wall time, "
          f"{gflops_cpu:.1f} GFLOP/s of CPU time ({args.dtype}); plain float32 pass {gflops32_cpu:.1f} GFLOP/s of "
          f"CPU time; vector updates {bandwidth_cpu:.1f} GB/s of CPU time (the cost model's cpu figures are per "
          "CPU second, so machine load does not enter them)")
    print(f"  bilevel settings ({args.scale} preset, first solve capped at {args.first_iters}): inner_max_iter "
          f"{bcfg.inner_max_iter}, tol schedule {bcfg.inner_tol_schedule}, {bcfg.hessian} ≤ {bcfg.solve_max_iter}")
    if epoch_ratios:
        print("  training epoch ÷ plain pass (interleaved): " + ", ".join(f"{k} {v:.1f}" for k, v in epoch_ratios.items()))
    for s in steps:
        print(f"  outer step {s['step']}: {s['wall_s']:.2f} s wall, {s['inner_iterations']} inner iterations, "
              f"{s['inner_evaluations']} evals, {s['hvps']} HVPs, {s['ls_trials']:.0f} line-search trials; "
              f"unit-time model {s['model_s']:.2f} s (wall/model {s['wall_over_model']:.2f}); "
              f"cost model {s['cost_model_s']:.2f} s (wall/cost model {s['wall_over_cost_model']:.2f}, "
              f"CPU time/cost model {s['cpu_over_cost_model']:.2f})")
    timed = steps[1:] or steps
    per_step = statistics.median(s["wall_s"] for s in timed)
    print(f"  median wall per outer step (steps 1..{len(steps) - 1}): {per_step:.2f} s")
    write_results(results_path("bilevel_cost", quick=args.quick, out=args.out), benchmark="bilevel_cost",
                  quick=args.quick, args={k: (str(val) if isinstance(val, Path) else val) for k, val in vars(args).items()},
                  num_parameters=layout.size, flops_per_eval=flops, unit_seconds=unit, unit_times=times,
                  eval_gflops=flops / unit["eval"] / 1e9, unit_cpu_seconds=unit_cpu, eval_gflops_per_cpu_s=gflops_cpu,
                  pass_float32_gflops_per_cpu_s=gflops32_cpu, vector_gbytes_per_cpu_s=bandwidth_cpu,
                  train_epoch_over_pass=epoch_ratios,
                  bilevel_config=bcfg.model_dump(mode="json"), steps=steps,
                  median_step_wall_s=per_step, load_average=list(os.getloadavg()),
                  date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=time.perf_counter() - t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
