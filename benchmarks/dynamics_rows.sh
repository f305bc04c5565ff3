#!/usr/bin/env bash
# One row of RESULTS.md "Dynamics matching — CNN and ResNets at n = 20": train the target (CIFAR-10, 2 images
# per class of 10, seed 0), run dynamics matching, Loo et al., Haim KKT at the reference settings and KKT at
# the new default (theta_init known), evaluate each, and write SimuDy's mean best SSIM with the nulls.
# (cnn20-binary: vehicles against animals, 10 images per side, logistic loss.)
#
#   benchmarks/dynamics_rows.sh ROW WORK [reconstruct flags for every attack, e.g. --device cuda --threads 2]
#
# ROW: cnn20 | cnn20-binary | resnet8-20 | resnet18-20 | resnet8-simudy | resnet18-simudy. WORK: a folder for the model and the runs (WORK/ROW/...).
# Budgets (outer steps) can be lowered for a trial: DYN_STEPS, LOO_STEPS, KKT_REF_STEPS, KKT_STEPS.
# The table goes to WORK/ROW/table.json, the log of every command to WORK/ROW/log.txt.
# DATARECON (default: datarecon; e.g. "python3 -m datarecon.cli.main" without an install) is the command,
# PYTHON (default: python3) runs the table; DATARECON_DATA points at the data.
set -uo pipefail
row=$1
work=$2
shift 2
flags=("$@")
read -ra dr <<<"${DATARECON:-datarecon}"
here=$(cd "$(dirname "$0")" && pwd)
data=(--dataset cifar10 --task all --n-per-class 2 --n-heldout-per-class 4 --loss cross-entropy --no-bias)
case $row in
  cnn20)  # fits in 60 steps; the attack replays all of them
    target=(--arch cnn --channels 32,64 --lr 0.1 --batch-size 10 --epochs 30)
    dyn=(--known-recipe model --steps "${DYN_STEPS:-1000}");;
  cnn20-binary)  # the same CNN and recipe on a binary task
    data=(--dataset cifar10 --task vehicles-animals --n-per-class 10 --n-heldout-per-class 20 --loss logistic --no-bias)
    target=(--arch cnn --channels 32,64 --lr 0.1 --batch-size 10 --epochs 30)
    dyn=(--known-recipe model --steps "${DYN_STEPS:-1000}");;
  resnet8-20)  # 300 steps to fit; the attack simulates the first 10 epochs (20 steps), its lr learned
    target=(--arch resnet8 --lr 0.03 --momentum 0.9 --batch-size 10 --epochs 150)
    dyn=(--known-recipe model:-lr --steps "${DYN_STEPS:-600}" --set epochs=10);;
  resnet18-20)  # the ResNet-8 recipe on ResNet-18 (no pretrained weights can be fetched here)
    target=(--arch resnet18 --lr 0.03 --momentum 0.9 --batch-size 10 --epochs 150)
    dyn=(--known-recipe model:-lr --steps "${DYN_STEPS:-300}" --set epochs=10);;
  resnet8-simudy | resnet18-simudy)  # SimuDy's recipe (lr 0.01, batch 20, 20 epochs), replayed whole
    target=(--arch "${row%-simudy}" --lr 0.01 --batch-size 20 --epochs 20)
    dyn=(--known-recipe model --steps "${DYN_STEPS:-500}");;
  *) echo "error: unknown row '$row'; valid rows: cnn20, cnn20-binary, resnet8-20, resnet18-20, resnet8-simudy, resnet18-simudy" >&2
     exit 2;;
esac
dir=$work/$row
mkdir -p "$dir"
log=$dir/log.txt
device=()
for ((i = 0; i < ${#flags[@]}; i++)); do [[ ${flags[i]} == --device ]] && device=(--device "${flags[i + 1]}"); done

step() {  # NAME CMD...: run, log, time; a failing attack is logged and the row goes on
  local name=$1 start
  shift
  start=$(date +%s)
  echo "== $name: $*" >>"$log"
  "$@" >>"$log" 2>&1
  echo "== $name: exit $? after $(($(date +%s) - start)) s" | tee -a "$log"
}

step train "${dr[@]}" train "${data[@]}" "${target[@]}" "${device[@]}" --no-progress --out "$dir/model" --overwrite
attack() {  # RUN FLAGS...
  local run=$1
  shift
  step "$run" "${dr[@]}" reconstruct --model "$dir/model" --candidates 20 --no-progress --out "$dir/$run" --overwrite \
    "${flags[@]}" "$@"
  step "$run-eval" "${dr[@]}" evaluate "$dir/$run"
  grep -E "training images reconstructed" "$log" | tail -1
}
attack dyn --method dynamics --known-init seed --init uniform --set tv_weight=0.001 "${dyn[@]}"
attack loo --method loo --known-init seed --init uniform --steps "${LOO_STEPS:-1000}"
attack kkt-ref --method kkt --init-scale 8.86e-4 --lr-x 0.555 --lr-lambda 1e-4 --lambda-min 0.498 --set alpha=19.1 \
  --steps "${KKT_REF_STEPS:-3000}"
attack kkt-init --method kkt --known-init seed --init uniform --steps "${KKT_STEPS:-1000}"
runs=()
for r in dyn loo kkt-ref kkt-init; do [[ -f $dir/$r/candidates.safetensors ]] && runs+=("$dir/$r"); done
step table "${PYTHON:-python3}" "$here/bench_dynamics.py" table "${runs[@]}" --out "$dir/table.json"
grep -E "mean best SSIM" "$log"
