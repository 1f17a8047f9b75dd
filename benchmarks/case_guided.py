"""Case 3: guided backpropagation's cost against plain saliency, and captum beside.

Times, side by side on one model and batch: ``camkit.Saliency`` (the reference: one
forward and one input-gradient backward), ``camkit.GuidedBackprop`` (the same plus the
ReLU-call interception and the guided rule in backward) and, when captum is installed,
captum's ``Saliency`` (``abs=False``) and ``GuidedBackprop``, each on its own deep copy of
the model. Every implementation gets the same explicit classes (the top-1 of a no-grad
forward).

Map agreement: captum's attributions [B, C, H, W] are given camkit's pixel contract
(``max_c |attr|``, then per-map min-max; :func:`camkit.methods.attribution.pixel.pixel_maps`), so the
difference printed compares the attributions themselves. On torchvision's resnet50 every
ReLU is an ``nn.ReLU`` module, which captum's module hooks see; the agreement row is
therefore a correctness check, not the functional-ReLU failure the issue describes
(``tests/methods/test_pixel.py`` covers that).

Default: resnet50 at 224x224, batch 8. ``--smoke``: resnet18 at 64x64, batch 2.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import camkit
from camkit.methods.attribution.pixel import pixel_maps

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

TITLE = "Guided backprop"
ORDER = 3

SALIENCY = "camkit Saliency"
GUIDED = "camkit GuidedBackprop"
TIME_LIMIT = 1.2


def _captum_label(name: str) -> str:
    version = package_version("captum")
    return f"captum {version} {name}" if version else f"captum {name}"


def _prepare(ctx: Context, model: nn.Module, x: Tensor, classes: Tensor) -> dict[str, Callable[[], Any]]:
    fns: dict[str, Callable[[], Any]] = {
        SALIENCY: lambda: camkit.Saliency(model).explain(x, classes).raw,
        GUIDED: lambda: camkit.GuidedBackprop(model).explain(x, classes).raw,
    }
    if ctx.available("captum"):
        from captum.attr import GuidedBackprop as CaptumGuided
        from captum.attr import Saliency as CaptumSaliency

        own_saliency, own_guided = copy.deepcopy(model), copy.deepcopy(model)
        saliency_c, guided_c = CaptumSaliency(own_saliency), CaptumGuided(own_guided)
        fns[_captum_label("Saliency")] = lambda: saliency_c.attribute(x, target=classes, abs=False)
        fns[_captum_label("GuidedBackprop")] = lambda: guided_c.attribute(x, target=classes)
    return fns


def run(ctx: Context) -> list[Row | Goal]:
    """Time the four implementations interleaved; one goal: GuidedBackprop within 1.2x of Saliency."""
    name, size, batch = ("resnet18", 64, 2) if ctx.smoke else ("resnet50", 224, 8)
    ctx.log(f"  {TITLE}: {name} {size}x{size}, batch {batch}")
    model = build_model(name, ctx.device)
    x = random_input(batch, size, ctx.device)
    with torch.no_grad():
        classes = model(x).argmax(dim=1)
    rows: list[Row] = []
    outputs: dict[str, Tensor] = {}
    fns: dict[str, Callable[[], Any]] = {}
    for impl, fn in _prepare(ctx, model, x, classes).items():
        try:
            outputs[impl] = fn().detach()  # also the first warm-up call
        except Exception as exc:  # an implementation that cannot run is reported, not fatal
            rows.append(Row(TITLE, impl, name, batch, ctx.device.type, note=describe_exception(exc)))
            continue
        fns[impl] = fn
    diffs: dict[str, float] = {}
    size2 = (size, size)
    pairs = {_captum_label("Saliency"): SALIENCY, _captum_label("GuidedBackprop"): GUIDED}
    for theirs, ours in pairs.items():
        if theirs in outputs and ours in outputs:
            diffs[theirs] = max_abs_diff(pixel_maps(outputs[ours], size2)[0], pixel_maps(outputs[theirs], size2)[0])
            ctx.log(f"    max |{ours} - {theirs}| maps = {diffs[theirs]:.2e}")
    notes = {}
    if SALIENCY in outputs and GUIDED in outputs:
        notes[GUIDED] = f"max |guided - plain| maps = {max_abs_diff(pixel_maps(outputs[GUIDED], size2)[0], pixel_maps(outputs[SALIENCY], size2)[0]):.2f}"
    outputs.clear()
    timings = ctx.time(fns)
    if SALIENCY not in timings:
        return rows
    rows = rows_for_timings(
        TITLE, timings, reference=SALIENCY, model=name, batch=batch, device=ctx.device, camkit=GUIDED,
        diffs=diffs, notes=notes,
    ) + rows
    ratio = paired_ratio(timings[GUIDED], timings[SALIENCY]) if GUIDED in timings else None
    goal = goal_at_most(
        TITLE, f"camkit GuidedBackprop within {TIME_LIMIT}x of camkit Saliency's time ({name}, {size}x{size}, batch {batch})",
        ratio, TIME_LIMIT,
    )
    return [*rows, goal]
