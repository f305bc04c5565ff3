"""Time of the subspace analysis of a first layer at Runkel's paper width (issue 24: ≤ 2 s on one core).

A float32 6144 × 3072 layer W = A X + s·E (X: n random "images", E: an i.i.d. initialisation of
std s) is analysed as :func:`datarecon.attacks.subspace.analyse` does it, for n in --n: from the
weights alone with n known (the top 2n + n/4 singular values and vectors by ``torch.svd_lowrank``),
from the weights alone with n unknown (the doubling search), and with θ_init and n known (W − W_init
= A X: the top n + n/4); a full ``torch.linalg.svd`` with vectors is timed for comparison.
Wall and CPU seconds of the process are recorded (on one thread the CPU time is the time on an
idle core, whatever else the machine runs).
Each timing is the median of --repeats runs in one process; the recovered rank is checked.

    python benchmarks/bench_subspace.py --threads 1
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch import nn

from _common import base_parser, machine, results_path, write_results


def layer(n: int, *, h: int, d: int, std: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    a = torch.randn(h, n, generator=g) / n ** 0.5
    ax[n] = a @ x
    return ax[n] + std * torch.randn(h, d, generator=g)


#: the planted change A X of the last layer() per n (the θ_init-known timing subtracts the rest)
ax: dict[int, torch.Tensor] = {}


def timed(fn, repeats: int, cpu: list[float] | None = None) -> tuple[float, object]:
    """Median wall seconds of ``repeats`` calls (and, appended to ``cpu``, the median CPU seconds of
    this process: on one thread the time on an idle core, whatever else the machine runs)."""
    times, cpus, out = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    if cpu is not None:
        cpu.append(statistics.median(cpus))
    return statistics.median(times), out


def main() -> None:
    ap = base_parser(__doc__, quick_help="n = 100 only, 1 repeat", repeats_help="repeats per timing (default 3)")
    ap.add_argument("--n", type=int, nargs="+", default=[100, 250, 500])
    ap.add_argument("--height", type=int, default=6144)
    ap.add_argument("--width", type=int, default=3072)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or 1)
    repeats = 1 if args.quick else (args.repeats or 3)
    ns = [100] if args.quick else args.n
    from datarecon.attacks.subspace import analyse

    h, d = args.height, args.width
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, h, bias=False), nn.ReLU(), nn.Linear(h, 1, bias=False))
    rows = []
    for n in ns:
        w = layer(n, h=h, d=d, std=1e-3)
        params = {"1.weight": w, "3.weight": torch.ones(1, h)}
        cpu: list[float] = []
        known, an = timed(lambda: analyse(model, params, n=n, generator=torch.Generator().manual_seed(0)), repeats,
                          cpu)
        unknown, an2 = timed(lambda: analyse(model, params, generator=torch.Generator().manual_seed(0)), repeats, cpu)
        init = {"1.weight": w - ax[n], "3.weight": params["3.weight"]}  # W − W_init = A X exactly
        with_init, an3 = timed(lambda: analyse(model, params, known_init=init, n=n,
                                               generator=torch.Generator().manual_seed(0)), repeats, cpu)
        rows.append({"n": n, "n_known_s": known, "n_unknown_s": unknown, "n_known_cpu_s": cpu[0],
                     "n_unknown_cpu_s": cpu[1], "init_known_s": with_init, "init_known_cpu_s": cpu[2],
                     "n_hat_init_known": an3.rank.n_hat, "k_init_known": an3.k, "k_known": an.k,
                     "n_hat_known": an.rank.n_hat,
                     "n_hat_unknown": an2.rank.n_hat, "searched_unknown": an2.rank.searched})
        print(f"n = {n}: n known {known:.2f} s wall, {cpu[0]:.2f} s CPU (n_hat {an.rank.n_hat}), n unknown "
              f"{unknown:.2f} s wall, {cpu[1]:.2f} s CPU (n_hat {an2.rank.n_hat}, {an2.rank.searched} values), "
              f"θ_init and n known {with_init:.2f} s wall, {cpu[2]:.2f} s CPU (k {an3.k})", flush=True)
    w = layer(ns[0], h=h, d=d, std=1e-3)
    full, _ = timed(lambda: torch.linalg.svd(w, full_matrices=False), 1)
    print(f"full SVD with vectors: {full:.2f} s")
    write_results(results_path("subspace", quick=args.quick, out=args.out), benchmark="subspace", quick=args.quick,
                  shape=[h, d], dtype="float32", rows=rows, full_svd_s=full, machine=machine(),
                  load_average_after=[round(v, 2) for v in os.getloadavg()], date=time.strftime("%Y-%m-%d"))


if __name__ == "__main__":
    main()
