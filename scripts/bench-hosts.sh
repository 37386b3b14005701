#!/usr/bin/env bash
# Tessera's strategies measured across the test hosts (scripts/testhosts.sh) at each link rate, and the simulator
# checked against every measurement:
#   1. `tessera bench comm` across 2 test hosts over TCP: allreduce bandwidth, then per strategy images/s, the
#      communication and waiting fractions, bytes per step, buckets with the communication thread and without;
#   2. `tessera bench scale --measured` on that report: SimGrid simulates the same hosts, its links calibrated from
#      the allreduce sweep and its computation from the ranks' step without a strategy (other runs than the
#      strategies' rows), and prints simulated against measured step time per strategy.
#
#   scripts/bench-hosts.sh OUT [--tessera PATH] [--rates 10gbit,1gbit] [--ranks-per-host K]
#                          [--model M --size PX --batch B --steps S --rounds R]
#
# Defaults: build/app/tessera; 10gbit and 1gbit; one rank per host (the hosts share this machine's cores: more
# ranks per host than cores per host slows computation, not the network); ResNet-18 at 96 px, batch 64 per rank,
# 16 steps, 1 round. Needs root (test hosts) and the simulator (a build with SimGrid: scripts/install-deps.sh).
# Writes OUT/comm-RATE.{json,txt} and OUT/scale-RATE/ (scale.json) and OUT/scale-RATE.txt; prints both tables.
set -euo pipefail

usage() {
  sed -n '2,17p' "$0" >&2
  exit 2
}
[ $# -ge 1 ] || usage
out=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
tessera=$here/build/app/tessera
testhosts=$here/scripts/testhosts.sh
rates=10gbit,1gbit
per_host=1
model=resnet18
size=96
batch=64
steps=16
rounds=1
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --tessera) tessera=$2 ;;
    --rates) rates=$2 ;;
    --ranks-per-host) per_host=$2 ;;
    --model) model=$2 ;;
    --size) size=$2 ;;
    --batch) batch=$2 ;;
    --steps) steps=$2 ;;
    --rounds) rounds=$2 ;;
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
  echo "== $rate: tessera bench comm across t1, t2 ($per_host rank(s) each) =="
  "$tessera" bench comm --launcher "$testhosts mpirun --host t1:$per_host,t2:$per_host" --ranks $((2 * per_host)) \
    --model "$model" --size "$size" --batch "$batch" --steps "$steps" --rounds "$rounds" \
    --json "$out/comm-$rate.json" | tee "$out/comm-$rate.txt"
  echo "== $rate: tessera bench scale --measured (SIMULATED against the measurement) =="
  "$tessera" bench scale --measured "$out/comm-$rate.json" --out "$out/scale-$rate" | tee "$out/scale-$rate.txt"
  "$testhosts" down
done
