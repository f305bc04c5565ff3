"""Wall-time estimates of reproduction pieces (``experiments.reproduce.cost``) against hand counts."""

from __future__ import annotations

from pathlib import Path

import math

import pytest
import torch

from datarecon.attacks.bilevel import BilevelConfig
from datarecon.experiments.reproduce import cost, load_config, plan_reproduction
from datarecon.models.spec import ArchSpec, build_model
from datarecon.training.target import ArchConfig


@pytest.mark.parametrize("arch", [ArchConfig(name="affine"), ArchConfig(name="one-hidden", hidden=(64,)),
                                  ArchConfig(name="mlp", hidden=(16, 8), bias=False)], ids=["affine", "one-hidden", "mlp"])
def test_macs_and_parameters_match_the_built_model(arch):
    model = build_model(ArchSpec(name=arch.name, input_shape=cost.CIFAR_SHAPE, num_outputs=1, hidden=arch.hidden,
                                 bias=arch.bias))
    assert cost.num_parameters(arch) == sum(p.numel() for p in model.parameters())
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert cost.macs_per_input(arch) == sum(w.numel() for w in weights)  # one MAC per weight per input


def test_bilevel_estimate_is_the_hand_count():
    """A kinked target with a fixed step: every solve hits the cap; one solve per outer step."""
    cfg = BilevelConfig(steps=7, lr_x=0.1, inner_max_iter=5, inner_max_iter_first=40, lbfgs_history=3,
                        solve_max_iter=4)
    arch = ArchConfig(name="one-hidden", hidden=(10,))
    k = cost.BILEVEL_COUNTS["kinked"]
    hvps = min(k.hvps, 4 + 2)
    passes = (1 + 40 * k.evals_per_iteration) + 7 * ((1 + 5 * k.evals_per_iteration) + hvps + 2)
    vec = 40 * (10 * 3 + 10) + 7 * (5 * (10 * 3 + 10) + 4 * hvps)
    m, p = 12, 3072 * 10 + 10 + 10 + 1
    flops = 6 * m * (3072 * 10 + 10)
    dev = cost.DEVICES.get("cpu")
    want = passes * (flops / dev.flops["float64"] + dev.pass_overhead_s) + vec * 3 * p * 8 / dev.bandwidth
    got = cost.estimate_bilevel(cfg, arch, m=m, kinks=True)("cpu")
    assert got == pytest.approx(want, rel=1e-12)
    assert cost.estimate_bilevel(cfg, arch, m=m, kinks=True)("tpu") is None  # no figures: no estimate
    # the problem-derived step re-solves once per line-search trial
    free = cost.bilevel_step_work(cfg.model_copy(update={"lr_x": None}), kinks=True)
    assert free.passes == pytest.approx(k.trials * (1 + 5 * k.evals_per_iteration) + hvps + 2)


def test_training_and_kkt_estimates_scale_with_their_work():
    arch = ArchConfig(name="mlp", hidden=(32, 32))
    t1 = cost.estimate_training(arch, n=10, epochs=100, optimizer="gd", dtype="float64")("cpu")
    t2 = cost.estimate_training(arch, n=10, epochs=200, optimizer="gd", dtype="float64")("cpu")
    assert t2 == pytest.approx(2 * t1)
    k = cost.estimate_kkt(arch, m=20, steps=10, dtype="float32")("cuda")
    flops = 6 * 20 * cost.macs_per_input(arch)
    cuda = cost.DEVICES.get("cuda")
    assert k == pytest.approx(10 * cost.KKT_PASSES_PER_STEP * (flops / cuda.flops["float32"] + cuda.pass_overhead_s))


def test_batched_kkt_estimate_is_the_hand_count():
    """K batched runs: on cpu K runs × the measured ratio; on cuda the FLOPs of all K runs, the
    per-pass overhead once per batched step and one commit of the stacked state per step (extrapolation)."""
    arch = ArchConfig(name="mlp", hidden=(32, 32))
    one = cost.estimate_kkt(arch, m=20, steps=10, dtype="float32")
    assert cost.estimate_kkt(arch, m=20, steps=10, dtype="float32", runs=5)("cuda") == pytest.approx(5 * one("cuda"))
    batched = cost.estimate_kkt(arch, m=20, steps=10, dtype="float32", runs=5, mode="batched")
    assert batched("cpu") == pytest.approx(5 * one("cpu") * cost.BATCHED_OVER_LOOPED_CPU)
    cuda = cost.DEVICES.get("cuda")
    flops = 6 * 20 * cost.macs_per_input(arch)
    want = 10 * (cost.KKT_PASSES_PER_STEP * (5 * flops / cuda.flops["float32"] + cuda.pass_overhead_s)
                 + cost.BATCH_COMMIT_PASSES * cuda.pass_overhead_s)
    assert batched("cuda") == pytest.approx(want, rel=1e-12) and batched("cuda") < 5 * one("cuda")
    assert batched("tpu") is None
    auto = cost.estimate_kkt(arch, m=20, steps=10, dtype="float32", runs=5, mode="auto")
    assert auto("cpu") == pytest.approx(5 * one("cpu")) and auto("cuda") == pytest.approx(batched("cuda"))


