#!/usr/bin/env bash
# The suite's time target (docs/RELIABILITY.md "The suite's time"): from a fresh clone of this
# checkout, `.ci/run` once, then `make test` RUNS times (default 3), each with a 2-thread PyTorch
# job running beside it (benchmarks/cpu_load.py). Prints the wall time and exit code of each.
#
#   benchmarks/suite_time.sh [CLONE_DIR] [RUNS]     # CLONE_DIR must sit beside ../shared (default ../suite-clone)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
clone="${1:-$here/../suite-clone}"
runs="${2:-3}"
rm -rf "$clone"
git clone -q "$here" "$clone"
cd "$clone"
s=$(date +%s); rc=0; .ci/run > ci.log 2>&1 || rc=$?
echo ".ci/run: rc=$rc, $(( $(date +%s) - s )) s (log: $clone/ci.log)"
for i in $(seq 1 "$runs"); do
    .venv/bin/python benchmarks/cpu_load.py & load=$!
    s=$(date +%s); rc=0; make test > "test$i.log" 2>&1 || rc=$?
    kill "$load"
    echo "make test #$i beside a 2-thread job: rc=$rc, $(( $(date +%s) - s )) s; $(grep -E '[0-9]+ passed' "test$i.log" | tail -1)"
done
