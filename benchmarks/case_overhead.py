"""Case 39: what a gradient CAM costs beyond the forward and backward it needs, at batch 1 on the CPU.

On a small model at batch 1 the model's arithmetic no longer hides the explainer's own work
(hooks, checks, target and layer resolution, the map's arithmetic, upsampling, normalisation).
Timed side by side (interleaved), for Grad-CAM, Grad-CAM++, XGrad-CAM, LayerCAM and HiResCAM:

* a ``torch.no_grad()`` forward;
* the **floor**: the forward with autograd switched on at the layer (its output made a leaf),
  the class's score, and ``torch.autograd.grad`` of it to the layer, written out by hand with
  plain hooks (no maps);
* camkit's explainer (the class given, maps at the input's size);
* torchcam 0.5's (its forward then its call with the class; maps at the layer's grid, normalised;
  it has no HiResCAM), and, for what a user of it needs to get maps at the input's size, the same
  followed by a bilinear resize and a min-max normalisation ("torchcam + resize");
* captum's ``LayerGradCam`` (Grad-CAM only) and pytorch-grad-cam's class of the same name.

Which torchcam row is like for like: torchcam's maps stay at the layer's grid, so the plain row
leaves out the upsampling camkit's output contract includes (counted with callgrind on the shapes
CNN, the bilinear kernel to 64x64 alone runs more instructions than torchcam's whole overhead above
the floor); the "+ resize" row adds it. Both rows are kept: the plain one is the goal as written.
torchcam's forward, run by its caller with autograd on, also records the layers before the target
layer (the floor and camkit do not), which counts in its overhead.

Each timed call runs ``INNER`` explanations (a batch-1 call takes about a millisecond). The
overhead is an implementation's time minus the floor's, round by round; the goal compares
camkit's with torchcam's: ``(camkit - floor) / (torchcam - floor)`` at most 1. Maps are compared
with camkit's after camkit's output contract (``finish_maps_like_camkit``).

Default: the bundled shapes CNN (trained weights, 64x64, layer ``last_conv``) and resnet18 (random
weights, 64x64, ``layer4``), batch 1, one thread. ``--smoke``: the shapes CNN, Grad-CAM only.
The CUDA rows (resnet50, convnext_tiny and vit_b_16 at batch 1, 8 and 64) are in ``case_gpu.py``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
    build_model,
    describe_exception,
    finish_maps_like_camkit,
    goal_at_most,
    max_abs_diff,
    package_version,
    rows_for_timings,
)

TITLE = "Per-call overhead"
ORDER = 39
INNER = 20

FORWARD = "no-grad forward"
FLOOR = "floor: forward + backward to the layer, by hand"
CAMKIT = "camkit"
COMPILED = "camkit compile=True"
METHODS: dict[str, type[camkit.GradientCAM]] = {
    "Grad-CAM": camkit.GradCAM, "Grad-CAM++": camkit.GradCAMPlusPlus, "XGrad-CAM": camkit.XGradCAM,
    "LayerCAM": camkit.LayerCAM, "HiResCAM": camkit.HiResCAM,
}  # fmt: skip
TORCHCAM = {"Grad-CAM": "GradCAM", "Grad-CAM++": "GradCAMpp", "XGrad-CAM": "XGradCAM", "LayerCAM": "LayerCAM"}
PGC = {"Grad-CAM": "GradCAM", "Grad-CAM++": "GradCAMPlusPlus", "XGrad-CAM": "XGradCAM", "LayerCAM": "LayerCAM",
       "HiResCAM": "HiResCAM"}  # fmt: skip
ANCHORS = {"torchcam": "torchcam", "captum": "captum", "pytorch-grad-cam": "pytorch_grad_cam"}
VERSIONS = {"torchcam": "torchcam", "captum": "captum", "pytorch-grad-cam": "grad-cam"}


def label(impl: str) -> str:
    """An anchor's name with its installed version (``torchcam 0.5.0``); camkit's rows as they are."""
    base = impl.removesuffix(" + resize")
    version = package_version(VERSIONS[base]) if base in VERSIONS else None
    return impl.replace(base, f"{base} {version}") if version else impl


def tokens_to_map(tokens: Tensor) -> Tensor:
    """ViT tokens [B, 1 + h*w, D] -> [B, D, h, w], for the anchors' reshape hooks."""
    side = math.isqrt(tokens.shape[1] - 1)
    return tokens[:, 1:, :].unflatten(1, (side, side)).permute(0, 3, 1, 2)


