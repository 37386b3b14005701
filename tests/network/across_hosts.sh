#!/usr/bin/env bash
# Tessera across a real TCP network: two test hosts (scripts/testhosts.sh: network namespaces with their own
# addresses and host names, links shaped to 10 Gbit/s) with two ranks each, against the same 4 ranks on one host.
#
#   across_hosts.sh TESSERA TESTHOSTS PART [ARGS...]
#     bench      `tessera bench comm --launcher` runs its ranks one per host and measures every row across the link
#     mpi MPI_TESTS STRATEGY_TESTS
#                the MPI facade's and the strategies' test programs on 2 hosts x 2 ranks (less the two-level tests
#                that ask for one group of every rank: across hosts MPI makes two, as it should)
#     hosts      the test hosts: names, addresses, exec, status, down and up again
#     train      allreduce, easgd and two-level train the same weights, bit for bit, on 2 hosts x 2 ranks as on one
#                host; two-level forms its node groups from the host names and logs them; async-easgd completes
#     pipeline   tile and infer across hosts write the same shards and heatmaps as on one host
#     killed     a rank on t2 killed after step 8 (a fault-injection point, not a timer) takes the job down with a
#                message naming the rank and the host, without hanging; --resume auto then ends where an
#                uninterrupted run does, bit for bit
#     link       t2's link pulled while rank 2 is stopped after step 8 (a fault-injection point, not a timer): the
#                job ends with Open MPI's message naming the host (the job's first line names its ranks), without
#                hanging; t2 is left with no process;
#                once the link is back --resume auto ends where an uninterrupted run does, bit for bit
#
# Exits 77 (CTest: skipped) with the reason when test hosts cannot be made here (not root, no ip netns).
set -euo pipefail

tessera=$1
testhosts=$2
part=$3

if ! reason=$("$testhosts" check 2>&1); then
  echo "SKIPPED: test hosts cannot be made here: $reason"
  exit 77
fi
for tool in mpirun h5diff; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool is missing (scripts/install-deps.sh installs it)"
    exit 77
  fi
done

