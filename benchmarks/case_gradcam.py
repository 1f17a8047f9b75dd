"""Case 1: Grad-CAM cost against a no-grad forward and the anchors.

Times, side by side, on one model and batch: a ``torch.no_grad()`` forward,
``camkit.GradCAM``, pytorch-grad-cam's ``GradCAM``, captum's ``LayerGradCam`` (with
``relu_attributions=True``) and torchcam's ``GradCAM``; every implementation is given
the same explicit classes (the top-1 of a no-grad forward) and its own deep copy of the
model, so no library's hooks run inside another's timing. Peak memory of one call at the
memory batch is measured above the loaded model, each implementation in a fresh process.

Map agreement: the anchors' maps are passed through camkit's output contract
(bilinear upsampling, then per-map min-max); for maps that an anchor already normalised
this changes nothing but the order of the two steps, so the difference printed measures
the CAM itself. pytorch-grad-cam normalises *before* its cv2 resize; the difference of its
maps as returned is given in the note.

Default: resnet50 at 224x224, time at batch 8, memory at batch 16. ``--full`` adds
resnet50, vgg16, mobilenet_v3_large and vit_b_16 at batch 1 and 16. ``--smoke``: resnet18
at 64x64, batch 2, memory at batch 4.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Ratio,
    Row,
    build_model,
    describe_exception,
    finish_maps_like_camkit,
    goal_at_least,
    goal_at_most,
    max_abs_diff,
    memory_rows,
    package_version,
    paired_ratio,
    random_input,
    rows_for_timings,
)

TITLE = "Grad-CAM"
ORDER = 1

FORWARD = "no-grad forward"
CAMKIT = "camkit"
IMPLS = (FORWARD, CAMKIT, "pytorch-grad-cam", "captum", "torchcam")
ANCHOR_MODULES = {"pytorch-grad-cam": "pytorch_grad_cam", "captum": "captum", "torchcam": "torchcam"}
ANCHOR_DISTS = {"pytorch-grad-cam": "grad-cam", "captum": "captum", "torchcam": "torchcam"}

# The layer each model is explained at (the last spatial block, as the anchors' docs use).
LAYERS = {
    "resnet18": "layer4",
    "resnet50": "layer4",
    "vgg16": "features.29",
    "mobilenet_v3_large": "features.16",
    "vit_b_16": "encoder.layers.encoder_layer_11.ln_1",
}

TIME_LIMIT = 1.15
MEMORY_LIMIT = 1.3
SPEEDUP_GOAL = 2.5


@dataclass(frozen=True)
class Config:
    model: str
    size: int
    time_batch: int
    memory_batch: int | None


def configs(ctx: Context) -> list[Config]:
    """The configurations for this mode; the first one is the one the goals are about."""
    if ctx.smoke:
        return [Config("resnet18", 64, 2, 4)]
    out = [Config("resnet50", 224, 8, 16)]
    if ctx.full:
        for name in ("resnet50", "vgg16", "mobilenet_v3_large", "vit_b_16"):
            # resnet50's memory at batch 16 is already the default configuration's.
            out += [Config(name, 224, 1, None), Config(name, 224, 16, None if name == "resnet50" else 16)]
    return out


@dataclass
class Prepared:
    """One implementation ready to run: ``run()`` does one call; ``maps(out)`` -> [B, H, W]."""

    run: Callable[[], Any]
    maps: Callable[[Any], Tensor] | None
    close: Callable[[], None]


def _nothing() -> None:
    return None


def tokens_to_map(tokens: Tensor) -> Tensor:
    """ViT tokens [B, 1 + h*w, D] (class token first) -> [B, D, h, w], for the anchors' reshape hooks."""
    side = math.isqrt(tokens.shape[1] - 1)
    return tokens[:, 1:, :].unflatten(1, (side, side)).permute(0, 3, 1, 2)


