#!/usr/bin/env bash
# Tessera under Slurm: the job scripts of examples/slurm/, submitted as they ship with sbatch to the test cluster
# (scripts/testcluster.sh: 2 nodes in network namespaces, 2 tasks each), give what the same jobs give without Slurm.
#
#   on_cluster.sh TESSERA TESTCLUSTER EXAMPLES PART
#     cluster   up twice (idempotent), two idle nodes with their own names, down; status then finds none
#     tile      tile.sbatch on 2 nodes x 2 tasks writes the shards `mpirun -n 4 tessera tile` writes, bit for bit;
#               `tessera tile` run by a batch script itself (no srun) runs as one rank without MPI and writes what
#               `mpirun -n 1` writes
#     train     train.sbatch under allreduce, easgd and two-level ends with the weights of the same job under
#               mpirun on one host, bit for bit (two-level's node groups are the Slurm nodes: t1 ranks 0-1, t2 2-3);
#               async-easgd completes and validates (not reproducible by design)
#     infer     submit-infer.sh: an array of 2 tasks over 4 slides and the afterok summary job: one infer.json with
#               the 4 slides, every heatmap as one `tessera infer` run writes it, and evaluate's figures as evaluate
#               gives over that run; infer.json records the Slurm job, array task, nodes and tasks
#     requeue   train.sbatch whose rank 0 waits after step 3 (do=wait: a fault-injection point held until a stop
#               signal is recorded; the job's log says so); then `scancel --signal=USR1`: every rank stops at that
#               step, checkpoints, exits 75, the script requeues the job and the requeued run (--resume auto) ends
#               with the uninterrupted weights
#     nodefail  train.sbatch with a node range (--nodes=1-2) on t1 and t2, rank 2 (on t2) held at step 3; t2's slurmd
#               and tasks are killed: Slurm fails the step naming t2, marks t2 down, requeues the job, which starts
#               again on t1 alone (2 ranks) and resumes from the step-2 checkpoint from the centre, ending with the
#               weights of the same job killed at that step under mpirun and resumed on 2 ranks
#     timelimit train.sbatch under a real time limit (1 minute, --signal=USR1@30): rank 0 waits after step 3 (do=wait: a
#               fault-injection point held until a signal, so the test does not depend on speed) until Slurm's
#               warning reaches every rank; they stop at step 3, checkpoint, exit 75, the script requeues the job and
#               it ends with the uninterrupted run's weights
#
# Exits 77 (CTest: skipped) with the reason when the cluster cannot start here (not root, no ip netns, no Slurm).
set -euo pipefail

tessera=$1
testcluster=$2
examples=$3
part=$4

if ! reason=$("$testcluster" check 2>&1); then
  echo "SKIPPED: a Slurm test cluster cannot start here: $reason"
  exit 77
fi
for tool in mpirun h5diff jq; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool is missing (scripts/install-deps.sh installs it)"
    exit 77
  fi
done

# The nodes have private /tmp folders: the jobs' files live where every node sees them.
work=$(mktemp -d /var/tmp/tessera-slurm.XXXXXX)
cleanup() {
  "$testcluster" down || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

if ! "$testcluster" up 2 >"$work/up.log" 2>&1; then
  echo "SKIPPED: the Slurm test cluster did not start: $(tail -5 "$work/up.log")"
  exit 77
fi
eval "$("$testcluster" env)"
# Open MPI between the nodes: TCP on the test network (one-sided windows over TCP take the pt2pt component).
export OMPI_MCA_btl=tcp,self,vader OMPI_MCA_btl_tcp_if_include=198.18.0.0/24 OMPI_MCA_oob_tcp_if_include=198.18.0.0/24
export OMPI_MCA_osc=sm,pt2pt
export TESSERA=$tessera

one_host() { mpirun --allow-run-as-root --oversubscribe -n 4 "$@"; }
testhosts=$(dirname "$testcluster")/testhosts.sh

# Waits until job JOB (and every task of an array) has left the queue; then its state must be COMPLETED. Slurm's
# own end of the job is the event: no time is assumed (CTest's timeout bounds a hang).
# The states of job JOB (of every task of an array), e.g. "JobState=RUNNING "; asked again while the controller is
# busy (a failed query is no state).
job_states() {
  local out
  until out=$(scontrol -o show job "$1" 2>/dev/null); do sleep 0.5; done
  grep -o 'JobState=[A-Z_]*' <<<"$out" | sort -u | tr '\n' ' '
}

# True while job JOB (or a task of it) is still to run, running or ending.
job_active() { [[ "$(job_states "$1")" =~ JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUED|REQUEUE_FED|RESIZING|SUSPENDED|STOPPED|SIGNALING) ]]; }

