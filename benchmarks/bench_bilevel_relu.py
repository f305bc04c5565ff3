"""How should the bilevel attack treat ReLU targets? The descent-rate measurement.

On a one-hidden ReLU target (CIFAR-10 vehicles/animals, trained with weight decay by L-BFGS, the
runkel2024 recipe) each treatment computes a hypergradient g at the same point (x, θ̂(x)):

* ``hessian``            undamped CG on ∇²_θE (the implicit function theorem as written);
* ``damped-<μ>``         CG on ∇²_θE + μI (the reproduction's former setting: μ = 1);
* ``gauss-newton``       CG on the generalised Gauss–Newton matrix (positive definite);
* ``softplus<β>-…``      the inner energy with softplus_β instead of ReLU (θ̂ re-solved on it),
                         with the Hessian or the Gauss–Newton matrix;
* ``qn``                 the paper's two-loop recursion over the inner L-BFGS pairs;
* ``random``             a random direction (control: its rate should be ≈ 0).

Each direction d = −g/‖g‖ is scored by the **descent rate**
r(t) = [l(θ̂(x)) − l(θ̂(x + t·d))] / t of the true upper loss l = ‖θ* − θ‖², with the inner
problem re-solved on the target's own (ReLU) energy, warm-started from θ̂(x)
(:func:`datarecon.attacks.bilevel.diagnostics.descent_rate`), at several points x (a few
outer steps of the attack from uniform-noise and partition starts) and step lengths t.

    python benchmarks/bench_bilevel_relu.py --quick    # width 32, n = 10
    python benchmarks/bench_bilevel_relu.py            # width 256, n = 40 (the small preset's target)

Writes benchmarks/results/bilevel_relu[_quick].json; exits non-zero on error.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import base_parser, results_path, write_results

from datarecon.attacks.bilevel import BilevelAttack, BilevelConfig, lbfgs_minimize, make_energy
from datarecon.attacks.bilevel.diagnostics import descent_rate, unit_descent_direction
from datarecon.attacks.bilevel.hypergrad import HypergradientSettings, hypergradient
from datarecon.attacks.bilevel.linear_solve import SolveOptions
from datarecon.attacks.bilevel.problem import INNER_ACTIVATIONS, value_and_grad

#: name -> (strategy, curvature, damping, inner activation, softplus β)
TREATMENTS: dict[str, tuple[str, str, float, str, float]] = {
    "hessian": ("cg", "hessian", 0.0, "target", 0.0),
    "damped-0.01": ("cg", "hessian", 0.01, "target", 0.0),
    "damped-0.1": ("cg", "hessian", 0.1, "target", 0.0),
    "damped-1": ("cg", "hessian", 1.0, "target", 0.0),
    "gauss-newton": ("cg", "gauss-newton", 0.0, "target", 0.0),
    "softplus20-hessian": ("cg", "hessian", 0.0, "softplus", 20.0),
    "softplus20-gauss-newton": ("cg", "gauss-newton", 0.0, "softplus", 20.0),
    "softplus5-gauss-newton": ("cg", "gauss-newton", 0.0, "softplus", 5.0),
    "qn": ("qn", "hessian", 0.0, "target", 0.0),
}


def train(out: Path, *, width: int, n_per_class: int, epochs: int, data_dir) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    cfg = TrainConfig(data=DataSpec(dataset="cifar10", task="vehicles-animals", n_per_class=n_per_class,
                                    normalisation="unit-minus-mean", n_partition_per_class=n_per_class),
                      arch=ArchConfig(name="one-hidden", hidden=(width,)), loss="logistic", weight_decay=1e-2,
                      optimizer="lbfgs", lr=1.0, epochs=epochs, dtype="float64")
    train_target(cfg, data_dir=data_dir, out=out, progress=False)
    return out


def measure(args) -> dict:
    from datarecon.experiments.reconstruct import build_run, prepare

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        mdir = train(Path(tmp) / "model", width=args.width, n_per_class=args.n_per_class, epochs=args.train_epochs,
                     data_dir=args.data_dir)
        train_s = time.perf_counter() - t0
        points = []
        for init in args.inits.split(","):
            setup = prepare(build_run({"model": str(mdir), "init": {"name": init}, "seed": args.seed}), data_dir=args.data_dir)
            points.append((init, setup))
        rows = []
        for init, setup in points:
            target, prior, x0 = setup.target, setup.prior, setup.x0
            # walk a few outer steps with the former reproduction setting, so the points are where an
            # attack actually is, not only at its start
            walker = BilevelAttack(BilevelConfig(lr_x=10.0, curvature="hessian", damping=1.0, hessian="cg",
                                                 inner_tol=1e-5, inner_max_iter=args.inner_iters,
                                                 inner_max_iter_first=args.inner_first, solve_max_iter=50))
            state = walker.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(args.seed))
            pr = walker.problem(target, prior)
            for k in range(args.points):
                for i in range(args.walk):
                    walker.step(target, prior, state, k * args.walk + i)
                rows.append(score_point(args, init, k * args.walk + args.walk, target, pr, state))
                print_row(rows[-1])
    return {"train_s": train_s, "rows": rows}


def score_point(args, init, step, target, pr, state) -> dict:
    x = state["x"]
    theta_star = pr.theta_star
    true_fun = pr.target_energy

    def resolve(xx, th):
        return lbfgs_minimize(value_and_grad(true_fun, xx), th, tol=1e-10, max_iter=args.resolve_iters,
                              history=10).theta

    def upper(th):
        return float(((th - theta_star) ** 2).sum())

    base = lbfgs_minimize(value_and_grad(true_fun, x), state["theta"], tol=1e-10, max_iter=args.inner_iters,
                          history=10)
    theta = base.theta
    pairs = base.new_pairs[-10:]
    xnorm = float(x.norm())
    steps = [tau * xnorm for tau in args.taus]
    out = {"init": init, "outer_step": step, "inner_grad_norm": base.grad_norm, "upper": upper(theta),
           "x_norm": xnorm, "taus": list(args.taus), "treatments": {}}
    for name, (strategy, curvature, mu, act, beta) in TREATMENTS.items():
        t = time.perf_counter()
        energy, th = true_fun, theta
        if act != "target":
            model = INNER_ACTIVATIONS.get(act)(target.model, beta)
            energy = make_energy(model, pr.layout, true_fun.labels, loss=true_fun.loss,
                                 weight_decay=true_fun.weight_decay)
            th = lbfgs_minimize(value_and_grad(energy, x), theta, tol=1e-10, max_iter=args.inner_iters,
                                history=10).theta
        hg = hypergradient(energy, x, th, theta_star, pairs=pairs,
                           settings=HypergradientSettings(strategy=strategy, curvature=curvature, options=SolveOptions(
                               tol=1e-6, max_iter=args.cg_iters, damping=mu)))
        d = unit_descent_direction(hg.grad_x)
        r = descent_rate(resolve, upper, x, theta, d, steps=steps)
        out["treatments"][name] = {"rates": list(r.rates), "solve_residual": hg.solve.residual,
                                   "solve_converged": hg.solve.converged,
                                   "negative_curvature": hg.solve.negative_curvature, "hvps": hg.solve.hvps,
                                   "seconds": time.perf_counter() - t}
    g = torch.Generator().manual_seed(step + 17)
    d = unit_descent_direction(torch.randn(x.shape, generator=g, dtype=x.dtype))
    r = descent_rate(resolve, upper, x, theta, d, steps=steps)
    out["treatments"]["random"] = {"rates": list(r.rates)}
    return out


def print_row(row: dict) -> None:
    print(f"\n{row['init']} after {row['outer_step']} outer steps: l = {row['upper']:.4g}, "
          f"inner ‖∇E‖ = {row['inner_grad_norm']:.1e}")
    for name, tr in row["treatments"].items():
        extra = "" if "hvps" not in tr else (f"  res {tr['solve_residual']:.1e} {'neg.curv' if tr['negative_curvature'] else ''}"
                                             f" {tr['hvps']} HVPs")
        print(f"  {name:>24}: " + " ".join(f"{r:10.3e}" for r in tr["rates"]) + extra)


def summarise(rows: list[dict]) -> dict:
    """Per treatment: median over points of its rate ÷ the best treatment's rate at that point (per t)."""
    names = list(rows[0]["treatments"])
    n_t = len(rows[0]["taus"])
    out = {}
    for name in names:
        rel = [[] for _ in range(n_t)]
        wins = 0
        for row in rows:
            for j in range(n_t):
                best = max(tr["rates"][j] for nm, tr in row["treatments"].items() if nm != "random")
                if best > 0:
                    rel[j].append(row["treatments"][name]["rates"][j] / best)
            best_small = max(row["treatments"], key=lambda nm: row["treatments"][nm]["rates"][0])
            wins += best_small == name
        out[name] = {"median_rate_over_best": [statistics.median(r) if r else float("nan") for r in rel],
                     "min_rate_over_best": [min(r) if r else float("nan") for r in rel],
                     "wins_smallest_step": wins}
    return out


