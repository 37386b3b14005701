#!/usr/bin/env bash
# Batch 4096 as decentralized EASGD runs it at scale, 16 ranks x 256 tiles, against batch 256, on 16 oversubscribed
# ranks: the large-batch slides (configs/synth-largebatch.yaml) tiled at 16 px and 2 um/px (the 32 um field of
# configs/tile-largebatch.yaml at half its resolution: harder, and four times less compute per tile), the compact
# CNN for the same epochs in each of
#   batch256         allreduce, 16 ranks x 16, SGD (configs/train-batch256.yaml's recipe: lr 0.1 at 256)
#   allreduce-lars   allreduce, 16 ranks x 256 = 4096, LARS, warmup, poly (configs/train-batch4096.yaml, no accumulation)
#   easgd            easgd tau 8, 16 ranks x 256: each replica an SGD learner on its own 256 tiles (rate 0.1)
# and prints each run's validation AUC, loss and steps.
#   scripts/batch4096.sh [path/to/tessera] [epochs]
# DATA=idc runs the same three on the real IDC patches instead (../shared/data/idc, the patient split and 32 px
# patches of scripts/convergence.sh: 5,432 training patches, 1,130 validation), where one rank's AUC is about 0.92
# rather than 1: at 4096 a rank's 339 patches make one step per epoch, so give it many epochs (e.g. 30).
# Runs stay in data/batch4096/ (data/batch4096-idc/ with DATA=idc; BATCH4096_DIR); a rerun skips the finished ones.
set -euo pipefail
tessera=$(realpath "${1:-build/app/tessera}")
epochs=${2:-3}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data=${DATA:-synthetic}
case $data in
  synthetic) root=${BATCH4096_DIR:-data/batch4096} ;;
  idc) root=${BATCH4096_DIR:-data/batch4096-idc} ;;
  *) echo "scripts/batch4096.sh: DATA is synthetic or idc, not '$data'" >&2; exit 2 ;;
esac
ranks=16
mpi() { mpirun -n "$ranks" --oversubscribe --bind-to none "$tessera" "$@"; }
prepare() { mpirun -n 4 --oversubscribe --bind-to none "$tessera" "$@"; }  # 12 slides: 3 per rank
mkdir -p "$root"

if [ "$data" = idc ]; then
  [ -d ../shared/data/idc ] || { echo "scripts/batch4096.sh: ../shared/data/idc is not here (the real IDC patches)" >&2; exit 3; }
  [ -f "$root/shards/manifest.json" ] ||
    "$tessera" import configs/import-idc.yaml --set output="$root/shards" --set tile.size=32 --set import.fit=resize
else
  [ -f "$root/slides/dataset.csv" ] || prepare synth configs/synth-largebatch.yaml --set output="$root/slides"
  [ -f "$root/shards/manifest.json" ] || prepare tile configs/tile-largebatch.yaml --set input.csv="$root/slides/dataset.csv" \
    --set output="$root/shards" --set tile.size=16 --set tile.mpp=2.0
fi

common=(--set data.shards="$root/shards" --set train.epochs="$epochs" --set train.threads=1 --set train.log_every=1)
run() {
  local name=$1
  shift
  [ -f "$root/$name/checkpoint-epoch-$(printf %03d "$epochs").h5" ] && return 0
  local start
  start=$(date +%s)
  echo "$(date -u +%H:%M:%S) $name (load $(cut -d' ' -f1-3 /proc/loadavg))"
  mpi train "$@" --out "$root/$name" "${common[@]}" >"$root/$name.log" 2>&1
  echo $(($(date +%s) - start)) >"$root/$name/wall-seconds"
}
run batch256 configs/train-batch256.yaml --set train.batch_size=16
run allreduce-lars configs/train-batch4096.yaml --set train.batch_size=256 --set train.accumulation_steps=1
run easgd configs/train-batch256.yaml --set train.batch_size=256 --set distributed.strategy=easgd \
  --set distributed.tau=8

/usr/bin/python3 - "$root" <<'PY'
import json, os, sys
root = sys.argv[1]
print("| run | global batch | per-worker rate | steps | val AUC | val loss | val accuracy | wall s |")
print("|---|---|---|---|---|---|---|---|")
for name, batch in (("batch256", 256), ("allreduce-lars", 4096), ("easgd", 4096)):
    path = os.path.join(root, name, "metrics.jsonl")
    if not os.path.exists(path):
        print("| %s | %d | not run | | | | | |" % (name, batch))
        continue
    lines = [json.loads(l) for l in open(path)]
    train = [l for l in lines if l["kind"] == "train"]
    val = [l for l in lines if l["kind"] == "val"][-1]
    wall = open(os.path.join(root, name, "wall-seconds")).read().strip()
    print("| %s | %d | %.4g | %d | %.4f | %.4f | %.4f | %s |" % (
        name, batch, max(l["lr"] for l in train), train[-1]["step"], val["auc"], val["loss"], val["accuracy"], wall))
PY