def prepare(impl: str, model: nn.Module, layer: str, x: Tensor, classes: Tensor) -> Prepared:
    """Build ``impl`` on its own copy of ``model`` (no hooks shared between implementations)."""
    size = (x.shape[-2], x.shape[-1])
    if impl == FORWARD:

        def forward() -> Tensor:
            with torch.no_grad():
                return model(x)

        return Prepared(forward, None, _nothing)
    if impl == CAMKIT:
        explainer = camkit.GradCAM(model, layer)
        return Prepared(lambda: explainer(x, target=classes), lambda out: out, _nothing)
    own = copy.deepcopy(model)
    module = own.get_submodule(layer)
    tokens = type(own).__name__ == "VisionTransformer"
    if impl == "pytorch-grad-cam":
        from pytorch_grad_cam import GradCAM as PGCGradCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        cam = PGCGradCAM(model=own, target_layers=[module], reshape_transform=tokens_to_map if tokens else None)
        targets = [ClassifierOutputTarget(int(c)) for c in classes.tolist()]
        return Prepared(
            lambda: cam(input_tensor=x, targets=targets),
            lambda out: finish_maps_like_camkit(torch.from_numpy(out), size),
            cam.activations_and_grads.release,
        )
    if impl == "captum":
        from captum.attr import LayerGradCam

        if tokens:
            raise NotImplementedError("captum's LayerGradCam has no token reshape; not comparable on a ViT")
        explainer_c = LayerGradCam(own, module)
        return Prepared(
            lambda: explainer_c.attribute(x, target=classes, relu_attributions=True),
            lambda out: finish_maps_like_camkit(out, size),
            _nothing,
        )
    if impl == "torchcam":
        from torchcam.methods import GradCAM as TCGradCAM

        extractor = TCGradCAM(own, layer, reshape_transform=tokens_to_map if tokens else None)
        class_list = classes.tolist()

        def torchcam_call() -> Tensor:
            scores = own(x)
            return extractor(class_idx=class_list, scores=scores)[0]

        return Prepared(torchcam_call, lambda out: finish_maps_like_camkit(out, size), extractor.remove_hooks)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def label(impl: str) -> str:
    """The implementation's name with its installed version, e.g. ``pytorch-grad-cam 1.5.7``."""
    dist = ANCHOR_DISTS.get(impl)
    version = package_version(dist) if dist else None
    return f"{impl} {version}" if version else impl


def top1(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x).argmax(dim=1)


def memory_job(device: torch.device, impl: str, model: str, batch: int, size: int) -> Callable[[], Any]:
    """Probe job: build ``impl`` on ``model`` and return one call at ``batch``.

    Warm-up: a no-grad forward at ``batch`` (to pick the classes) and one call of the
    implementation at batch 1. The anchors work on their own copy of the model, made after
    the warm-up, so no parameter gradient is held at the baseline: it is the model, the
    input and the explainer only (for an anchor, with its copy of the model).
    """
    net = build_model(model, device)
    layer = LAYERS[model]
    small = random_input(1, size, device, seed=1)
    warm = prepare(impl, net, layer, small, top1(net, small))
    warm.run()
    warm.close()
    del warm
    x = random_input(batch, size, device)
    return prepare(impl, net, layer, x, top1(net, x)).run


def _usable(ctx: Context) -> list[str]:
    return [impl for impl in IMPLS if impl not in ANCHOR_MODULES or ctx.available(ANCHOR_MODULES[impl])]


def _time_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, Any]]:
    net = build_model(cfg.model, ctx.device)
    layer = LAYERS[cfg.model]
    x = random_input(cfg.time_batch, cfg.size, ctx.device)
    classes = top1(net, x)
    prepared: dict[str, Prepared] = {}
    outputs: dict[str, Any] = {}
    notes: dict[str, str] = {}
    rows: list[Row] = []
    for impl in _usable(ctx):
        try:
            p = prepare(impl, net, layer, x, classes)
            outputs[impl] = p.run()  # also the first warm-up call
        except Exception as exc:  # an implementation that cannot run this model is reported, not fatal
            rows.append(Row(TITLE, label(impl), cfg.model, cfg.time_batch, ctx.device.type, note=describe_exception(exc)))
            ctx.log(f"    {impl}: skipped ({describe_exception(exc)})")
            continue
        prepared[impl] = p
    diffs: dict[str, float] = {}
    if CAMKIT in outputs:
        ours = outputs[CAMKIT]
        for impl, p in prepared.items():
            if impl in (CAMKIT, FORWARD) or p.maps is None:
                continue
            try:
                diffs[label(impl)] = max_abs_diff(ours, p.maps(outputs[impl]))
            except (RuntimeError, ValueError) as exc:
                notes[label(impl)] = f"maps not comparable: {describe_exception(exc)}"
                continue
            if impl == "pytorch-grad-cam":
                notes[label(impl)] = f"as returned (normalised before resize): {max_abs_diff(ours, outputs[impl]):.2e}"
            ctx.log(f"    max |camkit - {impl}| = {diffs[label(impl)]:.2e}")
    outputs.clear()
    try:
        timings = ctx.time({label(impl): p.run for impl, p in prepared.items()})
    finally:
        for p in prepared.values():
            p.close()
    if FORWARD not in prepared:
        return rows, {}
    rows = rows_for_timings(
        TITLE, timings, reference=FORWARD, model=cfg.model, batch=cfg.time_batch, device=ctx.device,
        camkit=label(CAMKIT), diffs=diffs, notes=notes,
    ) + rows
    return rows, timings


