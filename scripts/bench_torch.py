#!/usr/bin/python3
"""PyTorch's side of `tessera bench train` / `tessera bench infer`: images/s of the same model on the CPU.

The models are Tessera's registry (engine/models/registry.h), layer for layer: torchvision's resnet18/34/50,
vgg11/11_bn/16/16_bn and alexnet when torchvision is installed (Debian's python3-torchvision), else the same
definitions written out below; `compact`, `lenet5` and `tiny_cnn` are Tessera's own (engine/models/compact.h,
lenet.h) and always defined here. Tessera checks that the parameter counts agree.

  train   model.train(), synthetic random images and labels, per step: zero_grad, forward, cross-entropy,
          backward, SGD step (momentum 0.9, weight decay 1e-4), as Tessera's bench does
  infer   model.eval() under torch.inference_mode(): forward only

Usage (Debian's /usr/bin/python3 with python3-torch):
  scripts/bench_torch.py --model resnet18 --mode train --size 96 --batch 64 --threads 2 --seconds 3
      builds, warms up, measures for at least --seconds and prints one JSON object.
  ... --serve
      builds and warms up, prints one JSON line (the model's facts), then answers each line "measure SECONDS"
      on stdin with one JSON line {"images_per_s", "steps", "seconds"}, until end of input. Tessera runs it
      this way to alternate its own measurements with PyTorch's in rounds.
Without torch (or h5py, which scripts/torch_checkpoint.py imports) the script prints
{"available": false, "error": ...} and exits 0.
"""
import argparse
import json
import os
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    from torch import nn

    sys.path.insert(0, SCRIPTS)
    from torch_checkpoint import BasicBlock, TinyCNN  # torchvision's BasicBlock, Tessera's tiny_cnn (needs h5py)
except ImportError as error:  # the caller reports PyTorch as not measured
    print(json.dumps({"available": False, "error": str(error)}), flush=True)
    sys.exit(0)

try:
    import torchvision.models as tv_models
except ImportError:
    tv_models = None


# ---------------------------------------------------------------------------------------------------------------
# Tessera's own models.

