"""AttnLRP on torchvision's ViT, against a no-grad forward and LXT 2.1 (its ``cp_LRP`` patches with zennit's gamma).

Times, side by side (interleaved) on one model and batch: a ``torch.no_grad()`` forward, camkit's
``AttnLRP`` with LXT's ViT recipe (``attention="cp"``, the gamma rule: 0.25 on the patch embedding,
0 on linear layers, a stabiliser of 1e-9) and with its defaults (``attention="attnlrp"``, the epsilon rule), and LXT's
efficient implementation with the same rules on its own deep copy of the model. LXT patches
``nn.GELU``, ``nn.LayerNorm``, ``nn.MultiheadAttention`` and zennit's ``BasicHook`` for the whole
process; here each LXT call patches them, runs, and puts them back, so that the interleaved
camkit calls and forwards run on plain torch (the patching costs a few ``setattr``). Every
implementation explains the same classes: each image's top-1.

Agreement: the largest difference between camkit's recipe-equal map (``raw``, the relevance of
each input value) and LXT's, over LXT's map's largest value.

Peak memory of one call above the loaded model, each implementation in a fresh process
(``ctx.peak_memory``).

Models: torchvision's ``vit_b_16``, randomly initialised (its classification head, which starts at
zero, drawn from N(0, 0.02^2)), at 224 x 224, batch 4; ``--smoke``: a ViT of 2 blocks of width 32 at
32 x 32, batch 2.

Goals (CPU): camkit's AttnLRP (LXT's recipe) at most 3x a no-grad forward and not slower than LXT;
its peak memory not above LXT's.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    BenchmarkError,
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
    describe_exception,
    goal_at_most,
    memory_rows,
    paired_ratio,
    rows_for_timings,
)

TITLE = "AttnLRP on torchvision's ViT"
ORDER = 30

FORWARD = "no-grad forward"
RECIPE = "camkit AttnLRP (cp, gamma)"
DEFAULT = "camkit AttnLRP (defaults)"
LXT = "lxt 2.1 (cp_LRP + zennit Gamma)"
IMPLS = (FORWARD, RECIPE, DEFAULT, LXT)
CONV_GAMMA, LINEAR_GAMMA = 0.25, 0.0
# camkit gives nn.MultiheadAttention's projections the epsilon rule, LXT their plain gradient: a small
# stabiliser on both sides makes that difference vanish from the agreement check
STABILIZER = 1e-9
TIME_LIMIT = 3.0
REPEATS = 3


def build_model(name: str, device: torch.device | str = "cpu") -> nn.Module:
    """``vit_b_16`` or the smoke run's tiny ViT, seeded, head drawn from N(0, 0.02^2), eval mode."""
    from torchvision.models import VisionTransformer, vit_b_16

    torch.manual_seed(0)
    model = vit_b_16(weights=None) if name == "vit_b_16" else VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    )
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model.eval().to(device)


def _config(ctx: Context) -> tuple[str, int, int]:
    return ("tiny ViT", 32, 2) if ctx.smoke else ("vit_b_16", 224, 4)


@contextmanager
def _lxt_patched() -> Iterator[None]:
    """LXT's ``cp_LRP`` patches and its zennit patch for the block, every patched class put back after.

    ``lxt.efficient``'s ``__init__`` imports its BERT patches, which need names transformers 5 no longer
    has; stand-in packages (empty, their ``__path__`` the real folders) let its rules, patches and ViT
    map load without it.
    """
    import lxt
    from zennit.core import BasicHook

    root = Path(lxt.__file__).parent / "efficient"
    before = set(sys.modules)
    for name, path in (("lxt.efficient", root), ("lxt.efficient.models", root / "models")):
        if name not in sys.modules:
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [str(path)]
            sys.modules[name] = stand_in
    classes = (nn.GELU, nn.LayerNorm, nn.MultiheadAttention, BasicHook)
    saved = [(cls, dict(vars(cls))) for cls in classes]
    try:
        vit = importlib.import_module("lxt.efficient.models.vit_torch")
        for cls, patch in vit.cp_LRP.items():
            patch(cls)
        importlib.import_module("lxt.efficient.zennit_patches").monkey_patch_zennit()
        yield
    finally:
        for cls, attributes in saved:
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name in ("forward", "backward"):
                if name in attributes:
                    setattr(cls, name, attributes[name])
        for name in set(sys.modules) - before:
            if name.startswith("lxt.efficient"):
                del sys.modules[name]


def prepare(impl: str, model: nn.Module, x: Tensor, classes: Tensor) -> Callable[[], Tensor]:
    """A call of ``impl`` explaining ``classes``, returning the relevance [B, C, H, W] (the logits for the forward)."""
    if impl == FORWARD:

        def forward() -> Tensor:
            with torch.no_grad():
                return model(x)

        return forward
    if impl in (RECIPE, DEFAULT):
        explainer = (
            camkit.AttnLRP(model, "cp", "gamma", conv_gamma=CONV_GAMMA, gamma=LINEAR_GAMMA, epsilon=STABILIZER)
            if impl == RECIPE else camkit.AttnLRP(model)
        )
        return lambda: explainer.explain(x, target=classes).raw
    if impl == LXT:
        from zennit.composites import LayerMapComposite
        from zennit.rules import Gamma

        own = copy.deepcopy(model)
        composite = LayerMapComposite(
            [(nn.Conv2d, Gamma(CONV_GAMMA, STABILIZER)), (nn.Linear, Gamma(LINEAR_GAMMA, STABILIZER))]
        )

        def lxt_call() -> Tensor:
            leaf = x.detach().clone().requires_grad_(True)
            with _lxt_patched(), composite.context(own):
                out = own(leaf)
                (grad,) = torch.autograd.grad(out.gather(1, classes[:, None]).sum(), leaf)
            return leaf.detach() * grad

        return lxt_call
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def _input(batch: int, size: int, device: torch.device | str) -> Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)


