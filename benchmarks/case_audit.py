"""Case 6: ``camkit.audit`` throughput against a bare forward+backward loop over the same DataLoader.

Both sides read the same seeded JPEG folder through the same ``DataLoader`` (camkit's
``AuditDataset``: decoding, checks, resize, normalisation; same batch size and workers).
The bare loop runs ``model(x)``, then ``backward()`` of the top-1 scores, per batch, and
nothing else. The audit is the whole ``camkit.audit(...)`` call with Grad-CAM at
``layer4``: prediction, map, measures, an overlay PNG per image, batch files written
atomically, and the merged ``results.csv``, ``summary.json`` and ``report.html`` at the
end, each repeat into a fresh output folder. The ratio is the audit's images per second
divided by the bare loop's (bare time / audit time). No maps are compared: the bare loop
makes none.

A second baseline, the bare Grad-CAM loop, does only what a Grad-CAM pass needs (no autograd
before ``layer4``, the gradient of the top-1 scores with respect to ``layer4``'s output, the
weighted sum) and writes nothing: its row's camkit ratio is the cost of everything else
(measures, overlays, files). The bare forward+backward loop computes parameter gradients,
as a plain ``loss.backward()`` does, which is why the audit can be faster than it.

Default: resnet18 at 224x224, 32 images, batch 16, 2 workers, 3 repeats.
``--smoke``: resnet18 at 64x64, 4 images, batch 2, no workers.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

import camkit
from camkit.audit.data import AuditDataset, discover
from camkit.modelload import Preprocess

from ._harness import Context, Goal, Row, build_model, goal_at_least, paired_ratio, rows_for_timings

TITLE = "Audit throughput"
ORDER = 6

BARE = "bare forward+backward loop"
BARE_CAM = "bare Grad-CAM loop"
CAMKIT = "camkit"
GOAL = 0.8


def _make_folder(root: Path, count: int, side: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        cv2.imwrite(str(root / f"img{i:04d}.jpg"), image)


def run(ctx: Context) -> list[Row | Goal]:
    size, count, batch, workers = (64, 4, 2, 0) if ctx.smoke else (224, 32, 16, 2)
    repeats = 1 if ctx.smoke else min(ctx.repeats, 3)
    model = build_model("resnet18", ctx.device)
    root = Path(tempfile.mkdtemp(prefix="camkit-bench-audit-"))
    try:
        data = root / "data"
        data.mkdir()
        _make_folder(data, count, int(size * 1.15))
        found = discover(data)
        pre = Preprocess(size=(size, size))
        items = AuditDataset(found.records, range(len(found.records)), pre, (size, size))
        loader = torch.utils.data.DataLoader(
            items, batch_size=batch, num_workers=workers, pin_memory=ctx.device.type == "cuda"
        )
        runs = iter(range(10_000))

        def bare() -> None:
            for item in loader:
                x = item["x"].to(ctx.device, non_blocking=True)
                logits = model(x)
                logits.max(dim=1).values.sum().backward()
                model.zero_grad(set_to_none=True)

        def bare_cam() -> None:
            # the least a Grad-CAM pass needs: no autograd before layer4, gradient of the
            # top-1 scores w.r.t. layer4's output only (no parameter gradients), no output files
            for item in loader:
                x = item["x"].to(ctx.device, non_blocking=True)
                with torch.no_grad():
                    h = model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))))
                acts = model.layer4(h)
                logits = model.fc(torch.flatten(model.avgpool(acts), 1))
                (grads,) = torch.autograd.grad(logits.max(dim=1).values.sum(), acts)
                (grads.mean(dim=(2, 3), keepdim=True) * acts).sum(dim=1).relu().detach()

        def audit() -> None:
            camkit.audit(
                data, model, out=root / f"out{next(runs)}", layer="layer4", size=size, device=ctx.device,
                batch_size=batch, workers=workers, progress=False,
            )  # fmt: skip

        timings = ctx.time({BARE: bare, BARE_CAM: bare_cam, CAMKIT: audit}, repeats=repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_image = {name: f"{count / t.median:.1f} images/s" for name, t in timings.items()}
    rows = rows_for_timings(
        TITLE, timings, reference=BARE, model=f"resnet18 {size}px, {count} images", batch=batch,
        device=ctx.device, notes=per_image,
    )  # fmt: skip
    throughput = paired_ratio(timings[BARE], timings[CAMKIT])  # audit images/s / bare images/s
    text = f"audit at least {GOAL}x the images/s of a bare forward+backward loop (resnet18 {size}px, batch {batch})"
    return [*rows, goal_at_least(TITLE, text, throughput, GOAL)]
