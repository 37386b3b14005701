#!/usr/bin/env bash
# The demo: everything Tessera can do today, on generated data, from a fresh machine.
set -euo pipefail
tessera=${1:-build/app/tessera}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

ranks=2
echo "== 1. synthetic slides with ground truth (tessera synth, ${ranks} ranks)"
mpirun -n "$ranks" --oversubscribe "$tessera" synth configs/synth-demo.yaml

echo
echo "== 2. what is in a slide (tessera info)"
"$tessera" info data/demo/slides/tumor_001.svs data/demo/slides/normal_001.tif

echo
echo "== 3. labelled training tiles in HDF5 shards (tessera tile, ${ranks} ranks)"
mpirun -n "$ranks" --oversubscribe "$tessera" tile configs/tile-demo.yaml

echo
echo "== 4. a tumour/normal CNN trained on the tiles (tessera train, ${ranks} ranks, validation every epoch)"
mpirun -n "$ranks" --oversubscribe "$tessera" train configs/train-demo.yaml --set train.resume=auto

echo
echo "== 5. the trained model on the held-out test slides (tessera predict, ${ranks} ranks)"
mpirun -n "$ranks" --oversubscribe "$tessera" predict --checkpoint data/demo/train/checkpoint.h5 \
  --shards data/demo/shards --splits test --out data/demo/predictions/test.csv

echo
echo "Demo done."
echo "  slides, ASAP XML and QuPath GeoJSON annotations: data/demo/slides/"
echo "  slide list with labels and splits:               data/demo/dataset.csv"
echo "  slide previews with the ground truth outlined:    data/demo/previews/"
echo "  training shards and their manifest:              data/demo/shards/ (tiling previews in shards/previews/)"
echo "  the trained model and its learning curve:        data/demo/train/ (checkpoint.h5, metrics.csv)"
echo "  P(tumour) per test tile and the test AUC:        data/demo/predictions/ (test.csv, test.json)"
