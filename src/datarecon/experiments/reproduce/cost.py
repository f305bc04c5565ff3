"""Wall-time estimates of reproduction pieces, for ``datarecon reproduce ... --dry-run``.

A piece's work is counted in **passes**: one forward + backward of the target over the m inputs
it works on, 6·m·MACs FLOPs (2 forward, 4 backward; MACs = multiply-accumulates of one input,
:func:`macs_per_input`). A pass takes ``flops / device.flops + device.pass_overhead_s`` seconds.
The bilevel attack also streams P-vectors through its L-BFGS two-loop recursions and vector
updates: memory-bound work, ``bytes / device.bandwidth``.

* Training (full batch): ``epochs × TRAIN_PASSES_PER_EPOCH[optimizer]`` passes over the n images.
* KKT family (DecoReco): ``steps × KKT_PASSES_PER_STEP`` passes over the m candidates (the
  create-graph vector-Jacobian product and its backward, measured in docs/PERFORMANCE.md §2).
* Bilevel (Runkel update 7): the first inner solve, then per outer step the line-search trials'
  inner solves, the linear solve's Hessian-vector products, the shared graph and the mixed
  product (:func:`bilevel_step_work`), counted from the config's caps and the per-step counts
  measured on the medium rung (:data:`BILEVEL_COUNTS`).

Device speeds (:data:`DEVICES`): ``cpu`` is measured per CPU second of one thread, so a CPU
estimate is the CPU time of a one-thread run (its wall time on a machine shared with other jobs
is longer by the share of a core it gets: docs/PERFORMANCE.md §6); ``cuda`` is calibrated on
GPU measurements of training and KKT steps at D-1000-1000-1 (docs/PERFORMANCE.md §6), while its
vector bandwidth, used only by bilevel pieces, is assumed. :func:`device_note` says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from datarecon.attacks.bilevel.config import BilevelConfig
from datarecon.experiments.pipeline.memory import (  # noqa: F401 (cost's own vocabulary)
    PROCESS_BASE_BYTES,
    RSS_PER_TENSOR_BYTE,
    format_bytes,
    resident_bytes,
)
from datarecon.models.spec import ArchSpec, count_parameters
from datarecon.registry import Registry
from datarecon.training.target import ArchConfig

#: CIFAR-10 input shape of the runkel2024 targets.
CIFAR_SHAPE = (3, 32, 32)
#: input shape of each dataset's images (for the haim2022 pieces).
INPUT_SHAPES = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28), "digits": (1, 8, 8)}
ITEMSIZE = {"float32": 4, "float64": 8}


@dataclass(frozen=True)
class Device:
    """Speeds of one device kind.

    Attributes:
        flops: sustained FLOP/s of a pass, per dtype (``{"float32": ..., "float64": ...}``).
        bandwidth: bytes/s of large vector operations (read + write).
        pass_overhead_s: fixed seconds per pass (kernel launches, Python).
        measured: True when the figures were measured on such a device.
        source: where the figures come from (printed by the dry run).
    """

    flops: dict[str, float]
    bandwidth: float
    pass_overhead_s: float
    measured: bool
    source: str


DEVICES: Registry[Device] = Registry("estimate device")
DEVICES.register("cpu", Device(
    flops={"float64": 4.5e10, "float32": 9.0e10}, bandwidth=2.8e10, pass_overhead_s=2e-4, measured=True,
    source="measured per CPU second of one thread (time.process_time, so machine load does not enter; wall "
           "time on a shared machine is longer by the share of a core the run gets): forward+backward 45 GFLOP/s "
           "float64 (33-47 measured), 90 GFLOP/s float32 (90-94), vector updates 28 GB/s (26-29) "
           "(benchmarks/bench_bilevel_cost.py, docs/PERFORMANCE.md §6)"))
DEVICES.register("cuda", Device(
    flops={"float64": 1.84e13, "float32": 2.43e13}, bandwidth=1.5e12, pass_overhead_s=1.36e-4, measured=True,
    source="CALIBRATED on H100 measurements (2026-11-23, torch 2.11, D-1000-1000-1): "
           "full-batch training n = 500 float64 1.68 ms/epoch, KKT step m = 1000 3.2 ms float32 / 4.1 ms "
           "float64 (solved for FLOP/s and per-pass overhead with TRAIN_PASSES_PER_EPOCH and KKT_PASSES_PER_STEP); the 1.5 TB/s of vector updates is ASSUMED "
           "(bilevel pieces), no bilevel step was measured on a GPU"))


def device_kind(device: str) -> str:
    """``"cpu"`` or ``"cuda"`` for a torch device name (``"cuda:1"`` -> ``"cuda"``)."""
    return device.split(":", 1)[0]


def device_note(device: str) -> str:
    """One line naming where the estimates for ``device`` come from (measured or assumed)."""
    kind = device_kind(device)
    if kind not in DEVICES:
        return f"no speed figures for device {device!r}: no estimates (known: {', '.join(DEVICES.names())})"
    return f"estimates on {kind}: {DEVICES.get(kind).source}"


def _spec(arch: ArchConfig, input_shape: tuple[int, ...], num_outputs: int) -> ArchSpec:
    return ArchSpec(name=arch.name, input_shape=tuple(input_shape), num_outputs=num_outputs, hidden=arch.hidden,
                    bias=arch.bias, init_scale=arch.init_scale)


def macs_per_input(arch: ArchConfig, *, input_shape: tuple[int, ...] = CIFAR_SHAPE, num_outputs: int = 1) -> int:
    """Multiply-accumulates of one forward pass of one input through the MLP-family ``arch``."""
    spec = _spec(arch, input_shape, num_outputs)
    widths = [spec.input_dim, *spec.resolved_hidden(), num_outputs]
    return sum(a * b for a, b in zip(widths, widths[1:]))


def num_parameters(arch: ArchConfig, *, input_shape: tuple[int, ...] = CIFAR_SHAPE, num_outputs: int = 1) -> int:
    """P, the parameter count of ``arch`` (``datarecon.models.spec.count_parameters``)."""
    return count_parameters(_spec(arch, input_shape, num_outputs))


def pass_seconds(device: str, *, flops: float, dtype: str) -> float:
    """Seconds of one pass of ``flops`` FLOPs on ``device``."""
    d = DEVICES.get(device_kind(device))
    return flops / d.flops[dtype] + d.pass_overhead_s


# --------------------------------------------------------------------------- counts

#: Passes per training epoch, measured as epoch time ÷ plain forward+backward time, interleaved
#: (``benchmarks/bench_bilevel_cost.py --quick``: one-hidden width 1024, n = 100, float64, one thread;
#: 2026-11-23): gd 2.1 (the gradient and the epoch's metrics), lbfgs 9.9 (torch.optim.LBFGS, one
#: iteration per epoch: its strong-Wolfe evaluations and a two-loop recursion over 20 pairs).
TRAIN_PASSES_PER_EPOCH = {"gd": 2.1, "lbfgs": 9.9}
#: Passes per KKT-family step (docs/PERFORMANCE.md §2: step / plain forward+backward 2.77-2.96).
KKT_PASSES_PER_STEP = 2.8
#: Wall time of K batched KKT-family runs ÷ the same K runs one after the other, on CPU (one thread;
#: ``benchmarks/bench_batched_runs.py``, docs/PERFORMANCE.md §6.1: 1.25 at D-1000-1000-1, m = 100, K = 25,
#: on 2026-11-27 once θ* − g was computed once per step (1.51 before); 1.13-1.32 at the other sizes).
BATCHED_OVER_LOOPED_CPU = 1.25
#: Per batched step on cuda: the group's one optimiser update on its stacked state, its finiteness
#: check and the runs' metrics, in units of the per-pass overhead (~10 small kernels and three host
#: syncs ≈ one pass's launches; ASSUMED).
BATCH_COMMIT_PASSES = 1.0


@dataclass(frozen=True)
class BilevelCounts:
    """Per-outer-step counts of the bilevel attack that its config does not fix (measured).

    Attributes:
        trials: line-search trials (each an inner solve) per outer step (problem-derived step).
        evals_per_iteration: energy evaluations per inner L-BFGS iteration (strong-Wolfe search).
        iterations_per_solve: inner iterations per warm-started solve (at most ``inner_max_iter``);
            None: the cap.
        first_iterations: iterations of the first solve from θ⁰; None: ``inner_max_iter_first``.
        hvps: Hessian-vector products per linear solve (warm-started CG, residual check included).
    """

    trials: float
    evals_per_iteration: float
    iterations_per_solve: float | None
    first_iterations: float | None
    hvps: float


#: Measured on the medium rung (2026-11-23, ``out/medium-runkel``: totals of ``run.json`` over the
#: 28 affine runs, 3 100 outer steps, and the 3 one-hidden runs, 240 steps; docs/PERFORMANCE.md §6).
#: "smooth" = the affine target: 4.4 trials per step (the landscape's ground-truth-like points sit at
#: the floor of l, where all 8 trials are spent and rejected), 3.6 iterations per warm-started solve,
#: first solve from θ⁰ 32–68 iterations; "kinked" = the one-hidden ReLU target (width 1024, n = 100):
#: 1.03 trials per step, 7.9 HVPs per step, and solves that run to their cap (the energy stalls on
#: kinks: 8.4 of 10 iterations on average, 20 of 20 in a 6-step calibration with cap 20).
BILEVEL_COUNTS: dict[str, BilevelCounts] = {
    "smooth": BilevelCounts(trials=4.4, evals_per_iteration=1.1, iterations_per_solve=3.6, first_iterations=55.0,
                            hvps=15.5),
    "kinked": BilevelCounts(trials=1.03, evals_per_iteration=1.2, iterations_per_solve=None, first_iterations=None,
                            hvps=7.9),
}
#: P-vector updates per inner iteration besides the two-loop recursion, and per HVP of CG.
VECTOR_OPS_PER_ITERATION = 10
VECTOR_OPS_PER_HVP = 4


@dataclass(frozen=True)
class Work:
    """Work of a piece or step: passes of the target, and P-vector operations (memory-bound)."""

    passes: float
    vector_ops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.passes + other.passes, self.vector_ops + other.vector_ops)

    def scaled(self, k: float) -> Work:
        return Work(k * self.passes, k * self.vector_ops)


def _inner_work(iterations: float, counts: BilevelCounts, history: int) -> Work:
    """One inner L-BFGS solve of ``iterations`` iterations: the evaluation at its start, those of its
    line searches, and its vector operations (a two-loop recursion ≈ 10 vector operations per stored
    pair, ``benchmarks/bench_bilevel_cost.py``)."""
    return Work(1.0 + iterations * counts.evals_per_iteration,
                iterations * (10 * history + VECTOR_OPS_PER_ITERATION))


def bilevel_first_work(cfg: BilevelConfig, *, kinks: bool) -> Work:
    """Work of the first inner solve from θ⁰."""
    counts = BILEVEL_COUNTS["kinked" if kinks else "smooth"]
    it = cfg.inner_max_iter_first if counts.first_iterations is None else min(counts.first_iterations,
                                                                              cfg.inner_max_iter_first)
    return _inner_work(it, counts, cfg.lbfgs_history)


def bilevel_step_work(cfg: BilevelConfig, *, kinks: bool) -> Work:
    """Work of one outer step: inner solves (one per line-search trial; one per step with a fixed
    ``lr_x``), the linear solve's HVPs, the shared create-graph gradient and the mixed product."""
    counts = BILEVEL_COUNTS["kinked" if kinks else "smooth"]
    it = cfg.inner_max_iter if counts.iterations_per_solve is None else min(counts.iterations_per_solve,
                                                                            cfg.inner_max_iter)
    solves = counts.trials if cfg.lr_x is None else 1.0
    hvps = min(counts.hvps, cfg.solve_max_iter + 2.0) if cfg.hessian in ("cg", "pcg") else counts.hvps
    return _inner_work(it, counts, cfg.lbfgs_history).scaled(solves) + Work(hvps + 2.0, VECTOR_OPS_PER_HVP * hvps)


