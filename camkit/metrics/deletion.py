"""Deletion and insertion curves (Petsiuk et al. 2018), their AUC, and the confidence measures
of Chattopadhay et al. 2018 (average drop, increase in confidence).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from torch import Tensor, nn

from .._internal.checks import BATCH_SHAPES, check_broadcasts
from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..functional.attribution import blur
from ..targets.classes import OutputSelector, Target
from ._common import ChunkScorer, check_images, check_maps, chunks, nan_maps, pixel_ranks

__all__ = [
    "Baseline",
    "auc",
    "average_drop",
    "blur_baseline",
    "deletion_curve",
    "increase_in_confidence",
    "insertion_curve",
]

Baseline = Union[float, Tensor, str, Callable[[Tensor], Tensor]]
"""What replaces removed pixels: a number, a tensor broadcastable to the inputs [B, C, *S]
(for images [B, C, H, W]: a scalar, [C, 1, 1], [C, H, W] or [B, C, H, W]; for signals
[B, C, T]: [C, 1], [C, T] or [B, C, T]; for volumes [B, C, D, H, W]: [C, 1, 1, 1],
[C, D, H, W] or [B, C, D, H, W]), ``"blur"`` (:func:`blur_baseline`), ``"mean"`` (each
input's per-channel mean over all its positions), or a callable ``f(x) -> Tensor`` of that shape.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from camkit.metrics import deletion_curve
    >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    ...                     nn.Flatten(), nn.Linear(4, 2))
    >>> x, maps = torch.rand(2, 3, 8, 8), torch.rand(2, 8, 8)
    >>> baselines = (0.0, "blur", "mean", torch.zeros(3, 1, 1), lambda x: x.flip(-1))
    >>> [tuple(deletion_curve(net, x, maps, 0, steps=4, baseline=b)[1].shape) for b in baselines]
    [(2, 5), (2, 5), (2, 5), (2, 5), (2, 5)]
