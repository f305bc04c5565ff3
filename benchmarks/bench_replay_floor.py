"""Dynamics matching's outer step against its floor: how many forward+backward passes one outer step costs.

One outer step of dynamics matching replays T training steps with their graph (each a forward and a
create-graph backward of the target on the batch) and backpropagates through all of them (a double
backward per step). Its floor is therefore a small multiple of T plain forward+backward passes. This
prints, measured in one run per (network, threads, T):

    ratio = (seconds per outer step) / (T × seconds of one forward+backward of the target on the batch)

with the forward+backward timed the way training does it (the loss's gradient in the parameters,
no graph kept), float32, batch n = 20 on CIFAR-sized inputs (3×32×32, 10 classes), and the parts of
the outer step: the replay's forward (T steps, graph kept) and the backward through it.

    python benchmarks/bench_replay_floor.py --threads 1,2 --out benchmarks/results/replay_floor.json

Networks: the fine-tuning rows' CNN (channels 32, 64) and ResNet-8 with batch norm in eval mode
(fine-tuning), both bias-free as in ``benchmarks/finetune_rows.sh``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig
from datarecon.attacks.knowledge import KnownInit, KnownRecipe
from datarecon.kernel.step import TrainingRecipe, energy, normalisation_stats
from datarecon.models.spec import ArchSpec, build_model

NETWORKS = {
    "cnn": {"name": "cnn", "hidden": (32, 64)},
    "resnet8": {"name": "resnet8", "batch_norm": True},
}
N, CLASSES, SHAPE = 20, 10, (3, 32, 32)


def _interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, timed in turn within every repeat (so a change in the machine's load
    reaches all of them alike: the ratios stay fair on a shared machine)."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _setup(network: str, steps: int, *, memory_format: str = "contiguous"):
    spec = ArchSpec(input_shape=SHAPE, num_outputs=CLASSES, bias=False, **NETWORKS[network])
    model = build_model(spec, generator=torch.Generator().manual_seed(0)).eval()
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    params = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in init.items()}
    target = Target(model=model, params=params, loss="cross-entropy", weight_decay=0.0, input_shape=SHAPE,
                    num_outputs=CLASSES)
    recipe = KnownRecipe(TrainingRecipe(loss="cross-entropy", lr=0.01, epochs=steps, batch_size=N, seed=0, norm_mode="eval"),
                         n=N, known=("lr", "momentum", "batch_size", "epochs", "order"))
    labels = torch.arange(N) % CLASSES
    prior = AttackerPrior(labels=labels, input_shape=SHAPE, lower=0.0, upper=1.0,
                          known_init=KnownInit(params=init, sha256="bench", source="bench"), recipe=recipe)
    x = torch.rand((N, *SHAPE), generator=g)
    if memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return model, init, target, prior, x, labels


def measure(network: str, threads: int, steps: int, repeats: int) -> dict:
    """One row: seconds of a forward+backward, of an outer step and of its parts, and the ratio."""
    torch.set_num_threads(threads)
    model, init, target, prior, x, labels = _setup(network, steps)
    stats = normalisation_stats(model)
    leaves = {k: v.clone().requires_grad_(True) for k, v in init.items()}

    def forward_backward() -> None:
        _, _, e = energy(model, leaves, x, labels, loss="cross-entropy", stats=stats)
        torch.autograd.grad(e, list(leaves.values()))

    attack = DynamicsAttack(DynamicsConfig(lr_x=0.01, segment=0))
    state = attack.init_state(target, prior, x0=x, generator=torch.Generator())
    index = iter(range(10**6))

    def outer_step() -> None:
        attack.step(target, prior, state, next(index))

    xs = x.clone().requires_grad_(True)

    def replay_forward() -> torch.Tensor:
        return attack.matching_terms(target, prior, xs, 0.01, 0)["loss"]

    def replay_forward_backward() -> None:
        torch.autograd.grad(replay_forward(), [xs])

    med = _interleaved_medians({"fb": forward_backward, "outer": outer_step, "fwd": replay_forward,
                                "both": replay_forward_backward}, repeats)
    fb, outer, fwd, both = med["fb"], med["outer"], med["fwd"], med["both"]
    row = {"network": network, "threads": threads, "T": steps, "n": N, "dtype": "float32",
           "forward_backward_s": fb, "outer_step_s": outer, "replay_forward_s": fwd,
           "replay_backward_s": max(both - fwd, 0.0), "ratio": outer / (steps * fb),
           "replay_forward_ratio": fwd / (steps * fb), "replay_backward_ratio": max(both - fwd, 0.0) / (steps * fb)}
    print(f"{network:8s} threads {threads} T {steps:3d}: forward+backward {fb * 1e3:7.2f} ms, outer step "
          f"{outer * 1e3:8.1f} ms, ratio {row['ratio']:.2f} (replay forward {row['replay_forward_ratio']:.2f}, "
          f"backward through it {row['replay_backward_ratio']:.2f})", flush=True)
    return row


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default="cnn,resnet8")
    ap.add_argument("--threads", type=_ints, default=(1, 2))
    ap.add_argument("--T", type=_ints, default=(1, 20), help="comma-separated simulated steps")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [measure(net, threads, steps, args.repeats) for net in args.networks.split(",")
            for threads in args.threads for steps in args.T]
    if args.out:
        args.out.write_text(json.dumps({"date": str(date.today()), "machine": platform.platform(),
                                        "torch": torch.__version__, "command": " ".join(sys.argv), "rows": rows},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
