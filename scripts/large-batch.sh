#!/usr/bin/env bash
# The large-batch experiment: the same network trained for the same epochs with a global batch of 256 (SGD) and of
# 4096 (LARS, warmup, 8 accumulated micro-batches per rank), on generated slides. Prints both validation AUCs.
#   scripts/large-batch.sh [path/to/tessera] [ranks]
set -euo pipefail
tessera=${1:-build/app/tessera}
ranks=${2:-2}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { mpirun -n "$ranks" --oversubscribe "$tessera" "$@"; }

[ -f data/largebatch/dataset.csv ] || run synth configs/synth-largebatch.yaml
[ -f data/largebatch/shards/manifest.json ] || run tile configs/tile-largebatch.yaml
# The configs give 2 ranks the global batches 256 and 4096; other rank counts keep them by the micro-batch size.
per_rank_256=$((256 / ranks))
per_rank_4096=$((4096 / ranks / 8))
run train configs/train-batch256.yaml --set train.batch_size="$per_rank_256" --set train.resume=auto
run train configs/train-batch4096.yaml --set train.batch_size="$per_rank_4096" --set train.resume=auto

echo
for run_dir in data/largebatch/batch256 data/largebatch/batch4096; do
  last=$(tail -n 1 "$run_dir/metrics.csv")
  echo "$run_dir: epoch,step,lr,train_loss,val_loss,val_accuracy,val_auc,seconds = $last"
done
