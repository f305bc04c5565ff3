"""Does ``torch.compile`` speed up the KKT attack step? Cold-compile cost vs per-step saving.

Double backward through a compiled module is unsupported (torch 2.13 and 2.14.1; measured here, see
``checks.double_backward_through_compiled_module``), so the whole objective is written as ONE pure
function with torch.func and compiled as one graph::

    g(x, λ)   = torch.func.grad(θ ↦ (1/m) Σ out_i(Φ(x_i; θ), y_i, λ_i))(θ*)     (functional_call)
    L(x, λ)   = Σ_p ‖θ*_p − g_p‖² + w_box·box(x) + w_λ·hinge(λ)
    ∇L, L     = torch.func.grad_and_value(L, argnums=(x, λ))  →  torch.compile(fullgraph=True)

This is ``KKTConfig(compile=True)`` (``--compile``): :func:`datarecon.attacks.kkt_math.kkt_value_and_grad`
compiled by ``KKTAttack.compiled_value_and_grad``. The project's surrogate ReLU is a
``torch.autograd.Function``; inside torch.func + torch.compile it gives WRONG second derivatives
(measured here, see ``checks.autograd_function_surrogate_under_compile``), so the compiled path
uses the same surrogate in plain ops (:func:`datarecon.attacks.surrogate.plain_surrogate_relu`):
forward relu(z), derivative sigmoid(αz), second derivative α·σ(1−σ) — identical maths.

Checks (assert, exit non-zero on failure): the torch.func objective and its gradients w.r.t.
(x, λ), eager and compiled, match the project's eager ``KKTAttack.objective`` (plus the box prior) + autograd on a tiny
float64 net (binary and multiclass), and one compiled step equals one eager step.

Measures per case: cold compile (first step, empty inductor cache), warm-cache compile (after
``torch._dynamo.reset()``, as a second process would see it), then per-step time of
``KKTAttack.step`` eager vs ``compile=True`` (same metrics and optimiser update), interleaved
A,B,A,B in one process, medians; ratio and break-even steps = (first step − compiled step) / saving.
On a shared 2-core machine run with ``--threads 1``: with 2 threads and a busy neighbour the
eager step's many small kernels are slowed several-fold by thread contention.

Usage::

    python benchmarks/bench_compile.py            # quick case + D-1000-1000-1, m=1000 → results/compile.json
    python benchmarks/bench_compile.py --quick    # quick case only → results/compile_quick.json
"""

from __future__ import annotations

import os
import tempfile

# A fresh inductor cache so the first call measures a true cold compile (set before torch import).
_CACHE = None if "TORCHINDUCTOR_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="bench_compile_inductor_")
if _CACHE is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _CACHE

import shutil
import statistics
import sys
import time
import warnings

import torch
from _common import base_parser, results_path, write_results
from torch import nn


def _configure_inductor() -> int:
    import torch._inductor.config as icfg

    if (os.cpu_count() or 1) <= 4:
        icfg.compile_threads = 1
    return int(icfg.compile_threads)


# ----------------------------------------------------------------------------- paths

def compiled_attack(attack):
    """The same attack with ``compile=True`` (KKTConfig.compile → kkt_math.kkt_value_and_grad compiled)."""
    return type(attack)(attack.config.model_copy(update={"compile": True}))


def func_grads(attack, target, prior, x, lam, *, compiled: bool):
    """The torch.func objective (compiled or eager) at (x, λ): ((gx, gλ), (L, (R, box, hinge)))."""
    from datarecon.attacks import kkt_math
    from datarecon.attacks.surrogate import functional_surrogate

    if compiled:
        fn = compiled_attack(attack).compiled_value_and_grad(target)
    else:
        c = attack.config
        fn = kkt_math.kkt_value_and_grad(functional_surrogate(c.surrogate, target.model, alpha=c.alpha),
                                         objective=attack.kkt_objective(target))
    lo, hi = attack.bounds(prior, x.device)
    return fn(x, lam, attack.prepared(target).params, attack.labels(prior, x.device), lo, hi)


