"""Randomisation measures: do the maps depend on the model's weights and on the class explained?

* :func:`mprt`: the model parameter randomisation test (Adebayo et al. 2018), cascading
  or independent, with the smoothed explanations of smooth MPRT (Hedström et al. 2023);
* :func:`efficient_mprt`: the relative rise of the maps' entropy once every layer is
  random (eMPRT, Hedström et al. 2023);
* :func:`random_logit` (in :mod:`camkit.metrics.logit`): the similarity of a class's map
  with a random other class's (Sixt et al. 2020).

Weights are randomised on a copy of the model (never the model given), from a
``torch.Generator``; explanations are computed through an explainer built on that copy,
in batches of at most ``chunk_size`` inputs. Cost: one explanation pass of the batch per
layer (times ``samples`` for the smoothed test), one deep copy of the model (two for the
independent order).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import check_chunk_size, check_images, check_model
from ._randomize import (
    ExplainerFactory,
    Randomizer,
    call_order,
    check_module_names,
    randomise_parameters,
    randomised_models,
)
from ._reexplain import explain_stack, top1
from .sanity import spearman

__all__ = ["MPRTResult", "Similarity", "efficient_mprt", "mprt"]

Similarity = Callable[[Tensor, Tensor], Tensor]
_ORDERS = ("top-down", "bottom-up", "independent")


@dataclass(frozen=True)
class MPRTResult:
    """What :func:`mprt` returns.

    Attributes:
        layers: the modules randomised, one per step, in order.
        similarity: similarity of each step's maps with the original maps, float [L, B].
        original: similarity of an untouched copy's maps with the original maps [B]: 1 for
            a deterministic explainer (a self-check, left out of :attr:`average`).

    Example:
        >>> import torch
        >>> from camkit.metrics import MPRTResult
        >>> res = MPRTResult(("b", "a"), torch.tensor([[0.5, 0.2], [0.1, 0.0]]), torch.ones(2))
        >>> res.average.tolist(), res.last.tolist()
        ([0.30000001192092896, 0.10000000149011612], [0.10000000149011612, 0.0])
    """

    layers: tuple[str, ...]
    similarity: Tensor
    original: Tensor

    @property
    def average(self) -> Tensor:
        """Mean similarity over the randomised steps [B] (the unrandomised copy left out)."""
        return self.similarity.mean(dim=0)

    @property
    def last(self) -> Tensor:
        """Similarity after the last step [B]: the whole cascade randomised."""
        return self.similarity[-1]


def _explain(
    explainer: Callable[..., Any], x: Tensor, target: Target, chunk_size: int, noise: Tensor | None = None
) -> Tensor:
    """Maps [B, *S] (or [B, K, *S]) of ``x``; with ``noise`` [N, B, C, *S], the mean map over ``x + noise[n]``."""
    inputs = x[None] if noise is None else x[None] + noise
    return explain_stack(explainer, inputs, target, chunk_size, channels=True).mean(dim=0)


def _noise(x: Tensor, samples: int, magnitude: float, generator: torch.Generator) -> Tensor | None:
    """Smooth MPRT's noise [N, B, C, *S]: N - 1 draws of std ``magnitude * (max - min)`` per input, then zeros."""
    if samples == 1:
        return None
    dims = tuple(range(1, x.dim()))
    std = magnitude * (x.amax(dim=dims, keepdim=True) - x.amin(dim=dims, keepdim=True))
    draws = torch.randn((samples - 1, *x.shape), generator=generator, dtype=x.dtype).to(x.device) * std
    return torch.cat([draws, torch.zeros_like(x)[None]])


def _layer_names(
    base: nn.Module, x: Tensor, order: str, layers: Sequence[str] | None, output: OutputSelector
) -> list[str]:
    if layers is not None:
        names = list(layers)
    else:
        with torch.no_grad():
            names = call_order(base, x, output)
        if order == "top-down":
            names = names[::-1]
    check_module_names(base, names)
    if not names:
        raise InvalidInputError("the model has no parameters to randomise")
    return names


def _check_common(model: nn.Module, x: Tensor, order: str, chunk_size: int) -> None:
    check_model(model)
    check_images(x)
    check_chunk_size(chunk_size)
    if order not in _ORDERS:
        raise InvalidInputError(f"order must be one of {', '.join(map(repr, _ORDERS))}, got {order!r}")


