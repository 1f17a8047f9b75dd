"""The model-randomisation sanity check (Adebayo et al. 2018).

A map that barely changes when the model's weights are replaced by random ones does not
explain the model. :func:`randomization_check` re-initialises the layers of a *copy* of
the model one after another and compares each step's maps with the original maps.

Signals, images and volumes go through the same code: Spearman's correlation ranks every
position of a map, and SSIM (scikit-image) slides its window along every spatial axis.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target, select_output
from ._common import ANY_MAPS, MAP_SHAPES, average_ranks, check_images, check_model
from ._randomize import ExplainerFactory, call_order, check_module_names, randomise_parameters, randomised_models
from ._reexplain import explain_maps

__all__ = ["RandomizationResult", "randomization_check", "spearman", "ssim"]


@dataclass(frozen=True)
class RandomizationResult:
    """What :func:`randomization_check` returns.

    Attributes:
        layers: for each step, the name of the module randomised at that step; step 0 is
            ``"original"``: the maps of a second untouched copy, a self-check that gives
            similarity 1 unless the explainer is not deterministic.
        spearman: Spearman rank correlation with the original maps, float [S, B].
        ssim: structural similarity (scikit-image, data range 1) with the original maps, [S, B].
        maps: the maps of every step [S, B, *spatial] (``*spatial``: T, H W, or D H W) when
            ``keep_maps=True``, else ``None``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> from camkit.metrics import randomization_check
        >>> res = randomization_check(lambda m: camkit.GradCAM(m, "1"), net, torch.rand(2, 3, 8, 8), keep_maps=True)
        >>> res.layers[0], tuple(res.ssim.shape), tuple(res.maps.shape)
        ('original', (3, 2), (3, 2, 8, 8))
        >>> bool((res.ssim[0] > 0.999).all())  # step 0: an untouched copy gives the same maps (SSIM 1, also when flat)
        True
    """

    layers: tuple[str, ...]
    spearman: Tensor
    ssim: Tensor
    maps: Tensor | None = None


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation between paired maps [B, *S] (any rank, or [B, N]), per pair.

    Ties get their average rank. A constant map has no ranking: its pair gives NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import spearman
        >>> a = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
        >>> spearman(a, a ** 3).tolist(), spearman(a, -a).tolist()
        ([1.0], [-1.0])
    """
    if a.shape != b.shape or a.dim() < 2:
        raise InvalidInputError(f"expected two batches of maps of one shape, got {list(a.shape)} and {list(b.shape)}")
    ra = average_ranks(a.flatten(1).double())
    rb = average_ranks(b.flatten(1).double())
    ra = ra - ra.mean(dim=1, keepdim=True)
    rb = rb - rb.mean(dim=1, keepdim=True)
    denom = (ra.square().sum(1) * rb.square().sum(1)).sqrt()
    rho = (ra * rb).sum(1) / torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.where(denom == 0, torch.full_like(rho, float("nan")), rho).float()


def ssim(a: Tensor, b: Tensor, data_range: float = 1.0) -> Tensor:
    """Structural similarity (``skimage.metrics.structural_similarity``) per pair of maps [B, *S].

    Maps are signals [B, T], images [B, H, W] or volumes [B, D, H, W]: scikit-image slides
    a window of the same side along every spatial axis (a segment, a square, a cube). Runs
    on the CPU, one call per pair; the side is 7, or the largest odd size that fits the
    shortest axis. Every axis needs at least 3 positions. Returns float [B] on ``a``'s device.

    Example:
        >>> import torch
        >>> from camkit.metrics import ssim
        >>> a = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(0))
        >>> ssim(a, a).tolist()
        [1.0, 1.0]
    """
    from skimage.metrics import structural_similarity

    if a.shape != b.shape or a.dim() not in MAP_SHAPES:
        raise InvalidInputError(
            f"expected two batches of maps {ANY_MAPS} of one shape, got {list(a.shape)} and {list(b.shape)}"
        )
    side = min(a.shape[1:])
    if side < 3:
        raise InvalidInputError(
            f"SSIM needs at least 3 positions along every axis of the maps (3x3 pixels on an image), "
            f"got {list(a.shape[1:])}; compare such maps with spearman() alone"
        )
    window = min(7, side if side % 2 else side - 1)
    left = a.detach().to("cpu", torch.float64).numpy()
    right = b.detach().to("cpu", torch.float64).numpy()
    values = [structural_similarity(p, q, data_range=data_range, win_size=window) for p, q in zip(left, right)]
    return torch.tensor(np.asarray(values, dtype=np.float32), device=a.device)


