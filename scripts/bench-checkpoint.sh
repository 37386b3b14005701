#!/usr/bin/env bash
# What one checkpoint of an EASGD run costs as the rank count grows (issue 14 §2): for each rank count, one
# `tessera train` step of ResNet-18 under easgd, then its checkpoint (every rank writes its own replica file beside
# the checkpoint). Prints per rank count: the checkpoint's seconds on rank 0, the MB of the checkpoint (rank 0) and
# of each rank's replica file, and rank 0's peak memory for the whole run (GNU time's maximum resident set size).
# With a second program (--compare path/to/other/tessera) it also prints that program's rank-0 peak memory and
# checkpoint size for the same runs (e.g. a build that gathers every replica into rank 0's file).
#   scripts/bench-checkpoint.sh [--tessera path/to/tessera] [--compare path/to/tessera] [--ranks "1 2 4 8"]
#                               [--architecture resnet18] [--work folder]
# On one machine, ranks beyond its cores are oversubscribed and share one disk: the seconds grow with the rank
# count for that reason, not because any rank writes more.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/app/tessera
compare=""
ranks_list="1 2 4 8"
architecture=resnet18
work=data/bench-checkpoint
while [ $# -gt 0 ]; do
  case $1 in
    --tessera) tessera=$2; shift 2 ;;
    --compare) compare=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --architecture) architecture=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "bench-checkpoint.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x /usr/bin/time ] || { echo "bench-checkpoint.sh: needs GNU time (/usr/bin/time: scripts/install-deps.sh --bench)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
work=$(cd "$work" && pwd)

if [ ! -f "$work/shards/manifest.json" ]; then
  "$tessera" synth --out "$work/synth" --slides 4 --size 1024 --seed 3 --set preview.enabled=false \
    --set split.train=0.5 --set split.val=0.5 >/dev/null 2>&1
  printf 'input:\n  csv: %s\noutput: %s\ntile:\n  size: 32\n  mpp: 1.0\ntissue:\n  min_fraction: 0.3\n' \
    "$work/synth/dataset.csv" "$work/shards" >"$work/tile.yaml"
  "$tessera" tile "$work/tile.yaml" >/dev/null 2>&1
fi
cat >"$work/train.yaml" <<YAML
data:
  shards: $work/shards
  block_size: 16
  shuffle_buffer: 64
model:
  architecture: $architecture
train:
  batch_size: 2
  max_steps: 1
  seed: 1
  threads: 1
  log_every: 1
optimizer:
  name: sgd
  lr: 0.01
  momentum: 0.9
distributed:
  strategy: easgd
  tau: 1
YAML

# run PROGRAM RANKS NAME: one step and its checkpoint; GNU time writes each rank's peak RSS (KB) to rss.<rank>.
run() {
  local program=$1 ranks=$2 name=$3
  local out="$work/$name-$ranks"
  rm -rf "$out" "$work/$name-$ranks.rss".*
  mpirun -n "$ranks" --oversubscribe sh -c '/usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' \
    "$out" "$program" train "$work/train.yaml" --out "$out" --log-level debug >"$out.log" 2>&1 ||
    { echo "bench-checkpoint.sh: $name on $ranks rank(s) failed:" >&2; tail -20 "$out.log" >&2; exit 1; }
}
mb() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

echo "$architecture, easgd, one checkpoint after one step; $(nproc) cores, ranks oversubscribed beyond them"
printf '%-6s %-12s %-16s %-20s %-18s' ranks "seconds" "checkpoint MB" "replica file MB/rank" "rank 0 peak MB"
[ -n "$compare" ] && printf ' %-24s %-22s' "compared: rank 0 peak MB" "compared: checkpoint MB"
echo
for ranks in $ranks_list; do
  run "$tessera" "$ranks" new
  line=$(grep "checkpoint .*/checkpoint.h5 written in" "$work/new-$ranks.log" | tail -1)
  seconds=$(sed -n 's/.* written in \([0-9.]*\) s.*/\1/p' <<<"$line")
  replica=$(sed -n 's/.* replica file(s) of \([0-9.]*\) MB.*/\1/p' <<<"$line")
  peak=$(awk '{printf "%.0f", $1 / 1024}' "$work/new-$ranks.rss.0")
  printf '%-6s %-12s %-16s %-20s %-18s' "$ranks" "$seconds" "$(mb "$(stat -c %s "$work/new-$ranks/checkpoint.h5")")" \
    "$replica" "$peak"
  if [ -n "$compare" ]; then
    run "$compare" "$ranks" compared
    printf ' %-24s %-22s' "$(awk '{printf "%.0f", $1 / 1024}' "$work/compared-$ranks.rss.0")" \
      "$(mb "$(stat -c %s "$work/compared-$ranks/checkpoint.h5")")"
  fi
  echo
done
