#!/usr/bin/env bash
# The layering rule of docs/ARCHITECTURE.md ("Layers"), checked on every #include "<folder>/..." of Tessera's own
# code: a folder may include only itself and the layers below it. The link graph (each folder one library, linking
# only those below) enforces the same at link time; this check also catches a header-only use. Run by CTest
# (test `layers`, label unit) and by hand: scripts/check-layers.sh [<source root>].
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)

declare -A ALLOWED=(
  [core]="core"
  [io]="core io"
  [preprocessing]="core io preprocessing"
  [synth]="core io preprocessing synth"
  [engine]="core io preprocessing engine"
  [analysis]="core io analysis"
  [viewer]="core io analysis viewer"
  [bench]="core io preprocessing synth engine analysis viewer bench"
  [app]="core io preprocessing synth engine analysis viewer bench app"
  [sim]="core io preprocessing engine sim"
  [fuzz]="core io engine analysis fuzz"
)

violations=0
for folder in "${!ALLOWED[@]}"; do
  [ -d "$root/$folder" ] || continue
  allowed=" ${ALLOWED[$folder]} "
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    target=$(sed -E 's/^[^"]*"([^"]+)".*/\1/' <<< "${rest#*:}")
    layer=${target%%/*}
    [ "$layer" = "$target" ] && continue  # a file beside it (generated headers): not a layer
    case "$allowed" in *" $layer "*) continue ;; esac
    echo "${file#"$root"/}:${line}: ${folder}/ may not include \"${target}\" (${folder}/ may use: ${ALLOWED[$folder]})" >&2
    violations=$((violations + 1))
  done < <(grep -rnE --include='*.h' --include='*.cpp' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$root/$folder" || true)
done
if [ "$violations" -gt 0 ]; then
  echo "check-layers: ${violations} include(s) cross the layering of docs/ARCHITECTURE.md" >&2
  exit 1
fi
echo "check-layers: every #include of ${!ALLOWED[*]} keeps to its layer"
