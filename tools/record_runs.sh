#!/usr/bin/env bash
# Record the runs a refactoring must leave unchanged, into OUT (a new folder):
#   the smoke reproductions (haim2022, runkel2024), a run per built-in attack on small targets,
#   coupled runs, an early-stopped run, margin ascent, DP-SGD and membership with reference models.
# Then compare two recordings file by file (tensors bit for bit, JSON values, timings aside):
#   tools/record_runs.sh /tmp/before          # on the old commit
#   tools/record_runs.sh /tmp/after           # on the new one
#   python tools/compare_artefacts.py /tmp/before /tmp/after
#   python tools/compare_checkpoints.py /tmp/before /tmp/after   # checkpoints by state and progress (a recording
#                                                                # from before the one checkpoint schema lists them all)
# PARTS=attacks (or smoke, training, membership; space-separated) records a part only. One thread, CPU.
set -euo pipefail
OUT=${1:?usage: tools/record_runs.sh OUT}
PARTS=${PARTS:-"attacks training membership smoke"}
DR=${DATARECON:-datarecon}
mkdir -p "$OUT"
q=(--no-progress --threads 1)
want() { [[ " $PARTS " == *" $1 "* ]]; }

if want attacks; then
  # a homogeneous MLP on digits (binary), a 3-class MLP, a small ResNet with batch norm trained in mini-batches
  $DR train --dataset digits --task odd-even --n-per-class 5 --arch mlp --hidden 20 --no-bias --init-scale 1e-2 \
      --loss logistic --lr 0.5 --epochs 200 --dtype float64 "${q[@]}" --out "$OUT/mlp"
  $DR train --dataset digits --task classes:0,1,2 --n-per-class 3 --arch mlp --hidden 20 --no-bias --init-scale 1e-2 \
      --loss cross-entropy --lr 0.5 --epochs 200 --dtype float64 "${q[@]}" --out "$OUT/mlp3"
  $DR train --dataset digits --task odd-even --n-per-class 3 --arch resnet8 --channels 2,3,3 --no-bias \
      --batch-norm --loss logistic --lr 0.05 --momentum 0.5 --batch-size 4 --epochs 2 "${q[@]}" --out "$OUT/bn"
  r() { local name=$1; shift; $DR reconstruct "${q[@]}" --out "$OUT/$name" "$@"; }
  r kkt --model "$OUT/mlp" --method kkt --steps 30 --tv-weight 0.01
  r kkt-runs --model "$OUT/mlp" --method kkt --steps 20 --runs 2 --seed 3
  r kkt-stop --model "$OUT/mlp" --method kkt --steps 300 --early-stop-patience 5 --early-stop-tol 0.5
  r decoreco --model "$OUT/mlp3" --method decoreco --steps 30
  r gradnorm --model "$OUT/mlp" --method gradnorm --steps 30
  r loo --model "$OUT/mlp" --method loo --known-init seed --steps 30
  r bilevel --model "$OUT/mlp" --method bilevel --steps 4 --weight-decay-override 1e-2
  r dynamics --model "$OUT/bn" --method dynamics --known-init seed --known-recipe model --init uniform \
      --candidates 6 --steps 5 --feature-stats-weight 0.1
  r dynamics-group --model "$OUT/bn" --method dynamics --known-init seed --known-recipe model --init uniform \
      --candidates 6 --steps 3 --runs 2 --group-weight 0.1
  for run in kkt kkt-runs kkt-stop decoreco gradnorm loo bilevel dynamics dynamics-group; do
    $DR evaluate "$OUT/$run" --threads 1 >/dev/null
  done
fi

if want training; then
  $DR train --dataset digits --task odd-even --n-per-class 5 --arch mlp --hidden 20 --no-bias --init-scale 1e-3 \
      --loss logistic --lr 0.01 --schedule loss-normalised --max-lr-factor 1e9 --epochs 50 \
      --margin-ascent-steps 200 --margin-ascent-rtol 0.01 --margin-ascent-window 20 --kkt-score --dtype float64 \
      "${q[@]}" --out "$OUT/ascent"
  $DR train --dataset digits --task odd-even --n-per-class 5 --arch mlp --hidden 20 --no-bias --loss logistic \
      --lr 0.5 --epochs 20 --dp-noise 1.0 --dp-clip 1.0 --dp-batch-size 4 --dtype float64 "${q[@]}" --out "$OUT/dp"
fi

if want membership; then
  [ -d "$OUT/mlp" ] || $DR train --dataset digits --task odd-even --n-per-class 5 --arch mlp --hidden 20 --no-bias \
      --init-scale 1e-2 --loss logistic --lr 0.5 --epochs 200 --dtype float64 "${q[@]}" --out "$OUT/mlp"
  $DR membership --model "$OUT/mlp" --evaluate --references 4 --threads 1 --out "$OUT/membership" >/dev/null
fi

if want smoke; then
  $DR reproduce haim2022 --scale smoke "${q[@]}" --out "$OUT/haim2022"
  $DR reproduce runkel2024 --scale smoke "${q[@]}" --out "$OUT/runkel2024"
fi
echo "recorded into $OUT"
