"""Inverse-Hessian strategies of the bilevel attack: HVPs and wall time to a fixed residual.

Targets: an affine and a one-hidden ReLU classifier on CIFAR-10 vehicles/animals (first n/2
images per side), trained with weight decay 1e-2 by L-BFGS (the runkel2024 recipe). The
attack (default settings) walks ``--steps`` outer steps from uniform-noise candidates
(m = n); at every step, at the attack's own (x, θ̂(x)) and with its inner L-BFGS pairs, each
strategy solves M p = ∇_θ l to the relative residual ``--tol`` (M = the matrix the attack
inverts for that target: ∇²_θE for affine, the resolved kink treatment for ReLU), warm-started
from its own previous p as inside the attack. Strategies run interleaved (rotating order) at
each step, so machine load hits all of them alike.

Reported per strategy: Hessian-vector products per solve (the residual check included),
median ms per solve, the largest residual reached, the share of solves that converged, and
the relative error of the resulting hypergradient against a reference solve (CG to 1e-12).
``qn`` (the paper's two-loop recursion) does not solve to a tolerance: its row shows the
residual and hypergradient error it actually has.

    python benchmarks/bench_bilevel_solvers.py --quick     # n = 20, width 32
    python benchmarks/bench_bilevel_solvers.py             # n = 100, width 256

Writes benchmarks/results/bilevel_solvers[_quick].json; exits non-zero on error.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import base_parser, results_path, write_results

from datarecon.attacks.bilevel import CURVATURES, LINEAR_SOLVERS, BilevelAttack, BilevelConfig, SolveOptions
from datarecon.attacks.bilevel.hypergrad import implicit_gradient
from datarecon.attacks.bilevel.lbfgs import LBFGSMemory
from datarecon.attacks.bilevel.linear_solve import LinearSystem

STRATEGIES = ("qn", "cg", "pcg", "neumann")


def train(out: Path, *, arch: str, width: int, n_per_class: int, epochs: int, data_dir) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    hidden = (width,) if arch == "one-hidden" else None
    cfg = TrainConfig(data=DataSpec(dataset="cifar10", task="vehicles-animals", n_per_class=n_per_class,
                                    normalisation="unit-minus-mean"),
                      arch=ArchConfig(name=arch, hidden=hidden), loss="logistic", weight_decay=1e-2,
                      optimizer="lbfgs", lr=1.0, epochs=epochs, dtype="float64")
    train_target(cfg, data_dir=data_dir, out=out, progress=False)
    return out


def bench_target(arch: str, args, tmp: Path) -> dict:
    from datarecon.experiments.reconstruct import build_run, prepare

    mdir = train(tmp / arch, arch=arch, width=args.width, n_per_class=args.n // 2, epochs=args.train_epochs,
                 data_dir=args.data_dir)
    setup = prepare(build_run({"model": str(mdir), "init": {"name": "uniform"}, "candidates": args.n, "seed": args.seed}),
                    data_dir=args.data_dir)
    target, prior = setup.target, setup.prior
    walker = BilevelAttack(BilevelConfig(inner_max_iter=args.inner_iters, inner_max_iter_first=args.inner_first))
    state = walker.init_state(target, prior, x0=setup.x0, generator=torch.Generator().manual_seed(args.seed))
    pr = walker.problem(target, prior)
    mu = pr.treatment.damping
    opts = SolveOptions(tol=args.tol, max_iter=args.max_iter, neumann_max_terms=args.neumann_terms, damping=mu)
    prev: dict[str, torch.Tensor | None] = dict.fromkeys(STRATEGIES)
    eig: torch.Tensor | None = None
    rows: dict[str, list[dict]] = {s: [] for s in STRATEGIES}
    for k in range(args.steps):
        walker.step(target, prior, state, k)
        x, theta = state["x"], state["theta"]
        pairs = LBFGSMemory(state["lbfgs.s"], state["lbfgs.y"], state["lbfgs.meta"]).pairs()
        op = CURVATURES.get(pr.treatment.curvature)(pr.energy, x, theta)
        b = 2.0 * (theta - pr.theta_star)
        ref = LINEAR_SOLVERS.get("cg")(LinearSystem(hvp=op, b=b),
                                       SolveOptions(tol=1e-12, max_iter=5000, damping=mu, warm_start=False))
        g_ref = implicit_gradient(op, ref.p)
        order = STRATEGIES[k % len(STRATEGIES):] + STRATEGIES[:k % len(STRATEGIES)]
        for name in order:
            system = LinearSystem(hvp=op, b=b, previous=prev[name], pairs=pairs, eigvec=eig)
            t = time.perf_counter()
            res = LINEAR_SOLVERS.get(name)(system, opts)
            secs = time.perf_counter() - t
            prev[name] = res.p
            if name == "neumann" and res.eigvec is not None:
                eig = res.eigvec
            g = implicit_gradient(op, res.p)
            rows[name].append({"step": k, "hvps": res.hvps, "seconds": secs, "residual": res.residual,
                               "converged": res.converged, "stop_reason": res.stop_reason,
                               "hypergradient_rel_error": float((g - g_ref).norm() / g_ref.norm()),
                               "cosine": float((g * g_ref).sum() / (g.norm() * g_ref.norm())),
                               "lambda_max": res.lambda_max})
    table = {}
    for name, rs in rows.items():
        table[name] = {"hvps_per_solve": statistics.mean(r["hvps"] for r in rs),
                       "hvps_first_solve": rs[0]["hvps"],
                       "ms_per_solve_median": 1e3 * statistics.median(r["seconds"] for r in rs),
                       "residual_max": max(r["residual"] for r in rs),
                       "residual_median": statistics.median(r["residual"] for r in rs),
                       "converged_share": sum(r["converged"] for r in rs) / len(rs),
                       "hypergradient_rel_error_median": statistics.median(r["hypergradient_rel_error"] for r in rs),
                       "hypergradient_rel_error_max": max(r["hypergradient_rel_error"] for r in rs),
                       "cosine_min": min(r["cosine"] for r in rs)}
    return {"target": arch, "num_parameters": pr.layout.size, "n": args.n, "width": args.width if arch != "affine"
            else 0, "curvature": pr.treatment.curvature, "damping": mu, "tol": args.tol, "steps": args.steps,
            "table": table, "rows": rows}


def main(argv=None) -> int:
    ap = base_parser(__doc__, quick_help="n = 20, width 32, 5 steps", repeats_help="unused")
    ap.add_argument("--n", type=int, default=None, help="training images (= candidates m)")
    ap.add_argument("--width", type=int, default=None, help="one-hidden width")
    ap.add_argument("--steps", type=int, default=None, help="outer steps (one solve per strategy each)")
    ap.add_argument("--tol", type=float, default=1e-6, help="the fixed relative residual")
    ap.add_argument("--max-iter", type=int, default=500)
    ap.add_argument("--neumann-terms", type=int, default=20000)
    ap.add_argument("--train-epochs", type=int, default=500)
    ap.add_argument("--inner-iters", type=int, default=20)
    ap.add_argument("--inner-first", type=int, default=300)
    ap.add_argument("--targets", default="affine,one-hidden")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    args.n = args.n or (20 if args.quick else 100)
    args.width = args.width or (32 if args.quick else 256)
    args.steps = args.steps or (5 if args.quick else 15)
    torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for arch in args.targets.split(","):
                r = bench_target(arch, args, Path(tmp))
                results.append(r)
                print(f"\n{arch}: P = {r['num_parameters']}, n = m = {r['n']}, matrix {r['curvature']} "
                      f"(+{r['damping']:g}I), {r['steps']} solves each to relative residual {r['tol']:g}")
                print(f"{'strategy':>9} {'HVP/solve':>10} {'first':>6} {'ms/solve':>9} {'max res':>9} "
                      f"{'conv':>5} {'hg err med':>10} {'hg err max':>10}")
                for name, t in r["table"].items():
                    print(f"{name:>9} {t['hvps_per_solve']:10.1f} {t['hvps_first_solve']:6d} "
                          f"{t['ms_per_solve_median']:9.1f} {t['residual_max']:9.1e} {t['converged_share']:5.2f} "
                          f"{t['hypergradient_rel_error_median']:10.2e} {t['hypergradient_rel_error_max']:10.2e}")
    except Exception as exc:  # noqa: BLE001 — report and fail
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    write_results(results_path("bilevel_solvers", quick=args.quick, out=args.out), benchmark="bilevel_solvers",
                  quick=args.quick, args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  wall_s=time.perf_counter() - t0, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
