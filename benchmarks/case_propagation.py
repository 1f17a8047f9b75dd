"""Case 18: DeepLift and LRP against plain saliency, with captum's DeepLift and LRP and zennit's LRP beside.

Times, side by side on one model and batch, interleaved: ``camkit.Saliency`` (the
reference: one forward and one input-gradient backward), ``camkit.DeepLift`` (baseline 0:
the same plus a single-image reference forward and the Rescale multipliers),
``camkit.LRP`` with the epsilon rule (the same pass count, modified gradients at every
convolution, linear layer and batch norm) and with the ``"epsilonplus"`` composite (z+ on
convolutions: two extra convolutions per layer), and, when captum is installed, captum's
``DeepLift`` and ``LRP`` (default epsilon rules), each on its own deep copy of the model.
Every implementation gets the same explicit classes (the top-1 of a no-grad forward).

Two sets of interleaved rounds: camkit's four methods alone, which the goals and camkit's rows
come from; then, when captum is installed, captum's implementations beside camkit's Saliency,
DeepLift and LRP epsilon, which captum's rows come from (their ratio to Saliency, and camkit's
matching method ÷ theirs). In one set of rounds, captum's LRP, which allocates several GiB a
call, made camkit's Saliency fault its memory in afresh too under glibc's default settings, and
DeepLift's ratio to it measured that (docs/guide/performance.md).

Agreement: captum's attributions [B, C, H, W] are given camkit's pixel contract
(``max_c |attr|``, then per-map min-max; :func:`camkit.methods.attribution.pixel.pixel_maps`) and
compared with camkit's DeepLift and LRP epsilon (``epsilon=1e-9``, captum's value). An
implementation that cannot run the model (captum's DeepLift refuses a ReLU module called
twice, which every torchvision ResNet block does) gets a row with the error instead.
Captum's LRP does run on ResNets but has no rule for the in-place ``out += identity`` of
their blocks (it wants an ``Addition_Module``): the gradient of the sum hands each summand
the *whole* relevance, so relevance is duplicated at every block and its maps disagree
with camkit's (``tests/methods/test_propagation.py`` shows the duplication on a small residual net).

zennit (the LRP anchor camkit's maps equal, ``tests/methods/test_lrp_zennit.py``), when installed,
explains with its canonizer for the model (``ResNetCanonizer`` here) and the epsilon rule
(``epsilon`` and ``stabilizer`` 1e-9, beside camkit's LRP epsilon) and the ``EpsilonPlus``
composite (defaults, beside camkit's ``"epsilonplus"``), on its own deep copy; each call registers
and removes zennit's hooks and canonizers (``with Gradient(...)``), as a call of camkit's does its
own set-up. Its rows come from rounds of their own, as captum's do.

Configurations: ``--smoke`` resnet18 at 64x64, batch 2; default resnet18 at 224x224, batch 4;
``--full`` resnet50 at 224x224, batch 8.
"""

from __future__ import annotations

import copy
import dataclasses
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

TITLE = "DeepLift and LRP"
ORDER = 18

SALIENCY = "camkit Saliency"
DEEPLIFT = "camkit DeepLift"
LRP = "camkit LRP epsilon"
LRP_PLUS = "camkit LRP epsilonplus"
CAMKIT = (SALIENCY, DEEPLIFT, LRP, LRP_PLUS)  # timed in rounds of their own
TIME_LIMIT = 1.3


def _captum_label(name: str) -> str:
    version = package_version("captum")
    return f"captum {version} {name}" if version else f"captum {name}"


def _zennit_label(name: str) -> str:
    version = package_version("zennit")
    return f"zennit {version} {name}" if version else f"zennit {name}"


def _zennit_fns(model: nn.Module, x: Tensor, classes: Tensor) -> dict[str, Callable[[], Any]]:
    """zennit's LRP epsilon and EpsilonPlus with the model's canonizer, each on its own deep copy."""
    from zennit.attribution import Gradient
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.composites import EpsilonPlus, LayerMapComposite, layer_map_base
    from zennit.rules import Epsilon
    from zennit.torchvision import ResNetCanonizer, VGGCanonizer
    from zennit.types import Convolution

    def canonizers() -> list[Any]:
        name = type(model).__name__.lower()
        return [ResNetCanonizer() if "resnet" in name else VGGCanonizer() if "vgg" in name else SequentialMergeBatchNorm()]

    def start(out: Tensor) -> Tensor:  # the relevance starts as the target score, as camkit's does
        return out * torch.nn.functional.one_hot(classes, out.shape[1]).to(out)

    def epsilon() -> Any:
        rule = Epsilon(1e-9)
        return LayerMapComposite([*layer_map_base(1e-09), (Convolution, rule), (nn.Linear, rule)], canonizers=canonizers())

    def explain(twin: nn.Module, composite: Callable[[], Any]) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with Gradient(twin, composite()) as attributor:
                return attributor(x, start)[1]

        return call

    return {
        _zennit_label("LRP epsilon"): explain(copy.deepcopy(model), epsilon),
        _zennit_label("LRP EpsilonPlus"): explain(copy.deepcopy(model), lambda: EpsilonPlus(canonizers=canonizers())),
    }


