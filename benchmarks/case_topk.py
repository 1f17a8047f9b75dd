"""Case 7: Score-CAM's ``top_k`` option on trained models: speed-up and agreement with the full map.

Issue #4 asks for the top-k speed-up and the rank correlation with the full Score-CAM map on a
*trained* model (a random network's channels carry no meaning). Two trained models, no download:

- the bundled demo CNN (``camkit.demo``; 64 channels at ``last_conv``, 64x64 shape images);
- the CIFAR-10 ResNet-20 from ``../shared/eval/cifar10_resnet20.th`` when that file is there
  (64 channels at ``layer3``, 32x32 images: scikit-image photos resized), skipped otherwise.

For each, the full map and ``top_k=16`` (a quarter of the channels, ranked by activation mass)
run interleaved on the same images; the row notes give the mean Spearman rank correlation of
the two maps over the images' pixels. ``--smoke`` uses two images and the demo model only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

from ._harness import Context, Goal, Row, paired_ratio, rows_for_timings

TITLE = "Score-CAM top-k on trained models"
ORDER = 7
TOP_K = 16
SHARED = Path(__file__).resolve().parents[2] / "shared" / "eval" / "cifar10_resnet20.th"


class _Block(nn.Module):
    def __init__(self, inp: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = planes // 4 if (stride != 1 or inp != planes) else 0

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad)) if self.pad else x
        out += short
        return F.relu(out)


class ResNet20(nn.Module):
    """CIFAR ResNet-20 (He et al. 2016), written so the shared checkpoint's keys match."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, inp = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(3):
                blocks.append(_Block(inp, planes, stride if i == 0 else 1))
                inp = planes
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.linear = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


def _resnet20_inputs(count: int) -> Tensor:
    from skimage import data

    names = ["chelsea", "coffee", "astronaut", "rocket", "cat", "hubble_deep_field", "immunohistochemistry", "retina"]
    images = [camkit.to_tensor(getattr(data, n)(), size=32) for n in names[:count]]
    mean = torch.tensor((0.485, 0.456, 0.406)).view(3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1)
    return torch.stack([(img - mean) / std for img in images])


def _models(ctx: Context) -> list[tuple[str, nn.Module, str, Tensor]]:
    from camkit.bundled.model import CAM_LAYER, load_shapes_cnn
    from camkit.bundled.shapes import make_split, to_batch

    count = 2 if ctx.smoke else 8
    demo_images = to_batch(make_split("marked", count, seed=1))[0]
    found: list[tuple[str, nn.Module, str, Tensor]] = [
        ("demo ShapesCNN", load_shapes_cnn().eval(), CAM_LAYER, demo_images)
    ]
    if not ctx.smoke and SHARED.is_file():
        state = torch.load(SHARED, map_location="cpu", weights_only=False)["state_dict"]
        net = ResNet20()
        net.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
        found.append(("CIFAR ResNet-20", net.eval(), "layer3", _resnet20_inputs(count)))
    return found


def _spearman(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().cpu(), b.detach().cpu()
    ra = a.flatten().double().argsort().argsort().double()
    rb = b.flatten().double().argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def run(ctx: Context) -> list[Row | Goal]:
    rows: list[Row | Goal] = []
    for name, model, layer, x in _models(ctx):
        model = model.to(ctx.device)
        x = x.to(ctx.device)
        full = camkit.ScoreCAM(model, layer, batch_size=64)
        top = camkit.ScoreCAM(model, layer, batch_size=64, top_k=TOP_K)
        target = full.explain(x).target
        maps_full, maps_top = full(x, target), top(x, target)
        corr = sum(_spearman(a, b) for a, b in zip(maps_full, maps_top)) / x.shape[0]
        fns: dict[str, Any] = {"camkit ScoreCAM (all channels)": lambda f=full, t=target, xx=x: f(xx, t)}
        fns[f"camkit ScoreCAM top_k={TOP_K}"] = lambda f=top, t=target, xx=x: f(xx, t)
        timings = ctx.time(fns)
        speed = paired_ratio(timings["camkit ScoreCAM (all channels)"], timings[f"camkit ScoreCAM top_k={TOP_K}"])
        ctx.log(f"    {name}: top_k={TOP_K} speed-up {speed}, mean Spearman with the full map {corr:.3f}")
        notes = {f"camkit ScoreCAM top_k={TOP_K}": f"speed-up {speed}; mean Spearman rank correlation with the full map {corr:.3f}"}
        rows += rows_for_timings(TITLE, timings, reference="camkit ScoreCAM (all channels)", model=f"{name} ({layer})",
                                 batch=int(x.shape[0]), device=ctx.device, camkit="", notes=notes)  # fmt: skip
    return rows