def test_dry_run_estimates_every_training_and_attack_piece_and_says_where_gpu_figures_come_from(tmp_path):
    for device in ("cpu", "cuda"):
        planned = plan_reproduction("runkel2024", out=tmp_path / "none", scale="paper", device=device)
        for p in planned:
            if p.kind in ("train", "attack"):
                assert p.estimate_s is not None and math.isfinite(p.estimate_s) and p.estimate_s > 0, p.key
    assert "CALIBRATED" in cost.device_note("cuda:0") and "measured" in cost.device_note("cpu")
    assert "no speed figures" in cost.device_note("mps")
    # the paper preset's one-hidden bilevel pieces cost the most per outer step
    cfg = load_config("runkel2024", scale="paper")
    step = cost.bilevel_step_seconds(cfg.bilevel_one_hidden, cfg.one_hidden.arch, m=500, kinks=True, device="cpu")
    assert step > cost.bilevel_step_seconds(cfg.bilevel_affine, cfg.affine.arch, m=500, kinks=False, device="cpu")


def test_dry_run_cli_estimates_for_cuda_without_a_gpu(tmp_path, capsys):
    from datarecon.cli.main import main

    assert main(["reproduce", "runkel2024", "--scale", "paper", "--out", str(tmp_path / "o"), "--dry-run",
                 "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "time (cuda)" in out and "estimates on cuda: CALIBRATED" in out
    assert not (tmp_path / "o").exists()
    if not torch.cuda.is_available():  # a real run still needs the device
        assert main(["reproduce", "runkel2024", "--scale", "smoke", "--out", str(tmp_path / "o"),
                     "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_memory_estimates_are_the_hand_count_and_match_the_measured_activations():
    """Issue 25 item 10: a dry run says what memory a piece needs. The KKT activation count is the one
    measured in docs/PERFORMANCE.md §2 (saved for backward at m = 1000, float32: 65 MiB for
    D-1000-1000-1, 201 MiB for one-hidden 6144)."""
    from datarecon.training.target import ArchConfig

    mlp = ArchConfig(name="mlp", hidden=(1000, 1000), bias=False)
    d, h = 3 * 32 * 32, 1000 + 1000 + 1
    p = cost.num_parameters(mlp)
    assert cost.kkt_bytes(mlp, m=1000, dtype="float32") == 4 * (4 * p + 4 * 1000 * d + 8 * 1000 * h)
    for arch, measured_mib in ((mlp, 65), (ArchConfig(name="mlp", hidden=(6144,), bias=True), 201)):
        hidden = sum(arch.hidden) + 1
        saved = 4 * (cost.KKT_ACTIVATION_COPIES * 1000 * hidden + 1000 * d)  # activations + x, float32
        assert abs(saved / 2**20 - measured_mib) / measured_mib < 0.25, (arch.hidden, saved / 2**20)
    assert cost.kkt_bytes(mlp, m=100, dtype="float64", runs=5, mode="batched") == \
        5 * cost.kkt_bytes(mlp, m=100, dtype="float64")
    assert cost.kkt_bytes(mlp, m=100, dtype="float64", runs=5, mode="looped") == \
        cost.kkt_bytes(mlp, m=100, dtype="float64")
    assert cost.training_bytes(mlp, n=10, optimizer="lbfgs", dtype="float64") == \
        8 * (43 * p + 10 * d + 3 * 10 * h)
    assert cost.format_bytes(6.6e9) == "6.6 GB" and cost.format_bytes(65e6) == "65 MB"


def test_dry_run_says_time_and_memory_of_every_piece_kind(tmp_path):
    """Every train and attack piece has a memory estimate; the summary gives the modelled time, a range
    for the pieces without a cost model and the expected peak resident memory."""
    from datarecon.experiments.pipeline.pieces import format_plan

    for name in ("runkel2024", "haim2022"):
        planned = plan_reproduction(name, out=tmp_path / "none", scale="smoke")
        assert all(p.memory_bytes and p.memory_bytes > 0 for p in planned if p.kind in ("train", "attack"))
        lines = format_plan(planned, device="cpu")
        assert lines[0].split()[-1] == "memory"
        assert any(line.startswith("  + ") and "pieces without a cost model:" in line for line in lines)
        peak = [line for line in lines if line.startswith("peak memory: about ")]
        assert len(peak) == 1 and " resident (" in peak[0]
    # the paper dry run's measured peak (11.2 GB on 2026-11-21) is what the fit gives back
    big = max(p.memory_bytes or 0 for p in plan_reproduction(
        "runkel2024", out=tmp_path / "none", scale="paper",
        overrides=__import__("yaml").safe_load((Path(__file__).resolve().parents[2] / "examples" /
                                                "runkel2024-paper-dryrun.yaml").read_text())))
    assert abs(cost.resident_bytes(big) - 11.2e9) / 11.2e9 < 0.05
