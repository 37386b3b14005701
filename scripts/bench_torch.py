#!/usr/bin/python3
"""PyTorch's side of `tessera bench train` / `tessera bench infer`: images/s of the same model on the CPU.

The models are Tessera's registry (engine/models/registry.h), layer for layer, from scripts/torch_models.py:
torchvision's resnet18/34/50, vgg11/11_bn/16/16_bn and alexnet when torchvision is installed (Debian's
python3-torchvision), else the same definitions written out there; `compact`, `lenet5` and `tiny_cnn` are Tessera's
own. Tessera checks that the parameter counts agree.

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
Without torch the script prints
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
    from torch_models import build_model  # Tessera's registry in PyTorch
except ImportError as error:  # the caller reports PyTorch as not measured
    print(json.dumps({"available": False, "error": str(error)}), flush=True)
    sys.exit(0)


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
