#!/usr/bin/env bash
# Tiling end to end against a Python loop: the whole `tessera tile` process (start-up, planning with tissue masks,
# extraction into HDF5 shards, manifest) on N synthetic slides (default 64 of 8192² px at 0.25 um/px, 96 px tiles at
# 1 um/px, one rank) against the whole process of the loop Python tiling tools run (scripts/bench_tile_python.py:
# openslide-python read_region + RGBA->RGB + one h5py write per tile into one preallocated dataset; its imports,
# slide opening and writing included), in alternated rounds (default 3) with the order rotated each round.
#
# Three Tessera sides: quality control on (tile's default) and off, and off with tile.threads 1 (one thread reads the
# tiles and plans the slides, another writes the shards; the default is the cores this rank may use). The Python side does no planning: it is handed
# the QC-off job's tiles (slide, level-0 position, the level and region tessera reads for each), so it does no tissue
# detection, no labelling and no QC; QC off is the like-for-like comparison, QC on what a user runs by default.
# Prints per side the best and median wall and CPU time, the ratios Python / Tessera, and the load average of each
# run. Everything is in the work folder (slides made once with `tessera synth`, runs/<side>-<round>.log).
# BEFORE=<another tessera binary> adds its QC-on and QC-off jobs to the same rounds (sides before-qc-on and
# before-qc-off), to compare two builds under the same load, and prints each build's time over the other's.
#
#   scripts/bench-tile-python.sh [work folder]          (default data/bench-tile-python)
#   SLIDES=64 SIZE=8192 ROUNDS=3 TILE=96 MPP=1.0 TESSERA=build/app/tessera BEFORE= scripts/bench-tile-python.sh
set -euo pipefail

TESSERA=${TESSERA:-build/app/tessera}
WORK=${1:-data/bench-tile-python}
SLIDES=${SLIDES:-64}
SIZE=${SIZE:-8192}
ROUNDS=${ROUNDS:-3}
TILE=${TILE:-96}
MPP=${MPP:-1.0}
PYTHON=/usr/bin/python3
SCRIPT=$(realpath "$(dirname "$0")/bench_tile_python.py")

"$PYTHON" -c 'import openslide, h5py, numpy, PIL' 2>/dev/null || {
  echo "bench-tile-python.sh: needs $PYTHON with openslide, h5py, numpy and PIL (scripts/install-deps.sh --bench)" >&2
  exit 2
}
mkdir -p "$WORK/runs"
WORK=$(realpath "$WORK")
TESSERA=$(realpath "$TESSERA")
BEFORE=${BEFORE:+$(realpath "$BEFORE")}
slides="$WORK/slides-${SLIDES}x$SIZE"
if [ ! -f "$slides/dataset.csv" ]; then
  "$TESSERA" synth --out "$slides" --slides "$SLIDES" --size "$SIZE" --seed 11 --set preview.enabled=false \
    >"$WORK/synth.log" 2>&1
fi
for side in qc-on qc-off before-qc-on before-qc-off; do
  printf 'input:\n  csv: %s\noutput: %s\ntile:\n  size: %s\n  mpp: %s\nqc:\n  enabled: %s\n' "$slides/dataset.csv" \
    "$WORK/runs/$side" "$TILE" "$MPP" "$(case $side in *qc-on) echo true ;; *) echo false ;; esac)" >"$WORK/$side.yaml"
done

# A warm-up run of each Tessera side (the slides are then in the page cache for every measured run), and the Python
# side's tiles: those of the QC-off job, with the level and level region tessera's reader uses for each (the rule of
# io::Slide::plan_read_at_mpp: the coarsest level at most 1% finer than the target; its pixels as they are when
# that level is at the target resolution, else the tile's footprint, resized by the loop).
for side in qc-on qc-off; do "$TESSERA" tile "$WORK/$side.yaml" --force >"$WORK/runs/$side-warmup.log" 2>&1; done
if [ -n "$BEFORE" ]; then
  for side in before-qc-on before-qc-off; do
    "$BEFORE" tile "$WORK/$side.yaml" --force >"$WORK/runs/$side-warmup.log" 2>&1
  done
fi
"$PYTHON" - "$WORK/runs/qc-off" "$TILE" "$MPP" "$WORK/tiles.csv" <<'EOF'
import json, math, sys
import h5py, openslide
shards, tile, mpp, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
manifest = json.load(open(f"{shards}/manifest.json"))
paths = {s["id"]: s["path"] for s in manifest["slides"]}
opened = {}
def slide_resolution(slide):  # um/px: OpenSlide's property, else the TIFF resolution tags, as tessera reads it
    p = slide.properties
    if openslide.PROPERTY_NAME_MPP_X in p:
        return float(p[openslide.PROPERTY_NAME_MPP_X])
    per_unit = {"centimeter": 1e4, "inch": 25400.0}[p["tiff.ResolutionUnit"]]
    return per_unit / float(p["tiff.XResolution"])