def floor_call(model: nn.Module, layer: str, x: Tensor, classes: Tensor) -> Callable[[], Tensor]:
    """The forward with autograd from ``layer`` on and the gradient of the classes' scores there, by hand."""
    module = model.get_submodule(layer)
    rows = torch.arange(x.shape[0], device=x.device)

    def run() -> Tensor:
        kept: list[Tensor] = []

        def hook(m: nn.Module, args: Any, out: Tensor) -> Tensor:
            leaf = out.detach().requires_grad_(True)
            kept.append(leaf)
            torch.set_grad_enabled(True)
            return leaf

        handle = module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                scores = model(x)
                with torch.enable_grad():
                    return torch.autograd.grad(scores[rows, classes].sum(), kept[-1])[0]
        finally:
            handle.remove()

    return run


def _resize(maps: Tensor, size: Sequence[int]) -> Tensor:
    up = F.interpolate(maps[:, None], size=tuple(size), mode="bilinear", align_corners=False)[:, 0]
    low = up.amin(dim=(1, 2), keepdim=True)
    return (up - low) / (up.amax(dim=(1, 2), keepdim=True) - low).clamp_min(1e-12)


def prepare(impl: str, method: str, model: nn.Module, layer: str, x: Tensor, classes: Tensor
            ) -> tuple[Callable[[], Any], Callable[[Any], Tensor] | None, Callable[[], None]]:
    """``(call, maps_of_its_result, release)`` for ``impl``; anchors work on their own copy of ``model``."""
    size = tuple(x.shape[2:])
    if impl == FORWARD:
        return (lambda: _no_grad(model, x)), None, _nothing
    if impl == FLOOR:
        return floor_call(model, layer, x, classes), None, _nothing
    if impl in (CAMKIT, COMPILED):
        explainer = METHODS[method](model, layer, compile=impl == COMPILED)
        return (lambda: explainer(x, classes)), (lambda out: out), explainer._graphs.clear
    own = copy.deepcopy(model)
    tokens = type(own).__name__ == "VisionTransformer"
    if impl.startswith("torchcam"):
        import torchcam.methods as tc

        extractor = getattr(tc, TORCHCAM[method])(own, layer, reshape_transform=tokens_to_map if tokens else None)
        class_list = classes.tolist()
        resize = impl.endswith("+ resize")

        def torchcam_call() -> Tensor:
            maps = extractor(class_idx=class_list, scores=own(x))[0]
            return _resize(maps, size) if resize else maps

        return torchcam_call, (lambda out: finish_maps_like_camkit(out, size)), extractor.remove_hooks
    if impl == "captum":
        from captum.attr import LayerGradCam

        if method != "Grad-CAM" or tokens:
            raise NotImplementedError("captum has LayerGradCam only, without a token reshape")
        cam = LayerGradCam(own, own.get_submodule(layer))
        return (lambda: cam.attribute(x, target=classes, relu_attributions=True)), \
            (lambda out: finish_maps_like_camkit(out, size)), _nothing
    if impl == "pytorch-grad-cam":
        import pytorch_grad_cam
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        pgc = getattr(pytorch_grad_cam, PGC[method])(
            model=own, target_layers=[own.get_submodule(layer)], reshape_transform=tokens_to_map if tokens else None)
        targets = [ClassifierOutputTarget(int(c)) for c in classes.tolist()]
        return (lambda: pgc(input_tensor=x, targets=targets)), \
            (lambda out: finish_maps_like_camkit(torch.from_numpy(out).to(x.device), size)), pgc.activations_and_grads.release
    raise ValueError(f"unknown implementation {impl!r}")


def _nothing() -> None:
    return None


def _no_grad(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x)


def overhead_ratio(ours: Timing, theirs: Timing, floor: Timing) -> Ratio | None:
    """``(ours - floor) / (theirs - floor)``: of the medians, with the spread of the rounds' own ratios.

    A round where the anchor's time is not above the floor's (noise, on a busy machine) gives no
    ratio of its own; ``None`` when the medians' difference is not positive either.
    """
    above = theirs.median - floor.median
    if above <= 0:
        return None
    central = (ours.median - floor.median) / above
    rounds = [(a - f) / (b - f) for a, b, f in zip(ours.samples, theirs.samples, floor.samples) if b > f]
    return Ratio(central, min([central, *rounds]), max([central, *rounds]))


def implementations(ctx: Context, method: str, compiled: bool = False) -> list[str]:
    """The implementations timed for ``method`` (anchors only where installed and where they have it)."""
    impls = [FORWARD, FLOOR, CAMKIT] + ([COMPILED] if compiled else [])
    if ctx.available("torchcam") and method in TORCHCAM:
        impls += ["torchcam", "torchcam + resize"]
    if ctx.available("captum") and method == "Grad-CAM":
        impls.append("captum")
    if ctx.available("pytorch_grad_cam"):
        impls.append("pytorch-grad-cam")
    return impls


