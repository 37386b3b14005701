#!/usr/bin/env bash
# Tessera's strategies measured across the test hosts (scripts/testhosts.sh) at each link rate, and the simulator
# checked against every measurement:
#   1. `tessera bench comm` across 2 test hosts over TCP: allreduce bandwidth, then per strategy images/s, the
#      communication and waiting fractions, bytes per step, buckets with the communication thread and without;
#   2. `tessera bench scale --measured` on that report: SimGrid simulates the same hosts, its links calibrated from
#      the allreduce sweep and its computation from the ranks' step without a strategy (other runs than the
#      strategies' rows), and prints simulated against measured step time per strategy;
#   3. async-easgd, which is not reproducible by design, trained N times on 4 ranks of one host and N times on
#      2 hosts x 2 ranks (synthetic slides, tiny_cnn): the final validation AUC of every run.
#
#   scripts/bench-hosts.sh OUT [--tessera PATH] [--rates 10gbit,1gbit]
#                          [--model M --size PX --batch B --steps S --rounds R] [--auc-runs N]
#
# Defaults: build/app/tessera; 10gbit and 1gbit. One rank per host: the hosts share this machine's cores, and
# `bench scale --measured` calibrates the link from a 2-rank run. ResNet-18 at 96 px, batch 64 per rank,
# 16 steps, 1 round; 3 AUC runs per placement (0: none). Needs root (test hosts) and the simulator (a build
# with SimGrid: scripts/install-deps.sh).
# Writes OUT/comm-RATE.{json,txt} and OUT/scale-RATE/ (scale.json) and OUT/scale-RATE.txt; prints both tables.
set -euo pipefail

usage() {
  sed -n '2,19p' "$0" >&2
  exit 2
}
[ $# -ge 1 ] || usage
out=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
tessera=$here/build/app/tessera
testhosts=$here/scripts/testhosts.sh
rates=10gbit,1gbit
model=resnet18
size=96
batch=64
steps=16
rounds=1
auc_runs=3
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --tessera) tessera=$2 ;;
    --rates) rates=$2 ;;
    --model) model=$2 ;;
    --size) size=$2 ;;
    --batch) batch=$2 ;;
    --steps) steps=$2 ;;
    --rounds) rounds=$2 ;;
    --auc-runs) auc_runs=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[ -x "$tessera" ] || { echo "bench-hosts.sh: no tessera at $tessera (make build, or --tessera PATH)" >&2; exit 2; }
"$testhosts" check
mkdir -p "$out"
trap '"$testhosts" down' EXIT

for rate in ${rates//,/ }; do
  "$testhosts" up 2 --rate "$rate"
  echo "== $rate: tessera bench comm across t1, t2 (one rank each) =="
  "$tessera" bench comm --launcher "$testhosts mpirun --host t1:1,t2:1" --ranks 2 \
    --model "$model" --size "$size" --batch "$batch" --steps "$steps" --rounds "$rounds" \
    --json "$out/comm-$rate.json" | tee "$out/comm-$rate.txt"
  echo "== $rate: tessera bench scale --measured (SIMULATED against the measurement) =="
  "$tessera" bench scale --measured "$out/comm-$rate.json" --out "$out/scale-$rate" | tee "$out/scale-$rate.txt"
  "$testhosts" down
done

[ "$auc_runs" -gt 0 ] || exit 0
echo "== async-easgd: validation AUC on one host (4 ranks) and on 2 hosts x 2 ranks, $auc_runs runs each =="
"$testhosts" up 2 --rate 10gbit
data=$out/auc
mkdir -p "$data"
"$tessera" synth --out "$data/synth" --slides 8 --size 2048 --seed 5 --set preview.enabled=false \
  --set split.train=0.5 --set split.val=0.5 >"$data/synth.log" 2>&1
printf 'input:\n  csv: %s\ntile:\n  size: 32\n  mpp: 1.0\ntissue:\n  min_fraction: 0.3\n' "$data/synth/dataset.csv" \
  >"$data/tile.yaml"
"$tessera" tile "$data/tile.yaml" --out "$data/shards" >"$data/tile.log" 2>&1
printf 'data:\n  shards: %s\nmodel:\n  architecture: tiny_cnn\ntrain:\n  epochs: 3\n  batch_size: 8\n  threads: 1\noptimizer:\n  lr: 0.05\nschedule:\n  name: constant\n  reference_batch: 0\ndistributed:\n  strategy: async-easgd\n  tau: 2\n' \
  "$data/shards" >"$data/train.yaml"
final_auc() { grep '"kind":"val"' "$1/metrics.jsonl" | tail -1 | sed 's/.*"auc":\([0-9.e+-]*\).*/\1/'; }
for placement in one-host two-hosts; do
  aucs=""
  for run in $(seq 1 "$auc_runs"); do
    dir=$data/$placement-$run
    if [ "$placement" = one-host ]; then
      mpirun --allow-run-as-root --oversubscribe -n 4 "$tessera" train "$data/train.yaml" --out "$dir" >"$dir.log" 2>&1
    else
      "$testhosts" mpirun --host t1:2,t2:2 -n 4 "$tessera" train "$data/train.yaml" --out "$dir" >"$dir.log" 2>&1
    fi
    aucs="$aucs $(final_auc "$dir")"
  done
  echo "async-easgd, $placement: final validation AUC of each run:$aucs"
done
