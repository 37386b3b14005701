#!/usr/bin/python3
"""PyTorch <-> Tessera checkpoints, and reference outputs of the same models for Tessera's tests.

A Tessera checkpoint (io/checkpoint.h, docs/ARCHITECTURE.md "Checkpoints") is one HDF5 file:
  /params/<name>, /buffers/<name>   float32 tensors with torchvision names and layouts (conv O x I x kH x kW,
                                    linear [out, in], batch-norm running_mean / running_var); a name such as
                                    "layer1.0.conv1.weight" is one dataset directly in its group
  /meta                             attributes: format = "tessera-checkpoint", version, architecture,
                                    input_size, num_classes, class_names, mpp, stain_normalization,
                                    stain_target, config_yaml, step, epoch, created, tessera_version, and
                                    optionally the tiling's tissue_min_fraction, tissue_mask_mpp,
                                    tissue_reject_pen_marks (`export` writes none: inference then uses its
                                    defaults) and what the model was trained on: training_data,
                                    training_synthetic_slides, training_real_slides, training_unknown_slides,
                                    training_shards (`export` writes none: the training data is then unknown,
                                    and `tessera infer` claims nothing about it), and the model's size: width
                                    (compact) or classifier_width (alexnet, vgg*), int64, written for those
                                    architectures only; a file without it is the default size (32, 4096)
Training state for resuming (/optimizer, /easgd, /replicas/<rank>/..., /state) is ignored here: `import`
converts /params and /buffers only.
BatchNorm's `num_batches_tracked` is not stored (Tessera's batch norm uses a fixed momentum); `import` sets it
to 0, which changes nothing in eval mode or with a fixed momentum.

The models are Tessera's whole registry in PyTorch (scripts/torch_models.py: tiny_cnn, lenet5, compact, alexnet,
vgg11, vgg11_bn, vgg16, vgg16_bn, resnet18, resnet34, resnet50), torchvision's own where torchvision has them and
it is installed (Debian's python3-torchvision), with torchvision's parameter names.

Usage (Debian's python3 has python3-torch and python3-h5py):
  scripts/torch_checkpoint.py export --arch ARCH [--state-dict model.pt] [--seed 0] [--num-classes 2]
                                     [--input-size 224] [--width 32] [--classifier-width 4096]
                                     [--class-names normal,tumor] [--mpp 0.5] OUT.h5
      A state_dict from a .pt file (a bare state_dict, or a dict holding one under "state_dict"/"model";
      DataParallel "module." prefixes are removed; its class count is its classifier's, and its size, for compact
      and alexnet/vgg*, its tensors' shapes: --width and --classifier-width, when given, must agree), or a seeded
      random model with randomized batch-norm statistics when --state-dict is not given (of --width or
      --classifier-width, default 32 and 4096), written as a Tessera checkpoint whose /meta records that size
      (the input size defaults to the architecture's: 8 tiny_cnn, 32 lenet5, 96 compact, 224 the others).
      `tessera train` starts from it with model.init_from (the classifier head is replaced when the class
      count differs).
  scripts/torch_checkpoint.py import CKPT.h5 OUT.pt
      The checkpoint as a state_dict, loaded strictly into the architecture and size named in /meta, saved with
      torch.save.
  scripts/torch_checkpoint.py predict CKPT.h5 [--batch 2] [--size PX] [--json OUT.json]
      Eval-mode logits and softmax of the checkpoint's model for the fixed input below, printed as JSON.
  scripts/torch_checkpoint.py fixture OUT_DIR
      Regenerates tests/data/checkpoints/tiny_torch.h5 and tiny_torch.expected.json (see the README there).
  scripts/torch_checkpoint.py selftest
      export -> import is bit-exact and gives identical outputs, for every architecture.

The fixed input, reproducible without torch: x has shape [N, 3, S, S] in C order and for flat index i
  x[i] = float32(((i * 2654435761) mod 2^32) / 2^31 - 1)        (values in [-1, 1))
"""
import argparse
import datetime
import json
import os
import sys
import tempfile

import h5py
import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (beside this script)
from torch_models import ARCHITECTURES, DEFAULT_INPUT_SIZE, SIZE_KEY  # noqa: E402

FORMAT = "tessera-checkpoint"
VERSION = 1
SKIPPED_BUFFERS = ("num_batches_tracked",)


# ---------------------------------------------------------------------------------------------------------------
# Models: Tessera's registry in PyTorch (scripts/torch_models.py).

