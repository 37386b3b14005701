#!/usr/bin/python3
"""The PyTorch peer of scripts/idc.sh: the same model shape trained on the same shards and split, for as many epochs.

It reads the shards `tessera import` wrote (manifest.json for each patient's split, shard-NNNNN.h5 for the
patches), trains scripts/torch_models.py's definition of the architecture (CompactCNN is Tessera's compact CNN layer
for layer) the way a PyTorch user would write it, and scores the val and test patients as `tessera predict
--threshold-from val` does: ROC AUC, and at the threshold with the highest balanced accuracy on the val tiles,
balanced accuracy, F1, sensitivity and specificity on each split; with --tta d8 each val and test patch scores the
mean P over its 8 symmetries, as `tessera predict --tta d8`. It prints one JSON object.

Recipe, Tessera's job's knobs (with --config, read from the effective config a `tessera train` run wrote, so
both sides train the same recipe and model, of the run's model.width or model.classifier_width; a knob PyTorch cannot
mirror here stops the script, and so does a size the architecture is not built with): SGD with momentum and L2
weight decay on conv and linear weights only (as optimizer.weight_decay), the peak rate lr × batch /
reference_batch (Tessera's linear scaling), cosine decay to 0 over the run, cross-entropy with balanced class
weights, inputs scaled to [0, 1] and normalised with the ImageNet mean and standard deviation; each training patch
gets Tessera's augmentation chain: one of the 8 symmetries, H&E stain jitter in optical density, then
torchvision's ColorJitter (brightness, contrast, saturation, hue).

Usage (Debian's /usr/bin/python3 with python3-torch, python3-torchvision, python3-h5py and python3-yaml):
  scripts/idc_torch.py --shards data/idc/shards --config data/idc/train-seed1/train.config.yaml --seed 1
  scripts/idc_torch.py --shards data/idc/shards --epochs 10 --lr 0.1 --seed 1 [--model compact] [--width 32]
                       [--threads 2] [--tta d8]
"""
import argparse
import json
import os
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from torch import nn  # noqa: E402
from torchvision.transforms import ColorJitter  # noqa: E402

sys.path.insert(0, SCRIPTS)
from torch_models import DEFAULT_SIZE, SIZE_KEY, build_model  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_shards(folder):
    """The patches of every split as uint8 [N, T, T, 3] and labels [N], in shard order."""
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    split_of = {s["id"]: s["split"] for s in manifest["slides"]}
    by_split = {}
    for shard in manifest["shards"]:
        with h5py.File(os.path.join(folder, shard["file"]), "r") as h5:
            images = h5["images"][...]
            labels = h5["labels"][...]
            slide_index = h5["slide_index"][...]
            slides = [s.decode() if isinstance(s, bytes) else str(s) for s in h5["slides"][...]]
        splits = np.array([split_of[slides[i]] for i in slide_index])
        for name in np.unique(splits):
            keep = splits == name
            part = by_split.setdefault(name, ([], []))
            part[0].append(images[keep])
            part[1].append(labels[keep])
    return {name: (np.concatenate(x), np.concatenate(y)) for name, (x, y) in by_split.items()}


def to_input(images):
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def stain_unmixing():
    """Ruifrok & Johnston's H and E OD vectors (normalised) and the rows of the unmixing matrix that give the H and E
    concentrations, the residual vector orthogonal to both (preprocessing/stain.h's model)."""
    h = torch.tensor([0.650, 0.704, 0.286], dtype=torch.float64)
    e = torch.tensor([0.072, 0.990, 0.105], dtype=torch.float64)
    h, e = h / h.norm(), e / e.norm()
    r = torch.linalg.cross(h, e)
    r = r / r.norm()
    unmix = torch.linalg.inv(torch.stack([h, e, r], dim=1))
    return h.float(), e.float(), unmix[0].float(), unmix[1].float()