def main(argv=None) -> int:
    ap = base_parser(__doc__, quick_help="width 32, n = 10 (about a minute)", repeats_help="unused")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--n-per-class", type=int, default=None)
    ap.add_argument("--train-epochs", type=int, default=500)
    ap.add_argument("--inits", default="uniform,partition")
    ap.add_argument("--points", type=int, default=3, help="measurement points per init")
    ap.add_argument("--walk", type=int, default=5, help="outer steps between points")
    ap.add_argument("--taus", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2],
                    help="step lengths t as fractions of ‖x‖")
    ap.add_argument("--inner-iters", type=int, default=20)
    ap.add_argument("--inner-first", type=int, default=300)
    ap.add_argument("--resolve-iters", type=int, default=50)
    ap.add_argument("--cg-iters", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    args.width = args.width or (32 if args.quick else 256)
    args.n_per_class = args.n_per_class or (5 if args.quick else 20)
    torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    try:
        res = measure(args)
    except Exception as exc:  # noqa: BLE001 — report and fail
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary = summarise(res["rows"])
    print("\nrate ÷ best treatment's rate at the same point (median over points; per t/‖x‖ "
          f"{args.taus}), and points where it was best at the smallest t:")
    for name, s in summary.items():
        print(f"  {name:>24}: " + " ".join(f"{v:7.3f}" for v in s["median_rate_over_best"])
              + f"   wins {s['wins_smallest_step']}/{len(res['rows'])}")
    write_results(results_path("bilevel_relu", quick=args.quick, out=args.out), benchmark="bilevel_relu",
                  quick=args.quick, args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  wall_s=time.perf_counter() - t0, train_s=res["train_s"], rows=res["rows"], summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
