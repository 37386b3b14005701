#!/usr/bin/env bash
# The demo: the whole pipeline on generated data, from a fresh machine (make demo builds, then runs this).
#   synth -> tile -> train (2 ranks, EASGD) -> predict the held-out tiles -> infer the held-out slides -> evaluate
set -euo pipefail
tessera=${1:-build/app/tessera}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ranks=2
mpirun=(mpirun -n "$ranks" --oversubscribe)
start=$SECONDS
step() { echo; echo "== $1   [$((SECONDS - start)) s]"; }

step "1. synthetic slides with ground truth (tessera synth, ${ranks} ranks)"
"${mpirun[@]}" "$tessera" synth configs/synth-demo.yaml

step "2. what is in a slide (tessera info)"
"$tessera" info data/demo/slides/tumor_001.svs data/demo/slides/normal_001.tif

step "3. labelled training tiles in HDF5 shards (tessera tile, ${ranks} ranks)"
"${mpirun[@]}" "$tessera" tile configs/tile-demo.yaml

step "4. a tumour/normal CNN trained on the tiles (tessera train, ${ranks} ranks, EASGD, validation every epoch)"
"${mpirun[@]}" "$tessera" train configs/train-demo.yaml --set train.resume=auto

step "5. the trained model on the held-out test slides' tiles (tessera predict, ${ranks} ranks)"
"${mpirun[@]}" "$tessera" predict --checkpoint data/demo/train/checkpoint.h5 \
  --shards data/demo/shards --splits test --out data/demo/predictions/test.csv

step "6. tumour heatmaps of the held-out test slides (tessera infer, ${ranks} ranks)"
"${mpirun[@]}" "$tessera" infer configs/infer-demo.yaml

step "7. CAMELYON16-style scores against the pathologist's ground truth (tessera evaluate)"
"$tessera" evaluate configs/evaluate-demo.yaml

echo
echo "Demo done in $((SECONDS - start)) s."
echo "  slides, ASAP XML and QuPath GeoJSON annotations: data/demo/slides/"
echo "  slide list with labels and splits:               data/demo/dataset.csv"
echo "  slide previews with the ground truth outlined:    data/demo/previews/"
echo "  training shards and their manifest:              data/demo/shards/ (tiling previews in shards/previews/)"
echo "  the trained model and its learning curve:        data/demo/train/ (checkpoint.h5, metrics.csv)"
echo "  P(tumour) per test tile and the test AUC:        data/demo/predictions/ (test.csv, test.json)"
echo "  heatmaps of the held-out slides:                 data/demo/infer/<slide>.overlay.png (open in an image viewer),"
echo "                                                   .heatmap.tif (OpenSlide, QuPath), .geojson (QuPath),"
echo "                                                   .xml (ASAP), .detections.csv, .report.json"
echo "  scores, FROC and ROC curves:                     data/demo/evaluation/ (evaluation.json, froc.png, roc.png)"
echo
echo "To look at the slides, their heatmaps and regions in a web browser (a local server; Ctrl-C stops it):"
echo "  $tessera view data/demo/infer"