def work_seconds(work: Work, *, device: str, flops_per_pass: float, vector_bytes: float, dtype: str) -> float:
    """Seconds of ``work`` on ``device``: passes of ``flops_per_pass`` FLOPs, vector operations of
    ``vector_bytes`` bytes each."""
    d = DEVICES.get(device_kind(device))
    return work.passes * pass_seconds(device, flops=flops_per_pass, dtype=dtype) + \
        work.vector_ops * vector_bytes / d.bandwidth


# --------------------------------------------------------------------------- per piece

Estimate = Callable[[str], float | None]


def _known(device: str) -> bool:
    return device_kind(device) in DEVICES


# --------------------------------------------------------------------------- memory
#
# Peak tensor memory of a piece, in bytes: P-vectors (weights, gradients, optimiser state), the
# inputs, and the activations autograd keeps. A lower bound of the process's resident size: Python,
# torch and the data files add a few hundred MB, and the allocator keeps freed blocks.

#: P-vectors a training step holds per optimiser: gd θ, gradient, momentum; lbfgs θ, gradient, the
#: direction and 2 × 20 curvature pairs (training.optim.LBFGS, history 20).
TRAIN_P_VECTORS = {"gd": 3, "lbfgs": 3 + 2 * 20}
#: Activation copies of the hidden units per input kept by one training step (forward values and
#: ReLU masks for the backward).
TRAIN_ACTIVATION_COPIES = 3
#: Activation copies per candidate and hidden unit kept by one KKT-family step (create-graph VJP and
#: its backward): 7-8 measured, "saved for backward" beyond the inputs, D-1000-1000-1 and
#: one-hidden-6144 at m = 1000 (docs/PERFORMANCE.md §2: 65 MiB and 201 MiB in float32).
KKT_ACTIVATION_COPIES = 8
#: P-vectors of a KKT-family run: θ*, g, ∂L/∂g and the surrogate's copy of θ*.
KKT_P_VECTORS = 4
#: Input-sized tensors of a KKT-family run per candidate: x, its momentum, its gradient, the box term.
KKT_INPUT_COPIES = 4
#: P-vectors of a bilevel run besides its 2 × history curvature pairs: θ*, θ, gradients, the CG
#: vectors and the hypergradient's mixed product (attacks/bilevel).
BILEVEL_P_VECTORS = 10


