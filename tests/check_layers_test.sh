#!/usr/bin/env bash
# scripts/check-layers.sh must fail, naming the file, line and rule, on a tree where a lower layer includes a
# higher one, and pass on the same tree without that include.
set -euo pipefail
script=${1:?usage: check_layers_test.sh <scripts/check-layers.sh>}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/core" "$tree/io" "$tree/engine"
printf '#pragma once\n#include "core/b.h"\n' > "$tree/core/a.h"
printf '#pragma once\n' > "$tree/core/b.h"
printf '#include "io/c.h"\n#include "core/a.h"\n' > "$tree/engine/d.cpp"
printf '#pragma once\n#include "core/a.h"\n' > "$tree/io/c.h"
"$script" "$tree" > /dev/null
printf '#pragma once\n#include "core/b.h"\n  #include "engine/e.h"\n' > "$tree/core/a.h"
if out=$("$script" "$tree" 2>&1); then
  echo "FAIL: core/ including engine/ was not reported" >&2
  exit 1
fi
grep -q 'core/a.h:3: core/ may not include "engine/e.h"' <<< "$out" || { echo "FAIL: unexpected message: $out" >&2; exit 1; }
echo "ok: $out"
