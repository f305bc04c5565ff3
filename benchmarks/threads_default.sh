#!/bin/bash
# The default of --threads: README-sized workloads with one thread (--threads 1) against PyTorch's default
# (--threads 0: all cores). Run from an empty scratch folder with DATARECON_DATA set; prints wall times.
# docs/PERFORMANCE.md "Threads" holds the numbers of 2026-11-27 (2-core machine, beside other jobs).
set -e
# threads 1 against 0 (PyTorch's default: every core) for the README's workflows and one D-1000-1000-1 target
: "${DATARECON_DATA:?set DATARECON_DATA to the data folder}"
datarecon examples experiment-digits.yaml --out ./
uptime
for t in 1 0 1 0; do
  rm -rf e$t
  /usr/bin/time -f "run experiment-digits threads=$t: %e s" datarecon run experiment-digits.yaml --out e$t --threads $t --no-progress >/dev/null
done
for t in 1 0; do
  rm -rf m$t k$t
  s=$(date +%s.%N)
  datarecon train --dataset mnist --task odd-even --n-per-class 10 --arch mlp --hidden 100 --no-bias --init-scale 1e-3 --loss logistic --lr 0.5 --epochs 2000 --dtype float64 --out m$t --threads $t --no-progress >/dev/null
  datarecon reconstruct --model m$t --method kkt --init gaussian --init-scale 0.00174 --steps 3000 --lr-x 0.282 --lr-lambda 0.01 --lambda-min 0.415 --alpha 19.2 --out k$t --threads $t --no-progress > /dev/null
  datarecon evaluate k$t --threads $t --no-progress > /dev/null
  e=$(date +%s.%N); echo "README mnist train+reconstruct+evaluate threads=$t: $(echo "$e - $s" | bc) s"
done
rm -rf big1 big0
for t in 1 0; do
  /usr/bin/time -f "train D-1000-1000-1 mnist n=50/class 200 epochs threads=$t: %e s" datarecon train --dataset mnist --task odd-even --n-per-class 50 --no-bias --epochs 200 --lr 0.5 --out big$t --threads $t --no-progress >/dev/null
  /usr/bin/time -f "reconstruct D-1000-1000-1 300 steps threads=$t: %e s" datarecon reconstruct --model big$t --steps 300 --out bigr$t --threads $t --no-progress >/dev/null
done
uptime
