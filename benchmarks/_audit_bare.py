"""The bare script beside ``camkit audit``: ``python benchmarks/_audit_bare.py DATA --model NAME --size N ...``.

Run by path (not ``-m``), so that it imports torch and torchvision and nothing of camkit or of the
benchmarks. It does what a Grad-CAM audit of a folder of JPEGs cannot do without: decodes every
image (torchvision's ``decode_jpeg``), resizes it to ``size`` x ``size`` and normalises it with
ImageNet's statistics, builds torchvision's ``NAME`` (random weights, eval mode) on ``device``,
and per batch runs the forward (autograd on, as a plain script runs it), the gradient of the
top-1 scores with respect to ``layer``'s output (a forward hook keeps it), and the Grad-CAM map
at the input's size, brought back to the host. Nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms.v2 import functional as TF


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--layer", default="layer4")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model = getattr(torchvision.models, args.model)().eval().to(device)
    layer = model.get_submodule(args.layer)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    paths = sorted(args.data.glob("*.jpg"))
    seen: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        seen.append(output)

    handle = layer.register_forward_hook(keep)
    for start in range(0, len(paths), args.batch_size):
        images = [TF.resize(decode_jpeg(read_file(str(p))), [args.size, args.size]) for p in paths[start : start + args.batch_size]]
        x = (torch.stack(images).to(device, non_blocking=True).float() / 255 - mean) / std
        seen.clear()
        logits = model(x)
        acts = seen[0]
        (grads,) = torch.autograd.grad(logits.max(dim=1).values.sum(), acts)
        cam = (grads.mean(dim=(2, 3), keepdim=True) * acts).sum(dim=1, keepdim=True).relu()
        F.interpolate(cam.detach(), size=(args.size, args.size), mode="bilinear", align_corners=False).cpu()
    handle.remove()


if __name__ == "__main__":
    main(sys.argv[1:])
