#!/usr/bin/env bash
# One row of RESULTS.md "Reconstruction from fine-tuned CNNs and ResNets": pretrain on public CIFAR-10 images (the
# train and test images after the first 20 of every class; once per architecture, kept in WORK/pre-ARCH), fine-tune
# on n = 20 private images (the first 2 of every class, seed 0) with SimuDy's recipe (SGD lr 0.01, batch 20, 20
# steps) or one step (the single-step rung: one gradient step on one batch, gradient inversion), then run dynamics
# matching (RESTARTS runs from the public pretrained start, the one with the best final cosine kept: an attacker-side
# choice), Loo et al. and KKT (both with the pretrained start known) and Haim KKT at the reference settings (weights
# only), evaluate each, and write SimuDy's mean best SSIM with bootstrap intervals beside the nulls.
#
# Dynamics matching runs with the gradient-inversion settings of Geiping et al. (2020) as breaching ships them for
# "invertinggradients" (cosine objective, Adam at 0.1 on the gradient's sign, the step divided by 10 at 3/8, 5/8 and
# 7/8 of the steps, total variation 0.2 in breaching's normalised pixels = 0.8 in [0, 1] pixels, a pixel box), fixed
# before the rows ran; the earlier rows' SimuDy settings (TV 0.001, Adam 0.01) are the SETTINGS=simudy variant.
#
#   benchmarks/finetune_rows.sh ROW WORK [reconstruct flags for every attack, e.g. --threads 2]
#
# ROW: cnn-ft | cnn-ft1 | resnet8-ft | resnet8-ft1 (ft: SimuDy's 20 steps; ft1: one step; batch norm in eval mode,
# SimuDy's setting) | resnet8-ft-train | resnet8-ft1-train (the same fine-tunings with batch norm in train mode: each
# step normalises with the private batch's own statistics and moves the running ones). WORK: a folder for the
# models and runs (WORK/pre-ARCH, WORK/ROW/...).
#
# VARIANT (the ablation of the priors for networks with batch norm; default base): base (the rows' settings
# below) | fs (+ the feature-statistics prior: in eval mode the candidates' per-channel statistics against the
# running ones, in train mode the statistics the replay produces against the model's) | fs-labels (+ labels
# restored from the read-out's change instead of the balanced assumption) | fs-labels-group (+ group consistency:
# the RESTARTS restarts coupled in one step). Each variant's dynamics matching goes to WORK/ROW/dyn-VARIANT (base:
# WORK/ROW/dyn). Prior weights are chosen attacker-side before the variant runs: SELECT_STEPS (default 300) outer
# steps at each weight of FS_GRID (default 0.001 0.01 0.1) and GROUP_GRID (default 1e-6 1e-5 1e-4), the weight whose
# run ends at the highest cosine kept (the attack's own objective; the choice and every trial's cosine in
# WORK/ROW/choice-VARIANT.json). ONLY_DYN=1 skips Loo and the KKT attacks; SKIP_DYN=1 runs only them; TAG names
# another run of a variant (WORK/ROW/dyn-VARIANT-TAG, e.g. a larger budget).
# Budgets can be lowered for a trial: DYN_STEPS (outer steps per restart), RESTARTS, LOO_STEPS, KKT_REF_STEPS,
# KKT_STEPS; SETTINGS=simudy runs dynamics matching as the from-scratch rows did. The table goes to WORK/ROW/table.json,
# the log of every command to WORK/ROW/log.txt. DATARECON (default: datarecon) is the command, PYTHON (default:
# python3) runs the selection and the table; DATARECON_DATA points at the data. A rerun of a row keeps its fine-tuned
# model and its finished dynamics matching (delete WORK/ROW to start the row again).
set -uo pipefail
row=$1
work=$2
shift 2
flags=("$@")
read -ra dr <<<"${DATARECON:-datarecon}"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
common=(--dataset cifar10 --task all --normalisation unit --loss cross-entropy --no-bias)
# public: every class's train and test images after the first 20 (the private ones are among the first 4)
public=(--n-per-class 757 --skip-per-class 20 --n-partition-per-class 0 --n-heldout-per-class 67)
private=(--n-per-class 2 --n-heldout-per-class 4)
case $row in
  cnn-ft | cnn-ft1)
    arch=(--arch cnn --channels 32,64)
    pretrain=(--lr 0.02 --momentum 0.9 --batch-size 100 --epochs 30)
    pre=$work/pre-cnn;;
  resnet8-ft | resnet8-ft1 | resnet8-ft-train | resnet8-ft1-train)
    arch=(--arch resnet8 --batch-norm)
    pretrain=(--lr 0.05 --momentum 0.9 --weight-decay 5e-4 --batch-size 100 --epochs 15)
    pre=$work/pre-resnet8;;
  *) echo "error: unknown row '$row'; valid rows: cnn-ft, cnn-ft1, resnet8-ft, resnet8-ft1, resnet8-ft-train," \
       "resnet8-ft1-train" >&2
     exit 2;;
