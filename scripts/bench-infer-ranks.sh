#!/bin/sh
# Many slides on many ranks: `tessera infer` over N small slides (default 16) on the same two cores three ways,
#   1x2         1 rank x 2 threads
#   2x1-slides  2 ranks x 1 thread, whole slides handed out to the ranks (infer.distribute slides)
#   2x1-tiles   2 ranks x 1 thread, every slide's tiles split over both ranks (infer.distribute tiles)
# in alternated rounds (default 3), and prints for each its infer.json seconds (first slide to the end of the job:
# the model load and MPI start-up excluded) and the whole command's wall time, best and median over the rounds,
# with each rank's idle fraction in the best round (infer.json's per_rank: the time a rank waited for work or for
# the other ranks over its wall time). Every output is written (infer's default), as a user's job would.
#
# The model is the untrained `compact` checkpoint `tessera bench infer-slide` writes (96 px tiles at 1 um/px,
# Reinhard stain normalization; untrained weights score as fast as trained ones); the slides come from
# `tessera synth` (SIZE x SIZE px at 0.25 um/px). Both are made once in the work folder.
#
# BIG=SIZE adds one slide of SIZE x SIZE px to the job (e.g. BIG=16384 SLIDES=8: one slide that dwarfs the rest) and a
# fourth way, 2x1-auto: 2 ranks x 1 thread with infer.distribute auto, which splits the tiles of the slides larger
# than a rank's share of the slides left over both ranks first and hands out the rest whole. Each run prints how its
# slides went (infer.json's distribute and split_slides).
#
# HOSTS=1 adds two runs of 4 ranks x 1 thread with whole slides: on this machine alone (4x1-slides), and across two
# test hosts of scripts/testhosts.sh, 2 ranks each, over TCP (4x1-hosts; root and network namespaces needed; the
# hosts are made at 10 Gbit/s and removed at the end). On a 2-core machine these 4 ranks share the same 2 cores.
#
#   scripts/bench-infer-ranks.sh [work folder]        (default data/bench-infer-ranks)
#   SLIDES=16 SIZE=4096 BIG= ROUNDS=3 HOSTS=0 TESSERA=build/app/tessera MPIEXEC="mpirun ..." scripts/bench-infer-ranks.sh
set -eu

TESSERA=${TESSERA:-build/app/tessera}
MPIEXEC=${MPIEXEC:-mpirun --allow-run-as-root --oversubscribe}
WORK=${1:-data/bench-infer-ranks}
SLIDES=${SLIDES:-16}
SIZE=${SIZE:-4096}
ROUNDS=${ROUNDS:-3}
BIG=${BIG:-}
HOSTS=${HOSTS:-0}
TESTHOSTS=$(dirname "$0")/testhosts.sh

mkdir -p "$WORK"
# Absolute paths: the ranks on the test hosts start in their own namespaces.
WORK=$(realpath "$WORK")
TESSERA=$(realpath "$TESSERA")
if [ ! -f "$WORK/model/checkpoint.h5" ]; then
  "$TESSERA" bench infer-slide --size 1024 --rounds 1 --no-python --workdir "$WORK/model" >"$WORK/model.log" 2>&1
fi
if [ ! -f "$WORK/synth/dataset.csv" ]; then
  "$TESSERA" synth --out "$WORK/synth" --slides "$SLIDES" --size "$SIZE" --seed 3 --set preview.enabled=false \
    >"$WORK/synth.log" 2>&1
fi
input="--csv $WORK/synth/dataset.csv"
if [ -n "$BIG" ]; then
  # A tumour slide of BIG x BIG px under its own name (synth names its slides tumor_001, ... in every folder).
  if [ ! -f "$WORK/big-$BIG.svs" ]; then
    "$TESSERA" synth --out "$WORK/big-synth-$BIG" --slides 1 --size "$BIG" --seed 5 --set slides.tumour_fraction=1 \
      --set preview.enabled=false >"$WORK/big-synth-$BIG.log" 2>&1
    cp "$WORK/big-synth-$BIG/slides/tumor_001.svs" "$WORK/big-$BIG.svs"
  fi
  list="$WORK/big-$BIG.svs"
  for slide in "$WORK"/synth/slides/*.svs "$WORK"/synth/slides/*.tif; do
    if [ -f "$slide" ]; then list="$list,$slide"; fi
  done
  input="--slides $list"
fi

now() { date +%s.%N; }
# run NAME "LAUNCHER" "ARGS": one infer job into $WORK/runs/NAME-ROUND, its wall time in wall.txt
run() {
  name=$1
  out="$WORK/runs/$name-$round"
  rm -rf "$out"
  start=$(now)
  # shellcheck disable=SC2086  # the launcher and the arguments are word lists
  $2 "$TESSERA" infer --checkpoint "$WORK/model/checkpoint.h5" $input --out "$out" $3 >"$WORK/runs/$name-$round.log" 2>&1
  end=$(now)
  echo "$start $end" | awk '{ printf "%.3f\n", $2 - $1 }' >"$out/wall.txt"
}

names="1x2 2x1-slides 2x1-tiles"
if [ -n "$BIG" ]; then
  names="$names 2x1-auto"
fi
if [ "$HOSTS" = 1 ]; then
  "$TESTHOSTS" check
  trap '"$TESTHOSTS" down' EXIT
  "$TESTHOSTS" up 2 --rate 10gbit >/dev/null
  names="$names 4x1-slides 4x1-hosts"
fi

mkdir -p "$WORK/runs"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
round=1
while [ "$round" -le "$ROUNDS" ]; do
  run 1x2 "" "--threads 2"
  run 2x1-slides "$MPIEXEC -n 2" "--threads 1 --distribute slides"
  run 2x1-tiles "$MPIEXEC -n 2" "--threads 1 --distribute tiles"
  if [ -n "$BIG" ]; then
    run 2x1-auto "$MPIEXEC -n 2" "--threads 1 --distribute auto"
  fi
  if [ "$HOSTS" = 1 ]; then
    run 4x1-slides "$MPIEXEC -n 4" "--threads 1 --distribute slides"
    run 4x1-hosts "$TESTHOSTS mpirun --host t1:2,t2:2 -n 4" "--threads 1 --distribute slides"
  fi
  round=$((round + 1))
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# shellcheck disable=SC2086  # one argument per run name
python3 - "$WORK/runs" "$ROUNDS" $names <<'EOF'
import json, statistics, sys
runs, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
figures = {}
for name in names:
    rows = []
    for r in range(1, rounds + 1):
        with open(f"{runs}/{name}-{r}/infer.json") as f:
            summary = json.load(f)
        with open(f"{runs}/{name}-{r}/wall.txt") as f:
            wall = float(f.read())
        rows.append((summary["seconds"], wall, summary))
    best = min(rows, key=lambda row: row[0])
    figures[name] = best[0]
    idle = ", ".join(f"rank {p['rank']} {100 * p['idle_fraction']:.1f}%" for p in best[2]["per_rank"])
    print(f"{name:11s} infer.json seconds best {best[0]:.2f} median {statistics.median(r[0] for r in rows):.2f}; "
          f"wall best {min(r[1] for r in rows):.2f} median {statistics.median(r[1] for r in rows):.2f}; "
          f"{best[2]['tiles']} tiles, {len(best[2]['slides'])} slides; idle {idle}; "
          f"distribute {best[2]['distribute']}, split {', '.join(best[2].get('split_slides', [])) or 'none'}")
for name in names[1:]:
    print(f"{name} against 1x2 (best seconds): {figures['1x2'] / figures[name]:.2f}x")
EOF
