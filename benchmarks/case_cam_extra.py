"""Case 18: pytorch-grad-cam 1.5's further methods, camkit beside the anchor (``--full`` only).

For each method, times side by side (interleaved): a ``torch.no_grad()`` forward of the
batch, camkit's method and pytorch-grad-cam's, each library on its own deep copy of the
model, the same explicit classes for both. Agreement: the max |difference| of the maps, the
anchor's given camkit's output contract (``finish_maps_like_camkit``); the notes say where a
difference is expected (KPCA-CAM's sign and ReLU, FullGrad's and Finer-CAM's epsilons,
random and unordered outputs).

``--full``: resnet18 (random weights) at 224x224, batch 2, ``layer4``; SESS with 3 scales.
``--smoke``: resnet18 at 64x64, batch 1, three methods. The default run skips this case.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Row,
    build_model,
    describe_exception,
    finish_maps_like_camkit,
    max_abs_diff,
    package_version,
    random_input,
    rows_for_timings,
)

TITLE = "pytorch-grad-cam 1.5 methods"
ORDER = 18

FORWARD = "no-grad forward"
LAYER = "layer4"

# method -> (camkit factory, anchor class name, anchor kwargs, agreement note)
METHODS: dict[str, tuple[Callable[[nn.Module], Any], str, dict[str, Any], str]] = {
    "GradCAMElementWise": (lambda m: camkit.GradCAMElementWise(m, LAYER), "GradCAMElementWise", {}, ""),
    "ShapleyCAM": (lambda m: camkit.ShapleyCAM(m, LAYER), "ShapleyCAM", {}, ""),
    "FinerCAM": (lambda m: camkit.FinerCAM(m, LAYER), "FinerCAM", {}, "anchor: targets=None (top-1 vs 3 rivals)"),
    "FEM": (lambda m: camkit.FEM(m, LAYER), "FEM", {}, ""),
    "KPCACAM": (lambda m: camkit.KPCACAM(m, LAYER), "KPCA_CAM", {}, "anchor: ReLU of a sign chosen by scikit-learn"),
    "RandomCAM": (lambda m: camkit.RandomCAM(m, LAYER, seed=0), "RandomCAM", {}, "random: maps not comparable"),
    "FullGrad": (lambda m: camkit.FullGrad(m), "FullGrad", {}, "anchor: 1e-7 in each channel's min-max"),
    "DeepFeatureFactorization": (
        lambda m: camkit.DeepFeatureFactorization(m, LAYER, concepts=5), "DeepFeatureFactorization", {},
        "concepts unordered, anchor factorises the batch jointly: maps not compared",
    ),
    "SESS": (lambda m: camkit.SESS(camkit.GradCAM(m, LAYER), num_scales=3), "SESS", {"num_scales": 3}, ""),
}
SMOKE = ("GradCAMElementWise", "FEM", "RandomCAM")


def _anchor(name: str, kwargs: dict[str, Any], own: nn.Module, x: Tensor, classes: Tensor) -> tuple[Callable[[], Any], Callable[[], None]]:
    import pytorch_grad_cam as pgc
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    targets = [ClassifierOutputTarget(int(c)) for c in classes.tolist()]
    module = own.get_submodule(LAYER)
    if name == "DeepFeatureFactorization":
        dff = pgc.DeepFeatureFactorization(own, module)
        return (lambda: dff(x, n_components=5)), dff.activations_and_grads.release
    if name == "SESS":
        from pytorch_grad_cam.sess import SESS as AnchorSESS

        sess = AnchorSESS(own, [module], **kwargs)
        return (lambda: sess(x, targets)), sess.base_cam.activations_and_grads.release
    if name == "FinerCAM":
        finer = pgc.FinerCAM(own, [module])
        return (lambda: finer(x)), finer.base_cam.activations_and_grads.release
    if name == "FullGrad":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cam = pgc.FullGrad(own, [])
    else:
        cam = getattr(pgc, name)(own, [module], **kwargs)
    return (lambda: cam(x, targets)), cam.activations_and_grads.release


def _time_method(ctx: Context, method: str, net: nn.Module, x: Tensor, classes: Tensor, model: str) -> list[Row]:
    factory, anchor_name, kwargs, note = METHODS[method]
    explainer = factory(net)
    ours_label = f"camkit {method}"
    anchor_label = f"pytorch-grad-cam {package_version('grad-cam') or ''} {anchor_name}".replace("  ", " ")
    fns: dict[str, Callable[[], Any]] = {}

    def forward() -> Tensor:
        with torch.no_grad():
            return net(x)

    fns[FORWARD] = forward
    fns[ours_label] = (lambda: explainer(x)) if method == "FinerCAM" else (lambda: explainer(x, target=classes))
    close: Callable[[], None] = lambda: None  # noqa: E731
    notes: dict[str, str] = {}
    diffs: dict[str, float] = {}
    if ctx.available("pytorch_grad_cam"):
        try:
            run, close = _anchor(anchor_name, kwargs, copy.deepcopy(net), x, classes)
            fns[anchor_label] = run
        except Exception as exc:  # an anchor that cannot run is reported, not fatal
            notes[anchor_label] = describe_exception(exc)
    outputs = {name: fn() for name, fn in fns.items() if name != FORWARD}  # also the warm-up
    if anchor_label in outputs and "not" not in note:
        theirs = outputs[anchor_label]
        theirs = torch.from_numpy(np.asarray(theirs, dtype=np.float32))
        diffs[anchor_label] = max_abs_diff(outputs[ours_label], finish_maps_like_camkit(theirs, tuple(x.shape[-2:])))
        ctx.log(f"    {method}: max |camkit - anchor| = {diffs[anchor_label]:.2e}")
    if note and anchor_label in fns:
        notes[anchor_label] = note
    outputs.clear()
    try:
        timings = ctx.time(fns, repeats=min(ctx.repeats, 3))
    finally:
        close()
    return rows_for_timings(
        TITLE, timings, reference=FORWARD, model=model, batch=x.shape[0], device=ctx.device,
        camkit=ours_label, diffs=diffs, notes=notes,
    )


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Each method beside its anchor (``--full``); a few methods on a tiny input (``--smoke``)."""
    if not (ctx.full or ctx.smoke):
        ctx.log(f"  {TITLE}: run with --full")
        return []
    size, batch = (64, 1) if ctx.smoke else (224, 2)
    net = build_model("resnet18", ctx.device)
    x = random_input(batch, size, ctx.device)
    with torch.no_grad():
        classes = net(x).argmax(dim=1)
    rows: list[Row] = []
    for method in SMOKE if ctx.smoke else tuple(METHODS):
        ctx.log(f"  {TITLE}: {method}, resnet18 {size}x{size}, batch {batch}")
        rows += _time_method(ctx, method, net, x, classes, "resnet18")
    return rows
