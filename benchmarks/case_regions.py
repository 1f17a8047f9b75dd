"""Case 18: the region methods (FeatureAblation, ShapleyValueSampling, KernelShap, Lime) against
their floor of bare masked forwards and against captum. Runs with ``--full`` (and ``--smoke``).

For each method, side by side (interleaved, median of the repeats):

* **bare masked forwards**: one ``torch.no_grad()`` forward of the unperturbed image plus, in
  chunks of ``batch_size``, as many forwards of a ready masked batch as camkit ran distinct
  coalitions (``extras["evaluated"]``): the cost of the model calls alone;
* **camkit** with ``batch_size`` masked images per forward;
* **captum 0.9** with the same feature mask (``feature_mask``), the same number of samples and
  ``perturbations_per_eval`` equal to camkit's ``batch_size``; each on its own deep copy of
  the model.

Agreement: FeatureAblation is deterministic, so camkit's raw map is compared with captum's
attribution (max absolute difference). The sampling methods draw different random
coalitions (and camkit evaluates repeated coalitions once, which captum does not), so only
their time is compared; their agreement in expectation is tested in ``tests/methods/test_regions.py``.

Default: resnet18 (random weights), one 128x128 image, a 6x6 grid (36 regions), chunks of 32;
Shapley sampling with 3 orders, KernelSHAP and LIME with 64 samples. ``--smoke``: 32x32,
a 3x3 grid, no captum.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import camkit
from camkit.functional.regions import grid_regions

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

TITLE = "Region methods"
ORDER = 18
MODEL = "resnet18"
BARE = "bare masked forwards"
CAMKIT = "camkit"
FLOOR_MARGIN = 1.1
ANCHOR_MARGIN = 1.05


def _captum_label() -> str:
    version = package_version("captum")
    return f"captum {version}" if version else "captum"


def _methods(samples: int, orders: int) -> dict[str, tuple[Callable[..., camkit.Explainer], str, dict[str, Any]]]:
    """name -> (camkit factory taking (model, ids, chunk), captum class name, captum attribute kwargs)."""
    return {
        "FeatureAblation": (lambda m, ids, c: camkit.FeatureAblation(m, regions=ids, batch_size=c), "FeatureAblation", {}),
        "ShapleyValueSampling": (
            lambda m, ids, c: camkit.ShapleyValueSampling(m, regions=ids, samples=orders, batch_size=c),
            "ShapleyValueSampling",
            {"n_samples": orders},
        ),
        "KernelShap": (
            lambda m, ids, c: camkit.KernelShap(m, regions=ids, samples=samples, batch_size=c),
            "KernelShap",
            {"n_samples": samples + 2},
        ),
        "Lime": (lambda m, ids, c: camkit.Lime(m, regions=ids, samples=samples, batch_size=c), "Lime", {"n_samples": samples}),
    }


def _bare(model: nn.Module, x: Tensor, forwards: int, chunk: int) -> Callable[[], None]:
    masks = (torch.rand(min(chunk, forwards), 1, *x.shape[-2:], generator=torch.Generator().manual_seed(0)) < 0.5).to(x)
    masked = x * masks

    def run() -> None:
        with torch.no_grad():
            model(x)
            for start in range(0, forwards, chunk):
                model(masked[: min(chunk, forwards - start)])

    return run


def _captum(name: str, model: nn.Module, x: Tensor, ids: Tensor, cls: int, chunk: int, kwargs: dict[str, Any]) -> Callable[[], Tensor]:
    import captum.attr as captum_attr

    own = copy.deepcopy(model)
    method = getattr(captum_attr, name)(own)
    mask = ids[None, None]

    def run() -> Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out: Tensor = method.attribute(x, target=cls, feature_mask=mask, perturbations_per_eval=chunk, **kwargs)
        return out

    return run


def run(ctx: Context) -> list[Row | Goal]:
    if not (ctx.full or ctx.smoke):
        ctx.log(f"  {TITLE}: runs with --full")
        return []
    size, cells, chunk, samples, orders = (32, 3, 16, 16, 2) if ctx.smoke else (128, 6, 32, 64, 3)
    net = build_model(MODEL, ctx.device)
    x = random_input(1, size, ctx.device)
    ids = grid_regions((size, size), (cells, cells)).to(ctx.device)
    with torch.no_grad():
        cls = int(net(x).argmax(dim=1))
    use_captum = ctx.available("captum") and not ctx.smoke
    rows: list[Row | Goal] = []
    where = f"{MODEL}, {size}x{size}, {cells}x{cells} grid, one image, chunks of {chunk}"
    ctx.log(f"  {TITLE}: {where}")
    for name, (make, anchor, kwargs) in _methods(samples, orders).items():
        case = f"{TITLE}: {name}"
        explainer = make(net, ids, chunk)
        first = explainer.explain(x, target=cls)
        evaluated = int(first.extras["evaluated"])
        fns: dict[str, Callable[[], Any]] = {
            BARE: _bare(net, x, evaluated, chunk),
            CAMKIT: lambda e=explainer: e.explain(x, target=cls),
        }
        diffs: dict[str, float] = {}
        notes = {CAMKIT: f"{evaluated} distinct masked forwards + 1"}
        label = _captum_label()
        if use_captum:
            try:
                theirs = _captum(anchor, net, x, ids, cls, chunk, kwargs)
                out = theirs()
                fns[label] = theirs
                if name == "FeatureAblation":
                    diffs[label] = max_abs_diff(first.raw, out[:, 0])
                    notes[label] = "max |raw - captum attribution|"
                else:
                    notes[label] = f"{kwargs.get('n_samples')} samples, each evaluated (different random draws)"
            except Exception as exc:  # an anchor failure must not hide camkit's figures
                rows.append(Row(case, label, MODEL, 1, ctx.device.type, note=describe_exception(exc)))
        timings = ctx.time(fns, repeats=ctx.repeats if ctx.smoke else 3, warmup=1)
        rows += rows_for_timings(case, timings, reference=BARE, model=MODEL, batch=1, device=ctx.device,
                                 diffs=diffs, notes=notes)
        rows.append(goal_at_most(case, f"camkit {name} within {FLOOR_MARGIN}x of its bare masked forwards ({where})",
                                 paired_ratio(timings[CAMKIT], timings[BARE]), FLOOR_MARGIN))
        rows.append(goal_at_most(
            case, f"camkit {name} no slower than captum's, {ANCHOR_MARGIN - 1:.0%} noise margin ({where})",
            paired_ratio(timings[CAMKIT], timings[label]) if label in timings else None, ANCHOR_MARGIN,
            reason="" if label in timings else "captum not installed or not run (--smoke)",
        ))
    return rows
