"""Perturbation methods that need no layer: Occlusion and RISE, batched in chunks.

Both serve every rank: a signal [B, C, T], an image [B, C, H, W] and a volume or clip
[B, C, D, H, W]; windows, strides and grids are given per spatial axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.perturbation import default_window, occlusion_map, rise_masks, window_indicators
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.explainer import Explainer
from .._core.forward import (
    RowScorer,
    check_positive,
    expand_targets,
    forward_scores,
    make_explanation,
    masked_forwards,
)
from ..registry import register_method
from ._axes import PerAxis, check_fits, check_per_axis, per_axis

__all__ = ["RISE", "Occlusion"]


@register_method("occlusion")
class Occlusion(Explainer):
    """Occlusion sensitivity (Zeiler & Fergus 2014): the score lost when a window is covered.

    A ``window`` is slid over the input with ``stride`` on every spatial axis (plus one
    window flush with the far edge when the stride does not reach it, so every position
    is covered); the covered positions are set to ``baseline`` in every channel. A
    position's value is the mean, over the windows covering it, of ``y - y_occluded`` with
    ``y`` the target score (the model's output, before softmax, or a callable target's
    value). The raw map is signed at the input's resolution, [B, *S]; the output contract
    min-max normalises it.

    Args:
        model: the model to explain.
        window: window size per spatial axis: an int (every axis) or one int per axis,
            ``(T,)``, ``(height, width)`` or ``(depth, height, width)``. ``None`` (default):
            16 x 16 on an image; ``ceil(T / 32)`` on a signal (about 63 windows); ``ceil(S / 4)``
            on each axis of a volume or clip (about 7 per axis, 343 forwards); see
            :func:`~camkit.functional.perturbation.default_window`.
        stride: step between windows, an int or one per axis; ``None`` means half the window
            (at least 1) on each axis.
        baseline: the value written into covered positions.
        batch_size: occluded inputs per forward pass.
        progress: show a tqdm progress bar.
        output, keep_mode, input_index: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.Occlusion(net, window=4, stride=2)(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
        >>> signal = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        ...                        nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.Occlusion(signal)(torch.rand(2, 1, 64)).shape)  # windows of 2 samples
        (2, 64)
    """

    cost: ClassVar[str] = "1 forward per window position (729 at 224 px, window 16, stride 8)"
    use_when: ClassVar[str] = (
        "You want a model-agnostic, easily explained map and can afford hundreds of forwards."
    )

    needs_grad = False
    reruns_rows = True

    def __init__(
        self,
        model: nn.Module,
        window: PerAxis | None = None,
        stride: PerAxis | None = None,
        *,
        baseline: float = 0.0,
        batch_size: int = 32,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        self.window = check_per_axis("window", window)
        self.stride = check_per_axis("stride", stride)
        self.baseline = float(baseline)
        self.batch_size = check_positive("batch_size", batch_size)
        self.progress = progress
        self._on_device: dict[tuple[object, ...], tuple[Tensor, ...]] = {}

    def windows(self, size: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(window, stride)`` per spatial axis for an input of spatial ``size``.

        Example:
            >>> from torch import nn
            >>> import camkit
            >>> camkit.Occlusion(nn.Identity()).windows((16, 64, 64))
            ((4, 16, 16), (2, 8, 8))
        """
        window = default_window(size) if self.window is None else per_axis("window", self.window, size)
        check_fits("window", window, size)
        stride = tuple(max(1, w // 2) for w in window) if self.stride is None else per_axis("stride", self.stride, size)
        return window, stride

    def _indicators(self, x: Tensor) -> tuple[Tensor, ...]:
        """One window indicator [P_i, S_i] per spatial axis on ``x``'s device, built on the host and copied once."""
        size = tuple(x.shape[2:])
        window, stride = self.windows(size)
        key = (size, str(x.device), x.dtype, window, stride)
        if key not in self._on_device:
            self._on_device.clear()
            self._on_device[key] = tuple(
                window_indicators(n, w, s).to(x.dtype).to(x.device, non_blocking=True)
                for n, w, s in zip(size, window, stride)
            )
        return self._on_device[key]

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        indicators = self._indicators(x)  # checks the windows before any forward
        classes, scores = forward_scores(self, x, target)
        b, counts = x.shape[0], [ind.shape[0] for ind in indicators]
        total = b * torch.Size(counts).numel()
        flat = torch.arange(total, device=x.device)
        index: list[Tensor] = []  # the window position on each axis of every row, last axis fastest
        rest = flat
        for count in reversed(counts):
            index.insert(0, rest % count)
            rest = rest // count
        b_idx = rest
        n = len(counts)
        scorer = RowScorer(target, expand_targets(classes), softmax=False, output=self.output)
        base = (scores if scores.dim() == 2 else scores[:, None]).float()
        occluded = torch.empty(total, base.shape[1], device=x.device)

        def uncovered(part: slice) -> Tensor:
            terms = []  # each row's window on one axis, [n, 1, .., S_i, .., 1]
            for axis, (ind, idx) in enumerate(zip(indicators, index)):
                shape = [-1] + [1] * n
                shape[axis + 1] = ind.shape[1]
                terms.append(ind[idx[part]].view(shape))
            covered = terms[0]
            for term in terms[1:]:
                covered = covered * term
            return 1 - covered  # [n, *S]

        for part, _, values in masked_forwards(
            self, x, b_idx, uncovered, scorer, batch_size=self.batch_size, baseline=self.baseline,
            progress=self.progress, desc="Occlusion",
        ):
            occluded[part] = values
        drops = (base[b_idx] - occluded).reshape(b, *counts, -1).movedim(-1, 1)  # [B, K, *P]
        raw = occlusion_map(drops, *indicators)
        raw = raw if scores.dim() == 2 else raw[:, 0]
        return make_explanation(self.key, [raw], x, classes, scores)


@register_method("rise")
class RISE(Explainer):
    """RISE (Petsiuk et al. 2018): the score-weighted average of random smooth masks.

    ``masks`` binary grids of ``grid`` cells per spatial axis (each cell kept with
    probability ``p``) are upsampled (linear, bilinear or trilinear by rank), randomly
    shifted on every axis and cropped to the input size (see
    :func:`~camkit.functional.perturbation.rise_masks`); the map is
    ``sum_i s_i M_i / (masks * p)`` with ``s_i`` the softmax probability of the target for
    ``x * M_i`` (a callable target's value for callables), [B, *S] for an input
    [B, C, *S]. The masks come from a ``torch.Generator`` seeded with ``seed``, are the
    same for every sample, and do not depend on ``batch_size``; only ``batch_size`` of
    them exist at a time.

    Args:
        model: the model to explain.
        masks: number of random masks (the paper uses 4000 for ImageNet).
        seed: seed of the masks.
        grid: cells of the small grid per spatial axis: an int (every axis, default 7) or
            one int per axis, e.g. ``(4, 7, 7)`` for a clip of few frames.
        p: probability that a cell is kept.
        batch_size: masked inputs per forward pass.
        progress: show a tqdm progress bar.
        output, keep_mode, input_index: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.RISE(net, masks=16, seed=0, grid=4)(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
        >>> clip = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1),
        ...                      nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.RISE(clip, masks=16, grid=(2, 4, 4))(torch.rand(1, 3, 4, 8, 8)).shape)
        (1, 4, 8, 8)
    """

    cost: ClassVar[str] = "1 forward per random mask (masks, default 4000)"
    use_when: ClassVar[str] = (
        "You need a black-box map (no gradients, no layer access) and can afford thousands of forwards."
    )

    needs_grad = False
    reruns_rows = True

    def __init__(
        self,
        model: nn.Module,
        masks: int = 4000,
        seed: int = 0,
        *,
        grid: PerAxis = 7,
        p: float = 0.5,
        batch_size: int = 32,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        self.masks = check_positive("masks", masks)
        self.seed = int(seed)
        self.grid = check_per_axis("grid", grid)
        if not 0.0 < p <= 1.0:
            raise InvalidInputError(f"p must be in (0, 1], got {p}")
        self.p = float(p)
        self.batch_size = check_positive("batch_size", batch_size)
        self.progress = progress
        self._on_device: dict[tuple[object, ...], tuple[Tensor, Tensor]] = {}

    def _plan(self, size: Sequence[int]) -> tuple[Tensor, Tensor]:
        """The masks' grids [N, *g] and shifts [N, n] (one per spatial axis), on the CPU, from the seed."""
        cells = per_axis("grid", self.grid, size)  # type: ignore[arg-type]
        gen = torch.Generator().manual_seed(self.seed)
        grids = (torch.rand(self.masks, *cells, generator=gen) < self.p).float()
        cell = [-(-int(length) // g) for length, g in zip(size, cells)]
        shifts = torch.stack([torch.randint(0, c, (self.masks,), generator=gen) for c in cell], dim=1)
        return grids, shifts

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        size = tuple(x.shape[2:])
        per_axis("grid", self.grid, size)  # type: ignore[arg-type]  # checked before any forward
        classes, scores = forward_scores(self, x, target)
        key = (size, str(x.device), self.masks, self.seed, self.grid, self.p)
        if key not in self._on_device:  # the seeded plan is drawn on the host and copied once per device
            self._on_device.clear()
            grids, shifts = self._plan(size)
            self._on_device[key] = (grids.to(x.device, non_blocking=True), shifts.to(x.device, non_blocking=True))
        grids, shifts = self._on_device[key]
        b, k = x.shape[0], (scores.shape[1] if scores.dim() == 2 else 1)
        scorer = RowScorer(target, expand_targets(classes), softmax=True, output=self.output)
        raw = torch.zeros(b, k, *size, device=x.device)
        total = b * self.masks
        flat = torch.arange(total, device=x.device)
        b_idx, m_idx = flat // self.masks, flat % self.masks
        spread = (1,) * len(size)

        def masks_of(part: slice) -> Tensor:
            return rise_masks(grids[m_idx[part]], shifts[m_idx[part]], size)  # [n, *S]

        for part, masks, values in masked_forwards(
            self, x, b_idx, masks_of, scorer, batch_size=self.batch_size, progress=self.progress, desc="RISE"
        ):
            raw.index_add_(0, b_idx[part], values.view(*values.shape, *spread) * masks[:, None].float())
        raw = raw / (self.masks * self.p)
        return make_explanation(self.key, [raw if scores.dim() == 2 else raw[:, 0]], x, classes, scores)