def randomization_check(
    explainer_factory: ExplainerFactory,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    order: str = "top-down",
    *,
    layers: Sequence[str] | None = None,
    seed: int = 0,
    keep_maps: bool = False,
    output: OutputSelector = None,
) -> RandomizationResult:
    """Model-parameter randomisation test: do the maps change when the weights do?

    Works on ``copy.deepcopy(model)`` in eval mode; ``model`` itself is never touched.
    ``target=None`` is resolved once to the original model's top-1 classes, and those
    classes are explained at every step. Step 0 explains the untouched copy; each later
    step re-initialises one more module's parameters (weights ~ U(±1/sqrt(fan_in)),
    norm scales ~ U(0.5, 1.5), biases ~ U(±0.1), from a generator seeded with ``seed``)
    and compares the new maps with the original ones.

    Args:
        explainer_factory: ``f(model_copy) -> explainer``, called on the copy once per step;
            the explainer is called as ``explainer(x, target)`` and returns maps [B, *S]
            of the inputs' rank (camkit explainers do). Name layers by string (``lambda m: GradCAM(m, "layer4")``):
            a module object would belong to the original model.
        model: the model; never modified.
        x: inputs [B, C, *S]: signals [B, C, T], images [B, C, H, W] or volumes and videos
            [B, C, D, H, W].
        target: ``None`` (top-1 of the original model), an int, B ints, or a callable.
        order: ``"top-down"``: cascading from the output towards the input, each step
            adding one module to the randomised set (Adebayo et al.'s cascading test);
            ``"independent"``: each step randomises only its module, on a fresh copy.
        layers: the module names to randomise, in the order given (a container such as
            ``"layer4"`` randomises everything inside it at once). ``None``: every module
            that owns parameters, in reverse order of first call in the forward pass.
        seed: seed of the random weights.
        keep_maps: also return every step's maps.
        output: what to score when the model does not return a tensor.

    Returns:
        A :class:`RandomizationResult` with [S, B] similarities, S = 1 + number of layers.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.metrics import randomization_check
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> res = randomization_check(lambda m: camkit.GradCAM(m, "1"), net, torch.rand(2, 3, 8, 8))
        >>> res.layers, tuple(res.spearman.shape)
        (('original', '4', '0'), (3, 2))
    """
    base, names, target = _plan(model, x, target, order, layers, output)
    original = explain_maps(explainer_factory(base), x, target)
    generator = torch.Generator().manual_seed(seed)
    work = copy.deepcopy(base)
    steps = [explain_maps(explainer_factory(work), x, target)]  # same weights: a determinism self-check
    for _, randomised in randomised_models(base, names, order, randomise_parameters, generator, start=work):
        steps.append(explain_maps(explainer_factory(randomised), x, target))
    return _compare(original, torch.stack(steps), names, keep_maps)


def _plan(
    model: nn.Module, x: Tensor, target: Target, order: str, layers: Sequence[str] | None, output: OutputSelector
) -> tuple[nn.Module, list[str], Target]:
    """Check the arguments; the untouched copy, the modules to randomise and the target explained."""
    check_model(model)
    check_images(x)
    if order not in ("top-down", "independent"):
        raise InvalidInputError(f"order must be 'top-down' or 'independent', got {order!r}")
    base = copy.deepcopy(model)
    with torch.no_grad(), eval_mode(base):
        names = list(layers) if layers is not None else call_order(base, x, output)[::-1]
        if target is None:
            target = select_output(base(x), output).argmax(dim=1)
    check_module_names(base, names)
    if layers is None and not names:
        raise InvalidInputError("the model has no parameters to randomise")
    return base, names, target


def _compare(original: Tensor, stacked: Tensor, names: list[str], keep_maps: bool) -> RandomizationResult:
    """Each step's maps [S, B, *spatial] against the original maps [B, *spatial]."""
    reference = original.expand_as(stacked).flatten(0, 1)
    flat = stacked.flatten(0, 1)
    shape = tuple(stacked.shape[:2])
    return RandomizationResult(
        layers=("original", *names),
        spearman=spearman(reference, flat).view(shape),
        ssim=ssim(reference, flat).view(shape),
        maps=stacked if keep_maps else None,
    )
