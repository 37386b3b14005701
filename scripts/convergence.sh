#!/usr/bin/env bash
# The convergence experiment: the compact CNN trained on the real IDC patches (../shared/data/idc, imported at 32 px
# and split by patient) by configs/train-convergence.yaml under allreduce, easgd (tau 4 and 8) and two-level
# (ranks_per_node 4, inter easgd) on 1, 4, 8 and 16 ranks (oversubscribed on this machine), the same epochs each; then
# a table of every run: per-worker rate, per-rank and global batch, validation AUC and loss, wall time, and whether
# the run came within 0.01 of the one-rank AUC and within 10% of its loss (the one-rank run of as many epochs, when
# there is one).
#   scripts/convergence.sh [path/to/tessera] [path/to/old/tessera]
# The second program (e.g. a build from before the rate followed the batch one update averages) runs the easgd rows
# at 8 and 16 ranks again, marked "old". ROWS picks runs ("strategy:ranks ...", strategy one of allreduce, easgd4,
# easgd8, two-level; e.g. ROWS="easgd8:16"), OLD_ROWS the old program's. Runs stay in data/convergence/ (CONVERGENCE_DIR):
# a rerun skips the finished ones, so the table fills in as runs end. EPOCHS=N trains the chosen rows for N epochs
# instead of the config's (folders marked -eN), e.g. to see how many epochs a row needs to meet the one-rank run.
# SEED=N trains the chosen rows with train.seed N instead of the config's 1 (folders marked -sN): the initial weights,
# the data order and the augmentation. With runs of several seeds the table ends with their means per row, each
# against the mean of the one-rank runs of as many epochs (over the same seeds).
# LR=x trains the chosen rows with optimizer.lr x instead of the config's (folders marked -lrX; the per-worker rate
# follows it as section 1 says), e.g. EASGD's base rate at p ranks; BETA=b likewise sets distributed.beta (-bB).
# Every row is compared with the one-rank runs of the config's optimizer.lr.
set -euo pipefail
tessera=$(realpath "${1:-build/app/tessera}")
old=${2:+$(realpath "$2")}
cd "$(dirname "$0")/.."
[ -d ../shared/data/idc ] || { echo "scripts/convergence.sh: ../shared/data/idc is not here (the real IDC patches)" >&2; exit 3; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
root=${CONVERGENCE_DIR:-data/convergence}
config=configs/train-convergence.yaml
rows=${ROWS-"allreduce:1 allreduce:4 easgd4:4 easgd8:4 two-level:4 allreduce:8 easgd4:8 easgd8:8 two-level:8
  allreduce:16 easgd4:16 easgd8:16 two-level:16"}
old_rows=${OLD_ROWS-"easgd4:8 easgd8:8 easgd4:16 easgd8:16"}
mkdir -p "$root/runs"

[ -f "$root/shards/manifest.json" ] ||
  "$tessera" import configs/import-idc.yaml --set output="$root/shards" --set tile.size=32 --set import.fit=resize

settings() {
  case $1 in
    allreduce) echo "--set distributed.strategy=allreduce" ;;
    easgd4) echo "--set distributed.strategy=easgd --set distributed.tau=4" ;;
    easgd8) echo "--set distributed.strategy=easgd --set distributed.tau=8" ;;
    two-level) echo "--set distributed.strategy=two-level --set distributed.inter=easgd --set distributed.ranks_per_node=4 --set distributed.tau=4" ;;
    *) echo "scripts/convergence.sh: unknown row strategy '$1'" >&2; exit 2 ;;
  esac
}

# One run: train unless finished, then its figures into the run folder's row.json.
train() {
  local program=$1 strategy=$2 ranks=$3 tag=$4
  local out="$root/runs/$strategy-$ranks$tag${EPOCHS:+-e$EPOCHS}${SEED:+-s$SEED}${LR:+-lr$LR}${BETA:+-b$BETA}"
  [ -f "$out/row.json" ] && return 0
  settings "$strategy" >/dev/null || exit 2  # an unknown row stops the script before any run
  rm -rf "$out"
  local threads=1
  [ "$ranks" = 1 ] && threads=0
  local load start status=0
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  start=$(date +%s)
  echo "$(date -u +%H:%M:%S) $strategy on $ranks rank(s)$tag (load $load)"
  # shellcheck disable=SC2046
  mpirun -n "$ranks" --oversubscribe --bind-to none "$program" train "$config" --out "$out" \
    --set data.shards="$root/shards" --set train.threads="$threads" \
    ${EPOCHS:+--set train.epochs=$EPOCHS} ${SEED:+--set train.seed=$SEED} \
    ${LR:+--set optimizer.lr=$LR} ${BETA:+--set distributed.beta=$BETA} $(settings "$strategy") >"$out.log" 2>&1 || status=$?
  if [ "$status" != 0 ]; then
    echo "  failed (exit $status): $out.log" >&2
    return 0
  fi
  /usr/bin/python3 - "$out" "$strategy" "$ranks" "$tag" "$(($(date +%s) - start))" "$load" "$out.log" <<'PY'
import json, re, sys
out, strategy, ranks, tag, seconds, load, log = sys.argv[1:]
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
train = [l for l in lines if l.get("kind") == "train"]
val = [l for l in lines if l.get("kind") == "val"]
config = open(out + "/train.config.yaml").read()
batch = int(re.search(r"batch_size: *(\d+)", config).group(1))
seed = int(re.search(r"seed: *(\d+)", config).group(1))
base_lr = float(re.search(r"\noptimizer:(?:\n .*)*?\n  lr: *(\S+)", config).group(1))
beta = float(re.search(r"\n  beta: *(\S+)", config).group(1))
logged = re.search(r"learning rate (\S+) per update", open(log).read())
row = {"strategy": strategy, "ranks": int(ranks), "program": "old" if tag else "new", "batch": batch,
       "global_batch": batch * int(ranks), "seed": seed, "base_lr": base_lr, "beta": beta, "peak_lr": max(l["lr"] for l in train),
       "logged_lr": float(logged.group(1)) if logged else None, "steps": train[-1]["step"],
       "val_auc": val[-1]["auc"], "val_loss": val[-1]["loss"], "val_tiles": val[-1]["tiles"],
       "epochs": val[-1]["epoch"], "wall_seconds": int(seconds), "load_at_start": load}
json.dump(row, open(out + "/row.json", "w"))
print("  AUC %.4f, loss %.4f, %s s" % (row["val_auc"], row["val_loss"], seconds))
PY
}

