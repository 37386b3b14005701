#!/usr/bin/env bash
# Runs every fuzz target of a fuzz build (`make fuzz` builds it in build-fuzz) for a bounded, repeatable run:
# libFuzzer with -seed=1 and a fixed number of executions, from the same starting corpus every time.
#
#   scripts/fuzz.sh <build-fuzz>        FUZZ_SECONDS=60 (default): each target about that long on the reference
#                                       machine (2 cores); FUZZ_TARGETS="config tiff" runs only those
#
# The run count of a target is FUZZ_SECONDS x its executions per second measured here (RATE below), so a given
# FUZZ_SECONDS always means the same executions, whatever the machine's speed or load; -max_total_time only stops a
# run that takes five times longer than planned (it is then reported as cut short). FUZZ_CALIBRATE=1 instead runs each
# target for FUZZ_SECONDS of time and prints its executions per second, the figure for RATE. The starting corpus is made
# afresh in <build-fuzz>/fuzz-work/corpus/<target>/: the committed seeds (fuzz/corpus/, fuzz/regressions/), the
# matching cases of tests/data/, the demo configs, and seeds cut from ../shared/data/real-slides/ when it is there
# (scripts/fuzz-seeds.sh). A crash, leak or UBSan finding is written to <build-fuzz>/fuzz-work/crashes/<target>/ and
# makes the script exit 1 after every target ran; new inputs libFuzzer found stay in the work corpus.
set -euo pipefail

build=$(cd "${1:?usage: scripts/fuzz.sh <build-fuzz>}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${FUZZ_SECONDS:-60}
targets=(${FUZZ_TARGETS:-config asap_xml geojson dataset_csv detections_csv manifest tiff dicom})
work=$build/fuzz-work

# Executions per second of each target on this project's machine (2 cores, measured with FUZZ_CALIBRATE=1; dataset_csv
# was lowered from 15,000 when the target moved to the dataset.csv reader: 900,000 runs of it took 235 s on a loaded
# machine, 3,800/s; dicom ran 0.44 times as many executions as tiff in the same run on a loaded machine, 2,183 vs
# 5,014 in 25 s), the dictionary of tokens libFuzzer inserts (fuzz/dict/), and the largest input it makes.
declare -A RATE=([config]=250 [asap_xml]=8000 [geojson]=6000 [dataset_csv]=5000 [detections_csv]=10000
                 [manifest]=6000 [tiff]=2000 [dicom]=800)
declare -A DICT=([config]=yaml [asap_xml]=xml [geojson]=json [dataset_csv]=csv [detections_csv]=csv [manifest]=json
                 [tiff]=tiff [dicom]=dicom)
declare -A MAX_LEN=([config]=8192 [asap_xml]=16384 [geojson]=16384 [dataset_csv]=4096 [detections_csv]=4096
                    [manifest]=8192 [tiff]=65536 [dicom]=65536)

# Copies files into a corpus folder under names that cannot collide (<prefix>-<case>-<file>).
add_seeds() {
  local dest=$1 prefix=$2
  shift 2
  local f
  for f in "$@"; do
    [ -f "$f" ] || continue
    cp "$f" "$dest/$prefix-$(basename "$(dirname "$f")")-$(basename "$f")"
  done
}

rm -rf "$work"
mkdir -p "$work/corpus" "$work/real"
"$root/scripts/fuzz-seeds.sh" "$build/fuzz/fuzz_tiff_seed" "$work/real"
shopt -s nullglob
for t in "${targets[@]}"; do
  [ -n "${RATE[$t]:-}" ] || { echo "fuzz: unknown target '$t'" >&2; exit 2; }
  dest=$work/corpus/$t
  mkdir -p "$dest" "$work/crashes/$t"
  add_seeds "$dest" corpus "$root"/fuzz/corpus/"$t"/*
  add_seeds "$dest" regression "$root"/fuzz/regressions/"$t"/*
  add_seeds "$dest" real "$work"/real/"$t"/*
  case $t in
    config) add_seeds "$dest" tests "$root"/tests/data/config/*/job.yaml; add_seeds "$dest" repo "$root"/configs/*.yaml ;;
    asap_xml) add_seeds "$dest" tests "$root"/tests/data/annotations/*/*.xml ;;
    geojson) add_seeds "$dest" tests "$root"/tests/data/annotations/*/*.geojson "$root"/tests/data/annotations/*/*.json ;;
    dataset_csv) add_seeds "$dest" tests "$root"/tests/data/datasets/*/*.csv ;;
    detections_csv) add_seeds "$dest" tests "$root"/tests/data/detections/*/*.csv ;;
    manifest) add_seeds "$dest" tests "$root"/tests/data/manifest/*/*.json ;;
    tiff) add_seeds "$dest" tests "$root"/tests/data/slides/*/*.tif "$root"/tests/data/slides/*/*.tiff \
            "$root"/tests/data/slides/*/*.svs ;;
  esac
done

fixed_addresses=()
setarch "$(uname -m)" -R true 2> /dev/null && fixed_addresses=(setarch "$(uname -m)" -R)
failed=0
summary=()
for t in "${targets[@]}"; do
  runs=$((RATE[$t] * seconds))
  limit=(-runs="$runs" -max_total_time=$((seconds * 5)))
  [ -n "${FUZZ_CALIBRATE:-}" ] && runs=0 && limit=(-max_total_time="$seconds")
  seeds=$(find "$work/corpus/$t" -type f | wc -l)
  log=$work/$t.log
  echo "fuzz: $t: $runs executions from $seeds seeds (log: $log)"
  start=$(date +%s)
  status=0
  # Leak detection stays on: these parsers use libtiff, yaml-cpp, pugixml and nlohmann-json, none of which keep
  # allocations until exit (Open MPI and OpenSlide, which do, are linked but never started or opened here).
  # Same addresses every run (no ASLR) and no rereading of the corpus folder on a timer: nothing that varies between
  # runs steers the fuzzer.
  "${fixed_addresses[@]}" "$build/fuzz/${t}_fuzzer" -seed=1 -reload=0 "${limit[@]}" -dict="$root/fuzz/dict/${DICT[$t]}.dict" -max_len="${MAX_LEN[$t]}" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/crashes/$t/" \
    "$work/corpus/$t" > "$log" 2>&1 || status=$?
  elapsed=$(($(date +%s) - start))
  done_runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  crashes=$(find "$work/crashes/$t" -type f | wc -l)
  note=""
  if [ -z "$done_runs" ]; then
    failed=1
    note="FAILED: did not run (exit $status): $(tail -n 2 "$log" | tr '\n' ' ')"
  elif [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    note="FAILED (exit $status): $(grep -m 1 -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" || true)"
    for c in "$work/crashes/$t"/*; do note+=$'\n'"    input: $c"; done
  elif [ "${done_runs:-0}" -lt "$runs" ]; then
    note="cut short by the time limit after ${done_runs:-0} of $runs executions"
  fi
  [ -n "${FUZZ_CALIBRATE:-}" ] && note="$(( ${done_runs:-0} / (elapsed > 0 ? elapsed : 1) )) executions per second"
  summary+=("$(printf '%-15s %10s executions %4s s %3s crashes  %s' "$t" "${done_runs:-?}" "$elapsed" "$crashes" "$note")")
done

echo
echo "fuzz: seed 1, FUZZ_SECONDS=$seconds"
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "fuzz: FAILED: crashing inputs are under $work/crashes/ (replay one: <build-fuzz>/fuzz/<target>_fuzzer <file>)"
  exit 1
fi
echo "fuzz: no crash"