"""

_BASELINE_NAMES = ("blur", "mean")


def blur_baseline(x: Tensor, sigma: float = 5.0) -> Tensor:
    """Gaussian blur of inputs [B, C, *S], the ``"blur"`` baseline; never modifies ``x``.

    A separable kernel of radius ``ceil(3 * sigma)`` along every spatial axis (T of a
    signal; H and W of an image; D, H and W of a volume, so a video is blurred in time too),
    with edge positions replicated outwards. ``sigma`` is in positions along each axis.

    Example:
        >>> import torch
        >>> from camkit.metrics import blur_baseline
        >>> x = torch.zeros(1, 1, 1, 9); x[..., 4] = 1.0
        >>> y = blur_baseline(x, sigma=1.0)
        >>> round(float(y.sum()), 4), bool(y[..., 4] < 1), bool(torch.allclose(y, y.flip(-1)))
        (1.0, True, True)
    """
    check_images(x)
    if not sigma > 0:
        raise InvalidInputError(f"sigma must be a positive number of pixels, got {sigma!r}")
    return blur(x, sigma)


def _broadcast_hint(dim: int) -> str:
    """'give a scalar, [C, 1, 1], [C, H, W] or [B, C, H, W]' for images, the same per rank."""
    full = BATCH_SHAPES[dim]  # "[B, C, H, W]"
    axes = full[len("[B, C, ") : -1]
    ones = ", ".join("1" for _ in axes.split(", "))
    return f"give a scalar, [C, {ones}], [C, {axes}] or {full}"


def _resolve_baseline(baseline: Baseline, x: Tensor) -> Tensor:
    """The baseline as a tensor expanded (not copied) to ``x.shape``."""
    if isinstance(baseline, str):
        if baseline == "blur":
            canvas = blur_baseline(x)
        elif baseline == "mean":
            canvas = x.mean(dim=tuple(range(2, x.dim())), keepdim=True)
        else:
            raise InvalidInputError(
                f"unknown baseline {baseline!r}; use a number, a tensor, one of {list(_BASELINE_NAMES)}, "
                "or a callable f(x) -> Tensor"
            )
    elif isinstance(baseline, bool):
        raise InvalidInputError("baseline must be a number, a tensor, 'blur', 'mean' or a callable, not a bool")
    elif isinstance(baseline, (int, float)):
        canvas = torch.full((1,) * x.dim(), float(baseline), dtype=x.dtype, device=x.device)
    elif isinstance(baseline, Tensor):
        canvas = baseline
    elif callable(baseline):
        canvas = baseline(x)
        if not isinstance(canvas, Tensor):
            raise InvalidInputError(f"a callable baseline must return a tensor, got {type(canvas).__name__}")
    else:
        raise InvalidInputError(
            f"baseline must be a number, a tensor, 'blur', 'mean' or a callable, got {type(baseline).__name__}"
        )
    check_broadcasts(canvas, x, what="images" if x.dim() == 4 else "inputs", hint=_broadcast_hint(x.dim()))
    return canvas.detach().to(device=x.device, dtype=x.dtype).expand(x.shape)


def _counts(n: int, steps: int, spacing: str) -> list[int]:
    """How many of ``n`` positions are perturbed at each point of a curve of ``steps`` steps."""
    if spacing == "even":
        return [(k * n + steps - 1) // steps for k in range(steps + 1)]  # ceil(k * N / steps), exactly
    if spacing == "block":
        size = (n + steps - 1) // steps  # ceil(N / steps) a step, the last step takes the rest
        return [*range(0, n, size), n]
    raise InvalidInputError(f"spacing must be 'even' or 'block', got {spacing!r}")


def _curve(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target,
    *,
    steps: int,
    baseline: Baseline,
    insert: bool,
    spacing: str = "even",
    softmax: bool,
    chunk_size: int,
    output: OutputSelector,
    keep_mode: bool,
) -> tuple[Tensor, Tensor]:
    check_images(x)
    maps = check_maps(maps, x)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"steps must be a positive int, got {steps!r}")
    scorer = ChunkScorer(model, target, softmax=softmax, output=output, chunk_size=chunk_size)
    batch, n = x.shape[0], maps[0].numel()
    counts = _counts(n, steps, spacing)
    points = len(counts)
    clean_step = points - 1 if insert else 0
    perturbed = [k for k in range(points) if k != clean_step]
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        canvas = _resolve_baseline(baseline, x)
        ranks = pixel_ranks(maps).view(batch, 1, *maps.shape[1:])
        step_counts = torch.tensor([counts[k] for k in perturbed], device=x.device)
        clean = scorer.clean(x)
        curve = torch.empty(batch, points, dtype=clean.dtype, device=x.device)
        curve[:, clean_step] = clean
        columns = torch.tensor(perturbed, device=x.device)
        # Every (image, step) pair in image-major order, scored chunk_size at a time.
        for start, stop in chunks(batch * len(perturbed), chunk_size):
            pair = torch.arange(start, stop, device=x.device)
            owner, step = pair // len(perturbed), pair % len(perturbed)
            chosen = ranks[owner] < step_counts[step].view(-1, *(1,) * (x.dim() - 1))  # [M, 1, *S]
            kept, filler = (canvas[owner], x[owner]) if insert else (x[owner], canvas[owner])
            images = torch.where(chosen, filler, kept)
            curve[owner, columns[step]] = scorer.score(images, owner).to(curve.dtype)
        curve = torch.where(nan_maps(maps)[:, None], torch.full_like(curve, float("nan")), curve)
    fractions = (torch.tensor(counts, dtype=torch.float64) / n).to(device=x.device, dtype=curve.dtype)
    return fractions, curve


def deletion_curve(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    steps: int = 50,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    spacing: str = "even",
) -> tuple[Tensor, Tensor]:
    """The deletion curve: the target's score as the most relevant pixels are removed.

    Works on signals, images and volumes alike: a "pixel" is one position of the map
    (a time step, a pixel, a voxel). Positions are ranked by map value, highest first;
    equal values are taken in row-major order over all spatial axes (top-left first). At
    step ``k = 0..steps`` the top ``ceil(k * N / steps)`` of the ``N`` positions (``T``,
    ``H * W`` or ``D * H * W``) are replaced, all channels together, by the baseline, and
    the model scores the result. Step 0 is the unperturbed image and the last step the bare
    baseline. A good map makes the score fall fast (low :func:`auc`).

    All ``B * steps`` perturbed images are built on ``x``'s device and scored ``chunk_size``
    at a time with gradients off; the model runs in eval mode and every module's flag is
    restored after (``keep_mode=True`` keeps the caller's modes).

    Args:
        model: the classifier; never modified.
        x: inputs [B, C, *S]: signals [B, C, T], images [B, C, H, W] or volumes and
            videos [B, C, D, H, W].
        maps: saliency maps [B, *S] at the inputs' size (any real values; only their
            order matters). A map holding NaN gives a row of NaN scores.
        target: whose score to follow, resolved on the unperturbed images: ``None`` (top-1),
            an int, B ints, or a callable ``f(output) -> Tensor[M]`` that scores each row of
            the output on its own (it is called on chunks of perturbed images).
        steps: number of removal steps; the curve has ``steps + 1`` points.
        baseline: what removed pixels become: a number, a tensor broadcastable to ``x``,
            ``"blur"`` (:func:`blur_baseline`, sigma 5 px along every spatial axis),
            ``"mean"`` (each input's per-channel mean) or a callable ``f(x) -> Tensor``
            broadcastable to ``x``.
        softmax: follow the softmax probability instead of the raw score.
        chunk_size: perturbed images per forward pass (memory bound; results do not depend on it).
        output: what to score when the model does not return a tensor (see
            :func:`camkit.select_output`).
        keep_mode: run the model in the caller's train/eval modes.
        spacing: how the removed counts grow: ``"even"`` (default) removes the top
            ``ceil(k * N / steps)`` at step ``k``; ``"block"`` removes ``ceil(N / steps)``
            more positions a step and the rest at the last (RISE's and torchcam's grid), so
            the curve may have fewer than ``steps + 1`` points (``N = 5, steps = 3``: counts
            ``0, 2, 4, 5``).

    Returns:
        ``(fractions, scores)``: fractions removed [S] (counts divided by N) and scores
        [B, S], both on ``x``'s device; ``S = steps + 1`` with ``spacing="even"``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import auc, deletion_curve
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.sum(dim=(1, 2, 3))[:, None]
        >>> x = torch.tensor([[[[0.4, 0.3], [0.2, 0.1]]]])
        >>> fractions, scores = deletion_curve(Sum(), x, x[:, 0], steps=2)
        >>> fractions.tolist(), [round(v, 4) for v in scores[0].tolist()]
        ([0.0, 0.5, 1.0], [1.0, 0.3, 0.0])
        >>> round(float(auc(fractions, scores)[0]), 4)
        0.4
    """
    return _curve(
        model, x, maps, target, steps=steps, baseline=baseline, insert=False, softmax=softmax,
        chunk_size=chunk_size, output=output, keep_mode=keep_mode, spacing=spacing,
    )  # fmt: skip


def insertion_curve(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    steps: int = 50,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    spacing: str = "even",
) -> tuple[Tensor, Tensor]:
    """The insertion curve: the target's score as the most relevant pixels are put back.

    Same ranking and counts as :func:`deletion_curve`, the other way round: at step ``k``
    the top ``ceil(k * N / steps)`` pixels (all channels) are taken from the image and the
    rest from the baseline canvas. Step 0 is the bare baseline, the last step the image.
    A good map makes the score rise fast (high :func:`auc`). The default canvas is the
    same as deletion's (0.0); Petsiuk et al. insert onto a blurred copy: ``baseline="blur"``.

    Args and Returns: as :func:`deletion_curve` (``fractions`` is the share inserted).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import insertion_curve
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.sum(dim=(1, 2, 3))[:, None]
        >>> x = torch.tensor([[[[0.4, 0.3], [0.2, 0.1]]]])
        >>> _, scores = insertion_curve(Sum(), x, x[:, 0], steps=2)
        >>> [round(v, 4) for v in scores[0].tolist()]
        [0.0, 0.7, 1.0]
    """
    return _curve(
        model, x, maps, target, steps=steps, baseline=baseline, insert=True, softmax=softmax,
        chunk_size=chunk_size, output=output, keep_mode=keep_mode, spacing=spacing,
    )  # fmt: skip


def auc(fractions: Tensor, scores: Tensor) -> Tensor:
    """Area under curves by the trapezoid rule.

    Args:
        fractions: x values [S].
        scores: curves [..., S], e.g. [B, steps + 1] from :func:`deletion_curve`.

    Returns:
        Areas [...] (a [B] tensor for [B, S] scores).

    Example:
        >>> import torch
        >>> from camkit.metrics import auc
        >>> auc(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([[1.0, 0.3, 0.0]]))
        tensor([0.4000])
    """
    if not isinstance(fractions, Tensor) or not isinstance(scores, Tensor):
        raise InvalidInputError("fractions and scores must be tensors, as returned by deletion_curve")
    if fractions.dim() != 1 or scores.dim() < 1 or scores.shape[-1] != fractions.shape[0]:
        raise InvalidInputError(
            f"expected fractions [S] and scores [..., S], got {list(fractions.shape)} and {list(scores.shape)}"
        )
    return torch.trapezoid(scores, fractions.to(scores.device, scores.dtype), dim=-1)


def _masked_confidence(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target,
    *,
    softmax: bool,
    chunk_size: int,
    output: OutputSelector,
    keep_mode: bool,
) -> tuple[Tensor, Tensor]:
    """Scores [B] of the images and of the images times their maps (NaN for NaN maps)."""
    check_images(x)
    maps = check_maps(maps, x)
    scorer = ChunkScorer(model, target, softmax=softmax, output=output, chunk_size=chunk_size)
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        full = scorer.clean(x)
        owners = torch.arange(x.shape[0], device=x.device)
        masked = torch.cat([
            scorer.score(x[a:b] * maps[a:b, None].to(x.dtype), owners[a:b])
            for a, b in chunks(x.shape[0], chunk_size)
        ])  # fmt: skip
        masked = torch.where(nan_maps(maps), torch.full_like(masked, float("nan")), masked)
    return full, masked.to(full.dtype)


def average_drop(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    softmax: bool = True,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
) -> Tensor:
    """Drop in confidence when only the map is shown (Chattopadhay et al. 2018), per image.

    With ``Y`` the target's score on the image and ``O`` its score on ``x * map`` (the map,
    expected in [0, 1], used as a soft mask on every channel), the drop is
    ``max(0, Y - O) / Y``. The paper's "Average Drop %" is ``100 * drops.mean()``; lower is
    better. Scores are softmax probabilities by default (``softmax=False``: raw scores, for
    which ``Y <= 0`` makes the ratio meaningless: such images give NaN). NaN maps give NaN.

    Args:
        model, x, target, chunk_size, output, keep_mode: as :func:`deletion_curve`.
        maps: soft masks [B, *S] in [0, 1] at the inputs' size (any rank, as :func:`deletion_curve`).
        softmax: use softmax probabilities (default) or raw scores.

    Returns:
        Float tensor [B] on ``x``'s device.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import average_drop
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.sum(dim=(1, 2, 3))[:, None]
        >>> x = torch.ones(1, 1, 2, 2)
        >>> average_drop(Sum(), x, torch.tensor([[[1.0, 0.5], [0.0, 0.5]]]), softmax=False)
        tensor([0.5000])
    """
    full, masked = _masked_confidence(
        model, x, maps, target, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode
    )
    drop = (full - masked).clamp(min=0) / full
    return torch.where(full > 0, drop, torch.full_like(drop, float("nan")))


def increase_in_confidence(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    softmax: bool = True,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
) -> Tensor:
    """Whether showing only the map raises the target's confidence (Chattopadhay et al. 2018).

    Per image 1.0 where the score on ``x * map`` is strictly higher than on ``x``, else
    0.0 (NaN for NaN maps); the paper's "Increase in Confidence %" is
    ``100 * values.mean()``, higher is better. Arguments as :func:`average_drop`.

    Returns:
        Float tensor [B] of 0.0 / 1.0 (NaN for NaN maps) on ``x``'s device.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import increase_in_confidence
        >>> class Contrast(nn.Module):  # score: left column minus right column
        ...     def forward(self, x):
        ...         return (x[..., 0] - x[..., 1]).sum(dim=(1, 2))[:, None]
        >>> x = torch.ones(2, 1, 1, 2)
        >>> maps = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
        >>> increase_in_confidence(Contrast(), x, maps, softmax=False)
        tensor([1., 0.])
    """
    full, masked = _masked_confidence(
        model, x, maps, target, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode
    )
    rise = (masked > full).to(full.dtype)
    return torch.where(torch.isnan(masked), masked, rise)