for row in $rows; do train "$tessera" "${row%:*}" "${row#*:}" ""; done
if [ -n "$old" ]; then
  for row in $old_rows; do train "$old" "${row%:*}" "${row#*:}" "-old"; done
fi

/usr/bin/python3 - "$root" "$config" <<'PY'
import glob, json, re, statistics, sys
rows = [json.load(open(p)) for p in glob.glob(sys.argv[1] + "/runs/*/row.json")]
config_lr = float(re.search(r"\noptimizer:(?:\n .*)*?\n  lr: *(\S+)", open(sys.argv[2]).read()).group(1))
for r in rows:
    r.setdefault("seed", 1)  # rows written before the seed, base rate and beta were recorded: the config's
    r.setdefault("base_lr", config_lr)
    r.setdefault("beta", 0.9)
# Each row against the one-rank run of the config's rate, as many epochs and the same seed, or, without one, the
# one-rank run of the fewest epochs (the config's) of that seed.
base = sorted((r for r in rows if r["ranks"] == 1 and r["program"] == "new" and r["base_lr"] == config_lr),
              key=lambda r: r["epochs"])
base_of = {(r["epochs"], r["seed"]): r for r in base}
order = {"allreduce": 0, "easgd4": 1, "easgd8": 2, "two-level": 3}
name = {"easgd4": "easgd, tau 4", "easgd8": "easgd, tau 8", "two-level": "two-level (4 per node, inter easgd, tau 4)"}
rows.sort(key=lambda r: (r["program"] != "new", r["epochs"], r["ranks"], order[r["strategy"]], r["base_lr"], r["beta"],
                         r["seed"]))


def goal(auc, loss, b_auc, b_loss):
    if auc >= b_auc - 0.01 and loss <= 1.1 * b_loss:
        return "met"
    return "not met (AUC %+.4f, loss %+.1f%%)" % (auc - b_auc, 100 * (loss / b_loss - 1))


print("| strategy | ranks | code | epochs | seed | optimizer.lr | beta | per-worker rate | per-rank batch | global batch | steps | val AUC | val loss | wall s | goal |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    verdict = "-"
    of_seed = [b for b in base if b["seed"] == r["seed"]]
    b = base_of.get((r["epochs"], r["seed"]), of_seed[0] if of_seed else None)
    if b is not None and r is not b:
        verdict = goal(r["val_auc"], r["val_loss"], b["val_auc"], b["val_loss"])
        if b["epochs"] != r["epochs"]:
            verdict += " against the %d-epoch one-rank run" % b["epochs"]
    print("| %s | %d | %s | %d | %d | %.5g | %.3g | %.5g | %d | %d | %d | %.4f | %.4f | %d | %s |" % (
        name.get(r["strategy"], r["strategy"]), r["ranks"], r["program"], r["epochs"], r["seed"], r["base_lr"],
        r["beta"], r["peak_lr"],
        r["batch"], r["global_batch"], r["steps"], r["val_auc"], r["val_loss"], r["wall_seconds"], verdict))

# Means over seeds, where a row has more than one: each against the mean of the one-rank runs of as many epochs.
groups = {}
for r in rows:
    groups.setdefault((r["program"], r["epochs"], r["ranks"], r["strategy"], r["base_lr"], r["beta"]), []).append(r)
if any(len(g) > 1 for g in groups.values()):
    print()
    print("| strategy | ranks | code | epochs | optimizer.lr | beta | per-worker rate | seeds | val AUC mean (min-max) | "
          "val loss mean (min-max) | goal on the means |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (program, epochs, ranks, strategy, base_lr, beta), g in groups.items():
        one = groups.get(("new", epochs, 1, "allreduce", config_lr, 0.9))
        auc = statistics.mean(r["val_auc"] for r in g)
        loss = statistics.mean(r["val_loss"] for r in g)
        verdict = "-"
        if one is not None and g is not one:
            verdict = goal(auc, loss, statistics.mean(r["val_auc"] for r in one),
                           statistics.mean(r["val_loss"] for r in one))
            seeds = sorted(r["seed"] for r in g)
            if seeds != sorted(r["seed"] for r in one):
                verdict += " (one-rank seeds %s)" % ",".join(str(r["seed"]) for r in one)
        print("| %s | %d | %s | %d | %.5g | %.3g | %.5g | %s | %.4f (%.4f-%.4f) | %.4f (%.4f-%.4f) | %s |" % (
            name.get(strategy, strategy), ranks, program, epochs, base_lr, beta, g[0]["peak_lr"],
            ",".join(str(r["seed"]) for r in g), auc,
            min(r["val_auc"] for r in g), max(r["val_auc"] for r in g), loss, min(r["val_loss"] for r in g),
            max(r["val_loss"] for r in g), verdict))
PY
