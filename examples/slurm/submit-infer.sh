#!/bin/bash
# Submits tessera infer over a slide list as a job array of TASKS tasks and, after it (afterok), the summary job that
# gathers the parts and evaluates them. Prints the two job ids.
#   examples/slurm/submit-infer.sh SLIDES.txt CHECKPOINT OUT TASKS [DATASET.csv] [-- sbatch options...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${1:?usage: submit-infer.sh SLIDES.txt CHECKPOINT OUT TASKS [DATASET.csv] [-- sbatch options...]}
checkpoint=${2:?checkpoint missing}
out=${3:?output folder missing}
tasks=${4:?number of array tasks missing}
shift 4
dataset=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then dataset=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
mkdir -p "$out"
array=$(sbatch --parsable "$@" --array="0-$((tasks - 1))" --output="$out/infer-%A_%a.out" \
  "$here/infer-array.sbatch" "$list" "$checkpoint" "$out")
summary=$(sbatch --parsable "$@" --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  --output="$out/summary-%j.out" "$here/infer-summary.sbatch" "$out" ${dataset:+"$dataset"})
echo "$array $summary"
