"""Case 4: a deletion curve against its floor, the bare forwards of the same perturbed images.

``camkit.metrics.deletion_curve`` (50 steps, baseline 0, ``chunk_size=32``) is timed beside
its floor: the model's ``torch.no_grad()`` forwards of exactly the images the curve scores
(the clean batch, then every (image, step) pair in image-major order), built beforehand
and fed in the same chunks. So the ratio is what ranking the pixels, building the
perturbed images and gathering the scores add on top of the forwards that any
implementation must run. Agreement: the floor's scores, gathered for the same classes,
against camkit's curve (max abs difference).

Maps are smooth random maps (a 7x7 grid upsampled bilinearly), targets the top-1 classes
of the clean images, given explicitly to both.

Anchors: pytorch-grad-cam has no deletion curve but has ROAD; when it is installed, its
``ROADMostRelevantFirst(percentile=80)`` (removes the top 20 %) is timed beside
``camkit.metrics.road_curve(fractions=[0.2])`` on a small batch (imputation noise differs,
so no agreement is printed). torchcam's metrics module offers average drop / increase in
confidence, not deletion or insertion, so there is nothing to compare there.

Default: resnet50 at 224x224, 4 images (the issue's 16 images cost ~1 minute per call on 2
cores, too long for the default budget); ``--full`` adds the issue's 16 images. ``--smoke``:
resnet18 at 64x64, 2 images, 10 steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.metrics import deletion_curve, road_curve

from ._harness import (
    Context,
    Goal,
    Row,
    build_model,
    describe_exception,
    goal_at_most,
    max_abs_diff,
    package_version,
    paired_ratio,
    random_input,
    rows_for_timings,
)

TITLE = "Deletion curve"
ORDER = 4

FLOOR = "bare forwards (same images, same chunks)"
CAMKIT = "camkit"
FLOOR_LIMIT = 1.1


@dataclass(frozen=True)
class Config:
    model: str
    size: int
    batch: int
    steps: int
    chunk: int = 32


def configs(ctx: Context) -> list[Config]:
    if ctx.smoke:
        return [Config("resnet18", 64, 2, 10)]
    out = [Config("resnet50", 224, 4, 50)]
    if ctx.full:
        out.append(Config("resnet50", 224, 16, 50))
    return out


def smooth_maps(batch: int, size: int, device: torch.device, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 1, 7, 7, generator=g)
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)[:, 0].to(device)


def floor_chunks(x: Tensor, maps: Tensor, steps: int, chunk: int) -> tuple[list[Tensor], list[Tensor]]:
    """The images ``deletion_curve`` scores, in its chunks, and the owner image of each row.

    Built independently of camkit's code from the issue's definition: pixels ranked by map
    value, highest first, ties row-major; step k zeroes the top ceil(k * N / steps).
    """
    batch, n = x.shape[0], maps.shape[1] * maps.shape[2]
    order = torch.sort(maps.flatten(1), dim=1, descending=True, stable=True).indices
    images, owners = list(x.split(chunk)), list(torch.arange(batch, device=x.device).split(chunk))
    pending: list[Tensor] = []
    pending_owner: list[int] = []
    for b in range(batch):
        for k in range(1, steps + 1):
            keep = torch.ones(n, dtype=x.dtype, device=x.device)
            keep[order[b, : (k * n + steps - 1) // steps]] = 0
            pending.append(x[b] * keep.view(1, *maps.shape[1:]))
            pending_owner.append(b)
            if len(pending) == chunk:
                images.append(torch.stack(pending))
                owners.append(torch.tensor(pending_owner, device=x.device))
                pending, pending_owner = [], []
    if pending:
        images.append(torch.stack(pending))
        owners.append(torch.tensor(pending_owner, device=x.device))
    return images, owners


def _road_rows(ctx: Context, model: nn.Module, config: Config) -> tuple[list[Row], Goal]:
    text = "camkit's ROAD (MoRF, 20 % removed) not slower than pytorch-grad-cam's ROADMostRelevantFirst(80)"
    if not ctx.available("pytorch_grad_cam"):
        return [], goal_at_most(TITLE, text, None, 1.0, reason="pytorch-grad-cam is not installed")
    batch = 2
    x = random_input(batch, config.size, ctx.device, seed=2)
    maps = smooth_maps(batch, config.size, ctx.device, seed=3)
    with torch.no_grad():
        classes = model(x).argmax(dim=1)
    name = f"pytorch-grad-cam {package_version('grad-cam')} ROAD"
    fns: dict[str, Callable[[], object]] = {
        "camkit ROAD": lambda: road_curve(model, x, maps, classes, fractions=[0.2], chunk_size=config.chunk)
    }
    notes: dict[str, str] = {}
    try:
        from pytorch_grad_cam.metrics.road import ROADMostRelevantFirst
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        theirs = copy.deepcopy(model)
        metric = ROADMostRelevantFirst(percentile=80)
        targets = [ClassifierOutputTarget(int(c)) for c in classes]
        cams = maps.cpu().numpy()
        fns[name] = lambda: metric(x, cams, targets, theirs, return_diff=False)
    except Exception as exc:  # an anchor that cannot run becomes a note, not a crash
        notes[name] = describe_exception(exc)
    timings = ctx.time(fns)
    rows = rows_for_timings(
        TITLE, timings, reference="camkit ROAD", camkit="camkit ROAD", model=config.model, batch=batch,
        device=ctx.device, notes={"camkit ROAD": "road_curve(fractions=[0.2])", **notes},
    )  # fmt: skip
    if name in notes:
        rows.append(Row(case=TITLE, impl=name, model=config.model, batch=batch, device=ctx.device.type, note=notes[name]))
        return rows, goal_at_most(TITLE, text, None, 1.0, reason=notes[name])
    return rows, goal_at_most(TITLE, text, paired_ratio(timings["camkit ROAD"], timings[name]), 1.0)


def run(ctx: Context) -> list[Row | Goal]:
    out: list[Row | Goal] = []
    model: nn.Module | None = None
    for i, config in enumerate(configs(ctx)):
        ctx.log(f"  {config}")
        model = build_model(config.model, ctx.device)
        x = random_input(config.batch, config.size, ctx.device)
        maps = smooth_maps(config.batch, config.size, ctx.device)
        with torch.no_grad():
            classes = model(x).argmax(dim=1)
        images, owners = floor_chunks(x, maps, config.steps, config.chunk)

        def floor(images: list[Tensor] = images, model: nn.Module = model) -> list[Tensor]:
            with torch.no_grad():
                return [model(chunk) for chunk in images]

        def ours(x: Tensor = x, maps: Tensor = maps, classes: Tensor = classes, model: nn.Module = model,
                 config: Config = config) -> tuple[Tensor, Tensor]:  # fmt: skip
            return deletion_curve(model, x, maps, classes, steps=config.steps, chunk_size=config.chunk)

        _, curve = ours()
        floor_scores = torch.cat([o.gather(1, classes[w][:, None])[:, 0] for o, w in zip(floor(), owners)])
        expected = torch.cat([floor_scores[: config.batch, None], floor_scores[config.batch :].view(config.batch, -1)], 1)
        timings = ctx.time({FLOOR: floor, CAMKIT: ours})
        rows = rows_for_timings(
            TITLE, timings, reference=FLOOR, model=f"{config.model} {config.size}px, {config.steps} steps",
            batch=config.batch, device=ctx.device, diffs={CAMKIT: max_abs_diff(curve, expected)},
        )  # fmt: skip
        out += rows
        if i == 0 or config.batch == 16:
            ratio = paired_ratio(timings[CAMKIT], timings[FLOOR])
            text = (
                f"{config.steps}-step deletion curve of {config.batch} images ({config.model}, {config.size}px) "
                f"within {FLOOR_LIMIT}x of its floor"
            )
            out.append(goal_at_most(TITLE, text, ratio, FLOOR_LIMIT))
        del images, owners
    if model is not None:
        rows_road, goal = _road_rows(ctx, model, configs(ctx)[0])
        out += [*rows_road, goal]
    return out
