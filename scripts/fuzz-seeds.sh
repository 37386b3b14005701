#!/usr/bin/env bash
# Writes fuzz seeds derived from the real files in ../shared/data/real-slides/ (relative to the repository root)
# into <out>/<target>/: small inputs cut from them, never the large files whole. Prints what it wrote; writes
# nothing (and says so) when that folder is absent, as on a machine that has only the repository.
#
#   scripts/fuzz-seeds.sh <fuzz_tiff_seed> <out>
#
# <fuzz_tiff_seed> is the build-fuzz tool that cuts a slide's first tiled directory down to a few of its tiles.
set -euo pipefail

tool=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
real=$root/../shared/data/real-slides
if [ ! -d "$real" ]; then
  echo "fuzz-seeds: $real is absent: no seeds from real slides"
  exit 0
fi
mkdir -p "$out/tiff" "$out/asap_xml"

# Real slides that are already small (a 16x16 Aperio crop, a 4-level generic TIFF, a slide whose tiles are corrupt,
# one with an unsupported compression): whole.
for f in small.svs boxes.tiff unreadable.svs unopenable.tiff; do
  [ -f "$real/$f" ] && cp "$real/$f" "$out/tiff/real-$f"
done
# A real Aperio slide is 1.9 MB with its directory at the end: its header and its first tiles, cut out.
if [ -f "$real/cmu-1-small-region.svs" ]; then
  "$tool" "$real/cmu-1-small-region.svs" "$out/tiff/real-cmu-1-1x1.tif" 1
  "$tool" "$real/cmu-1-small-region.svs" "$out/tiff/real-cmu-1-2x2.tif" 2
fi

# A real CAMELYON16 annotation (620 kB, 10,778 vertices): its first annotation's first 40 vertices, and its groups.
xml=$real/camelyon16-tumor_009.xml
if [ -f "$xml" ]; then
  awk '
    /<Coordinate / { if (++n > 40) next }
    /<\/Coordinates>/ { if (done) next; done = 1; print; print "\t\t</Annotation>"; print "\t</Annotations>"; skip = 1; next }
    skip && /<AnnotationGroups>/ { skip = 0 }
    !skip { print }
  ' "$xml" > "$out/asap_xml/real-camelyon16-head.xml"
fi

chmod -R u+w "$out"  # copies of read-only files
for target in "$out"/*/; do
  echo "fuzz-seeds: $(basename "$target"): $(find "$target" -type f | wc -l) seeds from real files"
done