work=$(mktemp -d /tmp/tessera-network.XXXXXX)
watchdog=""
cleanup() {
  [ -z "$watchdog" ] || kill -- "-$watchdog" 2>/dev/null || true
  "$testhosts" down || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

one_host() { mpirun --allow-run-as-root --oversubscribe -n 4 "$@"; }
two_hosts() { "$testhosts" mpirun --host t1:2,t2:2 -n 4 "$@"; }

# Equal HDF5 content (h5diff compares every dataset and attribute value of OBJECT, exactly).
same_h5() {
  local a=$1 b=$2 object=$3 what=$4
  h5diff "$a" "$b" "$object" >/dev/null 2>&1 || {
    h5diff -r "$a" "$b" "$object" 2>&1 | head -20 >&2
    fail "$what: $a and $b differ in $object"
  }
}

"$testhosts" up 2 --rate 10gbit

# Small data, made on one host: four 1024 px slides (two train, two validate) tiled at 32 px.
data() {
  "$tessera" synth --out "$work/synth" --slides 4 --size 1024 --seed 3 --set preview.enabled=false \
    --set split.train=0.5 --set split.val=0.5 >"$work/synth.log" 2>&1 || fail "synth: $(tail -5 "$work/synth.log")"
  cat >"$work/tile.yaml" <<EOF
input:
  csv: $work/synth/dataset.csv
tile:
  size: 32
  mpp: 1.0
tissue:
  min_fraction: 0.3
EOF
}

# The job parts killed and link interrupt: tiny_cnn on the tiles of data(), a checkpoint every 2 steps.
interrupted_job() {
  data
  "$tessera" tile "$work/tile.yaml" --out "$work/shards" >"$work/tile.log" 2>&1 || fail "tile: $(tail -5 "$work/tile.log")"
  printf 'data:\n  shards: %s\n  block_size: 16\n  shuffle_buffer: 128\nmodel:\n  architecture: tiny_cnn\ntrain:\n  epochs: 3\n  batch_size: 2\n  seed: 2\n  threads: 1\n  checkpoint_every: 2\n' \
    "$work/shards" >"$work/train.yaml"
}

# After an interrupted_job stopped after step 8 (WHAT says how): --resume auto across hosts starts from step 8's
# checkpoint or, when the rank that stopped did so before rank 0 had published it, step 6's (that rank reaches step 8
# only after step 7's exchange, so step 6's is always there), and ends with an uninterrupted run's weights, bit for
# bit.
resume_ends_as_uninterrupted() {
  local what=$1
  two_hosts "$tessera" train "$work/train.yaml" --out "$work/run" --resume auto >"$work/resumed.log" 2>&1 ||
    fail "--resume auto across hosts: $(tail -5 "$work/resumed.log")"
  grep -Eq "resuming from .* at step (6|8) " "$work/resumed.log" ||
    fail "the resumed run did not start at step 6 or 8: $(grep -i resum "$work/resumed.log")"
  two_hosts "$tessera" train "$work/train.yaml" --out "$work/full" >"$work/full.log" 2>&1 ||
    fail "the uninterrupted run: $(tail -5 "$work/full.log")"
  local object
  for object in /params /buffers; do
    same_h5 "$work/run/checkpoint.h5" "$work/full/checkpoint.h5" "$object" "$what"
  done
}

case "$part" in
  hosts)
    for h in t1 t2; do
      name=$("$testhosts" exec "$h" hostname)
      [ "$name" = "$h" ] || fail "host $h calls itself '$name'"
    done
    address=$("$testhosts" exec t2 "ip -4 -o addr show eth0")
    [[ "$address" == *"198.18.0.12/24"* ]] || fail "t2's address: $address"
    [ "$("$testhosts" status | wc -l)" -eq 2 ] || fail "status lists $("$testhosts" status)"
    "$testhosts" up 2 --rate 1gbit  # again: the same two hosts, reshaped
    [ "$("$testhosts" status | wc -l)" -eq 2 ] || fail "up twice: $("$testhosts" status)"
    "$testhosts" down
    if "$testhosts" status >/dev/null; then fail "hosts left after down: $("$testhosts" status)"; fi
    ip link show tessera-br >/dev/null 2>&1 && fail "the bridge is left after down"
    if "$testhosts" exec t1 true 2>"$work/err"; then fail "exec on a host that is gone succeeded"; fi
    grep -q "no test host t1" "$work/err" || fail "exec on a gone host says: $(cat "$work/err")"
    ;;

  train)
    data
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
  batch_size: 8
  seed: 2
  threads: 1
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
    run_both() {  # NAME SETTINGS...: the job on one host and across hosts
      local name=$1
      shift
      one_host "$tessera" train "$work/train.yaml" --out "$work/one-$name" "$@" >"$work/one-$name.log" 2>&1 ||
        fail "$name on one host: $(tail -5 "$work/one-$name.log")"
      two_hosts "$tessera" train "$work/train.yaml" --out "$work/two-$name" "$@" >"$work/two-$name.log" 2>&1 ||
        fail "$name across hosts: $(tail -5 "$work/two-$name.log")"
    }
    for strategy in allreduce easgd; do
      run_both "$strategy" --set distributed.strategy="$strategy"
      for object in /params /buffers; do
        same_h5 "$work/one-$strategy/checkpoint.h5" "$work/two-$strategy/checkpoint.h5" "$object" "$strategy"
      done
      echo "$strategy: the same weights on 2 hosts x 2 ranks as on one host"
    done

    # two-level: across hosts the groups are the hosts (ranks_per_node 0: as MPI groups them); on one host the same
    # groups are asked for (ranks_per_node 2).
    one_host "$tessera" train "$work/train.yaml" --out "$work/one-two-level" --set distributed.strategy=two-level \
      --set distributed.ranks_per_node=2 >"$work/one-two-level.log" 2>&1 ||
      fail "two-level on one host: $(tail -5 "$work/one-two-level.log")"
    two_hosts "$tessera" train "$work/train.yaml" --out "$work/two-two-level" --set distributed.strategy=two-level \
      >"$work/two-two-level.log" 2>&1 || fail "two-level across hosts: $(tail -5 "$work/two-two-level.log")"
    grep -q "two-level: 2 node group(s), leaders exchange by allreduce: t1: ranks 0-1; t2: ranks 2-3" \
      "$work/two-two-level.log" || fail "two-level's groups across hosts: $(grep two-level: "$work/two-two-level.log")"
    for object in /params /buffers; do
      same_h5 "$work/one-two-level/checkpoint.h5" "$work/two-two-level/checkpoint.h5" "$object" two-level
    done
    echo "two-level: node groups from the host names (t1: 0-1, t2: 2-3), the same weights as on one host"

    # async-easgd is not reproducible by design: it completes, and validates.
    two_hosts "$tessera" train "$work/train.yaml" --out "$work/two-async" --set distributed.strategy=async-easgd \
      >"$work/two-async.log" 2>&1 || fail "async-easgd across hosts: $(tail -5 "$work/two-async.log")"
    grep -q '"kind":"val","epoch":2' "$work/two-async/metrics.jsonl" ||
      fail "async-easgd across hosts did not validate epoch 2: $(cat "$work/two-async/metrics.jsonl")"
    echo "async-easgd: completes across hosts"
    ;;

  pipeline)
    data
    one_host "$tessera" tile "$work/tile.yaml" --out "$work/one-shards" >"$work/one-tile.log" 2>&1 ||
      fail "tile on one host: $(tail -5 "$work/one-tile.log")"
    two_hosts "$tessera" tile "$work/tile.yaml" --out "$work/two-shards" >"$work/two-tile.log" 2>&1 ||
      fail "tile across hosts: $(tail -5 "$work/two-tile.log")"
    (cd "$work/one-shards" && ls shard-*.h5) >"$work/one-shards.txt"
    (cd "$work/two-shards" && ls shard-*.h5) >"$work/two-shards.txt"
    cmp -s "$work/one-shards.txt" "$work/two-shards.txt" || fail "the shard files differ: $(diff "$work/one-shards.txt" "$work/two-shards.txt")"
    [ -s "$work/one-shards.txt" ] || fail "no shards"
    while read -r shard; do
      same_h5 "$work/one-shards/$shard" "$work/two-shards/$shard" / "tile"
    done <"$work/one-shards.txt"
    cmp -s <(grep -v -e '"config_yaml"' -e '"config_hash"' "$work/one-shards/manifest.json" | sed "s|$work/one-shards|OUT|g") \
      <(grep -v -e '"config_yaml"' -e '"config_hash"' "$work/two-shards/manifest.json" | sed "s|$work/two-shards|OUT|g") ||
      fail "the manifests differ"
    echo "tile: the same shards and manifest across hosts as on one host"

    # A model to infer with: a few steps on one host.
    printf 'data:\n  shards: %s\nmodel:\n  architecture: tiny_cnn\ntrain:\n  epochs: 1\n  batch_size: 8\n  threads: 1\n' \
      "$work/one-shards" >"$work/train.yaml"
    "$tessera" train "$work/train.yaml" --out "$work/model" >"$work/train.log" 2>&1 || fail "train: $(tail -5 "$work/train.log")"
    for where in one two; do
      runner=one_host
      [ "$where" = two ] && runner=two_hosts
      "$runner" "$tessera" infer --checkpoint "$work/model/checkpoint.h5" --csv "$work/synth/dataset.csv" \
        --splits val --out "$work/$where-infer" --set outputs=[heatmap.h5] >"$work/$where-infer.log" 2>&1 ||
        fail "infer ($where): $(tail -5 "$work/$where-infer.log")"
    done
    count=0
    for map in "$work"/one-infer/*.heatmap.h5; do
      same_h5 "$map" "$work/two-infer/$(basename "$map")" /prob infer
      count=$((count + 1))
    done
    [ "$count" -ge 1 ] || fail "infer wrote no heatmap"
    echo "infer: the same $count heatmap(s) across hosts as on one host"
    ;;

  killed)
    interrupted_job
    status=0
    TESSERA_FAULT="train.step after=8 rank=2" two_hosts -x TESSERA_FAULT "$tessera" train "$work/train.yaml" \
      --out "$work/run" >"$work/killed.log" 2>&1 || status=$?
    [ "$status" -ne 0 ] || fail "the job whose rank 2 was killed exited 0"
    grep -q "rank 2 .* on node t2 exited on signal 9" "$work/killed.log" ||
      fail "no message naming rank 2 and host t2: $(tail -20 "$work/killed.log")"
    [ -f "$work/run/checkpoint.h5" ] || fail "no checkpoint before the kill"
    resume_ends_as_uninterrupted "killed and resumed"
    echo "killed: rank 2 on t2 named, no hang; the resumed run ends with the uninterrupted run's weights"
    ;;

  link)
    interrupted_job
    # Rank 2 (on t2) stops itself (SIGSTOP) right after step 8; the link goes down while it is stopped, then it goes
    # on into step 9's exchange. Each wait polls a state; a watchdog ends a hang, and only says so: nothing is timed.
    TESSERA_FAULT="train.step after=8 rank=2 do=stop" setsid "$testhosts" mpirun --host t1:2,t2:2 -n 4 \
      -x TESSERA_FAULT "$tessera" train "$work/train.yaml" --out "$work/run" >"$work/link.log" 2>&1 &
    job=$!
    # The watchdog has a process group of its own: ending it ends its sleep too.
    setsid sh -c 'sleep 600 && touch "$0" && kill -9 -- "-$1"' "$work/hung" "$job" >/dev/null 2>&1 &
    watchdog=$!
    until_done() {  # WHAT CHECK...: poll CHECK until it succeeds; the watchdog's end of the job fails it as a hang
      local what=$1
      shift
      until "$@"; do
        [ -f "$work/hung" ] && fail "$what: not so after 600 s, the watchdog ended the job: $(tail -20 "$work/link.log")"
        sleep 0.05
      done
    }
    stopped=""
    rank2_stopped() {
      kill -0 "$job" 2>/dev/null || fail "the job ended before rank 2 stopped: $(tail -20 "$work/link.log")"
      local pid
      for pid in $("$testhosts" pids t2); do
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tessera ] &&
          [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ]; then
          stopped=$pid
          return 0
        fi
      done
      return 1
    }
    # t2 sent mpirun rank 2's last line ("stopping process ...") and has its acknowledgement (delayed up to 40 ms):
    # a connection with data in flight when its link dies is out of the keepalive's reach, and t2's daemon would
    # then notice only after net.ipv4.tcp_retries2 (about 100 s on the test hosts) instead of with mpirun.
    t2_quiet() {
      grep -q "stopping process $stopped until SIGCONT" "$work/link.log" &&
        ! "$testhosts" exec t2 "ss -Htn state established dst 198.18.0.1" | awk '$2 != 0 {busy = 1} END {exit !busy}'
    }
    until_done "rank 2 stopped" rank2_stopped
    until_done "t2 has nothing in flight to mpirun" t2_quiet
    "$testhosts" link t2 down
    kill -CONT "$stopped"
    status=0
    wait "$job" || status=$?
    [ -f "$work/hung" ] &&
      fail "the job hung after t2's link went down (the watchdog ended it after 600 s): $(tail -20 "$work/link.log")"
    [ "$status" -ne 0 ] || fail "the job whose host t2 lost its link exited 0"
    grep -q "ORTE has lost communication with a remote daemon" "$work/link.log" &&
      grep -Eq "Remote daemon: \[\[[0-9]+,0\],[0-9]+\] on node t2$" "$work/link.log" ||
      fail "no message naming host t2: $(tail -20 "$work/link.log")"
    # Open MPI names the host; the job's first line names the ranks on it.
    grep -q "4 ranks on 2 host(s): t1: ranks 0-1; t2: ranks 2-3" "$work/link.log" ||
      fail "no line naming the ranks on each host: $(head -5 "$work/link.log")"
    # t2's daemon, cut off from mpirun too, ends its ranks: none is left running on the host.
    t2_empty() { [ -z "$("$testhosts" pids t2)" ]; }
    until_done "t2 has no process left" t2_empty
    kill -- "-$watchdog" 2>/dev/null || true
    watchdog=""
    "$testhosts" link t2 up
    [ -f "$work/run/checkpoint.h5" ] || fail "no checkpoint before the link went down"
    resume_ends_as_uninterrupted "link down and resumed"
    from=$(grep -Eo "resuming from .* at step [0-9]+ " "$work/resumed.log" | grep -Eo "[0-9]+ $")
    echo "link: t2's link down with rank 2 stopped after step 8: host t2 named, no hang, nothing left on t2; resumed from" \
      "step ${from% }, the run ends with the uninterrupted run's weights"
    ;;

  bench)
    "$tessera" bench comm --launcher "$testhosts mpirun --host t1:1,t2:1" --ranks 2 --rounds 1 --size 32 \
      --model tiny_cnn --steps 8 --json "$work/comm.json" >"$work/comm.log" 2>&1 ||
      fail "bench comm across hosts: $(tail -20 "$work/comm.log")"
    grep -q "\"launcher\": \"$testhosts mpirun --host t1:1,t2:1\"" "$work/comm.json" ||
      fail "the report does not name its launcher: $(grep launcher "$work/comm.json")"
    # A row that failed carries a "failure"; a measured one does not.
    rows=$(grep -c '"label": ' "$work/comm.json" || true)
    if grep -q '"failure": "[^"]' "$work/comm.json"; then
      fail "bench comm rows failed across hosts: $(grep '"failure": "[^"]' "$work/comm.json")"
    fi
    [ "$rows" -ge 14 ] || fail "bench comm has $rows rows, not one per strategy and reference: $(cat "$work/comm.log")"
    grep -q "^allreduce, 2 ranks" "$work/comm.log" || fail "no bandwidth table: $(cat "$work/comm.log")"
    echo "bench: bench comm measured $rows runs across the link"
    ;;

  mpi)
    mpi_tests=$4
    strategy_tests=$5
    two_hosts "$mpi_tests" >"$work/mpi.log" 2>&1 || fail "the MPI facade's tests across hosts: $(grep -E 'FAILED|Failure|error' "$work/mpi.log" | head -20)"
    two_hosts "$strategy_tests" --gtest_filter='-TwoLevel.*WithOneGroup*' >"$work/strategy.log" 2>&1 ||
      fail "the strategies' tests across hosts: $(grep -E 'FAILED|Failure|error' "$work/strategy.log" | head -20)"
    echo "mpi: $(grep -c '^.*\[       OK \]' "$work/mpi.log") facade and $(grep -c '^.*\[       OK \]' "$work/strategy.log") strategy tests pass across hosts"
    ;;

  *)
    fail "unknown part '$part' (hosts, train, pipeline, killed, link, bench, mpi)"
    ;;
esac
