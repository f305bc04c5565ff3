"""The KKT attack at the reference's budget shape: a random search over its four knobs, attacker-side selection
only, and the count against the number of runs pooled.

One ``datarecon sweep`` of ``--samples`` KKT runs whose x₀ scale, step, λ_min and surrogate sharpness α are drawn as
the reference draws them (``examples/sweep-haim-reference.yaml``: log-uniform s ∈ [1e-6, 0.1] and lr ∈ [1e-5, 1],
uniform λ_min ∈ [0.01, 0.5] and α ∈ [10, 500]), each ``--steps`` steps on m = 2n candidates; then, for
K = 1, 2, 4, …, the candidates of the K runs with the lowest relative residual (an attacker-side criterion) are
pooled and evaluated (``datarecon sweep pool``, ``datarecon evaluate``): the headline count beside its held-out and
noise nulls, and the papers' scoring. ``--known-init seed`` runs the θ_init-known objective instead.

    python benchmarks/kkt_random_search.py --model runs/regimes/ascent/model --samples 64 --steps 500 \\
        --work runs/random-search --out benchmarks/results/kkt_random_search.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS_DIR, machine

SWEEP = """name: {name}
model_dir: {model}
method: kkt
attack:
  optimizer: sgd
  momentum: 0.9
  lr_lambda: 1.0e-4
  lambda_init: uniform
init: {{name: gaussian, scale: 1.0e-3}}
steps: {steps}
dtype: float32
search:
  random:
    init.scale:        {{dist: log-uniform, low: 1.0e-6, high: 0.1}}
    attack.lr_x:       {{dist: log-uniform, low: 1.0e-5, high: 1.0}}
    attack.lambda_min: {{dist: uniform, low: 0.01, high: 0.5}}
    attack.alpha:      {{dist: uniform, low: 10.0, high: 500.0}}
  samples: {samples}
budget: {samples}
seed: {seed}
selection: {{criterion: relative_residual}}
max_retries: 0
{knowledge}"""


def _cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "datarecon.cli.main", *args], check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--known-init", default=None, help="e.g. seed: the θ_init-known objective")
    ap.add_argument("--merge", type=float, default=None,
                    help="attacker-side deduplication of the pool: drop a candidate whose cosine to a kept one of a "
                         "better run exceeds this (sweep pool --merge)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("runs/random-search"))
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "kkt_random_search.json")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    knowledge = f"knowledge: {{known_init: {args.known_init}}}\n" if args.known_init else ""
    cfg = args.work / "sweep.yaml"
    cfg.write_text(SWEEP.format(name="random-search", model=args.model.resolve(), steps=args.steps,
                                samples=args.samples, seed=args.seed, knowledge=knowledge))
    store = args.work / "store"
    sweep_s = _cli(["sweep", "--config", str(cfg), "--out", str(store), "--threads", str(args.threads)])
    rows = []
    k = 1
    while k <= args.samples:
        pool = args.work / f"pool-top{k}"
        if not (pool / "metrics.json").is_file():
            merge = ["--merge", str(args.merge)] if args.merge is not None else []
            _cli(["sweep", "pool", str(store), "--top", str(k), *merge, "--out", str(pool), "--overwrite"])
            _cli(["evaluate", str(pool), "--no-progress", "--threads", str(args.threads)])
        m = json.loads((pool / "metrics.json").read_text())
        h = m["headline"]
        rows.append({"runs_pooled": k, "candidates": m.get("n_candidates"), "count": h.get("count"),
                     "heldout": h.get("heldout"), "noise": h.get("noise"), "threshold": h.get("threshold"),
                     "n_heldout_candidates": h.get("n_heldout_candidates"), "reference_scoring":
                     h.get("reference_scoring"), "notes": h.get("notes")})
        print(f"top {k:3d}: {h.get('count')} of {h.get('n_train')} (held-out {h.get('heldout')}, noise "
              f"{h.get('noise')}); papers' scoring {(h.get('reference_scoring') or {}).get('count')}", flush=True)
        k *= 2
    args.out.write_text(json.dumps({"model": str(args.model), "samples": args.samples, "steps": args.steps,
                                    "known_init": args.known_init, "merge": args.merge, "sweep_wall_s": sweep_s, "rows": rows,
                                    "command": " ".join(sys.argv), "machine": machine(),
                                    "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