def augment(images, generator, args):
    """Tessera's augmentation chain (preprocessing/augment.h) per patch, on uint8 [B, T, T, 3] -> normalised float
    [B, 3, T, T]: one of the 8 symmetries, H&E stain jitter in optical density (concentrations scaled by a factor in
    [1 - hed_scale, 1 + hed_scale] and shifted by up to hed_shift), then torchvision's ColorJitter (brightness,
    contrast, saturation, hue, in a random order)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    n = x.shape[0]
    k = torch.randint(0, 4, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    h_vec, e_vec, h_row, e_row = stain_unmixing()
    scale = 1.0 + args.hed_scale * (2.0 * torch.rand(n, 2, generator=generator) - 1.0)
    shift = args.hed_shift * (2.0 * torch.rand(n, 2, generator=generator) - 1.0)
    jitter = ColorJitter(args.brightness, args.contrast, args.saturation, args.hue)
    out = torch.empty_like(x)
    for i in range(n):
        t = torch.rot90(x[i], int(k[i]), dims=(1, 2))
        if flip[i]:
            t = torch.flip(t, dims=(2,))
        if args.hed_scale > 0 or args.hed_shift > 0:
            od = -torch.log(t.clamp(min=1.0) / 255.0)                          # [3, T, T]
            h = torch.einsum("c,chw->hw", h_row, od)
            e = torch.einsum("c,chw->hw", e_row, od)
            dh = (scale[i, 0] - 1.0) * h + shift[i, 0]
            de = (scale[i, 1] - 1.0) * e + shift[i, 1]
            od = od + dh * h_vec.view(3, 1, 1) + de * e_vec.view(3, 1, 1)
            t = 255.0 * torch.exp(-od)
        out[i] = jitter(t.clamp_(0.0, 255.0) / 255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (out - mean) / std


def roc_auc(scores, labels):
    """Mann-Whitney AUC with ties counting one half (core/metrics.h's definition)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[i:j] = (i + 1 + j) / 2.0
        i = j
    positive = labels[order] != 0
    p = positive.sum()
    n = len(s) - p
    return float((ranks[positive].sum() - p * (p + 1) / 2.0) / (p * n))


def balanced_threshold(scores, labels):
    """The midpoint below the lowest score of the rule with the highest balanced accuracy (core::balanced_threshold)."""
    order = np.argsort(-scores, kind="mergesort")
    s = scores[order]
    y = labels[order] != 0
    p, n = int(y.sum()), int((~y).sum())
    tp = fp = 0
    best, best_end, lowest = 0, 0, float("inf")
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            tp += int(y[j])
            fp += int(not y[j])
            j += 1
        if tp * n - fp * p > best:
            best, best_end, lowest = tp * n - fp * p, j, float(s[i])
        i = j
    if best_end in (0, len(s)):
        return lowest
    below = float(s[best_end])
    return below + (lowest - below) / 2.0


def operating_point(scores, labels, threshold):
    called = scores >= threshold
    positive = labels != 0
    tp = int((called & positive).sum())
    fp = int((called & ~positive).sum())
    fn = int((~called & positive).sum())
    tn = int((~called & ~positive).sum())
    sensitivity = tp / (tp + fn) if tp + fn else float("nan")
    specificity = tn / (tn + fp) if tn + fp else float("nan")
    return {"balanced_accuracy": (sensitivity + specificity) / 2.0,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan"),
            "sensitivity": sensitivity, "specificity": specificity, "tp": tp, "fp": fp, "tn": tn, "fn": fn}


def dihedral(x, index):
    """The index-th (0-7) of the 8 symmetries of the square on [B, C, T, T]: index % 4 quarter turns, mirrored when
    index >= 4."""
    x = torch.rot90(x, index % 4, dims=(2, 3))
    return torch.flip(x, dims=(3,)) if index >= 4 else x


def predict(model, images, batch, tta="none"):
    """P(tumour) per patch; with tta "d8" the mean P over the patch's 8 symmetries (as `tessera predict --tta d8`)."""
    model.eval()
    views = 8 if tta == "d8" else 1
    out = []
    with torch.inference_mode():
        for i in range(0, len(images), batch):
            x = to_input(images[i:i + batch])
            p = sum(torch.softmax(model(dihedral(x, v)), dim=1)[:, 1] for v in range(views)) / views
            out.append(p.numpy())
    return np.concatenate(out).astype(np.float32)


def recipe_from_config(path):
    """The argparse defaults that mirror a `tessera train` effective config (train.config.yaml)."""
    with open(path) as f:
        c = yaml.safe_load(f)
    aug, colour, hed = c["augment"], c["augment"]["colour"], c["augment"]["hed"]
    unsupported = [(key, value, want) for key, value, want in (
        ("optimizer.name", c["optimizer"]["name"], "sgd"), ("optimizer.nesterov", c["optimizer"]["nesterov"], False),
        ("schedule.name", c["schedule"]["name"], "cosine"), ("schedule.warmup_epochs", c["schedule"]["warmup_epochs"], 0),
        ("schedule.min_lr", c["schedule"]["min_lr"], 0), ("train.class_weights", c["train"]["class_weights"], "balanced"),
        ("train.accumulation_steps", c["train"]["accumulation_steps"], 1), ("augment.enabled", aug["enabled"], True),
        ("augment.flip_horizontal", aug["flip_horizontal"], 0.5), ("augment.flip_vertical", aug["flip_vertical"], 0.5),
        ("augment.rotate90", aug["rotate90"], 0.5), ("augment.colour.probability", colour["probability"], 1),
        ("augment.hed.probability", hed["probability"], 1)) if value != want]
    if unsupported:
        raise SystemExit("%s: this script mirrors only %s" % (path, ", ".join(
            "%s: %s (not %s)" % (key, want, value) for key, value, want in unsupported)))
    # The model's size: model.width (compact) and model.classifier_width (alexnet, vgg*); absent in configs written
    # before the keys, whose models had the defaults.
    model = c["model"]
    return {"model": model["architecture"], "width": model.get("width", DEFAULT_SIZE["width"]),
            "classifier_width": model.get("classifier_width", DEFAULT_SIZE["classifier_width"]),
            "epochs": c["train"]["epochs"], "batch": c["train"]["batch_size"],
            "lr": c["optimizer"]["lr"], "reference_batch": c["schedule"]["reference_batch"],
            "momentum": c["optimizer"]["momentum"], "weight_decay": c["optimizer"]["weight_decay"],
            "brightness": colour["brightness"], "contrast": colour["contrast"], "saturation": colour["saturation"],
            "hue": colour["hue"], "hed_scale": hed["scale"], "hed_shift": hed["shift"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", required=True)
    parser.add_argument("--config", help="a tessera train run's train.config.yaml: its recipe becomes the defaults")
    parser.add_argument("--model", default="compact")
    parser.add_argument("--width", type=int, default=DEFAULT_SIZE["width"],
                        help="compact: channels of the first stage, as model.width")
    parser.add_argument("--classifier-width", type=int, default=DEFAULT_SIZE["classifier_width"],
                        help="alexnet, vgg*: hidden units of the classifier, as model.classifier_width")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1, help="peak rate at the reference batch (scaled linearly)")
    parser.add_argument("--reference-batch", type=int, default=256)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--brightness", type=float, default=0.2)
    parser.add_argument("--contrast", type=float, default=0.2)
    parser.add_argument("--saturation", type=float, default=0.2)
    parser.add_argument("--hue", type=float, default=0.04, help="in turns, as augment.colour.hue")
    parser.add_argument("--hed-scale", type=float, default=0.05)
    parser.add_argument("--hed-shift", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tta", choices=("none", "d8"), default="none",
                        help="test-time augmentation of the val and test patches, as tessera predict --tta")
    first, _ = parser.parse_known_args()
    if first.config:
        parser.set_defaults(**recipe_from_config(first.config))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    start = time.time()
    data = load_shards(args.shards)
    for name in ("train", "val", "test"):
        if name not in data:
            raise SystemExit("%s: no patient in split '%s'" % (args.shards, name))
    x_train, y_train = data["train"]
    model, source = build_model(args.model, 2, x_train.shape[1], width=args.width,
                                classifier_width=args.classifier_width)
    counts = np.bincount(y_train, minlength=2).astype(np.float64)
    weights = torch.tensor(len(y_train) / (2.0 * counts), dtype=torch.float32)  # balanced
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    lr = args.lr * args.batch / args.reference_batch if args.reference_batch > 0 else args.lr
    weights_only = [p for p in model.parameters() if p.dim() > 1]  # conv and linear weights: not biases or BN
    rest = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.SGD([{"params": weights_only, "weight_decay": args.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}], lr=lr, momentum=args.momentum)
    steps_per_epoch = len(y_train) // args.batch
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps_per_epoch * args.epochs)
    for _ in range(args.epochs):
        model.train()
        order = rng.permutation(len(y_train))
        for step in range(steps_per_epoch):
            idx = order[step * args.batch:(step + 1) * args.batch]
            x = augment(x_train[idx], generator, args)
            y = torch.from_numpy(y_train[idx].astype(np.int64))
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
    train_seconds = time.time() - start

    scores = {name: predict(model, data[name][0], 256, args.tta) for name in ("val", "test")}
    threshold = balanced_threshold(scores["val"], data["val"][1])
    result = {"framework": "pytorch " + torch.__version__, "model": args.model, "definition": source,
              "epochs": args.epochs, "batch": args.batch, "lr": lr, "weight_decay": args.weight_decay, "seed": args.seed, "threads": args.threads,
              "tta": args.tta,
              "train_tiles": int(len(y_train)), "seconds": time.time() - start, "train_seconds": train_seconds,
              "threshold": threshold, "threshold_from": "val", "per_split": {}}
    if args.model in SIZE_KEY:  # the size the architecture is built with (width or classifier_width), as in /meta
        key = SIZE_KEY[args.model]
        result[key] = getattr(args, key)
    for name in ("val", "test"):
        labels = data[name][1]
        entry = {"tiles": int(len(labels)), "auc": roc_auc(scores[name], labels)}
        entry.update(operating_point(scores[name], labels, threshold))
        result["per_split"][name] = entry
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
