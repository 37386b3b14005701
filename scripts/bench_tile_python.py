#!/usr/bin/python3
"""The per-tile loop that Python tiling tools run, for `tessera bench tile` to compare against.

For every row `slide,x,y,level,width,height` of the tile list (level-0 top-left, pyramid level, and the region's
size in level pixels: the window the tiler reads for that tile): openslide read_region, RGBA->RGB, area (box)
resize to the tile size when the level is not at the tile resolution, and one h5py write per tile into a
preallocated dataset. Writes the loop's tiles per wall second and per CPU second of the process (imports and
file opening excluded) to the result file, on one line.

usage: bench_tile_python.py TILES.csv TILE_SIZE OUT.h5 RESULT.txt
"""
import sys
import time

import h5py
import numpy as np
import openslide
from PIL import Image


def main():
    rows_path, tile_size, out_path, result_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rows = []
    with open(rows_path) as f:
        for line in f:
            path, x, y, level, width, height = line.strip().rsplit(",", 5)
            rows.append((path, int(x), int(y), int(level), int(width), int(height)))
    slides = {path: openslide.OpenSlide(path) for path in {r[0] for r in rows}}
    with h5py.File(out_path, "w") as h5:
        images = h5.create_dataset("images", (len(rows), tile_size, tile_size, 3), dtype="uint8")
        start = time.perf_counter()
        start_cpu = time.process_time()
        for i, (path, x, y, level, width, height) in enumerate(rows):
            region = slides[path].read_region((x, y), level, (width, height)).convert("RGB")
            if (width, height) != (tile_size, tile_size):
                region = region.resize((tile_size, tile_size), Image.BOX)
            images[i] = np.asarray(region)
        elapsed = time.perf_counter() - start
        elapsed_cpu = time.process_time() - start_cpu
    with open(result_path, "w") as f:
        f.write(f"{len(rows) / elapsed} {len(rows) / elapsed_cpu}\n")


if __name__ == "__main__":
    main()
