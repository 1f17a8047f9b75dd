"""Case 6: ``camkit.audit`` throughput against a bare forward+backward loop over the same DataLoader.

Both sides read the same seeded JPEG folder through the same ``DataLoader`` (camkit's
``AuditDataset``: decoding, checks, resize, normalisation; same batch size and workers).
The bare loop runs ``model(x)``, then ``backward()`` of the top-1 scores, per batch, and
nothing else. The audit is the whole ``camkit.audit(...)`` call with Grad-CAM: prediction,
map, measures, an overlay per image (JPEG at the input size, drawn batched and encoded in the
writer threads), batch files written atomically, and the merged ``results.csv``,
``summary.json`` and ``report.html`` at the end, each repeat into a fresh output folder. The
ratio is the audit's images per second divided by the bare loop's (bare time / audit time).

Three configurations, each its own goal of at least 0.8x:

* **resnet18** (the original case): resnet18 at 224x224, 32 images, batch 16, 2 workers, 3
  repeats; here the model dominates. A second baseline, the bare Grad-CAM loop, does only
  what a Grad-CAM pass needs and writes nothing: its row's camkit ratio is the cost of
  everything else (measures, overlays, files).
* **near-free model** (CPU): a two-convolution model at 224x224, 448 JPEGs of 320x240,
  batch 32, 2 workers: decoding and overlays dominate, as they do next to a GPU. On the CPU
  the audit runs its model with the intra-op threads the decoding workers leave while it
  waits for them (one here, see :class:`camkit.audit.stages.ThreadPacer`) while the bare
  loop keeps torch's default;
  a third row, the bare loop with one intra-op thread, shows how much of the ratio that
  setting accounts for (its "camkit ÷ this" column). The goal stays against the default loop.
* **resnet50 on CUDA**: batch 64, 2048 JPEGs of 320x240, 8 workers; measured only when the
  device is a GPU (reported as not measured otherwise).

``--smoke``: resnet18 at 64x64, 4 images, batch 2, no workers; the near-free model at 64x64
on 16 images.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

import camkit
from camkit.modelload import Preprocess
from camkit.runs.data import AuditDataset, discover

from ._harness import Context, Goal, Row, build_model, goal_at_least, paired_ratio, rows_for_timings

TITLE = "Audit throughput"
ORDER = 6

BARE = "bare forward+backward loop"
BARE_CAM = "bare Grad-CAM loop"
BARE_ONE = "bare loop, 1 intra-op thread"
CAMKIT = "camkit"
GOAL = 0.8


def _make_folder(root: Path, count: int, side: int | tuple[int, int]) -> None:
    """``count`` seeded JPEGs of ``side`` (square) or ``(height, width)``; smooth enough to look like photos."""
    height, width = (side, side) if isinstance(side, int) else side
    rng = np.random.default_rng(0)
    for i in range(count):
        image = cv2.GaussianBlur(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), (0, 0), 2)
        cv2.imwrite(str(root / f"img{i:04d}.jpg"), image)


class _TwoConv(torch.nn.Module):
    """The near-free model: two small convolutions, global pooling, a linear head (CAM layer ``relu2``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.relu1 = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.relu2 = torch.nn.ReLU()
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu2(self.conv2(self.relu1(self.conv1(x)))).mean(dim=(2, 3)))


