"""captum's perturbation classes beside ``camkit.compat.captum``'s of the same name, on the same call.

Quantus's MNIST test fixtures (a LeNet: two 5x5 convolutions with max-pooling, three linear
layers; seeded random weights here, a batch of 28x28 one-channel images) and Quantus's own calls:
``Occlusion`` with a (1, 4, 4) window at stride 1 (625 placements), ``FeatureAblation`` with every
pixel its own feature (784), once with one perturbation per forward call and once with 16;
``ShapleyValueSampling``, ``KernelShap`` and ``Lime`` on 49 patches of 4x4 pixels. Each row
times, interleaved: a ``torch.no_grad()`` forward of the batch, captum's class and camkit's
compat class (both on the same model, sampling methods seeded alike before each call).
Agreement: the max |difference| between the two attributions.

``--smoke``: batch 2, Occlusion at stride (1, 2, 2), FeatureAblation on the 49 patches, fewer samples. The default run uses batch 8
as Quantus's fixtures do.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ._harness import Context, Goal, Row, max_abs_diff, package_version, rows_for_timings

TITLE = "captum compat: perturbation"
ORDER = 19

FORWARD = "no-grad forward"
CAMKIT = "camkit.compat.captum"


def lenet() -> nn.Module:
    """A seeded LeNet with the layout of Quantus's MNIST test model."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    ).eval()


def _calls(x: Tensor, y: Tensor, smoke: bool) -> dict[str, Callable[[Any, nn.Module], Tensor]]:
    """Each method's call on a module holding captum's classes (captum.attr or the compat one)."""
    patches = torch.arange(49).reshape(7, 7).repeat_interleave(4, 0).repeat_interleave(4, 1)[None, None]
    stride = (1, 2, 2) if smoke else 1
    samples = 20 if smoke else 100
    pixels = patches if smoke else None  # every pixel its own feature, as Quantus calls it

    def seeded(call: Callable[[Any, nn.Module], Tensor]) -> Callable[[Any, nn.Module], Tensor]:
        def run(mod: Any, net: nn.Module) -> Tensor:
            torch.manual_seed(1)
            return call(mod, net)

        return run

    return {
        "Occlusion": lambda m, n: m.Occlusion(n).attribute(x, sliding_window_shapes=(1, 4, 4), strides=stride, target=y),
        "FeatureAblation": lambda m, n: m.FeatureAblation(n).attribute(x, target=y, feature_mask=pixels),
        "FeatureAblation, 16 per eval": lambda m, n: m.FeatureAblation(n).attribute(
            x, target=y, feature_mask=pixels, perturbations_per_eval=16),
        "ShapleyValueSampling": seeded(lambda m, n: m.ShapleyValueSampling(n).attribute(
            x, target=y, feature_mask=patches, n_samples=2)),
        "KernelShap": seeded(lambda m, n: m.KernelShap(n).attribute(x[:1], target=y[:1], feature_mask=patches, n_samples=samples)),
        "Lime": seeded(lambda m, n: m.Lime(n).attribute(x[:1], target=y[:1], feature_mask=patches, n_samples=samples)),
    }


def _bound(call: Callable[[Any, nn.Module], Tensor], mod: Any, net: nn.Module) -> Callable[[], Tensor]:
    return lambda: call(mod, net)


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Each perturbation class of captum beside camkit's compat class, interleaved."""
    if not ctx.available("captum"):
        ctx.log(f"  {TITLE}: captum is not installed")
        return []
    import captum.attr as theirs

    import camkit.compat.captum.attr as ours

    batch = 2 if ctx.smoke else 8
    net = lenet().to(ctx.device)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, generator=g).to(ctx.device)
    with torch.no_grad():
        y = net(x).argmax(dim=1)
    label = f"captum {package_version('captum') or ''}".strip()
    rows: list[Row] = []

    def forward() -> Tensor:
        with torch.no_grad():
            out: Tensor = net(x)
        return out

    for name, call in _calls(x, y, ctx.smoke).items():
        ctx.log(f"  {TITLE}: {name}, LeNet 28x28, batch {batch}")
        fns: dict[str, Callable[[], Any]] = {
            FORWARD: forward, label: _bound(call, theirs, net), CAMKIT: _bound(call, ours, net),
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            diff = max_abs_diff(fns[CAMKIT]().detach(), fns[label]().detach())
            timings = ctx.time(fns, repeats=min(ctx.repeats, 3))
        ctx.log(f"    {name}: max |camkit - captum| = {diff:.2e}")
        rows += rows_for_timings(
            f"{TITLE}: {name}", timings, reference=FORWARD, model="LeNet", batch=batch, device=ctx.device,
            camkit=CAMKIT, diffs={label: diff},
        )
    return rows
