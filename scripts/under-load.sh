#!/usr/bin/env bash
# Runs a command while stress-ng keeps every core busy (CI's check that no test depends on timing or load), and
# returns the command's exit code. stress-ng comes from Debian (scripts/install-deps.sh).
set -uo pipefail
if ! command -v stress-ng >/dev/null 2>&1; then
  echo "under-load.sh: stress-ng is missing (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
# A bounded load: even if this script is killed before its trap runs, stress-ng ends by itself.
stress-ng --cpu "$(nproc)" --cpu-method matrixprod --timeout 45m --quiet &
load=$!
trap 'kill "$load" 2>/dev/null; wait "$load" 2>/dev/null' EXIT
sleep 1
if ! kill -0 "$load" 2>/dev/null; then
  echo "under-load.sh: stress-ng did not start" >&2
  exit 2
fi
echo "under-load.sh: stress-ng --cpu $(nproc) running (pid $load)"
"$@"
