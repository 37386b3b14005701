#!/usr/bin/python3
"""The patch loop that Python users run to put labelled patches in HDF5, for `tessera bench import` to compare against.

For every row `path,label,...` of the CSV (a header line first; paths relative to the CSV's folder): PIL open and
convert to RGB, centred on a white TILE_SIZE square when its size differs (Tessera's `import.fit: pad`), and one
h5py write per patch (image and label) into preallocated datasets. Writes the loop's patches per wall second and per
CPU second to the result file (the whole process, start-up and imports included, is timed by the caller).

usage: bench_import_python.py PATCHES.csv TILE_SIZE OUT.h5 RESULT.txt
"""
import csv
import os
import sys
import time

import h5py
import numpy as np
from PIL import Image


def main():
    csv_path, tile_size, out_path, result_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    base = os.path.dirname(os.path.abspath(csv_path))
    with open(csv_path, newline="") as f:
        rows = [(os.path.join(base, r["path"]), int(r["label"])) for r in csv.DictReader(f)]
    with h5py.File(out_path, "w") as h5:
        images = h5.create_dataset("images", (len(rows), tile_size, tile_size, 3), dtype="uint8")
        labels = h5.create_dataset("labels", (len(rows),), dtype="uint8")
        start = time.perf_counter()
        start_cpu = time.process_time()
        for i, (path, label) in enumerate(rows):
            patch = Image.open(path).convert("RGB")
            if patch.size != (tile_size, tile_size):
                canvas = Image.new("RGB", (tile_size, tile_size), (255, 255, 255))
                w, h = min(patch.width, tile_size), min(patch.height, tile_size)
                left, top = (patch.width - w) // 2, (patch.height - h) // 2
                canvas.paste(patch.crop((left, top, left + w, top + h)), ((tile_size - w) // 2, (tile_size - h) // 2))
                patch = canvas
            images[i] = np.asarray(patch)
            labels[i] = label
        elapsed = time.perf_counter() - start
        elapsed_cpu = time.process_time() - start_cpu
    with open(result_path, "w") as f:
        f.write(f"{len(rows) / elapsed} {len(rows) / elapsed_cpu}\n")


if __name__ == "__main__":
    main()
