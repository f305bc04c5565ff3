"""Benchmark of the bilevel attack's inverse-Hessian strategies (qn, cg, neumann).

For an affine CIFAR-shaped target (3072 + 1 parameters) and a reduced-width one-hidden ReLU
target, trained with logistic loss + weight decay on n synthetic images (U(0,1) − 0.5), the
attack starts from fresh random candidates (m = n) and runs a few shared warm-up outer steps.
At that common point, with θ̂ solved tightly, each strategy's hypergradient is compared with a
tight-CG reference (relative error, cosine); then each strategy runs timed outer steps from
the same state (wall time per step, HVPs and inner iterations per step).

    python benchmarks/bench_bilevel.py --quick        # ~30 s
    python benchmarks/bench_bilevel.py                # full

Writes benchmarks/results/bilevel.json; exits non-zero on error.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.bilevel import BilevelAttack, BilevelConfig, FlatLayout, lbfgs_minimize, make_energy
from datarecon.attacks.bilevel.hypergrad import HypergradientSettings, hypergradient
from datarecon.attacks.bilevel.lbfgs import LBFGSMemory
from datarecon.attacks.bilevel.linear_solve import SolveOptions, estimate_lambda_max
from datarecon.attacks.bilevel.problem import HessianOperator, value_and_grad
from datarecon.utils.io import atomic_write_json, versions

SHAPE = (3, 32, 32)
STRATEGIES = ("qn", "cg", "neumann")


def make_target(kind: str, *, n: int, width: int, wd: float, dtype: torch.dtype, seed: int,
                args_train_iter: int = 500):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d = 3 * 32 * 32
    if kind == "affine":
        model = nn.Sequential(nn.Flatten(), nn.Linear(d, 1))
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(d, width), nn.ReLU(), nn.Linear(width, 1))
    model = model.to(dtype)
    layout = FlatLayout({k: v.detach() for k, v in model.named_parameters()})
    x = torch.rand(n, *SHAPE, generator=g, dtype=dtype) - 0.5
    y = torch.cat([torch.ones(n - n // 2), -torch.ones(n // 2)]).to(dtype)
    energy = make_energy(model, layout, y, loss="logistic", weight_decay=wd)
    theta0 = layout.flatten({k: v.detach() for k, v in model.named_parameters()})
    res = lbfgs_minimize(value_and_grad(energy, x), theta0, tol=1e-8, max_iter=args_train_iter)
    target = Target(model=model, params=layout.unflatten(res.theta.clone()), loss="logistic", weight_decay=wd,
                    input_shape=SHAPE, num_outputs=1)
    prior = AttackerPrior(labels=y, input_shape=SHAPE, lower=-0.5, upper=0.5)
    return target, prior, {"train_grad_norm": res.grad_norm, "train_iters": res.iterations}


def bench(kind: str, args) -> dict:
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    width = args.width if kind == "one-hidden" else 0
    # ReLU targets: the inner solve stalls on kinks and ∇²E there is indefinite (undamped and
    # μ ≤ 0.1 CG meet negative curvature at once); METHODS §7: damping 1 converges.
    mu = args.damping_one_hidden if kind == "one-hidden" else 0.0
    target, prior, train = make_target(kind, n=args.n, width=width, wd=args.wd, dtype=dtype, seed=args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x0 = (torch.rand(args.n, *SHAPE, generator=g, dtype=dtype) - 0.5)
    base = dict(lr_x=args.lr_x, inner_tol=args.inner_tol, dtype=args.dtype, theta0="uniform",
                inner_max_iter=args.inner_max_iter, inner_max_iter_first=args.inner_max_iter_first, damping=mu)
    warm = BilevelAttack(BilevelConfig(hessian="cg", **base))
    state = warm.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for i in range(args.warmup):
        warm.step(target, prior, state, i)
    warm_s = time.perf_counter() - t0

    # --- accuracy at the common point: θ̂ solved tightly, reference = CG to 1e-10 relative residual
    layout, energy, theta_star = warm._problem(target, prior)
    memory = LBFGSMemory(state["lbfgs.s"].clone(), state["lbfgs.y"].clone(), state["lbfgs.meta"].clone())
    tight = lbfgs_minimize(value_and_grad(energy, state["x"]), state["theta"], pairs=memory.pairs(),
                           tol=args.tight_tol, max_iter=500, history=memory.size)
    memory.extend(tight.new_pairs)
    pairs = memory.pairs()
    op = HessianOperator(energy, state["x"], tight.theta, need_x=False)
    lam_max, power_hvps = estimate_lambda_max(op, torch.ones_like(tight.theta), iters=30)
    alpha = 1.0 / (lam_max + mu)
    ref = hypergradient(energy, state["x"], tight.theta, theta_star,
                        settings=HypergradientSettings(strategy="cg", options=SolveOptions(
                            tol=1e-10, max_iter=5000, warm_start=False, damping=mu)))
    if ref.solve.negative_curvature or not ref.solve.converged:
        raise RuntimeError(f"{kind}: reference CG did not converge (negative curvature "
                           f"{ref.solve.negative_curvature}); raise --damping-one-hidden")
    strat_opts = {
        "qn": SolveOptions(),
        "cg": SolveOptions(tol=args.cg_tol, max_iter=args.cg_max_iter, warm_start=False, damping=mu),
        "neumann": SolveOptions(neumann_alpha=alpha, neumann_max_terms=args.neumann_terms, damping=mu),
    }
    rows = []
    for strat in STRATEGIES:
        hg = hypergradient(energy, state["x"], tight.theta, theta_star,
                           settings=HypergradientSettings(strategy=strat, options=strat_opts[strat]), pairs=pairs)
        diff = hg.grad_x - ref.grad_x
        rel = float(diff.norm() / ref.grad_x.norm())
        cos = float((hg.grad_x * ref.grad_x).sum() / (hg.grad_x.norm() * ref.grad_x.norm()))
        # --- timing: outer steps from the same warm state
        cfg = BilevelConfig(hessian=strat, solve_tol=args.cg_tol, solve_max_iter=args.cg_max_iter,
                            neumann_max_terms=args.neumann_terms, neumann_alpha=alpha, **base)
        attack = BilevelAttack(cfg)
        st = {k: v.clone() for k, v in state.items()}
        times, hvps, inner_iters, residuals = [], [], [], []
        m: dict[str, float] = {}
        for i in range(args.steps):
            t = time.perf_counter()
            m = attack.step(target, prior, st, args.warmup + i)
            times.append(time.perf_counter() - t)
            hvps.append(m["hvps"])
            inner_iters.append(m["inner_iters"])
            residuals.append(m["residual"])
            if not all(v == v for v in m.values()):
                raise RuntimeError(f"{kind}/{strat}: non-finite metrics {m}")
        rows.append({"strategy": strat, "rel_error": rel, "cosine": cos, "hvps_accuracy_solve": hg.solve.hvps,
                     "ms_per_step_median": 1e3 * statistics.median(times), "ms_per_step_mean": 1e3 * statistics.mean(times),
                     "hvps_per_step": statistics.mean(hvps), "inner_iters_per_step": statistics.mean(inner_iters),
                     "inner_residual_max": max(residuals), "param_distance_end": m["param_distance"]})
    return {"target": kind, "num_parameters": layout.size, "damping": mu, "width": width, "n": args.n, "dtype": args.dtype,
            "weight_decay": args.wd, "train": train, "warmup_steps": args.warmup, "warmup_s": warm_s,
            "tight_inner_residual": tight.grad_norm, "lambda_max": lam_max, "neumann_alpha": alpha,
            "reference_cg_hvps": ref.solve.hvps, "reference_residual": ref.solve.residual,
            "lbfgs_pairs": len(pairs), "strategies": rows}


def bench_schedule(kind: str, args) -> dict:
    """Fixed vs "distance" inner tolerance over ``args.schedule_steps`` outer steps from the same x₀.

    Same target, x₀, θ⁰ and settings; the two schedules alternate over ``args.schedule_repeats``
    rounds (fixed, distance, fixed, ...) so load changes hit both. Reports wall time per outer
    step, inner L-BFGS iterations and the final ‖θ* − θ‖².
    """
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    width = args.width if kind == "one-hidden" else 0
    mu = args.damping_one_hidden if kind == "one-hidden" else 0.0
    target, prior, _ = make_target(kind, n=args.n, width=width, wd=args.wd, dtype=dtype, seed=args.seed)
    x0 = (torch.rand(args.n, *SHAPE, generator=torch.Generator().manual_seed(args.seed + 1), dtype=dtype) - 0.5)
    base = dict(lr_x=args.lr_x_schedule, inner_tol=args.inner_tol, dtype=args.dtype, theta0="uniform",
                inner_max_iter=args.inner_max_iter, inner_max_iter_first=args.inner_max_iter_first, damping=mu,
                hessian="cg", solve_tol=args.cg_tol, solve_max_iter=args.cg_max_iter)
    runs: dict[str, list[dict]] = {"fixed": [], "distance": []}
    for _ in range(args.schedule_repeats):
        for schedule in runs:
            attack = BilevelAttack(BilevelConfig(inner_tol_schedule=schedule, **base))
            st = attack.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
            t0 = time.perf_counter()
            inner, hvps = 0.0, 0.0
            m: dict[str, float] = {}
            for i in range(args.schedule_steps):
                m = attack.step(target, prior, st, i)
                inner += m["inner_iters"]
                hvps += m["hvps"]
            wall = time.perf_counter() - t0
            runs[schedule].append({"wall_s": wall, "inner_iters": inner, "hvps": hvps,
                                   "param_distance_end": m["param_distance"], "inner_tol_end": m["inner_tol"]})
    out = {"target": kind, "steps": args.schedule_steps, "repeats": args.schedule_repeats, "lr_x": args.lr_x_schedule}
    for schedule, rs in runs.items():
        out[schedule] = {"ms_per_step_median": 1e3 * statistics.median(r["wall_s"] for r in rs) / args.schedule_steps,
                         "inner_iters_total": rs[0]["inner_iters"], "hvps_total": rs[0]["hvps"],
                         "param_distance_end": rs[0]["param_distance_end"], "inner_tol_end": rs[0]["inner_tol_end"],
                         "runs": rs}
    out["speedup"] = out["fixed"]["ms_per_step_median"] / out["distance"]["ms_per_step_median"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--width", type=int, default=None, help="one-hidden width (default 128; quick 32)")
    ap.add_argument("--wd", type=float, default=1e-2)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--lr-x", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed outer steps per strategy")
    ap.add_argument("--inner-tol", type=float, default=1e-6)
    ap.add_argument("--inner-max-iter", type=int, default=50)
    ap.add_argument("--inner-max-iter-first", type=int, default=300)
    ap.add_argument("--tight-tol", type=float, default=1e-10)
    ap.add_argument("--cg-tol", type=float, default=1e-6)
    ap.add_argument("--cg-max-iter", type=int, default=100)
    ap.add_argument("--neumann-terms", type=int, default=100)
    ap.add_argument("--damping-one-hidden", type=float, default=1.0,
                    help="μ of H + μI for the ReLU one-hidden target (reference, cg, neumann; qn has none)")
    ap.add_argument("--targets", default="affine,one-hidden")
    ap.add_argument("--schedule-steps", type=int, default=0,
                    help="also compare the fixed and 'distance' inner-tolerance schedules over this many outer steps "
                         "from fresh candidates (0: skip)")
    ap.add_argument("--schedule-repeats", type=int, default=2)
    ap.add_argument("--lr-x-schedule", type=float, default=10.0, help="x step size of the schedule comparison")
    ap.add_argument("--schedule-only", action="store_true", help="run only the schedule comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: least noisy on a shared 2-core box)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bilevel.json")
    args = ap.parse_args(argv)
    args.width = args.width or (32 if args.quick else 128)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.steps = args.steps or (5 if args.quick else 10)
    torch.set_num_threads(args.threads)
    results = []
    try:
        for kind in ([] if args.schedule_only else args.targets.split(",")):
            t = time.perf_counter()
            r = bench(kind, args)
            r["wall_s"] = time.perf_counter() - t
            results.append(r)
            print(f"\n{kind}: P = {r['num_parameters']}, n = {r['n']}, {r['dtype']}, wd = {r['weight_decay']}, "
                  f"λ_max ≈ {r['lambda_max']:.3g} (neumann α = {r['neumann_alpha']:.3g}), "
                  f"damping μ = {r['damping']}, reference CG {r['reference_cg_hvps']} HVPs, tight inner residual {r['tight_inner_residual']:.1e}")
            print(f"{'strategy':>9} {'rel.err':>9} {'cosine':>8} {'ms/step':>9} {'HVP/step':>9} {'inner it':>9} "
                  f"{'inner res':>10}")
            for s in r["strategies"]:
                print(f"{s['strategy']:>9} {s['rel_error']:9.2e} {s['cosine']:8.4f} {s['ms_per_step_median']:9.1f} "
                      f"{s['hvps_per_step']:9.1f} {s['inner_iters_per_step']:9.1f} {s['inner_residual_max']:10.1e}")
        schedules = []
        if args.schedule_steps:
            for kind in args.targets.split(","):
                r = bench_schedule(kind, args)
                schedules.append(r)
                print(f"\n{kind}: inner tolerance schedule over {r['steps']} outer steps (lr_x {r['lr_x']}, "
                      f"{r['repeats']} alternating repeats)")
                for name in ("fixed", "distance"):
                    v = r[name]
                    print(f"{name:>9}: {v['ms_per_step_median']:8.1f} ms/step, {v['inner_iters_total']:6.0f} inner iters, "
                          f"{v['hvps_total']:6.0f} HVPs, final ‖θ*−θ‖² {v['param_distance_end']:.3e}")
                print(f"  speed-up of 'distance': {r['speedup']:.2f}x")
    except Exception as exc:  # noqa: BLE001 — report and fail
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    payload = {"benchmark": "bilevel", "quick": args.quick, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                                     for k, v in vars(args).items()},
               "platform": platform.platform(), "threads": torch.get_num_threads(), "versions": versions(),
               "results": results, "schedules": schedules}
    atomic_write_json(args.out, payload)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