esac
case $row in
  *-ft1 | *-ft1-train) finetune=(--lr 0.01 --batch-size 20 --epochs 1);;   # one step on the one batch of 20
  *) finetune=(--lr 0.01 --batch-size 20 --epochs 20);;      # SimuDy's recipe: 20 full-batch steps
esac
case $row in
  *-train) finetune+=(--norm-mode train);;   # batch norm on the batch's own statistics (PyTorch's model.train())
esac
variant=${VARIANT:-base}
case $variant in
  base | fs) prior_flags=();;
  fs-labels | fs-labels-group) prior_flags=(--known-labels restored);;
  *) echo "error: unknown VARIANT '$variant'; valid: base, fs, fs-labels, fs-labels-group" >&2; exit 2;;
esac
# restarts x outer steps of dynamics matching, sized to about an hour of attack on 2 CPU threads (measured per step:
# CNN 0.03 s one step / 0.6 s twenty steps, ResNet-8 0.3 s / 3 s)
case $row in
  cnn-ft1) budget=(4 12000);;
  cnn-ft) budget=(1 5000);;
  resnet8-ft1 | resnet8-ft1-train) budget=(2 5000);;
  resnet8-ft | resnet8-ft-train) budget=(1 1000);;
esac
restarts=${RESTARTS:-${budget[0]}}
dyn_steps=${DYN_STEPS:-${budget[1]}}
case ${SETTINGS:-ig} in
  ig) dyn_settings=(--lr-x 0.1 --signed --lr-schedule step --tv-weight 0.8);;
  simudy) dyn_settings=(--lr-x 0.01 --tv-weight 0.001);;
  *) echo "error: unknown SETTINGS '${SETTINGS}'; valid: ig, simudy" >&2; exit 2;;