def _hidden_units(arch: ArchConfig, input_shape: tuple[int, ...], num_outputs: int) -> int:
    spec = _spec(arch, input_shape, num_outputs)
    return sum(spec.resolved_hidden()) + num_outputs


def _input_dim(input_shape: tuple[int, ...]) -> int:
    d = 1
    for v in input_shape:
        d *= int(v)
    return d


def training_bytes(arch: ArchConfig, *, n: int, optimizer: str, dtype: str,
                   input_shape: tuple[int, ...] = CIFAR_SHAPE, num_outputs: int = 1) -> int:
    """Peak tensor bytes of full-batch training on ``n`` images (see the constants above)."""
    p = num_parameters(arch, input_shape=input_shape, num_outputs=num_outputs)
    vectors = TRAIN_P_VECTORS.get(optimizer, TRAIN_P_VECTORS["lbfgs"])
    h = _hidden_units(arch, input_shape, num_outputs)
    return ITEMSIZE[dtype] * (vectors * p + n * _input_dim(input_shape) + TRAIN_ACTIVATION_COPIES * n * h)


def kkt_bytes(arch: ArchConfig, *, m: int, dtype: str, input_shape: tuple[int, ...] = CIFAR_SHAPE,
              num_outputs: int = 1, runs: int = 1, mode: str = "looped") -> int:
    """Peak tensor bytes of a KKT-family piece: one run at a time when looped, all ``runs`` at once
    when batched (``auto`` counts as batched: what a GPU runs)."""
    p = num_parameters(arch, input_shape=input_shape, num_outputs=num_outputs)
    h = _hidden_units(arch, input_shape, num_outputs)
    one = ITEMSIZE[dtype] * (KKT_P_VECTORS * p + KKT_INPUT_COPIES * m * _input_dim(input_shape)
                             + KKT_ACTIVATION_COPIES * m * h)
    together = runs if mode in ("batched", "auto") else 1
    return together * one