def _pairs() -> list[tuple[str, str]]:
    """(anchor, the camkit method it matches)."""
    return [
        (_captum_label("DeepLift"), DEEPLIFT),
        (_captum_label("LRP"), LRP),
        (_zennit_label("LRP epsilon"), LRP),
        (_zennit_label("LRP EpsilonPlus"), LRP_PLUS),
    ]


def _prepare(ctx: Context, model: nn.Module, x: Tensor, classes: Tensor) -> dict[str, Callable[[], Any]]:
    saliency, deeplift = camkit.Saliency(model), camkit.DeepLift(model)
    lrp, lrp_plus = camkit.LRP(model, "epsilon", epsilon=1e-9), camkit.LRP(model, "epsilonplus")
    fns: dict[str, Callable[[], Any]] = {
        SALIENCY: lambda: saliency.explain(x, classes).raw,
        DEEPLIFT: lambda: deeplift.explain(x, classes).raw,
        LRP: lambda: lrp.explain(x, classes).raw,
        LRP_PLUS: lambda: lrp_plus.explain(x, classes).raw,
    }
    if ctx.available("captum"):
        from captum.attr import LRP as CaptumLRP
        from captum.attr import DeepLift as CaptumDeepLift

        deeplift_c, lrp_c = CaptumDeepLift(copy.deepcopy(model)), CaptumLRP(copy.deepcopy(model))
        base = torch.zeros_like(x)
        fns[_captum_label("DeepLift")] = lambda: deeplift_c.attribute(x, base, target=classes)
        fns[_captum_label("LRP")] = lambda: lrp_c.attribute(x, target=classes)
    if ctx.available("zennit"):
        fns.update(_zennit_fns(model, x, classes))
    return fns


def _anchor_rows(
    ctx: Context, fns: dict[str, Callable[[], Any]], diffs: dict[str, float], name: str, batch: int
) -> list[Row]:
    """captum's rows, from rounds of their own beside camkit's Saliency and the camkit method each matches."""
    pairs = [(theirs, ours) for theirs, ours in _pairs() if theirs in fns and ours in fns]
    if not pairs or SALIENCY not in fns:
        return []
    ctx.log("    the anchors, in rounds of their own with camkit's Saliency, DeepLift and LRP:")
    timings = ctx.time(
        {impl: fns[impl] for impl in (SALIENCY, DEEPLIFT, LRP, LRP_PLUS, *(theirs for theirs, _ in pairs)) if impl in fns}
    )
    notes = {
        _captum_label("LRP"): "no rule for the blocks' out += identity: relevance duplicated at each (see docstring)"
    }
    rows: list[Row] = []
    for theirs, ours in pairs:
        pair = {SALIENCY: timings[SALIENCY], ours: timings[ours], theirs: timings[theirs]}
        (row,) = [
            r
            for r in rows_for_timings(
                TITLE,
                pair,
                reference=SALIENCY,
                model=name,
                batch=batch,
                device=ctx.device,
                camkit=ours,
                diffs=diffs,
                notes=notes,
            )
            if r.impl == theirs
        ]
        note = "; ".join(filter(None, [f"own rounds; camkit ÷ this is {ours} ÷ this", row.note]))
        rows.append(dataclasses.replace(row, note=note))
    return rows


def run(ctx: Context) -> list[Row | Goal]:
    """Time the implementations interleaved; goals: DeepLift and LRP (epsilon) within 1.3x of Saliency."""
    if ctx.smoke:
        name, size, batch = "resnet18", 64, 2
    elif ctx.full:
        name, size, batch = "resnet50", 224, 8
    else:
        name, size, batch = "resnet18", 224, 4
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
    for theirs, ours in _pairs():
        if theirs in outputs and ours in outputs:
            diffs[theirs] = max_abs_diff(pixel_maps(outputs[ours], size2)[0], pixel_maps(outputs[theirs], size2)[0])
            ctx.log(f"    max |{ours} - {theirs}| maps = {diffs[theirs]:.2e}")
    outputs.clear()
    # camkit's methods in rounds of their own, which the goals come from: captum's calls between them change
    # glibc's heap under camkit's (see the module docstring)
    ours = {impl: fns[impl] for impl in CAMKIT if impl in fns}
    timings = ctx.time(ours)
    if SALIENCY not in timings:
        return rows
    rows = (
        rows_for_timings(
            TITLE, timings, reference=SALIENCY, model=name, batch=batch, device=ctx.device, camkit=DEEPLIFT
        )
        + rows
    )
    rows += _anchor_rows(ctx, fns, diffs, name, batch)
    goals = []
    for impl in (DEEPLIFT, LRP):
        ratio = paired_ratio(timings[impl], timings[SALIENCY]) if impl in timings else None
        goals.append(
            goal_at_most(
                TITLE,
                f"{impl} within {TIME_LIMIT}x of camkit Saliency's time ({name}, {size}x{size}, batch {batch})",
                ratio,
                TIME_LIMIT,
            )
        )
    return [*rows, *goals]