def memory_job(device: torch.device, impl: str, model: str, batch: int, size: int) -> Callable[[], Any]:
    """Probe job: ``impl`` on ``model``, warmed up at batch 1; returns one call at ``batch``."""
    net = build_model(model, device)
    small = _input(1, size, device)
    with torch.no_grad():
        first = net(small).argmax(dim=1)
    prepare(impl, net, small, first)()
    x = _input(batch, size, device)
    with torch.no_grad():
        classes = net(x).argmax(dim=1)
    return prepare(impl, net, x, classes)


def _usable(ctx: Context) -> list[str]:
    anchors = ctx.available("lxt") and ctx.available("zennit")
    return [impl for impl in IMPLS if impl != LXT or anchors]


def _time(ctx: Context, model: str, size: int, batch: int) -> tuple[list[Row], dict[str, Timing]]:
    net = build_model(model, ctx.device)
    x = _input(batch, size, ctx.device)
    with torch.no_grad():
        classes = net(x).argmax(dim=1)
    calls, outputs, rows = {}, {}, []
    for impl in _usable(ctx):
        try:
            calls[impl] = prepare(impl, net, x, classes)
            outputs[impl] = calls[impl]()  # the warm-up round
        except Exception as exc:  # reported, not fatal
            rows.append(Row(TITLE, impl, model, batch, ctx.device.type, note=describe_exception(exc)))
            calls.pop(impl, None)
    diffs = {}
    if LXT in outputs and RECIPE in outputs:
        ref = outputs[LXT]
        diffs[LXT] = float((outputs[RECIPE] - ref).abs().amax() / ref.abs().amax())
        ctx.log(f"    max |camkit - lxt| / max |lxt| = {diffs[LXT]:.2e}")
    timings = ctx.time(calls, repeats=ctx.repeats if ctx.smoke else REPEATS, warmup=0)
    rows = rows_for_timings(TITLE, timings, reference=FORWARD, model=model, batch=batch, device=ctx.device,
                            camkit=RECIPE, diffs=diffs) + rows  # fmt: skip
    return rows, timings


def _memory(ctx: Context, model: str, size: int, batch: int) -> tuple[list[Row], dict[str, float]]:
    impls = [FORWARD, RECIPE] if ctx.smoke else _usable(ctx)  # smoke: the probes' imports would take a minute
    runs = {impl: {"impl": impl, "model": model, "batch": batch, "size": size} for impl in impls}
    peaks, failed = ctx.peaks(f"{__name__}:memory_job", runs)
    rows = memory_rows(TITLE, peaks, reference=FORWARD, model=model, batch=batch, device=ctx.device, camkit=RECIPE)
    return rows + [Row(TITLE, impl, model, batch, ctx.device.type, note=why) for impl, why in failed.items()], peaks


def goals(timings: dict[str, Timing], peaks: dict[str, float], where: str) -> list[Goal]:
    """camkit's recipe-equal AttnLRP against the forward's time and LXT's time and peak memory."""
    ours, forward, theirs = timings.get(RECIPE), timings.get(FORWARD), timings.get(LXT)
    missing = "" if theirs else "lxt or zennit is not installed"
    memory = peaks[RECIPE] / peaks[LXT] if peaks.get(LXT) and RECIPE in peaks else None
    return [
        goal_at_most(TITLE, f"AttnLRP at most {TIME_LIMIT}x a no-grad forward ({where})",
                     paired_ratio(ours, forward) if ours and forward else None, TIME_LIMIT),
        goal_at_most(TITLE, f"AttnLRP not slower than LXT ({where}; ratio = camkit / lxt)",
                     paired_ratio(ours, theirs) if ours and theirs else None, 1.0, reason=missing),
        goal_at_most(TITLE, f"AttnLRP's peak memory not above LXT's ({where}; ratio = camkit / lxt)",
                     None if memory is None else Ratio.exact(memory), 1.0, reason=missing),
    ]  # fmt: skip


def run(ctx: Context) -> Sequence[Row | Goal]:
    model, size, batch = _config(ctx)
    ctx.log(f"  {TITLE}: {model} {size}x{size}, batch {batch}")
    try:
        time_rows, timings = _time(ctx, model, size, batch)
        mem_rows, peaks = _memory(ctx, model, size, batch)
    except BenchmarkError as exc:
        return [Row(TITLE, RECIPE, model, batch, ctx.device.type, note=describe_exception(exc))]
    return [*time_rows, *mem_rows, *goals(timings, peaks, f"{model} {size}x{size}, batch {batch}")]