def bilevel_bytes(cfg: BilevelConfig, arch: ArchConfig, *, m: int, input_shape: tuple[int, ...] = CIFAR_SHAPE,
                  num_outputs: int = 1) -> int:
    """Peak tensor bytes of a bilevel run: its P-vectors (curvature pairs included) and one
    create-graph pass over the m candidates."""
    p = num_parameters(arch, input_shape=input_shape, num_outputs=num_outputs)
    h = _hidden_units(arch, input_shape, num_outputs)
    return ITEMSIZE[cfg.dtype] * ((2 * cfg.lbfgs_history + BILEVEL_P_VECTORS) * p
                                  + KKT_INPUT_COPIES * m * _input_dim(input_shape) + KKT_ACTIVATION_COPIES * m * h)


def estimate_training(arch: ArchConfig, *, n: int, epochs: int, optimizer: str, dtype: str,
                      input_shape: tuple[int, ...] = CIFAR_SHAPE) -> Estimate:
    """``estimate(device) -> seconds`` of full-batch training on n images (None: unknown device
    or optimizer). Margin-ascent steps cost one pass each: add them to ``epochs``. The function
    carries ``memory_bytes`` (:func:`training_bytes`) for ``--dry-run``."""
    flops = 6.0 * n * macs_per_input(arch, input_shape=input_shape)

    def estimate(device: str) -> float | None:
        if not _known(device) or optimizer not in TRAIN_PASSES_PER_EPOCH:
            return None
        return epochs * TRAIN_PASSES_PER_EPOCH[optimizer] * pass_seconds(device, flops=flops, dtype=dtype)

    estimate.memory_bytes = training_bytes(arch, n=n, optimizer=optimizer, dtype=dtype,  # type: ignore[attr-defined]
                                           input_shape=input_shape)
    return estimate


