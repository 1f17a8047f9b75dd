"""The rows of the metric table that need more than one map and a forward pass.

The axiomatic metrics, the robustness metrics that re-explain perturbed inputs, sufficiency and
consistency (which compare the images of a batch), focus (which explains mosaics of the batch's
images) and the randomisation metrics (which explain randomised copies of the model). Every row
re-explains through the method being evaluated: ``MetricInput.explain`` (the method's explainer
on the model) or ``MetricInput.factory`` (the method built on another model), ``chunk_size``
inputs per call. Importing this module registers the rows (:mod:`camkit.evaluation` does).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..hooks import LayerCapture
from ..layers import resolve_layers
from ..metrics import (
    completeness,
    consistency,
    continuity,
    efficient_mprt,
    focus,
    infidelity,
    input_invariance,
    local_lipschitz_estimate,
    mprt,
    non_sensitivity,
    random_logit,
    relative_input_stability,
    relative_output_stability,
    relative_representation_stability,
    sufficiency,
)
from .table import MetricInput, MetricSpec, _per_step, register_metric

__all__ = ["layer_features", "mosaics"]

SAMPLES = 10
"""Perturbations per image of the re-explaining rows (Quantus's defaults are 10 to 200)."""


def _explain(i: MetricInput) -> Callable[[Tensor, Tensor], Tensor]:
    if i.explain is None:
        raise InvalidInputError("this metric explains perturbed inputs again and needs the method's explainer")
    return i.explain


def _factory(i: MetricInput) -> Callable[[nn.Module], Any]:
    if i.factory is None:
        raise InvalidInputError("this metric explains other models (randomised or shifted) and needs the method's "
                                "explainer factory, f(model) -> explainer")  # fmt: skip
    return i.factory


def _float(values: Tensor) -> Tensor:
    return values.detach().float()


def layer_features(model: nn.Module, layer: str | None) -> Callable[[Tensor], Tensor]:
    """``f(inputs) -> features [M, ...]``: the output of ``layer`` (``None``: the CAM layer camkit picks).

    The representation of relative representation stability. The layer is resolved on the first
    call's inputs [M, C, *S], then kept; the model runs in eval mode without gradients, and its
    hooks are removed after each call.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.evaluation.rows import layer_features
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> layer_features(net, "1")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 4, 8, 8])
    """
    pairs: list[tuple[str, nn.Module]] = []

    def features(inputs: Tensor) -> Tensor:
        if not pairs:
            pairs.extend(resolve_layers(model, layer, inputs)[:1])
        with eval_mode(model), LayerCapture(pairs, gradients=False) as capture:
            model(inputs)
            return capture.activations()[0]

    return features


def mosaics(x: Tensor) -> tuple[Tensor, Tensor]:
    """Mosaics of the batch: mosaic ``b`` shows images ``b, b + 1, ...`` (mod B), each shrunk to one part.

    The extent of ``x`` [B, C, *S] is halved along every spatial axis (parts of ``S // 2`` and
    ``S - S // 2`` positions, in row-major order, as :func:`camkit.metrics.focus` reads them);
    part ``p`` of mosaic ``b`` is image ``(b + p) mod B`` averaged down to the part's size.

    Returns:
        The mosaics [B, C, *S] and the source image of each part, long [B, P].

    Example:
        >>> import torch
        >>> from camkit.evaluation.rows import mosaics
        >>> x = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 4, 4)
        >>> tiles, sources = mosaics(x)
        >>> tiles[1, 0].tolist(), sources[1].tolist()
        ([[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]], [1, 2, 0, 1])
    """
    batch, spatial = x.shape[0], x.shape[2:]
    if any(s < 2 for s in spatial):
        raise InvalidInputError(f"a mosaic halves every spatial axis, which needs at least 2 positions, got {list(x.shape)}")
    pools: dict[int, Callable[..., Tensor]] = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d,
                                               3: F.adaptive_avg_pool3d}  # fmt: skip
    pool = pools.get(len(spatial))
    if pool is None:
        raise InvalidInputError(f"mosaics take inputs [B, C, T], [B, C, H, W] or [B, C, D, H, W], got {list(x.shape)}")
    out = torch.empty_like(x)
    parts = list(itertools.product((0, 1), repeat=len(spatial)))
    sources = (torch.arange(batch)[:, None] + torch.arange(len(parts))[None]) % batch
    for p, bits in enumerate(parts):
        window = tuple(slice(0, s // 2) if b == 0 else slice(s // 2, s) for b, s in zip(bits, spatial))
        size = tuple(s // 2 if b == 0 else s - s // 2 for b, s in zip(bits, spatial))
        out[(slice(None), slice(None), *window)] = pool(x[sources[:, p].to(x.device)], size)
    return out, sources


def _predictions(i: MetricInput) -> Tensor:
    """The model's top-1 classes [B] (eval mode, no gradients, ``chunk_size`` images per call)."""
    with torch.no_grad(), eval_mode(i.model):
        return torch.cat([i.model(i.x[a : a + i.chunk_size]).argmax(dim=1) for a in range(0, i.x.shape[0], i.chunk_size)])


def _focus(i: MetricInput) -> Tensor:
    tiles, sources = mosaics(i.x)
    predicted = _predictions(i)
    shown = predicted[sources.to(predicted.device)] == i.target[:, None]  # [B, P]: the part shows the class
    maps = _float(_explain(i)(tiles, i.target))
    values = focus(maps, shown)
    informative = shown.any(dim=1) & ~shown.all(dim=1)  # all parts alike: nothing to tell apart
    return torch.where(informative.to(values.device), values, torch.full_like(values, float("nan")))


def _input_invariance(i: MetricInput) -> Tensor:
    make = _factory(i)
    return _float(input_invariance(lambda m, x, t: make(m)(x, t), i.model, i.x, i.target))


def _mprt(order: str, samples: int = 1) -> Callable[[MetricInput], Tensor]:
    def compute(i: MetricInput) -> Tensor:
        res = mprt(_factory(i), i.model, i.x, i.target, order=order, maps=i.maps, samples=samples,
                   generator=i.generator, chunk_size=i.chunk_size)  # fmt: skip
        return res.average

    return compute


def _relative(kind: str) -> Callable[[MetricInput], Tensor]:
    def compute(i: MetricInput) -> Tensor:
        common: dict[str, Any] = {"maps": i.maps, "samples": SAMPLES, "generator": i.generator,
                                  "chunk_size": i.chunk_size}  # fmt: skip
        if kind == "input":
            return relative_input_stability(_explain(i), i.model, i.x, i.target, **common)
        if kind == "output":
            return relative_output_stability(_explain(i), i.model, i.x, i.target, **common)
        if i.representation is None:
            raise InvalidInputError("relative representation stability needs a representation function")
        return relative_representation_stability(_explain(i), i.model, i.x, i.target,
                                                 representation=i.representation, **common)  # fmt: skip

    return compute


_RANDOMISED = "a randomised copy of the model"
_STABILITY = "uniform noise of radius 0.2 that keeps the class (Agarwal et al. 2022)"

for _spec in (
    MetricSpec("infidelity_unnormalised", "robustness",
               lambda i: infidelity(i.model, i.x, i.maps, i.target, samples=SAMPLES, softmax=True,
                                    generator=i.generator, chunk_size=i.chunk_size).float(),
               False, default=False, cost="10 forward passes",
               summary="infidelity of Gaussian perturbations, the map taken at its own scale (Yeh et al. 2019; captum's "
               "default): on maps scaled to [0, 1] it also measures the scale"),
    MetricSpec("local_lipschitz_estimate", "robustness",
               lambda i: local_lipschitz_estimate(_explain(i), i.x, i.target, model=i.model, maps=i.maps,
                                                  samples=SAMPLES, generator=i.generator, chunk_size=i.chunk_size),
               False, needs_reexplain=True, default=False, cost="10 explanations",
               summary="largest change of the map over that of the input under Gaussian noise of std 0.1 "
               "(Alvarez-Melis and Jaakkola 2018)"),
    MetricSpec("continuity", "robustness",
               lambda i: continuity(_explain(i), i.x, i.target, model=i.model, maps=i.maps, steps=SAMPLES,
                                    chunk_size=i.chunk_size),
               False, needs_reexplain=True, default=False, cost="10 explanations",
               summary="largest L1 change of the map over the L2 change of the input as it slides sideways "
               "(Montavon et al. 2018)"),
    MetricSpec("relative_input_stability", "robustness", _relative("input"), False, needs_reexplain=True,
               default=False, cost="10 explanations and forward passes",
               summary="largest relative change of the map over that of the input, " + _STABILITY),
    MetricSpec("relative_output_stability", "robustness", _relative("output"), False, needs_reexplain=True,
               default=False, cost="10 explanations and forward passes",
               summary="largest relative change of the map over the change of the logits, " + _STABILITY),
    MetricSpec("relative_representation_stability", "robustness", _relative("representation"), False,
               needs_reexplain=True, default=False, cost="10 explanations, forward and layer passes",
               summary="largest relative change of the map over that of the CAM layer's output, " + _STABILITY),
    MetricSpec("consistency", "robustness", lambda i: consistency(i.maps, _predictions(i)), True, default=False,
               cost="1 forward pass; compares the batch's maps",
               summary="share of the batch's images whose map has the same signs on its first 5 values that get the "
               "same class (Dasgupta et al. 2022); NaN without such an image"),
    MetricSpec("sufficiency", "faithfulness",
               lambda i: sufficiency(i.model, i.x, i.maps, relative=True, chunk_size=i.chunk_size).float(), True,
               default=False, cost="1 forward pass; compares the batch's maps",
               summary="share of the batch's images with a map within 0.6 of the largest distance that get the same "
               "class (Dasgupta et al. 2022)"),
    MetricSpec("completeness", "axiomatic",
               lambda i: completeness(i.model, i.x, i.maps, i.target, softmax=True, chunk_size=i.chunk_size).float(),
               None, default=False, cost="2 forward passes",
               summary="sum of the map minus the softmax drop from the input to zeros (Sundararajan et al. 2017); "
               "0 is complete, so not ranked"),
    MetricSpec("non_sensitivity", "axiomatic",
               lambda i: non_sensitivity(i.model, i.x, i.maps, i.target, features_in_step=_per_step(i), softmax=True,
                                         chunk_size=i.chunk_size).float(),
               False, default=False, cost="steps forward passes",
               summary="pixels the map calls irrelevant but the model uses, or the other way round, at 1e-5 "
               "(Nguyen and Martinez 2020)"),
    MetricSpec("input_invariance", "axiomatic", _input_invariance, True, needs_reexplain=True, default=False,
               cost="1 explanation of a shifted input and model",
               summary="1 when the map is unchanged (to 1e-4) after shifting the input by -1 and the model back "
               "(Kindermans et al. 2019)"),
    MetricSpec("focus", "localisation", _focus, True, needs_reexplain=True, default=False,
               cost="1 explanation and forward pass",
               summary="share of positive relevance on the parts of a mosaic of the batch's images that show the "
               "class (Arias-Duart et al. 2022); NaN where every part, or none, shows it"),
    MetricSpec("mprt", "randomisation", _mprt("top-down"), False, needs_reexplain=True, default=False,
               cost="1 explanation per layer with parameters",
               summary="mean Spearman correlation of the map with the maps of the model randomised layer by layer "
               "from the output (Adebayo et al. 2018)"),
    MetricSpec("mprt_bottom_up", "randomisation", _mprt("bottom-up"), False, needs_reexplain=True, default=False,
               cost="1 explanation per layer with parameters",
               summary="as mprt, the layers randomised from the input (Hedström et al. 2023)"),
    MetricSpec("mprt_independent", "randomisation", _mprt("independent"), False, needs_reexplain=True,
               default=False, cost="1 explanation per layer with parameters",
               summary="as mprt, each layer randomised alone (Adebayo et al. 2018)"),
    MetricSpec("smooth_mprt", "randomisation", _mprt("bottom-up", samples=5), False, needs_reexplain=True,
               default=False, cost="5 explanations per layer with parameters",
               summary="as mprt_bottom_up, each map the mean over 4 noisy copies and the input (Hedström et al. 2023)"),
    MetricSpec("efficient_mprt", "randomisation",
               lambda i: efficient_mprt(_factory(i), i.model, i.x, i.target, maps=i.maps, generator=i.generator,
                                        chunk_size=i.chunk_size),
               True, needs_reexplain=True, default=False, cost="1 explanation of " + _RANDOMISED,
               summary="relative rise of the map's histogram entropy once every layer is random (Hedström et al. "
               "2023)"),
    MetricSpec("random_logit", "randomisation",
               lambda i: random_logit(_explain(i), i.model, i.x, i.target, maps=i.maps, generator=i.generator,
                                      chunk_size=i.chunk_size),
               False, needs_reexplain=True, default=False, cost="1 explanation and 1 forward pass",
               summary="SSIM of the map with the map of a random other class (Sixt et al. 2020)"),
):  # fmt: skip
    register_metric(_spec)
del _spec
