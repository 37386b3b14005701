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
echo "Demo done. Slides, ASAP XML and QuPath GeoJSON annotations: data/demo/slides/"
echo "Slide list with labels and splits: data/demo/dataset.csv; previews: data/demo/previews/"