def build_model(arch, num_classes, size=None, sizes=None):
    """`sizes`: {"width": w} or {"classifier_width": w} (a checkpoint's /meta attributes), or None for the default."""
    if arch not in ARCHITECTURES:
        sys.exit("unknown architecture '%s' (known: %s)" % (arch, ", ".join(ARCHITECTURES)))
    return torch_models.build_model(arch, num_classes, size, **(sizes or {}))[0]


def meta_sizes(meta):
    """The model's size a checkpoint's /meta records (none in files written before it: the default)."""
    return {key: meta[key] for key in ("width", "classifier_width") if key in meta}


def randomize_batchnorm(model, generator):
    """Non-trivial affine parameters and running statistics, so that eval-mode batch norm is not an identity."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(0.5 + torch.rand(c, generator=generator))
                m.bias.copy_(0.4 * torch.rand(c, generator=generator) - 0.2)
                m.running_mean.copy_(0.4 * torch.rand(c, generator=generator) - 0.2)
                m.running_var.copy_(0.5 + 1.5 * torch.rand(c, generator=generator))


def seeded_model(arch, num_classes, seed, size=None, sizes=None):
    torch.manual_seed(seed)
    model = build_model(arch, num_classes, size, sizes)
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()


def fixed_input(n, size):
    count = n * 3 * size * size
    i = np.arange(count, dtype=np.uint64)
    k = (i * np.uint64(2654435761)) % np.uint64(2 ** 32)
    x = (k.astype(np.float64) / 2.0 ** 31 - 1.0).astype(np.float32)
    return torch.from_numpy(x.reshape(n, 3, size, size))


# ---------------------------------------------------------------------------------------------------------------
# The HDF5 layout.

def split_state(model):
    """(params, buffers) of a model as name -> float32 numpy array, in the model's order."""
    params = {name: p.detach().cpu().numpy().astype("<f4") for name, p in model.named_parameters()}
    buffers = {name: b.detach().cpu().numpy().astype("<f4") for name, b in model.named_buffers()
               if name.rsplit(".", 1)[-1] not in SKIPPED_BUFFERS}
    return params, buffers


def write_checkpoint(path, params, buffers, meta):
    """Writes like Tessera does: groups in creation order, contiguous float32, temporary name then rename."""
    temporary = "%s.tmp-%d" % (path, os.getpid())

    def order_without_times(plist):
        # No modification times in object headers: the same model gives the same bytes.
        plist.set_obj_track_times(False)
        plist.set_link_creation_order(h5py.h5p.CRT_ORDER_TRACKED | h5py.h5p.CRT_ORDER_INDEXED)
        return plist

    def create_group(parent, name):
        gcpl = order_without_times(h5py.h5p.create(h5py.h5p.GROUP_CREATE))
        return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))

    try:
        fcpl = order_without_times(h5py.h5p.create(h5py.h5p.FILE_CREATE))
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_libver_bounds(h5py.h5f.LIBVER_V18, h5py.h5f.LIBVER_V18)
        with h5py.File(h5py.h5f.create(temporary.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)) as f:
            m = create_group(f, "meta")
            m.attrs["format"] = FORMAT
            m.attrs["version"] = np.int64(VERSION)
            m.attrs["architecture"] = meta["architecture"]
            m.attrs["input_size"] = np.int64(meta["input_size"])
            m.attrs["num_classes"] = np.int64(meta["num_classes"])
            if meta.get("class_names"):
                m.attrs["class_names"] = np.array(meta["class_names"], dtype=h5py.string_dtype("utf-8"))
            m.attrs["mpp"] = np.float64(meta.get("mpp", 0.0))
            m.attrs["stain_normalization"] = meta.get("stain_normalization", "none")
            m.attrs["stain_target"] = meta.get("stain_target", "")
            m.attrs["config_yaml"] = meta.get("config_yaml", "")
            m.attrs["step"] = np.int64(meta.get("step", 0))
            m.attrs["epoch"] = np.int64(meta.get("epoch", 0))
            m.attrs["created"] = meta.get("created") or datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
            for key, value in meta_sizes(meta).items():
                m.attrs[key] = np.int64(value)
            # Every dataset first, the data after: contiguous storage is allocated at the first write, so all
            # metadata precedes all data and a file cut short still names its tensors (as Tessera writes).
            pending = []
            for group_name, tensors in (("params", params), ("buffers", buffers)):
                g = create_group(f, group_name)
                for name, value in tensors.items():
                    pending.append((g.create_dataset(name, shape=value.shape, dtype="<f4", track_times=False), value))
            f.flush()  # metadata held in temporary file space gets its final address here, before the data
            for dataset, value in pending:
                if value.size:
                    dataset[...] = np.ascontiguousarray(value, dtype="<f4")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def read_checkpoint(path):
    """(meta dict, params, buffers) with tensors as float32 torch tensors."""
    with h5py.File(path, "r") as f:
        if "meta" not in f or f["meta"].attrs.get("format") != FORMAT:
            sys.exit("%s: not a Tessera checkpoint (no /meta format = '%s')" % (path, FORMAT))
        meta = {}
        for key, value in f["meta"].attrs.items():
            if isinstance(value, np.ndarray):
                value = [v.decode() if isinstance(v, bytes) else str(v) for v in value]
            elif isinstance(value, np.integer):
                value = int(value)
            elif isinstance(value, np.floating):
                value = float(value)
            meta[key] = value
        tensors = []
        for group_name in ("params", "buffers"):
            group = f.get(group_name, {})
            tensors.append({name: torch.from_numpy(np.array(group[name][()], dtype=np.float32)) for name in group})
    return meta, tensors[0], tensors[1]


