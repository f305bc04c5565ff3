"""The step-size probe on one target: the scales the rule tries, each one's verdict and residual, the scale it
chooses, and (``--scales``) the same 50-step probe at further scales, to see where the residual is lowest.

The run is the identifiability regime study's weights-only KKT run at the reference's first CIFAR setting
(``kkt-ref-a``: x₀ scale 8.86e-4, lr_x 0.555, λ_min 0.498, α 19.1, lr_λ 1e-4; m = 200, seed 0); only the
attacker-side objective is read (:mod:`datarecon.attacks.probe`).

    python benchmarks/step_probe_scan.py --model W/converged/model --scales 0.0562,0.1778,0.2371 \\
        --out benchmarks/results/step_probe_scan_converged.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from _common import machine

REF_A = {"method": "kkt", "steps": 3000, "lr_x": 0.555, "lr_lambda": 1e-4, "lambda_min": 0.498, "alpha": 19.1}


def main() -> None:
    from datarecon.attacks.probe import probe_step_sizes, probe_trial
    from datarecon.experiments.reconstruct import build_run, make_attack, prepare

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--scales", default="", help="comma-separated further scales to probe (on every step size)")
    p.add_argument("--steps", type=int, default=50, help="probe length (the run's default step_probe)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    run = build_run({"model": args.model, "candidates": 200, "seed": 0, "attack": REF_A,
                     "init": {"name": "gaussian", "scale": 8.86e-4}})
    setup = prepare(run)
    attack = make_attack(run.method, run.method_config())
    t0 = time.perf_counter()
    chosen = probe_step_sizes(attack, setup, steps=args.steps)
    probe_s = time.perf_counter() - t0
    extra = [probe_trial(attack, setup, steps=args.steps, scale=float(s)) for s in args.scales.split(",") if s.strip()]
    result = {"model": args.model, "settings": REF_A, "probe": chosen.record, "probe_s": probe_s, "further": extra,
              "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
