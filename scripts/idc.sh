#!/usr/bin/env bash
# The real-data experiment: the IDC patches of ../shared/data/idc imported and split by patient
# (configs/import-idc.yaml), the compact CNN trained by configs/train-idc.yaml for each seed, the val and test
# patients predicted with the decision threshold chosen on the val patients (`tessera predict --threshold-from val`),
# and the PyTorch peer (scripts/idc_torch.py: the same model shape, split and recipe, read from the Tessera run's
# train.config.yaml) for each seed. Prints a table of
# the test patients' AUC, balanced accuracy and F1 per run, and their mean and range.
#   scripts/idc.sh [path/to/tessera] [seeds]        e.g. scripts/idc.sh build/app/tessera "1 2 3"
# Both sides score each val and test patch as the mean P over its 8 symmetries (test-time augmentation, TTA=d8; set
# TTA=none for one view). Set TORCH=0 to leave out the PyTorch side, TORCH_THREADS=1 to run it on one thread (on a
# loaded machine two of its threads wait on each other far longer than they save). Results stay in data/idc/ (a rerun
# reuses finished runs).
set -euo pipefail
tessera=$(realpath "${1:-build/app/tessera}")
seeds=${2:-"1 2 3"}
cd "$(dirname "$0")/.."
[ -d ../shared/data/idc ] || { echo "scripts/idc.sh: ../shared/data/idc is not here (the real IDC patches)" >&2; exit 3; }
/usr/bin/python3 -c 'import yaml' 2>/dev/null ||
  { echo "scripts/idc.sh: needs /usr/bin/python3 with PyYAML (scripts/install-deps.sh --bench)" >&2; exit 2; }
tta=${TTA:-d8}
epochs=$(sed -n 's/^ *epochs: *\([0-9]*\).*/\1/p' configs/train-idc.yaml | head -n 1)

[ -f data/idc/shards/manifest.json ] || "$tessera" import configs/import-idc.yaml
mkdir -p data/idc/results
# Whether a run's effective config ($1) is the recipe (on standard input): every key of the run but where it
# went has the recipe's value (keys a later version added, at their defaults, do not count).
same_recipe() {
  /usr/bin/python3 -c 'import sys, yaml
def flat(d, p=""):
    return {k: v for key, value in d.items()
            for k, v in (flat(value, p + key + ".").items() if isinstance(value, dict) else [(p + key, value)])}
run, recipe = flat(yaml.safe_load(open(sys.argv[1]))), flat(yaml.safe_load(sys.stdin))
sys.exit(any(k not in ("output", "train.resume") and recipe.get(k, object()) != v for k, v in run.items()))' "$1"
}
for seed in $seeds; do
  run=data/idc/train-seed$seed
  set_seed=(--set train.seed="$seed" --set output="$run" --set train.resume=auto)
  # A run left by another recipe (an earlier configs/train-idc.yaml) would be resumed into this one's schedule.
  if [ -f "$run/train.config.yaml" ] && ! "$tessera" train configs/train-idc.yaml "${set_seed[@]}" --print-config \
      | same_recipe "$run/train.config.yaml"; then
    echo "scripts/idc.sh: $run/train.config.yaml is not the recipe of configs/train-idc.yaml; move $run and" \
      "data/idc/results aside" >&2
    exit 3
  fi
  if [ ! -f "$run/checkpoint-epoch-$(printf %03d "$epochs").h5" ]; then
    rm -f "data/idc/results/torch-seed$seed.json"  # the peer of an earlier run of this seed
    start=$(date +%s)
    "$tessera" train configs/train-idc.yaml "${set_seed[@]}"
    echo $(($(date +%s) - start)) > "$run/wall-seconds"
  fi
  "$tessera" predict --checkpoint "$run/checkpoint.h5" --shards data/idc/shards --splits val,test \
    --threshold-from val --tta "$tta" --out "data/idc/results/tessera-seed$seed.csv"
  # The peer's result is kept only when it was scored with the same test-time augmentation.
  if [ "${TORCH:-1}" != 0 ] && ! /usr/bin/python3 -c 'import json, sys
sys.exit(json.load(open(sys.argv[1])).get("tta", "none") != sys.argv[2])' "data/idc/results/torch-seed$seed.json" "$tta" \
    2>/dev/null; then
    /usr/bin/python3 scripts/idc_torch.py --shards data/idc/shards --config "$run/train.config.yaml" --seed "$seed" \
      --threads "${TORCH_THREADS:-2}" --tta "$tta" \
      > "data/idc/results/torch-seed$seed.json.part"
    mv "data/idc/results/torch-seed$seed.json.part" "data/idc/results/torch-seed$seed.json"
  fi
done

/usr/bin/python3 - "$seeds" <<'PY'
import json, os, sys
seeds = sys.argv[1].split()
rows = {}
for side, pattern in (("tessera", "data/idc/results/tessera-seed%s.json"), ("pytorch", "data/idc/results/torch-seed%s.json")):
    for seed in seeds:
        path = pattern % seed
        if not os.path.exists(path):
            continue
        result = json.load(open(path))
        test = result["per_split"]["test"]
        seconds = result.get("train_seconds")
        if side == "tessera":
            wall = "data/idc/train-seed%s/wall-seconds" % seed
            seconds = float(open(wall).read()) if os.path.exists(wall) else None
        rows.setdefault(side, []).append((seed, test["auc"], test["balanced_accuracy"], test["f1"], result["threshold"],
                                          result["per_split"]["val"]["auc"], seconds))
print("side     seed  test AUC  balanced acc.  F1      threshold (val)  val AUC  train s")
for side, runs in rows.items():
    for seed, auc, ba, f1, t, val_auc, s in runs:
        print("%-8s %-5s %.4f    %.4f         %.4f  %.4f           %.4f   %s" % (
            side, seed, auc, ba, f1, t, val_auc, "%.0f" % s if s else "-"))
    for name, k in (("AUC", 1), ("balanced accuracy", 2), ("F1", 3), ("val AUC", 5)):
        values = [r[k] for r in runs]
        print("%-8s %s: mean %.4f, range %.4f-%.4f over %d seed(s)" % (side, name, sum(values) / len(values), min(values), max(values), len(values)))
PY