def load_into_model(path):
    meta, params, buffers = read_checkpoint(path)
    model = build_model(meta["architecture"], meta["num_classes"], meta.get("input_size"), meta_sizes(meta))
    missing, unexpected = model.load_state_dict({**params, **buffers}, strict=False)
    missing = [k for k in missing if k.rsplit(".", 1)[-1] not in SKIPPED_BUFFERS]
    if missing or unexpected:
        sys.exit("%s: does not match %s: missing %s, unexpected %s" % (path, meta["architecture"], missing, unexpected))
    return meta, model.eval()


def load_state_dict_file(path):
    state = torch.load(path, map_location="cpu")
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def predict(model, batch, size):
    x = fixed_input(batch, size)
    with torch.no_grad():
        logits = model(x)
    return x, logits, torch.softmax(logits, dim=1)


def as_list(t):
    # float() of a float32 is exact in a double, and JSON keeps a double exactly: no rounding on either side.
    return [float(v) for v in t.detach().numpy().astype(np.float32).reshape(-1)]


def readable_json(document):
    """One line per top-level key (and per entry of a top-level object), arrays kept on their line."""
    lines = []
    for key, value in document.items():
        if isinstance(value, dict):
            inner = ["  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in value.items()]
            lines.append(" %s: {\n%s\n }" % (json.dumps(key), ",\n".join(inner)))
        else:
            lines.append(" %s: %s" % (json.dumps(key), json.dumps(value)))
    return "{\n" + ",\n".join(lines) + "\n}\n"


# ---------------------------------------------------------------------------------------------------------------
# Commands.

def command_export(args):
    size = args.input_size or DEFAULT_INPUT_SIZE[args.arch]
    given = torch_models.given_sizes(args.arch, args.width, args.classifier_width)
    if args.state_dict:
        state = load_state_dict_file(args.state_dict)
        sizes = torch_models.model_size(args.arch, state)
        for key, value in given.items():
            if sizes.get(key, value) != value:
                sys.exit("%s: its tensors make a %s of %s %d, not --%s %d" % (
                    args.state_dict, args.arch, key.replace("_", " "), sizes[key], key.replace("_", "-"), value))
        head = torch_models.classifier_weight(build_model(args.arch, 2, size, sizes))
        if head not in state:
            sys.exit("%s: not a %s state_dict: no classifier weight '%s'" % (args.state_dict, args.arch, head))
        num_classes = args.num_classes or int(state[head].shape[0])
        model = build_model(args.arch, num_classes, size, sizes)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k.rsplit(".", 1)[-1] not in SKIPPED_BUFFERS]
        if missing or unexpected:
            sys.exit("%s: not a %s state_dict: missing %s, unexpected %s" % (args.state_dict, args.arch, missing,
                                                                             unexpected))
    else:
        num_classes = args.num_classes or 2
        sizes = given
        model = seeded_model(args.arch, num_classes, args.seed, size, sizes)
    params, buffers = split_state(model)
    class_names = args.class_names.split(",") if args.class_names else []
    meta = {"architecture": args.arch, "input_size": size,
            "num_classes": num_classes, "class_names": class_names, "mpp": args.mpp,
            "config_yaml": "# exported by scripts/torch_checkpoint.py\n", "created": args.created}
    if args.arch in SIZE_KEY:  # recorded as Tessera does: for the architectures built with a size
        key = SIZE_KEY[args.arch]
        meta[key] = sizes.get(key, torch_models.DEFAULT_SIZE[key])
    write_checkpoint(args.out, params, buffers, meta)
    print("wrote %s: %d params, %d buffers" % (args.out, len(params), len(buffers)))


def command_import(args):
    _, model = load_into_model(args.checkpoint)
    torch.save(model.state_dict(), args.out)
    print("wrote %s" % args.out)