with open(out, "w") as rows:
    for entry in manifest["shards"]:
        with h5py.File(f"{shards}/{entry['file']}", "r") as h5:
            names = [n.decode() if isinstance(n, bytes) else n for n in h5["slides"][:]]
            for (x, y), s in zip(h5["coords"][:], h5["slide_index"][:]):
                path = paths[names[s]]
                if path not in opened:
                    opened[path] = openslide.OpenSlide(path)
                slide = opened[path]
                slide_mpp = slide_resolution(slide)
                level = max(i for i, ds in enumerate(slide.level_downsamples) if slide_mpp * ds <= mpp * 1.01)
                ds = slide.level_downsamples[level]
                if abs(slide_mpp * ds - mpp) <= mpp * 0.01:
                    lx, ly, lw, lh = math.floor(x / ds), math.floor(y / ds), tile, tile
                else:
                    lx, ly = math.floor(x / ds), math.floor(y / ds)
                    lw = max(1, math.ceil((x + tile * mpp / slide_mpp) / ds - 1e-6) - lx)
                    lh = max(1, math.ceil((y + tile * mpp / slide_mpp) / ds - 1e-6) - ly)
                rows.write(f"{path},{round(lx * ds)},{round(ly * ds)},{level},{lw},{lh}\n")
EOF

# run SIDE: one measured run into runs/SIDE-ROUND.log; its wall, user and system seconds and the load average before
# it in runs/SIDE-ROUND.time.
run() {
  local side=$1 log="$WORK/runs/$1-$round.log" load
  load=$(cut -d' ' -f1 /proc/loadavg)
  TIMEFORMAT="%R %U %S $load"
  if [ "$side" = python ]; then
    { time "$PYTHON" "$SCRIPT" "$WORK/tiles.csv" "$TILE" "$WORK/runs/python.h5" "$WORK/runs/python-$round.rate" \
      >"$log" 2>&1; } 2>"$WORK/runs/$side-$round.time"
  elif [ "${side#before-}" != "$side" ]; then
    { time "$BEFORE" tile "$WORK/$side.yaml" --force >"$log" 2>&1; } 2>"$WORK/runs/$side-$round.time"
  elif [ "$side" = qc-off-1thread ]; then
    { time "$TESSERA" tile "$WORK/qc-off.yaml" --force --set tile.threads=1 >"$log" 2>&1; } \
      2>"$WORK/runs/$side-$round.time"
  else
    { time "$TESSERA" tile "$WORK/$side.yaml" --force >"$log" 2>&1; } 2>"$WORK/runs/$side-$round.time"
  fi
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
sides=(qc-on qc-off qc-off-1thread python)
[ -z "$BEFORE" ] || sides+=(before-qc-on before-qc-off)
for ((round = 1; round <= ROUNDS; ++round)); do
  for ((k = 0; k < ${#sides[@]}; ++k)); do run "${sides[$(((k + round - 1) % ${#sides[@]}))]}"; done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PYTHON" - "$WORK" "$ROUNDS" "${BEFORE:+before}" <<'EOF'
import json, statistics, sys
work, rounds, before = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "before"
def tiles(side):
    if side == "python":
        return sum(1 for _ in open(f"{work}/tiles.csv"))
    folder = "qc-off" if side == "qc-off-1thread" else side
    return sum(s["tiles"] for s in json.load(open(f"{work}/runs/{folder}/manifest.json"))["shards"])
figures = {}
sides = ["qc-on", "qc-off", "qc-off-1thread", "python"] + (["before-qc-on", "before-qc-off"] if before else [])
for side in sides:
    runs = [tuple(map(float, open(f"{work}/runs/{side}-{r}.time").read().split())) for r in range(1, rounds + 1)]
    wall = [r[0] for r in runs]
    cpu = [r[1] + r[2] for r in runs]
    figures[side] = (min(wall), statistics.median(wall), min(cpu))
    print(f"{side:14s} {tiles(side):6d} tiles; wall best {min(wall):.2f} s median {statistics.median(wall):.2f} s "
          f"(each: {', '.join(f'{w:.2f}' for w in wall)}); CPU best {min(cpu):.2f} s; "
          f"load before each run {', '.join(f'{r[3]:.2f}' for r in runs)}")
for side in [s for s in sides if s != "python"]:
    p, t = figures["python"], figures[side]
    print(f"python / tessera tile {side}: {p[0] / t[0]:.2f}x by best wall, {p[1] / t[1]:.2f}x by median wall, "
          f"{p[2] / t[2]:.2f}x by best CPU")
for side in ("qc-on", "qc-off") if before else ():
    b, t = figures["before-" + side], figures[side]
    print(f"before / this build, {side}: {b[0] / t[0]:.2f}x by best wall, {b[1] / t[1]:.2f}x by median wall, "
          f"{b[2] / t[2]:.2f}x by best CPU")
EOF