def _compare(ctx: Context, title: str, model: torch.nn.Module, name: str, layer: str, *, size: int, count: int,
             side: int | tuple[int, int], batch: int, workers: int, repeats: int,
             bare_cam: bool = False, bare_one_thread: bool = False) -> list[Row | Goal]:  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="camkit-bench-audit-"))
    try:
        data = root / "data"
        data.mkdir()
        _make_folder(data, count, side)
        found = discover(data)
        pre = Preprocess(size=(size, size))
        items = AuditDataset(found.records, range(len(found.records)), pre, (size, size))
        loader = torch.utils.data.DataLoader(
            items, batch_size=batch, num_workers=workers, pin_memory=ctx.device.type == "cuda",
            prefetch_factor=2 if workers else None,  # as camkit.audit's own loader
        )  # fmt: skip
        runs = iter(range(10_000))

        def bare() -> None:
            for item in loader:
                x = item["x"].to(ctx.device, non_blocking=True)
                logits = model(x)
                logits.max(dim=1).values.sum().backward()
                model.zero_grad(set_to_none=True)

        def bare_one() -> None:
            # the same loop with one intra-op thread, as the audit itself runs next to its workers here
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                bare()
            finally:
                torch.set_num_threads(before)

        def bare_gradcam() -> None:
            # the least a Grad-CAM pass needs: no autograd before layer4, gradient of the
            # top-1 scores w.r.t. layer4's output only (no parameter gradients), no output files
            m: Any = model
            for item in loader:
                x = item["x"].to(ctx.device, non_blocking=True)
                with torch.no_grad():
                    h = m.layer3(m.layer2(m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x)))))))
                acts = m.layer4(h)
                logits = m.fc(torch.flatten(m.avgpool(acts), 1))
                (grads,) = torch.autograd.grad(logits.max(dim=1).values.sum(), acts)
                (grads.mean(dim=(2, 3), keepdim=True) * acts).sum(dim=1).relu().detach()

        def audit() -> None:
            camkit.audit(
                data, model, out=root / f"out{next(runs)}", layer=layer, size=size, device=ctx.device,
                batch_size=batch, workers=workers, progress=False,
            )  # fmt: skip

        fns = {
            BARE: bare, **({BARE_CAM: bare_gradcam} if bare_cam else {}), **({BARE_ONE: bare_one} if bare_one_thread else {}),
            CAMKIT: audit,
        }  # fmt: skip
        timings = ctx.time(fns, repeats=repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_image = {n: f"{count / t.median:.1f} images/s, workers {workers}" for n, t in timings.items()}
    rows = rows_for_timings(
        title, timings, reference=BARE, model=f"{name} {size}px, {count} images", batch=batch,
        device=ctx.device, notes=per_image,
    )  # fmt: skip
    throughput = paired_ratio(timings[BARE], timings[CAMKIT])  # audit images/s / bare images/s
    text = (
        f"audit at least {GOAL}x the images/s of a bare forward+backward loop ({name} {size}px, batch {batch}, "
        f"{workers} workers, {ctx.device.type})"
    )
    return [*rows, goal_at_least(title, text, throughput, GOAL)]


def run(ctx: Context) -> list[Row | Goal]:
    out: list[Row | Goal] = []
    repeats = 1 if ctx.smoke else min(ctx.repeats, 3)
    if ctx.device.type == "cpu" or ctx.smoke:
        size, count, batch, workers = (64, 4, 2, 0) if ctx.smoke else (224, 32, 16, 2)
        out += _compare(
            ctx, TITLE, build_model("resnet18", ctx.device), "resnet18", "layer4", size=size, count=count,
            side=int(size * 1.15), batch=batch, workers=workers, repeats=repeats, bare_cam=True,
        )  # fmt: skip
    if ctx.device.type == "cpu":
        size, count, batch, workers = (64, 16, 8, 0) if ctx.smoke else (224, 448, 32, 2)
        out += _compare(
            ctx, f"{TITLE} (near-free model)", _TwoConv().eval().to(ctx.device), "two-conv", "relu2", size=size,
            count=count, side=(240, 320), batch=batch, workers=workers, repeats=repeats, bare_one_thread=True,
        )  # fmt: skip
    if ctx.device.type == "cuda" and not ctx.smoke:
        out += _compare(
            ctx, f"{TITLE} (GPU)", build_model("resnet50", ctx.device), "resnet50", "layer4", size=224, count=2048,
            side=(240, 320), batch=64, workers=8, repeats=repeats,
        )  # fmt: skip
    elif not torch.cuda.is_available():
        text = f"audit at least {GOAL}x the images/s of a bare forward+backward loop (resnet50 224px, batch 64, 8 workers, cuda)"
        out.append(goal_at_least(f"{TITLE} (GPU)", text, None, GOAL, "no CUDA GPU on this machine: not run"))
    return out