def eager_grads(attack, target, prior, x, lam):
    """The autograd path: KKTAttack.objective plus the box prior, then autograd.grad (the interface's default
    gradient of the same objective)."""
    from datarecon.attacks.priors import box_penalty

    x = x.detach().requires_grad_(True)
    lam = lam.detach().requires_grad_(True)
    terms = dict(attack.objective(target, prior, x, **{"lambda": lam}))
    terms["box"] = box_penalty(x, prior.lower, prior.upper)
    terms["loss"] = terms["loss"] + attack.config.box_weight * terms["box"]
    gx, gl = torch.autograd.grad(terms["loss"], [x, lam])
    return (gx, gl), {k: v.detach() for k, v in terms.items()}


# ----------------------------------------------------------------------------- setup

def build(case: dict, dtype: torch.dtype, *, lr_x: float = 1e-6):
    from datarecon.attacks.base import AttackerPrior, Target
    from datarecon.attacks.init import CandidateSpec, make_init
    from datarecon.attacks.kkt import KKTAttack, KKTConfig
    from datarecon.models.spec import ArchSpec, build_model, is_homogeneous

    k = case.get("k", 1)
    arch = ArchSpec(name="mlp", input_shape=case["input_shape"], hidden=case["hidden"], bias=case["bias"],
                    num_outputs=k)
    gen = torch.Generator().manual_seed(0)
    model = build_model(arch, generator=gen, dtype=dtype)
    params = {n: v.detach() for n, v in model.named_parameters()}
    target = Target(model=model, params=params, loss="logistic" if k == 1 else "cross-entropy", weight_decay=0.0,
                    input_shape=arch.input_shape, num_outputs=k, homogeneous=is_homogeneous(arch))
    m = case["m"]
    prior = AttackerPrior.balanced(m=m, num_outputs=k, input_shape=arch.input_shape, lower=-1.0, upper=1.0)
    # scale 0.5 so the surrogate's second derivative and the box prior both matter in the check
    x0 = make_init("gaussian", CandidateSpec(m=m, input_shape=arch.input_shape,
                                             dtype=dtype, device=torch.device("cpu")),
                   generator=gen, scale=case.get("init_scale", 1e-3))
    attack = KKTAttack(KKTConfig(steps=1, dtype="float64" if dtype == torch.float64 else "float32", lr_x=lr_x,
                                 lr_lambda=1e-4, formulation="auto"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = attack.init_state(target, prior, x0=x0, generator=gen)
    return attack, target, prior, state


def _maxrel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def check_tiny() -> dict:
    """torch.func objective (eager and compiled) == project eager path, float64, tiny nets."""
    out = {}
    for name, k in (("binary", 1), ("multiclass", 3)):
        case = dict(input_shape=(1, 4, 4), hidden=(20,), bias=False, m=6, k=k, init_scale=0.5)
        attack, target, prior, state = build(case, torch.float64, lr_x=0.1)
        (ex, el), eterms = eager_grads(attack, target, prior, state["x"], state["lambda"])
        row = {}
        for label, compiled in (("func_eager", False), ("func_compiled", True)):
            t0 = time.perf_counter()
            (gx, gl), (loss, (res, box, hinge)) = func_grads(attack, target, prior, state["x"], state["lambda"],
                                                             compiled=compiled)
            if compiled and "process_first_compile_s" not in out:  # includes importing inductor
                out["process_first_compile_s"] = time.perf_counter() - t0
            torch.testing.assert_close(loss, eterms["loss"], rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(res, eterms["residual"], rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(box, eterms["box"], rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(hinge, eterms["lambda_hinge"], rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(gx, ex, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(gl, el, rtol=1e-9, atol=1e-12)
            row[label] = {"grad_x_maxrel": _maxrel(gx, ex), "grad_lambda_maxrel": _maxrel(gl, el)}
            if compiled:  # one full step: same optimiser update
                s_e = {kk: v.clone() for kk, v in state.items()}
                s_c = {kk: v.clone() for kk, v in state.items()}
                me = attack.step(target, prior, s_e, 0)
                mc = compiled_attack(attack).step(target, prior, s_c, 0)
                for kk in s_e:
                    torch.testing.assert_close(s_c[kk], s_e[kk], rtol=1e-9, atol=1e-14)
                assert abs(mc["loss"] - me["loss"]) <= 1e-10 * abs(me["loss"])
        out[name] = row
        print(f"check tiny float64 {name}: compiled grad max rel diff x {row['func_compiled']['grad_x_maxrel']:.1e}, "
              f"lambda {row['func_compiled']['grad_lambda_maxrel']:.1e}  OK", flush=True)
    out["autograd_function_surrogate_under_compile"] = check_autograd_function_surrogate()
    out["double_backward_through_compiled_module"] = check_double_backward_through_compiled_module()
    return out


def check_double_backward_through_compiled_module() -> dict:
    """Evidence: create_graph=True backward through a ``torch.compile``d module, then a second backward.

    The reason the compiled path is one torch.func function instead of a compiled model inside the
    eager residual. ``{"supported": True, "grad_x_maxrel": ...}`` when the second derivative runs
    (compared with the eager module's), else the error.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 20, bias=False), nn.Tanh(), nn.Linear(20, 1, bias=False)).double()
    x = torch.randn(6, 16, dtype=torch.float64)

    def second(net) -> torch.Tensor:
        xr = x.clone().requires_grad_(True)
        g = torch.autograd.grad(net(xr).sum(), list(model.parameters()), create_graph=True)
        return torch.autograd.grad(sum((gi ** 2).sum() for gi in g), xr)[0]

    eager = second(model)
    torch._dynamo.reset()
    try:
        res = {"supported": True, "grad_x_maxrel": _maxrel(second(torch.compile(model)), eager)}
    except Exception as exc:  # noqa: BLE001 - evidence only
        res = {"supported": False, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
    print(f"evidence: double backward through a compiled module: {res}", flush=True)
    return res


def check_autograd_function_surrogate() -> dict:
    """Evidence: the project's autograd.Function surrogate (with setup_context) under torch.func + compile."""
    from torch.func import functional_call, grad, grad_and_value

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(z, alpha):
            return z.clamp_min(0)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.alpha = inputs[1]

        @staticmethod
        def backward(ctx, gr):
            (z,) = ctx.saved_tensors
            return gr * torch.sigmoid(ctx.alpha * z), None

    class _Mod(nn.Module):
        def forward(self, z):
            return _Fn.apply(z, 20.0)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 20, bias=False), _Mod(), nn.Linear(20, 1, bias=False)).double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    x = 0.5 * torch.randn(6, 1, 4, 4, dtype=torch.float64)
    lam = torch.rand(6, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64)

    def objective(x, lam):
        g = grad(lambda p: (lam * y * functional_call(model, p, (x,))[:, 0]).sum() / 6)(params)
        return sum(((params[k] - g[k]) ** 2).sum() for k in params)

    vg = grad_and_value(objective, argnums=(0, 1))
    (ex, el), _ = vg(x, lam)
    try:
        (cx, cl), _ = torch.compile(vg, fullgraph=True)(x, lam)
        res = {"compiled": True, "grad_x_maxrel": _maxrel(cx, ex), "grad_lambda_maxrel": _maxrel(cl, el)}
    except Exception as exc:  # noqa: BLE001 - evidence only
        res = {"compiled": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    print(f"evidence: autograd.Function surrogate under torch.func+compile: {res}", flush=True)
    return res


# ----------------------------------------------------------------------------- timing

def _cases(quick: bool) -> list[dict]:
    cases = [dict(name="mlp-3x8x8-64-64-1", input_shape=(3, 8, 8), hidden=(64, 64), bias=False, m=64,
                  dtypes=(torch.float32, torch.float64))]
    if not quick:
        cases.append(dict(name="mlp-3x32x32-1000-1000-1", input_shape=(3, 32, 32), hidden=(1000, 1000), bias=False,
                          m=1000, dtypes=(torch.float32, torch.float64)))
    return cases


def bench_case(case: dict, dtype: torch.dtype, *, repeats: int) -> dict:
    attack, target, prior, state = build(case, dtype)
    s_eager = {k: v.clone() for k, v in state.items()}
    s_comp = {k: v.clone() for k, v in state.items()}

    torch._dynamo.reset()
    comp = compiled_attack(attack)
    t0 = time.perf_counter()
    comp.step(target, prior, s_comp, 0)
    cold = time.perf_counter() - t0
    # warm-cache compile: a new process with the same shapes reuses the on-disk inductor cache
    torch._dynamo.reset()
    comp = compiled_attack(attack)
    t0 = time.perf_counter()
    comp.step(target, prior, s_comp, 0)
    warm_cache = time.perf_counter() - t0

    # agreement at this size and dtype (compiled vs eager gradients)
    (ex, el), _ = eager_grads(attack, target, prior, state["x"], state["lambda"])
    lo, hi = attack.bounds(prior, state["x"].device)
    (cx, cl), _ = comp.compiled_value_and_grad(target)(state["x"], state["lambda"], attack.prepared(target).params,
                                                       attack.labels(prior, state["x"].device), lo, hi)
    agree = {"grad_x_maxrel": _maxrel(cx, ex), "grad_lambda_maxrel": _maxrel(cl, el)}

    def eager():
        attack.step(target, prior, s_eager, 0)

    def compiled():
        comp.step(target, prior, s_comp, 0)

    eager()
    compiled()
    te, tc = [], []
    for _ in range(repeats):  # interleaved A, B, A, B
        t0 = time.perf_counter()
        eager()
        te.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compiled()
        tc.append(time.perf_counter() - t0)
    me, mc = statistics.median(te), statistics.median(tc)
    saving = me - mc
    overhead = cold - mc
    row = {"case": case["name"], "dtype": str(dtype).replace("torch.", ""), "m": case["m"],
           "input_shape": list(case["input_shape"]), "hidden": list(case["hidden"]),
           "num_parameters": sum(p.numel() for p in target.params.values()), "repeats": repeats,
           "cold_compile_first_call_s": cold, "warm_cache_compile_first_call_s": warm_cache,
           "eager_step_s": {"median": me, "min": min(te), "all": te},
           "compiled_step_s": {"median": mc, "min": min(tc), "all": tc},
           "speedup_eager_over_compiled": me / mc, "saving_per_step_s": saving,
           "break_even_steps_cold": (overhead / saving) if saving > 0 else None,
           "break_even_steps_warm_cache": ((warm_cache - mc) / saving) if saving > 0 else None,
           "agreement_vs_eager": agree}
    be = row["break_even_steps_cold"]
    print(f"{row['case']:>26} {row['dtype']:>7}: cold compile {cold:.1f} s (warm cache {warm_cache:.1f} s); "
          f"eager {me * 1e3:.1f} ms/step, compiled {mc * 1e3:.1f} ms/step, eager/compiled {me / mc:.2f}x; "
          f"break-even {'never' if be is None else f'{be:.0f} steps'}; "
          f"grad max rel diff x {agree['grad_x_maxrel']:.1e} lambda {agree['grad_lambda_maxrel']:.1e}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = base_parser(__doc__, quick_help="only the small case (about a minute)",
                     repeats_help="interleaved timed pairs (default 20, full case 5)")
    args = ap.parse_args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        compile_threads = _configure_inductor()
        out = results_path("compile", quick=args.quick, out=args.out)
        checks = check_tiny()
        rows = []
        for case in _cases(args.quick):
            big = case["m"] >= 1000
            repeats = args.repeats or (5 if big else 20)
            for dtype in case["dtypes"]:
                rows.append(bench_case(case, dtype, repeats=repeats))
        write_results(out, benchmark="compile", quick=args.quick, inductor_compile_threads=compile_threads,
                      cpu_count=os.cpu_count(), checks=checks, results=rows)
    except Exception as exc:  # exit non-zero with a one-line reason
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if _CACHE is not None:
            shutil.rmtree(_CACHE, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
