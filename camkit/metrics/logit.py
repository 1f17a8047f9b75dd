"""The random logit test (Sixt et al. 2020): does a class's map change when another class is explained?"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import check_chunk_size, check_images, check_model
from ._reexplain import model_outputs
from .randomisation import Similarity, _explain
from .sanity import ssim

__all__ = ["random_logit"]


def random_logit(
    explainer: Callable[..., Any],
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    num_classes: int | None = None,
    maps: Tensor | None = None,
    similarity: Similarity = ssim,
    off_classes: Tensor | None = None,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Random logit test (Sixt et al. 2020): similarity of a class's map with another class's map.

    For each input the explained class ``y`` and a class ``y' != y`` drawn uniformly from
    the other ``K - 1`` classes; the score is ``similarity(e_y, e_y')`` (SSIM by default,
    on the maps' own grid). Lower is better: a map that does not change with the class
    explains nothing about the class. Needs a model (for the classes) and re-explanation;
    costs one explanation of the batch (two without ``maps``).

    Args:
        explainer: called as ``explainer(x, classes)``, returns maps [B, *S] (or ``.maps``).
        model: the model; run (without gradients, on chunks) only when ``target`` or
            ``num_classes`` is ``None``.
        x: inputs [B, C, *S].
        target: the explained classes: ``None`` (top-1), an int or B ints.
        num_classes: K; ``None``: the width of the model's output.
        maps: the maps of ``target`` [B, *S]; ``None`` explains them.
        similarity: ``f(a, b) -> [B]``; the default SSIM expects maps in [0, 1].
        off_classes: the other classes [B] (a pre-drawn plan); ``None`` draws them.
        generator: the source of the draw; ``None``: a generator seeded with 0.
        chunk_size: inputs per explainer or model call.
        output: what to score when the model does not return a tensor.

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.metrics import random_logit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> random_logit(camkit.GradCAM(net, "1"), net, torch.rand(2, 3, 8, 8), target=[0, 1]).shape
        torch.Size([2])
    """
    check_model(model)
    check_images(x)
    check_chunk_size(chunk_size)
    batch = x.shape[0]
    if target is None or num_classes is None:
        logits = model_outputs(model, x, chunk_size, output)
        num_classes = num_classes if num_classes is not None else logits.shape[1]
        if target is None:
            target = logits.argmax(dim=1)
    classes = None if callable(target) else torch.as_tensor(target, device=x.device).long().flatten()
    if classes is not None and classes.numel() == 1:
        classes = classes.expand(batch)
    if classes is None or classes.shape != (batch,) or not ((classes >= 0) & (classes < num_classes)).all():
        raise InvalidInputError(f"random_logit needs one class per input, from 0 to {num_classes - 1}, got {target!r}")
    if num_classes < 2:
        raise InvalidInputError(f"random_logit needs at least 2 classes, got num_classes={num_classes}")
    if off_classes is None:
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        drawn = torch.randint(0, num_classes - 1, (batch,), generator=generator).to(x.device)
        off_classes = drawn + (drawn >= classes).long()  # skip the explained class
    off_classes = off_classes.to(x.device).long()
    if off_classes.shape != (batch,) or (off_classes == classes).any():
        raise InvalidInputError(f"off_classes must be [B] = [{batch}] classes, none equal to the target's")
    if maps is None:
        maps = _explain(explainer, x, classes, chunk_size)
    other = _explain(explainer, x, off_classes, chunk_size)
    return similarity(maps.detach().float().to(x.device), other).float()