wait_done() {
  local job=$1 what=$2
  while job_active "$job"; do sleep 0.5; done
  local states
  states=$(job_states "$job")
  if [ "$states" != "JobState=COMPLETED " ]; then
    local logs
    logs=$(scontrol -o show job "$job" | grep -o 'StdOut=[^ ]*' | sed 's/^StdOut=//' | sort -u)
    fail "$what: job $job ended as $states: $(for f in $logs; do echo "== $f"; tail -20 "$f"; done 2>&1)"
  fi
}

same_h5() {
  local a=$1 b=$2 object=$3 what=$4
  h5diff "$a" "$b" "$object" >/dev/null 2>&1 || {
    h5diff -r "$a" "$b" "$object" 2>&1 | head -20 >&2
    fail "$what: $a and $b differ in $object"
  }
}

# Two tile outputs, $work/A-shards and $work/B-shards, hold the same shard files, each the same bit for bit; their
# lists are left in $work/A.txt and $work/B.txt.
same_shards() {
  local a=$1 b=$2 what=$3
  (cd "$work/$a-shards" && ls shard-*.h5) >"$work/$a.txt"
  (cd "$work/$b-shards" && ls shard-*.h5) >"$work/$b.txt"
  [ -s "$work/$a.txt" ] || fail "$what: no shards in $work/$a-shards"
  cmp -s "$work/$a.txt" "$work/$b.txt" || fail "$what: the shard files differ: $(diff "$work/$a.txt" "$work/$b.txt")"
  local shard
  while read -r shard; do
    same_h5 "$work/$a-shards/$shard" "$work/$b-shards/$shard" / "$what"
  done <"$work/$a.txt"
}

