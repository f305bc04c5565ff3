"""Cost of one KKT attack step relative to one plain forward+backward of the same model and batch.

One attack step = the create-graph VJP g = ∇_θ[(1/m)Σ λ_i y_i Φ(x_i)] + the backward of
‖θ* − g‖² (+ priors) to x and λ + the optimiser update (KKTAttack.step). The plain pass is
the logistic training loss on the same batch, backward to θ. The two are timed interleaved
(plain, step, plain, step, ...) so that load changes on a shared machine hit both. Memory: the bytes
autograd saves for backward in each (all devices) and, on CUDA, the peak allocation. METHODS.md §7 measured ≈ 0.36–0.5 s
(float32) and ≈ 0.72 s (float64) per step on 2 cores for D-1000-1000-1, m = 1000.

Usage::

    python benchmarks/bench_attack_step.py            # full sizes → benchmarks/results/attack_step.json
    python benchmarks/bench_attack_step.py --quick    # small sizes → benchmarks/results/attack_step_quick.json

Exits non-zero on any error.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from _common import base_parser, results_path, write_results


def _cases(quick: bool) -> list[dict]:
    if quick:
        return [dict(name="mlp-quick", arch="mlp", input_shape=(3, 8, 8), hidden=(64, 64), m=64, bias=False),
                dict(name="one-hidden-quick", arch="one-hidden", input_shape=(3, 8, 8), hidden=(256,), m=64,
                     bias=True)]
    return [dict(name="mlp-1000-1000", arch="mlp", input_shape=(3, 32, 32), hidden=(1000, 1000), m=1000, bias=False),
            dict(name="one-hidden-6144", arch="one-hidden", input_shape=(3, 32, 32), hidden=(6144,), m=1000,
                 bias=True)]


def bench_case(case: dict, *, dtype: torch.dtype, device: torch.device, repeats: int) -> dict:
    import warnings

    from datarecon.attacks.base import AttackerPrior, Target
    from datarecon.attacks.init import CandidateSpec, make_init
    from datarecon.attacks.kkt import KKTAttack, KKTConfig
    from datarecon.models.spec import ArchSpec, build_model, is_homogeneous
    from datarecon.kernel.losses import energy

    arch = ArchSpec(name=case["arch"], input_shape=case["input_shape"], hidden=case["hidden"], bias=case["bias"])
    gen = torch.Generator().manual_seed(0)
    model = build_model(arch, generator=gen, dtype=dtype).to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    target = Target(model=model, params=params, loss="logistic", weight_decay=0.0, input_shape=arch.input_shape,
                    num_outputs=1, homogeneous=is_homogeneous(arch))
    m = case["m"]
    prior = AttackerPrior.balanced(m=m, num_outputs=1, input_shape=arch.input_shape, lower=-1.0, upper=1.0)
    x0 = make_init("gaussian", CandidateSpec(m=m, input_shape=arch.input_shape, dtype=dtype, device=device),
                   generator=gen, scale=1e-3)
    attack = KKTAttack(KKTConfig(steps=1, dtype="float64" if dtype == torch.float64 else "float32", lr_x=1e-6,
                                 lr_lambda=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = attack.init_state(target, prior, x0=x0, generator=gen)
    labels = prior.labels.to(device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def plain():
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.requires_grad_(True)
        e = energy(model(x0), labels, dict(model.named_parameters()), loss="logistic", weight_decay=0.0)
        e.backward()
        sync()

    def step():
        attack.step(target, prior, state, 0)
        sync()

    t_plain, t_step, ratios = _time_interleaved(plain, step, repeats=repeats)
    matmuls = {"plain_fwd_bwd": _matmul_time(plain, repeats=3), "attack_step": _matmul_time(step, repeats=3)}
    matmuls["ratio"] = matmuls["attack_step"]["s"] / matmuls["plain_fwd_bwd"]["s"]
    mem_plain, mem_step = _saved_bytes(plain), _saved_bytes(step)
    peak = {}
    if device.type == "cuda":
        for name, fn in (("plain_fwd_bwd", plain), ("attack_step", step)):
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            fn()
            peak[name] = torch.cuda.max_memory_allocated(device) - base
    return {"case": case["name"], "dtype": str(dtype).replace("torch.", ""), "device": str(device), "m": m,
            "input_shape": list(case["input_shape"]), "hidden": list(case["hidden"]),
            "num_parameters": sum(p.numel() for p in params.values()), "plain_fwd_bwd": t_plain, "attack_step": t_step,
            "ratio": t_step["median_s"] / t_plain["median_s"], "ratio_pairs_median": statistics.median(ratios),
            "saved_for_backward_bytes": {"plain_fwd_bwd": mem_plain, "attack_step": mem_step},
            "matmuls": matmuls,
            "cuda_peak_extra_bytes": peak or None}


def _time_interleaved(a, b, *, repeats: int) -> tuple[dict, dict, list[float]]:
    """Time a and b alternately (a, b, a, b, ...) so that load changes hit both; per-pair ratios b/a."""
    a(), b()  # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        for fn, acc in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    summary = [{"median_s": statistics.median(t), "min_s": min(t), "repeats": repeats} for t in (ta, tb)]
    return summary[0], summary[1], [y / x for x, y in zip(ta, tb)]


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")  # the kernels (aten::matmul only dispatches)


def _matmul_time(fn, *, repeats: int) -> dict:
    """Matrix-multiply calls and their self time per call of ``fn`` (torch.profiler, CPU ops).

    The ratio of these between the attack step and the plain pass is the matmul floor of the step:
    what it would cost if all other work were free.
    """
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(repeats):
            fn()
    calls, us = 0, 0.0
    for ev in prof.key_averages():
        if ev.key in MATMUL_OPS:
            calls += ev.count
            us += max(ev.self_cpu_time_total, getattr(ev, "self_device_time_total", 0.0) or 0.0)
    return {"calls": calls // repeats, "s": us * 1e-6 / repeats}


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn`` runs (forward, create-graph VJP
    and double backward): the memory an attack step holds beyond its inputs, on any device. Views of
    one storage are counted once."""
    seen: dict[int, int] = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except RuntimeError:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return int(sum(seen.values()))