def mprt(
    explainer_factory: ExplainerFactory,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    order: str = "top-down",
    layers: Sequence[str] | None = None,
    maps: Tensor | None = None,
    similarity: Similarity = spearman,
    samples: int = 1,
    noise_magnitude: float = 0.1,
    last_only: bool = False,
    randomize: Randomizer | None = None,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> MPRTResult:
    """Model parameter randomisation test: similarity of the maps before and after randomising layers.

    For each step ``l`` the maps ``e_l`` of the model with layers randomised are compared with
    the original maps ``e``: ``similarity(e, e_l)`` (Spearman's rank correlation by default).
    A map that explains the model changes, so low similarity is good. Cascading orders
    randomise one more layer at each step, from the output (``"top-down"``, Adebayo et al.
    2018) or from the input (``"bottom-up"``, as Hedström et al. 2023 recommend);
    ``"independent"`` randomises one layer alone at each step. With ``samples = N > 1`` each
    explanation is the mean over N - 1 noisy copies ``x + eps``,
    ``eps ~ N(0, (noise_magnitude * (max x - min x))^2)`` per input, and ``x`` itself
    (smooth MPRT, Hedström et al. 2023).

    Needs: a model and re-explanation (``explainer_factory`` is called on the copy). Cost:
    ``(1 + L) * N`` explanations of the batch (``2 * N`` with ``last_only``), in chunks of
    ``chunk_size`` inputs; one or two deep copies of the model.

    Args:
        explainer_factory: ``f(model_copy) -> explainer``; the explainer is called as
            ``explainer(x, target)`` and returns maps [B, *S] or an object with ``.maps``
            (camkit explainers do); maps with a channel axis [B, K, *S] (per-channel
            attributions) are compared whole. Name layers by string: a module object would
            belong to the original model.
        model: the model; never modified (the copy is put in eval mode).
        x: inputs [B, C, *S] ([B, C, T], [B, C, H, W] or [B, C, D, H, W]).
        target: ``None`` (the original model's top-1 class), an int, B ints, or a callable.
        order: ``"top-down"``, ``"bottom-up"`` or ``"independent"``.
        layers: module names randomised, in the order given; ``None``: every module owning
            parameters in order of first call in the forward pass (reversed for top-down).
        maps: the original maps [B, *S] (or [B, K, *S]); ``None`` explains the original model.
        similarity: ``f(a, b) -> [B]`` on maps [B, *S] (or [B, K, *S]).
        samples: explanations averaged per map (1: plain MPRT).
        noise_magnitude: noise std as a share of each input's value range.
        last_only: compute only the last step (the whole cascade).
        randomize: ``f(module, generator)`` re-drawing a module's parameters in place;
            default: weights ~ U(+-1/sqrt(fan_in)), norm scales ~ U(0.5, 1.5), biases ~ U(+-0.1).
        generator: the source of every draw; ``None``: a generator seeded with 0.
        chunk_size: inputs per explainer call.
        output: what to score when the model does not return a tensor.

    Returns:
        An :class:`MPRTResult`: ``similarity`` [L, B] (L = 1 with ``last_only``), ``average``, ``last``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.metrics import mprt
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        >>> res = mprt(lambda m: camkit.Saliency(m), net, x)
        >>> res.layers, tuple(res.similarity.shape), res.original.tolist()
        (('4', '0'), (2, 2), [1.0, 1.0])
    """
    return _run(
        explainer_factory, model, x, target, order, layers, maps, similarity, samples, noise_magnitude,
        last_only, randomize, generator, chunk_size, output, self_check=True,
    )  # fmt: skip


def _run(
    explainer_factory: ExplainerFactory,
    model: nn.Module,
    x: Tensor,
    target: Target,
    order: str,
    layers: Sequence[str] | None,
    maps: Tensor | None,
    similarity: Similarity,
    samples: int,
    noise_magnitude: float,
    last_only: bool,
    randomize: Randomizer | None,
    generator: torch.Generator | None,
    chunk_size: int,
    output: OutputSelector,
    *,
    self_check: bool,
) -> MPRTResult:
    _check_common(model, x, order, chunk_size)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise InvalidInputError(f"samples must be a positive int, got {samples!r}")
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    randomize = randomize if randomize is not None else randomise_parameters
    base = copy.deepcopy(model).eval()
    names = _layer_names(base, x, order, layers, output)
    if target is None:
        target = top1(base, x, chunk_size, output)
    noise = _noise(x, samples, noise_magnitude, generator)
    if maps is None:
        maps = _explain(explainer_factory(base), x, target, chunk_size, noise)
    elif not isinstance(maps, Tensor) or not (
        maps.shape == (x.shape[0], *x.shape[2:])
        or (maps.dim() == x.dim() and maps.shape[0] == x.shape[0] and maps.shape[2:] == x.shape[2:])
    ):  # fmt: skip
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(
            f"maps must be [B, *S] = {[x.shape[0], *x.shape[2:]]} (or [B, K, *S] with a channel axis) for inputs "
            f"{list(x.shape)}, got {got}"
        )
    maps = maps.detach().float().to(x.device)
    original = torch.full((x.shape[0],), float("nan"), device=x.device)
    if self_check:
        untouched = _explain(explainer_factory(copy.deepcopy(base)), x, target, chunk_size, noise)
        original = similarity(maps, untouched).float()
    steps, scores = [], []
    for step, (name, work) in enumerate(randomised_models(base, names, order, randomize, generator)):
        if last_only and step < len(names) - 1:
            continue
        steps.append(name)
        scores.append(similarity(maps, _explain(explainer_factory(work), x, target, chunk_size, noise)))
    return MPRTResult(tuple(steps), torch.stack(scores).float(), original)


def discrete_entropy(maps: Tensor, bins: int) -> Tensor:
    """Shannon entropy (nats) of the histogram of each map's values [B]: ``bins`` equal bins from min to max.

    Bins are assigned as ``numpy.histogram`` assigns them, in the maps' own precision (the
    last bin closed, a value on an edge in the bin above it, a constant map in one bin).
    """
    flat = maps.flatten(1)
    low = flat.amin(dim=1, keepdim=True)
    high = flat.amax(dim=1, keepdim=True)
    same = low == high
    low, high = torch.where(same, low - 0.5, low), torch.where(same, high + 0.5, high)
    span = high - low
    index = ((flat - low) / span * bins).floor().long().clamp(0, bins - 1)
    edges = torch.arange(bins + 1, dtype=flat.dtype, device=flat.device) * (span / bins) + low  # [B, bins + 1]
    edges[:, -1:] = high
    index = index - (flat < edges.gather(1, index)).long()
    index = index + ((flat >= edges.gather(1, index + 1)) & (index != bins - 1)).long()
    counts = torch.zeros(flat.shape[0], bins, dtype=torch.float64, device=flat.device)
    counts.scatter_add_(1, index, torch.ones_like(flat, dtype=torch.float64))
    p = counts / flat.shape[1]
    return -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(dim=1).float()


def efficient_mprt(
    explainer_factory: ExplainerFactory,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    bins: int = 100,
    layers: Sequence[str] | None = None,
    maps: Tensor | None = None,
    randomize: Randomizer | None = None,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Efficient MPRT (eMPRT, Hedström et al. 2023): how much more complex the maps get once the model is random.

    ``(H(e_random) - H(e)) / H(e)`` per input, where ``H`` is the discrete entropy of the
    histogram of a map's values in ``bins`` equal bins and ``e_random`` the map of the model
    with every layer randomised (bottom-up, all at once at the end). Higher is better: a map
    that explains the model turns to noise. Needs a model and re-explanation; costs two
    explanations of the batch and one copy of the model.

    Args:
        explainer_factory, model, x, target, layers, maps, randomize, generator, chunk_size, output: see :func:`mprt`.
        bins: histogram bins.

    Returns:
        Float tensor [B]; NaN where the original map is constant (entropy 0).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.metrics import efficient_mprt
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> efficient_mprt(lambda m: camkit.Saliency(m), net, torch.rand(2, 3, 8, 8), bins=10).shape
        torch.Size([2])
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise InvalidInputError(f"bins must be a positive int, got {bins!r}")
    entropies: list[Tensor] = []

    def measure(a: Tensor, b: Tensor) -> Tensor:
        entropies.append(discrete_entropy(a, bins))
        return discrete_entropy(b, bins)

    res = _run(
        explainer_factory, model, x, target, "bottom-up", layers, maps, measure, 1, 0.0, True, randomize,
        generator, chunk_size, output, self_check=False,
    )  # fmt: skip
    before, after = entropies[0], res.last
    rise = (after - before) / torch.where(before == 0, torch.ones_like(before), before)
    return torch.where(before == 0, torch.full_like(rise, float("nan")), rise)