esac
dir=$work/$row
mkdir -p "$dir"
log=$dir/log.txt
threads=()
for ((i = 0; i < ${#flags[@]}; i++)); do [[ ${flags[i]} == --threads ]] && threads=(--threads "${flags[i + 1]}"); done

step() {  # NAME CMD...: run, log, time; a failing attack is logged and the row goes on
  local name=$1 start
  shift
  start=$(date +%s)
  echo "== $name: $*" >>"$log"
  "$@" >>"$log" 2>&1
  echo "== $name: exit $? after $(($(date +%s) - start)) s" | tee -a "$log"
}

[[ -f $pre/model.json ]] || step pretrain "${dr[@]}" train "${common[@]}" "${public[@]}" "${arch[@]}" "${pretrain[@]}" \
  "${threads[@]}" --checkpoint-every 3 --log-every 1 --no-progress --out "$pre" --resume
[[ -f $dir/model/model.json ]] || step finetune "${dr[@]}" train "${common[@]}" "${private[@]}" "${arch[@]}" "${finetune[@]}" --pretrained "$pre" \
  --log-every 1 --no-progress --out "$dir/model" --overwrite
attack() {  # RUN FLAGS...
  local run=$1
  shift
  step "$run" "${dr[@]}" reconstruct --model "$dir/model" --candidates 20 --no-progress --out "$dir/$run" --overwrite \
    "${flags[@]}" "$@"
}
dyn_base=(--method dynamics --known-init pretrained --known-recipe model --init uniform "${dyn_settings[@]}"
          "${prior_flags[@]}")
best_cosine() {  # FOLDER: the run (a --runs folder's run<j>, or the folder) whose final cosine is highest
  "$py" - "$1" <<'EOF'
import json, pathlib, sys
runs = sorted(pathlib.Path(sys.argv[1]).glob("run[0-9]*")) or [pathlib.Path(sys.argv[1])]  # one restart: the folder
scores = {r: json.loads((r / "run.json").read_text())["selection"]["cosine"]["value"] for r in runs
          if (r / "candidates.safetensors").is_file()}
print(max(scores, key=scores.get))
EOF
}
choose() {  # FIELD GRID... : SELECT_STEPS outer steps at each weight; prints the weight of the highest final cosine
  local field=$1 w run
  shift
  for w in "$@"; do
    run=$dir/select-$variant-$field-$w
    [[ -f $run/candidates.safetensors || -f $run/run0/candidates.safetensors ]] || attack "select-$variant-$field-$w" \
      "${dyn_base[@]}" "${chosen[@]}" --set "$field=$w" --steps "${SELECT_STEPS:-300}" "${select_runs[@]}" >&2
  done
  "$py" - "$dir" "$variant" "$field" "$@" <<'EOF'
import json, pathlib, sys
work, variant, field, grid = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
cos = {}
for w in grid:
    folder = work / f"select-{variant}-{field}-{w}"
    runs = sorted(folder.glob("run[0-9]*")) or [folder]
    vals = [json.loads((r / "run.json").read_text())["selection"]["cosine"]["value"] for r in runs
            if (r / "candidates.safetensors").is_file()]
    cos[w] = sum(vals) / len(vals) if vals else float("-inf")
pick = max(grid, key=lambda w: cos[w])
path = work / f"choice-{variant}.json"
record = json.loads(path.read_text()) if path.is_file() else {}
record[field] = {"chosen": float(pick), "final_cosine": {w: cos[w] for w in grid},
                 "rule": "highest final cosine (mean over the coupled runs) after SELECT_STEPS outer steps"}
path.write_text(json.dumps(record, indent=1))
print(pick)
EOF
}
# dynamics matching: RESTARTS runs (seeds 0..RESTARTS-1), the one whose simulated change points closest to the real
# one (highest final cosine, what the attack optimises) kept; evaluated alone, so the nulls keep m = 20 candidates
dyn=$dir/dyn
[[ $variant == base ]] || dyn=$dir/dyn-$variant
[[ -z ${TAG:-} ]] || dyn=$dyn-$TAG   # another budget of the same variant (its weights chosen once per variant)
chosen=()
select_runs=()
done_dyn() { [[ -f $dyn/candidates.safetensors ]]; }
if [[ $variant == fs* ]] && ! done_dyn; then
  fs=$(choose feature_stats_weight ${FS_GRID:-0.001 0.01 0.1})
  echo "== $variant: feature_stats_weight $fs (highest final cosine)" | tee -a "$log"
  chosen+=(--feature-stats-weight "$fs")
fi
if [[ $variant == *group ]] && ! done_dyn; then
  select_runs=(--runs "$restarts")
  gw=$(choose group_weight ${GROUP_GRID:-1e-6 1e-5 1e-4})
  echo "== $variant: group_weight $gw (highest mean final cosine)" | tee -a "$log"
  chosen+=(--group-weight "$gw")
fi
best=
if [[ -z ${SKIP_DYN:-} ]]; then
  done_dyn || attack "${dyn#"$dir"/}" "${dyn_base[@]}" "${chosen[@]}" --steps "$dyn_steps" --runs "$restarts"
  best=$(best_cosine "$dyn")
  echo "== ${dyn#"$dir"/}: kept $best (highest final cosine)" | tee -a "$log"
  step dyn-eval "${dr[@]}" evaluate "$best"
fi
if [[ -n ${ONLY_DYN:-} ]]; then
  step table "$py" "$here/bench_dynamics.py" table "$best" --out "$dir/table-$variant${TAG:+-$TAG}.json"
  grep -E "mean best SSIM|training images reconstructed" "$log"
  exit 0
fi
attack loo --method loo --known-init pretrained --init uniform --steps "${LOO_STEPS:-1000}"
step loo-eval "${dr[@]}" evaluate "$dir/loo"
attack kkt-ref --method kkt --init-scale 8.86e-4 --lr-x 0.555 --lr-lambda 1e-4 --lambda-min 0.498 --set alpha=19.1 \
  --steps "${KKT_REF_STEPS:-3000}"
step kkt-ref-eval "${dr[@]}" evaluate "$dir/kkt-ref"
attack kkt-init --method kkt --known-init pretrained --init uniform --steps "${KKT_STEPS:-1000}"
step kkt-init-eval "${dr[@]}" evaluate "$dir/kkt-init"
runs=()
for r in $best "$dir/loo" "$dir/kkt-ref" "$dir/kkt-init"; do [[ -f $r/candidates.safetensors ]] && runs+=("$r"); done
step table "$py" "$here/bench_dynamics.py" table "${runs[@]}" --out "$dir/table.json"
grep -E "mean best SSIM|training images reconstructed" "$log"