def main(argv: list[str] | None = None) -> int:
    ap = base_parser(__doc__, quick_help="small sizes (seconds)",
                     repeats_help="timed repeats per measurement (default 3, quick 5)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        device = torch.device(args.device)
        repeats = args.repeats or (5 if args.quick else 3)
        out = results_path("attack_step", quick=args.quick, out=args.out)
        rows = []
        for case in _cases(args.quick):
            for dtype in (torch.float32, torch.float64):
                r = bench_case(case, dtype=dtype, device=device, repeats=repeats)
                rows.append(r)
                mem = r["saved_for_backward_bytes"]
                print(f"{r['case']:>18} {r['dtype']:>7}: attack step {r['attack_step']['median_s']:.4f} s, "
                      f"plain fwd+bwd {r['plain_fwd_bwd']['median_s']:.4f} s, ratio {r['ratio']:.2f}x "
                      f"(median of interleaved pairs {r['ratio_pairs_median']:.2f}x); saved for backward "
                      f"{mem['attack_step'] / 2**20:.1f} MiB vs {mem['plain_fwd_bwd'] / 2**20:.1f} MiB", flush=True)
                mm = r["matmuls"]
                print(f"{'':>26} matmuls alone: step {mm['attack_step']['calls']} calls {mm['attack_step']['s']:.4f} s, "
                      f"plain {mm['plain_fwd_bwd']['calls']} calls {mm['plain_fwd_bwd']['s']:.4f} s, "
                      f"ratio {mm['ratio']:.2f}x", flush=True)
        write_results(out, benchmark="attack_step", quick=args.quick, results=rows)
    except Exception as exc:  # exit non-zero with a one-line reason
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
