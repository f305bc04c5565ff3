#!/usr/bin/env bash
# Why the Runkel reproduction runs the one-hidden bilevel attack with CG damping 1 and SGD (lr 10):
# three settings on the smoke one-hidden target, from the same partition start, 60 outer steps.
# Prints ‖θ* − θ‖² and ‖∇x‖ every 10 steps and the mean L2 move of x per image.
# Needs: datarecon reproduce runkel2024 --scale smoke --out out/smoke-runkel (for the target).
# Usage: bash benchmarks/bilevel_one_hidden_settings.sh [TARGET_MODEL_DIR] [OUT_DIR]
set -euo pipefail
M=${1:-out/smoke-runkel/models/one-hidden/model}
OUT=${2:-/tmp/bilevel-one-hidden-settings}
PY=${PYTHON:-.venv/bin/python}
DR=${DATARECON:-.venv/bin/datarecon}
if [[ ! -f "$M/model.json" ]]; then
  echo "error: no model directory at $M; run: datarecon reproduce runkel2024 --scale smoke --out out/smoke-runkel" >&2
  exit 2
fi
common=(--model "$M" --method bilevel --init partition --candidates 10 --steps 60 --log-every 10 --no-progress
        --set inner_tol=1e-5 --set inner_max_iter=10 --set inner_max_iter_first=100 --set solve_max_iter=30)
declare -A settings=(
  [undamped-sgd]="--set damping=0 --optimizer sgd --lr-x 0.001"
  [damped-sgd]="--set damping=1 --optimizer sgd --lr-x 10"
  [damped-adam]="--set damping=1 --optimizer adam --lr-x 0.05"
)
for name in undamped-sgd damped-sgd damped-adam; do
  # shellcheck disable=SC2086
  "$DR" reconstruct "${common[@]}" ${settings[$name]} --out "$OUT/$name" --overwrite > /dev/null
  "$PY" - "$OUT/$name" "$name" "$M" <<'PY'
import json, sys
from pathlib import Path
from datarecon.experiments.reconstruct import prepare_attack
from datarecon.utils.io import load_tensors
run, name, model = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
h = [json.loads(line) for line in open(run / "history.jsonl")]
x = load_tensors(run / "candidates.safetensors")["x"].double()
x0 = prepare_attack(model, init="partition", candidates=10).x0.double()  # the same start (seed 0)
move = float((x - x0).flatten(1).norm(dim=1).mean())
print(f"{name:>13}: |theta*-theta|^2 {[round(r['param_distance'], 2) for r in h]}")
print(f"{'':>13}  |grad_x|        {['%.1e' % r['grad_x_norm'] for r in h]}")
print(f"{'':>13}  mean L2 move of x per image {move:.2f}")
PY
done