def estimate_kkt(arch: ArchConfig, *, m: int, steps: int, dtype: str,
                 input_shape: tuple[int, ...] = CIFAR_SHAPE, runs: int = 1, mode: str = "looped") -> Estimate:
    """``estimate(device) -> seconds`` of ``runs`` KKT-family (KKT, DecoReco) runs on m candidates each.

    ``mode`` ``looped`` (or separate pieces): ``runs`` × one run; ``auto``: looped on cpu, batched
    elsewhere (as ``attacks.batched.AUTO_MODE``). ``batched``
    (:func:`datarecon.attacks.batched.run_batched`): on cpu ``runs`` × one run ×
    :data:`BATCHED_OVER_LOOPED_CPU` (measured); on cuda the FLOPs of all runs plus the per-pass
    overhead once per batched step and :data:`BATCH_COMMIT_PASSES` per batched step for the update
    of the runs' stacked state (an EXTRAPOLATION: no batched step was measured on a GPU).
    """
    flops = 6.0 * m * macs_per_input(arch, input_shape=input_shape)

    def estimate(device: str) -> float | None:
        if not _known(device):
            return None
        one = steps * KKT_PASSES_PER_STEP * pass_seconds(device, flops=flops, dtype=dtype)
        if mode == "auto":  # as attacks/batched.resolve_mode
            batched = device_kind(device) != "cpu"
        else:
            batched = mode == "batched"
        if not batched or runs == 1:
            return runs * one
        if device_kind(device) == "cpu":
            return runs * one * BATCHED_OVER_LOOPED_CPU
        d = DEVICES.get(device_kind(device))
        per_step = KKT_PASSES_PER_STEP * (runs * flops / d.flops[dtype] + d.pass_overhead_s)
        return steps * (per_step + BATCH_COMMIT_PASSES * d.pass_overhead_s)

    estimate.memory_bytes = kkt_bytes(arch, m=m, dtype=dtype, input_shape=input_shape,  # type: ignore[attr-defined]
                                      runs=runs, mode=mode)
    return estimate


def estimate_bilevel(cfg: BilevelConfig, arch: ArchConfig, *, m: int, kinks: bool) -> Estimate:
    """``estimate(device) -> seconds`` of a bilevel run on m candidates: the first inner solve plus
    ``cfg.steps`` outer steps (:func:`bilevel_step_work`)."""
    flops = 6.0 * m * macs_per_input(arch)
    vector_bytes = 3.0 * num_parameters(arch) * ITEMSIZE[cfg.dtype]  # y ← y + a·x: two reads, one write
    work = bilevel_first_work(cfg, kinks=kinks) + bilevel_step_work(cfg, kinks=kinks).scaled(cfg.steps)

    def estimate(device: str) -> float | None:
        if not _known(device):
            return None
        return work_seconds(work, device=device, flops_per_pass=flops, vector_bytes=vector_bytes, dtype=cfg.dtype)

    estimate.memory_bytes = bilevel_bytes(cfg, arch, m=m)  # type: ignore[attr-defined]
    return estimate


def bilevel_step_seconds(cfg: BilevelConfig, arch: ArchConfig, *, m: int, kinks: bool, device: str) -> float:
    """Estimated seconds of one outer step (the number ``--dry-run`` reports per bilevel piece)."""
    flops = 6.0 * m * macs_per_input(arch)
    vector_bytes = 3.0 * num_parameters(arch) * ITEMSIZE[cfg.dtype]
    return work_seconds(bilevel_step_work(cfg, kinks=kinks), device=device, flops_per_pass=flops,
                        vector_bytes=vector_bytes, dtype=cfg.dtype)