# Two training outputs end with the same easgd state: the checkpoint's weights and centre and, when the replicas
# differ at the end, each rank's replica file beside the checkpoint, in the one set the checkpoint names (the set's
# name differs between runs): both runs have them, or neither, and they agree.
same_checkpoint() {
  local a_dir=$1 b_dir=$2 what=$3 object rank
  for object in /params /buffers /easgd; do
    same_h5 "$a_dir/checkpoint.h5" "$b_dir/checkpoint.h5" "$object" "$what"
  done
  shopt -s nullglob
  for rank in 0 1 2 3; do
    local a_files=("$a_dir"/checkpoint.replicas/*/rank-"$rank".h5)
    local b_files=("$b_dir"/checkpoint.replicas/*/rank-"$rank".h5)
    if [ ${#a_files[@]} -ne ${#b_files[@]} ] || [ ${#a_files[@]} -gt 1 ]; then
      fail "$what: rank $rank's replica files: ${a_files[*]} and ${b_files[*]}"
    fi
    [ ${#a_files[@]} -eq 1 ] || continue
    for object in /params /buffers /optimizer; do
      same_h5 "${a_files[0]}" "${b_files[0]}" "$object" "$what, rank $rank's replica"
    done
  done
  shopt -u nullglob
}

# A tessera for the job scripts ($TESSERA) that runs under TESSERA_FAULT=$1 in the job's first run only (Slurm counts
# restarts: SLURM_RESTART_COUNT): $work/tessera-first-run-stops.
first_run_fault() {
  cat >"$work/tessera-first-run-stops" <<EOF
#!/bin/sh
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ]; then export TESSERA_FAULT='$1'; fi
exec "$tessera" "\$@"
EOF
  chmod +x "$work/tessera-first-run-stops"
}

# Waits for the line `marker` in the job's log `log` (a fault-injection point reached), failing when the job ends first.
wait_for_line() {
  local job=$1 log=$2 marker=$3
  until grep -q "$marker" "$log" 2>/dev/null; do
    job_active "$job" || fail "job $job ended before '$marker' ($(job_states "$job")): $(cat "$log")"
    sleep 0.5
  done
}

# The seconds since `start` (a `date +%s.%N`), to one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

data() {
  "$tessera" synth --out "$work/synth" --slides 4 --size 1024 --seed 3 --set preview.enabled=false \
    --set split.train=0.5 --set split.val=0.5 >"$work/synth.log" 2>&1 || fail "synth: $(tail -5 "$work/synth.log")"
  printf 'input:\n  csv: %s\ntile:\n  size: 32\n  mpp: 1.0\ntissue:\n  min_fraction: 0.3\nshards:\n  tiles_per_shard: 50\n' \
    "$work/synth/dataset.csv" >"$work/tile.yaml"
}

train_job() {
  "$tessera" tile "$work/tile.yaml" --out "$work/shards" >"$work/tile.log" 2>&1 || fail "tile: $(tail -5 "$work/tile.log")"
  cat >"$work/train.yaml" <<EOF
data:
  shards: $work/shards
  block_size: 16
  shuffle_buffer: 128
model:
  architecture: tiny_cnn
train:
  epochs: 2
  batch_size: 4
  seed: 2
  threads: 1
  log_every: 1
optimizer:
  name: sgd
  lr: 0.05
  momentum: 0.9
schedule:
  name: constant
  reference_batch: 0
distributed:
  tau: 2
EOF
}

# sbatch with the job's log in the work folder; prints the job id.
submit() {
  local name=$1
  shift
  sbatch --parsable --output="$work/$name-%j.out" "$@"
}

case "$part" in
  cluster)
    "$testcluster" up 2 >/dev/null  # again: the same cluster, started afresh
    nodes=$("$testcluster" status | awk 'NR > 1 && $2 == "idle" {print $1}' | tr '\n' ' ')
    [ "$nodes" = "t1 t2 " ] || fail "idle nodes after up twice: '$nodes' ($("$testcluster" status))"
    job=$(sbatch --parsable -N 2 --ntasks-per-node=1 --output="$work/names-%j.out" --wrap 'srun hostname')
    wait_done "$job" "hostname on both nodes"
    [ "$(sort "$work/names-$job.out" | tr '\n' ' ')" = "t1 t2 " ] || fail "the nodes call themselves $(cat "$work/names-$job.out")"
    "$testcluster" down
    if "$testcluster" status >/dev/null 2>&1; then fail "a cluster answers after down"; fi
    [ ! -e /var/tmp/tessera-testcluster ] || [ -n "${TESSERA_CLUSTER_DIR:-}" ] || fail "the cluster's folder is left after down"
    echo "cluster: up twice, two nodes named t1 and t2, down"
    ;;

  tile)
    data
    job=$(submit tile "$examples/tile.sbatch" "$work/tile.yaml" --out "$work/slurm-shards")
    wait_done "$job" "tile.sbatch"
    one_host "$tessera" tile "$work/tile.yaml" --out "$work/local-shards" >"$work/local-tile.log" 2>&1 ||
      fail "tile under mpirun: $(tail -5 "$work/local-tile.log")"
    same_shards local slurm "tile under Slurm"
    grep -q "4 ranks on 2 host(s)" "$work/tile-$job.out" || fail "tile did not run 4 ranks on 2 nodes: $(head -3 "$work/tile-$job.out")"
    grep -q "without MPI" "$work/tile-$job.out" && fail "tile under srun started without MPI: $(head -3 "$work/tile-$job.out")"
    # The batch script's own process (no srun: SLURM_PROCID=0, no SLURM_STEP_ID) tiles as one rank without MPI.
    job=$(submit tile-alone -N 1 --ntasks=1 --wrap "'$tessera' tile '$work/tile.yaml' --out '$work/alone-shards' --log-level debug")
    wait_done "$job" "tile in a batch script without srun"
    grep -q "started without a launcher: one rank, without MPI" "$work/tile-alone-$job.out" ||
      fail "tile in a batch script without srun started MPI: $(head -5 "$work/tile-alone-$job.out")"
    mpirun --allow-run-as-root -n 1 "$tessera" tile "$work/tile.yaml" --out "$work/local1-shards" >"$work/local1-tile.log" 2>&1 ||
      fail "tile under mpirun -n 1: $(tail -5 "$work/local1-tile.log")"
    same_shards local1 alone "tile in a batch script without srun"
    echo "tile: $(wc -l <"$work/local.txt") shards from sbatch on 2 nodes x 2 tasks, bit for bit as under mpirun -n 4;" \
      "$(wc -l <"$work/alone.txt") from the batch script's own process (no srun, no MPI), bit for bit as under mpirun -n 1"
    ;;

  train)
    data
    train_job
    for strategy in allreduce easgd two-level; do
      local_settings=(--set distributed.strategy="$strategy")
      [ "$strategy" = two-level ] && local_settings+=(--set distributed.ranks_per_node=2)
      job=$(submit "train-$strategy" "$examples/train.sbatch" "$work/train.yaml" --out "$work/slurm-$strategy" \
        --set distributed.strategy="$strategy")
      wait_done "$job" "train.sbatch ($strategy)"
      one_host "$tessera" train "$work/train.yaml" --out "$work/local-$strategy" "${local_settings[@]}" \
        >"$work/local-$strategy.log" 2>&1 || fail "$strategy under mpirun: $(tail -5 "$work/local-$strategy.log")"
      for object in /params /buffers; do
        same_h5 "$work/local-$strategy/checkpoint.h5" "$work/slurm-$strategy/checkpoint.h5" "$object" "$strategy"
      done
      echo "train $strategy: the same weights from sbatch on 2 nodes x 2 tasks as under mpirun on one host"
    done
    grep -q "two-level: 2 node group(s), .*: t1: ranks 0-1; t2: ranks 2-3" "$work"/train-two-level-*.out ||
      fail "two-level's groups are not the nodes: $(grep two-level: "$work"/train-two-level-*.out)"
    job=$(submit train-async "$examples/train.sbatch" "$work/train.yaml" --out "$work/slurm-async" \
      --set distributed.strategy=async-easgd)
    wait_done "$job" "train.sbatch (async-easgd)"
    grep -q '"kind":"val","epoch":2' "$work/slurm-async/metrics.jsonl" ||
      fail "async-easgd did not validate epoch 2: $(cat "$work/slurm-async/metrics.jsonl")"
    echo "train async-easgd: completes and validates under Slurm"
    ;;

  infer)
    data
    train_job
    "$tessera" train "$work/train.yaml" --out "$work/model" --set train.epochs=1 >"$work/model.log" 2>&1 ||
      fail "the model: $(tail -5 "$work/model.log")"
    ls "$work"/synth/slides/*.svs "$work"/synth/slides/*.tif 2>/dev/null | sort >"$work/slides.txt" || true
    [ "$(wc -l <"$work/slides.txt")" -eq 4 ] || fail "slides: $(cat "$work/slides.txt")"
    read -r array summary < <("$examples/submit-infer.sh" "$work/slides.txt" "$work/model/checkpoint.h5" \
      "$work/slurm-infer" 2 "$work/synth/dataset.csv")
    wait_done "$array" "infer-array.sbatch"
    wait_done "$summary" "infer-summary.sbatch"
    slides=$(paste -sd, "$work/slides.txt")
    "$tessera" infer --checkpoint "$work/model/checkpoint.h5" --slides "$slides" --out "$work/local-infer" \
      >"$work/local-infer.log" 2>&1 || fail "infer: $(tail -5 "$work/local-infer.log")"
    "$tessera" evaluate --dataset "$work/synth/dataset.csv" --detections "$work/local-infer" \
      --out "$work/local-evaluation" >"$work/local-evaluate.log" 2>&1 || fail "evaluate: $(tail -5 "$work/local-evaluate.log")"
    all=$work/slurm-infer/all/infer.json
    [ "$(jq '.slides | length' "$all")" -eq 4 ] || fail "the summary lists $(jq -c '[.slides[].id]' "$all")"
    [ "$(jq '.parts' "$all")" -eq 2 ] || fail "the summary has $(jq '.parts' "$all") parts"
    for part in 0 1; do
      json=$work/slurm-infer/part-$part/infer.json
      [ "$(jq -r '.slurm.array_job_id' "$json")" = "$array" ] || fail "part $part's array job: $(jq -c .slurm "$json")"
      [ "$(jq -r '.slurm.array_task_id' "$json")" = "$part" ] || fail "part $part's array task: $(jq -c .slurm "$json")"
      [ "$(jq -r '.slurm.ntasks' "$json")" = 1 ] || fail "part $part's task count: $(jq -c .slurm "$json")"
    done
    while read -r slide; do
      id=$(basename "${slide%.*}")
      map=$(ls "$work"/slurm-infer/part-*/"$id.heatmap.h5")
      same_h5 "$work/local-infer/$id.heatmap.h5" "$map" / "infer of $id"
      cmp -s "$work/local-infer/$id.detections.csv" "$work/slurm-infer/all/$id.detections.csv" ||
        fail "$id's detections differ"
    done <"$work/slides.txt"
    jq -e '.froc != null and (.slide_auc | type) == "number"' "$work/local-evaluation/evaluation.json" >/dev/null ||
      fail "evaluate gave no FROC or slide AUC: $(head -c 400 "$work/local-evaluation/evaluation.json")"
    [ "$(jq '.missing_detections | length' "$work/slurm-infer/evaluation/evaluation.json")" -eq 0 ] ||
      fail "the summary's evaluate missed detections: $(jq -c .missing_detections "$work/slurm-infer/evaluation/evaluation.json")"
    # The figures, overall and per slide (the per-slide entries less the files they name: other folders).
    for key in froc slide_auc 'per_slide | map(del(.detections_file, .report_file, .qc_file))'; do
      a=$(jq -c ".$key" "$work/local-evaluation/evaluation.json")
      b=$(jq -c ".$key" "$work/slurm-infer/evaluation/evaluation.json")
      [ "$a" = "$b" ] || fail "evaluate's $key: $b under Slurm, $a without"
    done
    echo "infer: an array of 2 tasks and the afterok summary give every map, detection and figure of one run"
    ;;

  requeue)
    data
    train_job
    # The job's first run only (Slurm counts restarts) holds rank 0 after step 3 (of 5 per epoch at batch 2) until a
    # stop signal is recorded: a point, not a time. (Not do=stop and SIGCONT: a signal that came while the process was
    # stopped may be taken by any of its threads after SIGCONT, and the main thread could pass step 3's boundary
    # before that thread's handler has recorded it, stopping at step 4.)
    first_run_fault 'train.step after=3 rank=0 do=wait'
    job=$(submit requeue --export="ALL,TESSERA=$work/tessera-first-run-stops" "$examples/train.sbatch" \
      "$work/train.yaml" --out "$work/requeued" --set distributed.strategy=easgd --set train.batch_size=2)
    log=$work/requeue-$job.out
    # The event: rank 0 says it holds at the point (every other rank waits for it at the step boundary).
    wait_for_line "$job" "$log" "fault injected at train.step: process [0-9]* waits for SIGUSR1"
    scancel --signal=USR1 "$job"
    wait_done "$job" "the requeued train.sbatch"
    grep -q "SIGUSR1: stopped at step 3" "$log" || fail "no stop at step 3: $(tail -20 "$log")"
    grep -q "requeueing job $job" "$log" || fail "the script did not requeue: $(tail -20 "$log")"
    grep -q "resuming from .* at step 3 " "$log" || fail "the requeued run did not resume at step 3: $(tail -20 "$log")"
    [ "$(scontrol -o show job "$job" | grep -o 'Restarts=[0-9]*')" = Restarts=1 ] ||
      fail "restarts: $(scontrol -o show job "$job" | grep -o 'Restarts=[0-9]*')"
    one_host "$tessera" train "$work/train.yaml" --out "$work/uninterrupted" --set distributed.strategy=easgd \
      --set train.batch_size=2 \
      >"$work/uninterrupted.log" 2>&1 || fail "the uninterrupted run: $(tail -5 "$work/uninterrupted.log")"
    same_checkpoint "$work/uninterrupted" "$work/requeued" "requeued easgd"
    echo "requeue: USR1 at step 3 on every rank, checkpoint, exit 75, requeued, resumed: the uninterrupted weights"
    ;;

  nodefail)
    data
    train_job
    # 4 ranks (t1: 0-1, t2: 2-3), batch 2: 6 steps an epoch, a checkpoint every 2 steps. Rank 2 holds after step 3 (a
    # point, not a time): the others wait for it in step 4's exchange, the last checkpoint is step 2's.
    first_run_fault 'train.step after=3 rank=2 do=stop'
    settings=(--set distributed.strategy=easgd --set train.batch_size=2 --set train.checkpoint_every=2)
    job=$(submit nodefail --export="ALL,TESSERA=$work/tessera-first-run-stops" --nodes=1-2 "$examples/train.sbatch" \
      "$work/train.yaml" --out "$work/node-left" "${settings[@]}")
    log=$work/nodefail-$job.out
    wait_for_line "$job" "$log" "fault injected at train.step: stopping process"
    grep -q "4 ranks on 2 host(s): t1: ranks 0-1; t2: ranks 2-3" "$log" || fail "not 4 ranks on t1 and t2: $(head -3 "$log")"
    # t2 dies: its slurmd, slurmstepd and tasks (every process in its namespace) are killed at once.
    start=$(date +%s.%N)
    "$testhosts" pids t2 | xargs -r kill -9
    # Slurm notices (SlurmdTimeout), marks t2 down and requeues the job: wait for each event, timed.
    until [[ "$(sinfo -h -n t2 -o %T 2>/dev/null)" =~ ^down ]]; do sleep 0.5; done
    noticed=$(since "$start")
    until [ "$(scontrol -o show job "$job" | grep -o 'Restarts=[0-9]*')" = Restarts=1 ]; do
      job_active "$job" || fail "job $job ended without a requeue ($(job_states "$job")): $(tail -20 "$log")"
      sleep 0.5
    done
    requeued=$(since "$start")
    until [[ "$(job_states "$job")" =~ RUNNING ]] && grep -q "Restarts=1 .*NodeList=t" <(scontrol -o show job "$job"); do
      job_active "$job" || break
      sleep 0.5
    done
    restarted=$(since "$start")
    wait_done "$job" "train.sbatch after t2 died"
    ended=$(since "$start")
    grep -q "srun: error: Node failure on t2" "$log" || fail "no message naming t2: $(tail -20 "$log")"
    grep -q "2 ranks on 1 host(s): t1: ranks 0-1" "$log" || fail "the requeued run is not on t1 alone: $(tail -20 "$log")"
    grep -q "written by a run on 4 rank(s), this one has 2: .*(the centre; every replica starts from it)" "$log" ||
      fail "the requeued run did not resume from the centre: $(tail -20 "$log")"
    grep -q "resuming from .* at step 2 " "$log" || fail "the requeued run did not resume at step 2: $(tail -20 "$log")"
    # The same job under mpirun on one host, killed at the same point, then resumed on 2 ranks.
    TESSERA_FAULT='train.step after=3 rank=2 do=kill' one_host "$tessera" train "$work/train.yaml" \
      --out "$work/killed" "${settings[@]}" >"$work/killed.log" 2>&1 && fail "the killed run ended: $(tail -5 "$work/killed.log")"
    mpirun --allow-run-as-root --oversubscribe -n 2 "$tessera" train "$work/train.yaml" --out "$work/killed" \
      "${settings[@]}" --resume auto >"$work/resumed.log" 2>&1 || fail "the resumed run: $(tail -5 "$work/resumed.log")"
    same_checkpoint "$work/killed" "$work/node-left" "resumed on the node left"
    echo "nodefail: t2 killed; Slurm marked it down after ${noticed} s, requeued the job after ${requeued} s, started it" \
      "on t1 after ${restarted} s; it ended after ${ended} s with the weights of the same job resumed on 2 ranks"
    ;;

  timelimit)
    data
    train_job
    first_run_fault 'train.step after=3 rank=0 do=wait'
    settings=(--set distributed.strategy=easgd --set train.batch_size=2)
    # Slurm looks at time limits about every 30 s and sends the warning at the first look that finds the job within
    # N + 30 s of its limit, so with a limit of a minute the warning may come before srun has started the ranks (and
    # reach none) or while a rank is still starting (before its handlers: SIGUSR1 would end it). So the job starts
    # with 10 minutes; once rank 0 waits at its point (every rank started), its limit becomes 1 minute from its
    # start, as --time=1 would have made it (more only when it has run 30 s by then), and Slurm's own warning and
    # limit take their course. When the warning
    # has stopped the job, the limit goes back to 10 minutes for the requeued run (which Slurm starts no sooner than
    # cred_expire, 10 s, after the requeue).
    start=$(date +%s.%N)
    job=$(submit timelimit --export="ALL,TESSERA=$work/tessera-first-run-stops" --time=10 --signal=USR1@30 \
      "$examples/train.sbatch" "$work/train.yaml" --out "$work/timed" "${settings[@]}")
    log=$work/timelimit-$job.out
    wait_for_line "$job" "$log" "fault injected at train.step: process [0-9]* waits for SIGUSR1 or SIGTERM"
    waiting=$(since "$start")
    # One minute, or more when the job has run so long that less than 30 s would be left (a slow start).
    runtime=$(scontrol -o show job "$job" | grep -o 'RunTime=[0-9:]*' | cut -d= -f2)
    ran=$(awk -F: '{print $1 * 3600 + $2 * 60 + $3}' <<<"$runtime")
    limit=$(((ran + 30) / 60 + 1))
    scontrol update JobId="$job" TimeLimit="$limit"
    wait_for_line "$job" "$log" "SIGUSR1: stopped at step 3"
    signalled=$(since "$start")
    scontrol update JobId="$job" TimeLimit=10
    until [ "$(scontrol -o show job "$job" | grep -o 'Restarts=[0-9]*')" = Restarts=1 ]; do
      job_active "$job" || fail "job $job ended without a requeue ($(job_states "$job")): $(tail -20 "$log")"
      sleep 0.5
    done
    requeued=$(since "$start")
    wait_done "$job" "train.sbatch under a time limit"
    ended=$(since "$start")
    grep -q "srun: error: .*: tasks 0-1: Exited with exit code 75" "$log" || fail "no exit 75: $(tail -20 "$log")"
    grep -q "requeueing job $job" "$log" || fail "the script did not requeue: $(tail -20 "$log")"
    grep -q "resuming from .* at step 3 " "$log" || fail "the requeued run did not resume at step 3: $(tail -20 "$log")"
    one_host "$tessera" train "$work/train.yaml" --out "$work/uninterrupted" "${settings[@]}" \
      >"$work/uninterrupted.log" 2>&1 || fail "the uninterrupted run: $(tail -5 "$work/uninterrupted.log")"
    same_checkpoint "$work/uninterrupted" "$work/timed" "easgd under a time limit"
    echo "timelimit: rank 0 waited at step 3 after ${waiting} s; the limit set to $limit minute(s), Slurm's SIGUSR1 stopped" \
      "every rank after ${signalled} s, the job was requeued after ${requeued} s and ended after ${ended} s with the" \
      "uninterrupted weights"
    ;;

  *) fail "unknown part '$part'" ;;
esac