def command_predict(args):
    meta, model = load_into_model(args.checkpoint)
    size = args.size or meta["input_size"]
    x, logits, probabilities = predict(model, args.batch, size)
    result = {"architecture": meta["architecture"], "input_shape": list(x.shape), "logits_shape": list(logits.shape),
              "logits": as_list(logits), "probabilities": as_list(probabilities)}
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)


def command_fixture(args):
    os.makedirs(args.out_dir, exist_ok=True)
    model = seeded_model("tiny_cnn", 2, seed=7)
    params, buffers = split_state(model)
    meta = {"architecture": "tiny_cnn", "input_size": 8, "num_classes": 2, "class_names": ["normal", "tumor"],
            "mpp": 0.5, "stain_normalization": "none", "config_yaml": "# tiny_cnn made by scripts/torch_checkpoint.py\n",
            "step": 0, "epoch": 0, "created": "2024-01-01T00:00:00Z"}
    h5_path = os.path.join(args.out_dir, "tiny_torch.h5")
    write_checkpoint(h5_path, params, buffers, meta)
    batch = 2
    x, logits, probabilities = predict(model, batch, meta["input_size"])
    tensors = {}
    for group_name, group in (("params", params), ("buffers", buffers)):
        for name, value in group.items():
            tensors[name] = {"group": group_name, "shape": list(value.shape),
                             "data": [float(v) for v in value.reshape(-1)]}
    expected = {
        "architecture": "tiny_cnn",
        "about": "scripts/torch_checkpoint.py fixture: eval-mode outputs of tiny_torch.h5 for the fixed input",
        "input_formula": "x[i] = float32(((i * 2654435761) mod 2^32) / 2^31 - 1), i = flat C-order index",
        "input_shape": list(x.shape),
        "input": as_list(x),
        "logits_shape": list(logits.shape),
        "logits": as_list(logits),
        "probabilities": as_list(probabilities),
        "tensors": tensors,
    }
    with open(os.path.join(args.out_dir, "tiny_torch.expected.json"), "w") as f:
        f.write(readable_json(expected))
    print("wrote %s and tiny_torch.expected.json (%d bytes)" % (h5_path, os.path.getsize(h5_path)))


def command_selftest(_):
    with tempfile.TemporaryDirectory() as folder:
        cases = [(arch, {}) for arch in ARCHITECTURES] + [("compact", {"width": 8}), ("alexnet", {"classifier_width": 64})]
        for arch, sizes in cases:
            size = DEFAULT_INPUT_SIZE[arch]
            model = seeded_model(arch, 3, seed=11, size=size, sizes=sizes)
            params, buffers = split_state(model)
            path = os.path.join(folder, arch + ".h5")
            write_checkpoint(path, params, buffers, {"architecture": arch, "input_size": size, "num_classes": 3, **sizes})
            _, loaded = load_into_model(path)
            original, restored = model.state_dict(), loaded.state_dict()
            for name, value in original.items():
                if name.rsplit(".", 1)[-1] in SKIPPED_BUFFERS:
                    continue
                if not torch.equal(value, restored[name]):
                    sys.exit("%s: %s differs after export -> import" % (arch, name))
            batch = 2 if size <= 64 else 1
            _, a, _ = predict(model, batch, size)
            _, b, _ = predict(loaded, batch, size)
            if not torch.equal(a, b):
                sys.exit("%s: outputs differ after export -> import" % arch)
            print("%s%s: %d tensors bit-exact, outputs identical"
                  % (arch, "".join(" %s %d" % item for item in sizes.items()), len(params) + len(buffers)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("export")
    p.add_argument("--arch", required=True, choices=ARCHITECTURES)
    p.add_argument("--state-dict")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-classes", type=int)
    p.add_argument("--input-size", type=int)
    p.add_argument("--width", type=int, help="compact: channels of the first stage (default 32, or the state_dict's)")
    p.add_argument("--classifier-width", type=int,
                   help="alexnet, vgg*: hidden units of the classifier (default 4096, or the state_dict's)")
    p.add_argument("--class-names")
    p.add_argument("--mpp", type=float, default=0.0)
    p.add_argument("--created", default="")
    p.add_argument("out")
    p.set_defaults(run=command_export)
    p = commands.add_parser("import")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.set_defaults(run=command_import)
    p = commands.add_parser("predict")
    p.add_argument("checkpoint")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int)
    p.add_argument("--json")
    p.set_defaults(run=command_predict)
    p = commands.add_parser("fixture")
    p.add_argument("out_dir")
    p.set_defaults(run=command_fixture)
    p = commands.add_parser("selftest")
    p.set_defaults(run=command_selftest)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
