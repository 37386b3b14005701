#!/usr/bin/python3
"""The Python side of `tessera bench infer-slide`: the whole-slide pipeline a user would otherwise run.

For each tile: OpenSlide read_region at the best level for the model's resolution, PIL resize to the model's input,
scaling to [0, 1]; batches through the same model shape in PyTorch (scripts/bench_torch.py's definitions, eval mode
under torch.inference_mode, random weights: the same work as trained ones); the tumour probabilities saved as a
grid with numpy. The tiles are the ones Tessera scored on the same slide: the cells of its heatmap.h5 that are
not NaN (top-left (origin_x + col*step, origin_y + row*step), side `tile`, in level-0 pixels). No tissue detection,
stain normalization or viewer outputs here: the comparison leaves that work to Tessera's side alone.

Usage (Debian's /usr/bin/python3 with python3-torch, python3-openslide, python3-h5py, python3-pil; install-deps.sh
--bench):
  scripts/bench_infer_slide.py --slide S.svs --heatmap S.heatmap.h5 --model compact --size 96 --batch 64 \
      --threads 2 --out grid.npy
prints one line "bench-infer-slide-python: {json}" with the tiles and the seconds of each phase. Without one of
the modules it prints that line with {"available": false, "error": ...} and exits 0.
"""
import argparse
import json
import os
import sys
import time

START = time.perf_counter()
PREFIX = "bench-infer-slide-python: "
SCRIPTS = os.path.dirname(os.path.abspath(__file__))

try:
    import h5py
    import numpy as np
    import openslide
    import torch
    from PIL import Image

    sys.path.insert(0, SCRIPTS)
    from bench_torch import build_model
except ImportError as error:  # the caller reports the Python side as not measured
    print(PREFIX + json.dumps({"available": False, "error": str(error)}), flush=True)
    sys.exit(0)


def tiles_of(heatmap_path):
    """The tiles Tessera scored: level-0 top-left corners, the tile side, and the grid's shape."""
    with h5py.File(heatmap_path, "r") as f:
        prob = f["prob"][:]
        attrs = {k: f.attrs[k] for k in ("origin_x", "origin_y", "step", "tile")}
    rows, cols = np.nonzero(~np.isnan(prob))
    xs = int(attrs["origin_x"]) + cols * int(attrs["step"])
    ys = int(attrs["origin_y"]) + rows * int(attrs["step"])
    return list(zip(xs.tolist(), ys.tolist(), rows.tolist(), cols.tolist())), int(attrs["tile"]), prob.shape


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slide", required=True)
    parser.add_argument("--heatmap", required=True, help="Tessera's heatmap.h5 of the slide: the tiles to score")
    parser.add_argument("--model", default="compact")
    parser.add_argument("--size", type=int, default=96, help="the model's input in px")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default (all cores)")
    parser.add_argument("--out", required=True, help="where the probability grid goes (.npy)")
    args = parser.parse_args()

    phases = {"imports": time.perf_counter() - START}
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t = time.perf_counter()
    torch.manual_seed(0)
    model, source = build_model(args.model, 2, args.size)
    model.eval()
    slide = openslide.OpenSlide(args.slide)
    tiles, side, shape = tiles_of(args.heatmap)
    phases["setup"] = time.perf_counter() - t

    downsample = side / args.size
    level = slide.get_best_level_for_downsample(downsample)
    level_downsample = slide.level_downsamples[level]
    read_side = max(1, int(round(side / level_downsample)))
    grid = np.full(shape, np.nan, dtype=np.float32)
    read_seconds = 0.0
    model_seconds = 0.0
    batch = np.empty((args.batch, 3, args.size, args.size), dtype=np.float32)
    where = []

    def score(n):
        nonlocal model_seconds
        t0 = time.perf_counter()
        with torch.inference_mode():
            p = torch.softmax(model(torch.from_numpy(batch[:n])), dim=1)[:, 1].numpy()
        for (row, col), value in zip(where, p):
            grid[row, col] = value
        model_seconds += time.perf_counter() - t0

    for x, y, row, col in tiles:
        t0 = time.perf_counter()
        image = slide.read_region((x, y), level, (read_side, read_side)).convert("RGB")
        if image.size != (args.size, args.size):
            image = image.resize((args.size, args.size), Image.BILINEAR)
        batch[len(where)] = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
        where.append((row, col))
        read_seconds += time.perf_counter() - t0
        if len(where) == args.batch:
            score(len(where))
            where.clear()
    if where:
        score(len(where))
    phases["read"] = read_seconds
    phases["model"] = model_seconds
    t = time.perf_counter()
    np.save(args.out, grid)
    phases["write"] = time.perf_counter() - t
    print(PREFIX + json.dumps({"available": True, "torch": torch.__version__, "model": args.model, "source": source,
                               "threads": torch.get_num_threads(), "tiles": len(tiles), "level": level,
                               "read_side": read_side, "parameters": sum(p.numel() for p in model.parameters()),
                               "seconds": phases, "total_seconds": time.perf_counter() - START}), flush=True)


if __name__ == "__main__":
    main()