def _memory_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, float]]:
    if cfg.memory_batch is None:
        return [], {}
    # Smoke runs keep the probe working with the two cheapest processes (each probe imports torch afresh).
    impls = [FORWARD, CAMKIT] if ctx.smoke else _usable(ctx)
    peaks, notes = ctx.peaks(f"{__name__}:memory_job", {
        label(impl): {"impl": impl, "model": cfg.model, "batch": cfg.memory_batch, "size": cfg.size} for impl in impls
    })  # fmt: skip
    rows = memory_rows(
        TITLE, peaks, reference=FORWARD, model=cfg.model, batch=cfg.memory_batch, device=ctx.device, camkit=label(CAMKIT)
    )
    rows += [Row(TITLE, impl, cfg.model, cfg.memory_batch, ctx.device.type, note=n) for impl, n in notes.items()]
    return rows, peaks


def goals(timings: dict[str, Any], peaks: dict[str, float], cfg: Config) -> list[Goal]:
    """The three Grad-CAM goals of the core issue, from the primary configuration."""
    where = f"{cfg.model}, {cfg.size}x{cfg.size}"
    fwd, ours, pgc = timings.get(FORWARD), timings.get(label(CAMKIT)), timings.get(label("pytorch-grad-cam"))
    time_ratio = paired_ratio(ours, fwd) if ours and fwd else None
    mem_ratio = (
        Ratio.exact(peaks[label(CAMKIT)] / peaks[FORWARD])
        if peaks.get(FORWARD) and label(CAMKIT) in peaks
        else None
    )
    speedup = paired_ratio(pgc, ours) if ours and pgc else None
    return [
        goal_at_most(
            TITLE, f"camkit GradCAM within {TIME_LIMIT}x of a no-grad forward's time ({where}, batch {cfg.time_batch})",
            time_ratio, TIME_LIMIT,
        ),
        goal_at_most(
            TITLE,
            f"camkit GradCAM within {MEMORY_LIMIT}x of a no-grad forward's peak memory above the model "
            f"({where}, batch {cfg.memory_batch})",
            mem_ratio, MEMORY_LIMIT,
        ),
        goal_at_least(
            TITLE, f"camkit GradCAM at least {SPEEDUP_GOAL}x faster than pytorch-grad-cam 1.5.7 ({where}, batch "
            f"{cfg.time_batch}; ratio = pytorch-grad-cam time / camkit time)",
            speedup, SPEEDUP_GOAL,
            reason="" if pgc else "pytorch-grad-cam did not run (not installed: pip install -e '.[bench]'; or --no-anchors)",
        ),
    ]


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Run every configuration of this mode; goals come from the first one."""
    results: list[Row | Goal] = []
    measured: list[tuple[dict[str, Any], dict[str, float]]] = []
    for cfg in configs(ctx):
        ctx.log(f"  {TITLE}: {cfg.model} {cfg.size}x{cfg.size}, time at batch {cfg.time_batch}")
        time_rows, timings = _time_config(ctx, cfg)
        results += time_rows
        if cfg.memory_batch is not None:
            ctx.log(f"  {TITLE}: {cfg.model}, peak memory at batch {cfg.memory_batch}")
        mem_rows, peaks = _memory_config(ctx, cfg)
        results += mem_rows
        measured.append((timings, peaks))
    timings, peaks = measured[0]
    return results + goals(timings, peaks, configs(ctx)[0])