def time_method(ctx: Context, method: str, model: nn.Module, layer: str, x: Tensor, where: str, *,
                inner: int, compiled: bool = False, repeats: int | None = None,
                extra: dict[str, Callable[[], Any]] | None = None) -> tuple[list[Row], dict[str, Timing]]:
    """Rows and timings of every implementation of ``method`` on one model and batch, interleaved.

    ``extra``: further calls timed in the same rounds (a graph-replayed forward, say), named as given.
    """
    with torch.no_grad():
        classes = model(x).argmax(dim=1)
    calls: dict[str, Callable[[], Any]] = {f"{method}: {name}": call for name, call in (extra or {}).items()}
    releases: list[Callable[[], None]] = []
    diffs: dict[str, float] = {}
    rows: list[Row] = []
    ours = None
    for impl in implementations(ctx, method, compiled):
        try:
            call, maps, release = prepare(impl, method, model, layer, x, classes)
            out = call()  # also a warm-up (and the capture, compiled)
        except Exception as exc:  # an implementation that cannot run this model is reported, not fatal
            rows.append(Row(TITLE, f"{method}: {label(impl)}", where, x.shape[0], ctx.device.type,
                            note=describe_exception(exc)))
            continue
        releases.append(release)
        if impl == CAMKIT:
            ours = out
        elif maps is not None and ours is not None:
            diffs[f"{method}: {label(impl)}"] = max_abs_diff(ours, maps(out))
        calls[f"{method}: {label(impl)}"] = _repeated(call, inner)
    try:
        timings = ctx.time(calls, repeats=repeats)
    finally:
        for release in releases:
            release()
    rows = rows_for_timings(TITLE, timings, reference=f"{method}: {FORWARD}", model=where, batch=x.shape[0],
                            device=ctx.device, camkit=f"{method}: {CAMKIT}", diffs=diffs) + rows
    return rows, timings


def _repeated(call: Callable[[], Any], inner: int) -> Callable[[], Any]:
    def run() -> Any:
        for _ in range(inner - 1):
            call()
        return call()

    return run


def _goals(timings: dict[str, Timing], method: str, where: str) -> list[Goal]:
    """camkit's overhead against torchcam's as it returns its maps (the goal), and with them resized (like for like)."""
    goals = []
    for anchor, what in (("torchcam", "torchcam's"), ("torchcam + resize", "torchcam's with its maps resized to the input")):
        theirs = timings.get(f"{method}: {label(anchor)}")
        ratio = overhead_ratio(timings[f"{method}: {CAMKIT}"], theirs, timings[f"{method}: {FLOOR}"]) if theirs else None
        goals.append(goal_at_most(
            TITLE, f"camkit {method}'s overhead above forward + backward at most {what} ({where}, batch 1, CPU, one "
            f"thread; ratio = (camkit - floor) / ({anchor} - floor), medians)", ratio, 1.0,
            reason="" if theirs else "torchcam did not run (pip install -e '.[bench]'; or --no-anchors)"))
    return goals


def _models(ctx: Context) -> list[tuple[str, nn.Module, str]]:
    from camkit.bundled.model import CAM_LAYER, load_shapes_cnn

    out = [("shapes CNN 64x64", load_shapes_cnn().to(ctx.device), CAM_LAYER)]
    if not ctx.smoke:
        out.append(("resnet18 64x64", build_model("resnet18", ctx.device), "layer4"))
    return out


def run(ctx: Context) -> list[Row | Goal]:
    """Time each method on each small model at batch 1; one goal per model and method torchcam has."""
    if ctx.device.type != "cpu":
        return [Row(TITLE, "skipped", device=ctx.device.type, note="CPU rows; the CUDA rows are case_gpu.py's")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the overhead is serial Python and small kernels; one thread steadies it
    out: list[Row | Goal] = []
    try:
        for where, model, layer in _models(ctx):
            x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)).to(ctx.device)
            for method in ["Grad-CAM"] if ctx.smoke else list(METHODS):
                ctx.log(f"  {TITLE}: {where}, {method}, batch 1 ({1 if ctx.smoke else INNER} calls per timing)")
                rows, timings = time_method(ctx, method, model, layer, x, where, inner=2 if ctx.smoke else INNER)
                out += rows
                if method in TORCHCAM:
                    out += _goals(timings, method, where)
    finally:
        torch.set_num_threads(threads)
    return out
