#!/usr/bin/env bash
# Quality control's effect on detection, measured on twins (README "Slide quality control"): the same seed drawn once
# with every artefact class and once without (the same tissue and tumour), scored by one checkpoint with QC on
# (tessera infer's default), then evaluated. Each twin's FROC counts, besides CAMELYON16's, only the lesions mostly
# outside the excluded areas of both twins (tessera evaluate's also_excluded: the other twin's <slide>.qc.png).
#   scripts/qc-twins.sh CHECKPOINT OUTPUT [SEED] [SLIDES] [TESSERA]
# e.g. scripts/qc-twins.sh data/demo/train/checkpoint.h5 data/qc-twins 9201 16   (8192² px slides, half tumour)
# Prints per twin the FROC, the FROC outside excluded areas, the slide AUC and the normal slides' scores and
# false-positive regions; everything is in OUTPUT/<twin>/ (slides, infer, evaluation).
set -euo pipefail
checkpoint=$(realpath "${1:?checkpoint}") out=$(realpath -m "${2:?output folder}") seed=${3:-9201} slides=${4:-16}
tessera=${5:+$(realpath "$5")}  # paths given are taken from where the script is run
cd "$(dirname "$0")/.."
tessera=${tessera:-$(realpath build/app/tessera)}
for twin in clean artefacts; do
  on=$([ "$twin" = artefacts ] && echo true || echo false)
  "$tessera" synth configs/synth-artefacts.yaml --set seed="$seed" --set slides.count="$slides" \
    --set output="$out/$twin" --set artefacts.blur="$on" --set artefacts.pen_marks="$on" --set artefacts.folds="$on" \
    --set artefacts.red_ink="$on" --set artefacts.bubbles="$on" --set artefacts.exposure="$on"
  "$tessera" infer --checkpoint "$checkpoint" --csv "$out/$twin/dataset.csv" --out "$out/$twin/infer"
done
for twin in clean artefacts; do
  other=$([ "$twin" = artefacts ] && echo clean || echo artefacts)
  "$tessera" evaluate --dataset "$out/$twin/dataset.csv" --detections "$out/$twin/infer" \
    --set "also_excluded=[$out/$other/infer]" --out "$out/$twin/evaluation" | tee "$out/$twin/evaluation.txt"
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
scores = {}
for twin in ("clean", "artefacts"):
    e = json.load(open(f"{out}/{twin}/evaluation/evaluation.json"))
    normal = [s for s in e["per_slide"] if s["label"] == "normal"]
    scores[twin] = {s["slide_id"]: s["score"] for s in normal}
    o = e["froc_outside_excluded"] or {}
    print(f"{twin}: FROC {e['froc']['score']:.3f}, outside excluded areas of both twins {o.get('score', float('nan')):.3f} "
          f"({o.get('lesions')} lesions, {o.get('excluded_lesions')} left out), slide AUC {e['slide_auc']:.3f}, "
          f"false-positive detections on {len(normal)} normal slides {sum(s['false_positives'] for s in normal)}, "
          f"their scores {min(scores[twin].values()):.3f}-{max(scores[twin].values()):.3f}")
change = [abs(scores["artefacts"][k] - scores["clean"][k]) for k in scores["clean"]]
print(f"median normal-slide score change, artefacts vs clean: {statistics.median(change):.3f}")
PY