class CompactCNN(nn.Module):
    """engine/models/compact.h: five conv3x3-BN-ReLU stages (the first four max-pooled), global average pool,
    dropout, fc."""

    def __init__(self, num_classes=2, channels=3, width=32, dropout=0.5):
        super().__init__()
        layers = []
        inputs = channels
        for stage, factor in enumerate((1, 2, 4, 8, 8)):
            out = width * factor
            layers += [nn.Conv2d(inputs, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            if stage < 4:
                layers.append(nn.MaxPool2d(2))
            inputs = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(inputs, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.fc(self.dropout(x))


class LeNet5(nn.Module):
    """engine/models/lenet.h: ReLU and max-pooling; fc1 sized from the input."""

    def __init__(self, num_classes=2, channels=3, size=32):
        super().__init__()
        s = ((size - 4) // 2 - 4) // 2
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


# ---------------------------------------------------------------------------------------------------------------
# torchvision's models, for when torchvision is not installed (same modules, same parameters).

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, block, blocks, num_classes):
        super().__init__()
        expansion = getattr(block, "expansion", 1)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = 64
        for index, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if index == 0 else 2
            layers = [block(inplanes, planes, stride)]
            inplanes = planes * expansion
            layers += [block(inplanes, planes, 1) for _ in range(count - 1)]
            setattr(self, "layer%d" % (index + 1), nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * expansion, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


VGG_CONFIGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, config, batch_norm, num_classes, width=4096, dropout=0.5):
        super().__init__()
        layers = []
        inputs = 3
        for v in config:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            layers.append(nn.Conv2d(inputs, v, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            inputs = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, width), nn.ReLU(True), nn.Dropout(dropout),
                                        nn.Linear(width, width), nn.ReLU(True), nn.Dropout(dropout),
                                        nn.Linear(width, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class AlexNet(nn.Module):
    def __init__(self, num_classes, width=4096, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(256 * 6 * 6, width), nn.ReLU(inplace=True),
                                        nn.Dropout(dropout), nn.Linear(width, width), nn.ReLU(inplace=True),
                                        nn.Linear(width, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


RESNETS = {"resnet18": (BasicBlock, (2, 2, 2, 2)), "resnet34": (BasicBlock, (3, 4, 6, 3)),
           "resnet50": (Bottleneck, (3, 4, 6, 3))}
TORCHVISION = ("resnet18", "resnet34", "resnet50", "vgg11", "vgg11_bn", "vgg16", "vgg16_bn", "alexnet")


def build_model(name, num_classes, size):
    """The model and where its definition came from ("torchvision" or "bench_torch.py")."""
    if name == "compact":
        return CompactCNN(num_classes), "bench_torch.py"
    if name == "lenet5":
        return LeNet5(num_classes, size=size), "bench_torch.py"
    if name == "tiny_cnn":
        return TinyCNN(num_classes), "torch_checkpoint.py"
    if name not in TORCHVISION:
        raise SystemExit("bench_torch.py: unknown model '%s' (known: compact, lenet5, tiny_cnn, %s)"
                         % (name, ", ".join(TORCHVISION)))
    if tv_models is not None:
        return getattr(tv_models, name)(num_classes=num_classes), "torchvision"
    if name in RESNETS:
        block, blocks = RESNETS[name]
        return ResNet(block, blocks, num_classes), "bench_torch.py"
    if name == "alexnet":
        return AlexNet(num_classes), "bench_torch.py"
    base = name.replace("_bn", "")
    return VGG(VGG_CONFIGS[base], name.endswith("_bn"), num_classes), "bench_torch.py"


# ---------------------------------------------------------------------------------------------------------------
# Measuring.

class Bench:
    def __init__(self, args):
        torch.manual_seed(args.seed)
        self.model, self.source = build_model(args.model, args.classes, args.size)
        self.train = args.mode == "train"
        self.batch = args.batch
        generator = torch.Generator().manual_seed(args.seed)
        self.x = torch.randn(args.batch, 3, args.size, args.size, generator=generator)
        self.y = torch.randint(0, args.classes, (args.batch,), generator=generator)
        if self.train:
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
            self.loss = nn.CrossEntropyLoss()
        else:
            self.model.eval()

    def step(self):
        if self.train:
            self.optimizer.zero_grad()
            self.loss(self.model(self.x), self.y).backward()
            self.optimizer.step()
        else:
            with torch.inference_mode():
                self.model(self.x)

    def measure(self, seconds):
        """At least one step and at least `seconds`; images per second over the whole time."""
        steps = 0
        start = time.perf_counter()
        elapsed = 0.0
        while steps == 0 or elapsed < seconds:
            self.step()
            steps += 1
            elapsed = time.perf_counter() - start
        return {"images_per_s": steps * self.batch / elapsed, "steps": steps, "seconds": elapsed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="compact")
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default (all cores)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after building the model")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve", action="store_true", help="answer 'measure SECONDS' lines on stdin")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    bench = Bench(args)
    start = time.perf_counter()
    for _ in range(args.warmup):
        bench.step()
    facts = {"available": True, "torch": torch.__version__, "model": args.model, "source": bench.source,
             "mode": args.mode, "parameters": sum(p.numel() for p in bench.model.parameters()),
             "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available(),
             "warmup_seconds": time.perf_counter() - start}
    if not args.serve:
        facts.update(bench.measure(args.seconds))
        print(json.dumps(facts), flush=True)
        return
    print(json.dumps(facts), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "measure":
            raise SystemExit("bench_torch.py: expected 'measure SECONDS', got %r" % line)
        print(json.dumps(bench.measure(float(words[1]))), flush=True)


if __name__ == "__main__":
    main()
