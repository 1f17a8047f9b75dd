"""Perturbation methods that need no layer: Occlusion and RISE, batched in chunks."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..explanation import Explanation
from ..functional.perturbation import occlusion_map, rise_masks, window_indicators
from ..registry import register_method
from ..targets.classes import OutputSelector, Target
from ._forward import (
    RowScorer,
    check_positive,
    expand_targets,
    forward_scores,
    make_explanation,
    masked_forwards,
    refuse_extra_inputs,
)
from .base import Explainer

__all__ = ["RISE", "Occlusion"]


def _pair(name: str, value: int | tuple[int, int]) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
        raise InvalidInputError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return pair[0], pair[1]


@register_method("occlusion")
class Occlusion(Explainer):
    """Occlusion sensitivity (Zeiler & Fergus 2014): the score lost when a window is covered.

    A ``window`` is slid over the input with ``stride`` (plus one window flush with the far
    edge when the stride does not reach it, so every pixel is covered); the covered pixels
    are set to ``baseline`` in every channel. A pixel's value is the mean, over the windows
    covering it, of ``y - y_occluded`` with ``y`` the target score (the model's output,
    before softmax, or a callable target's value). The raw map is signed at the input's
    resolution; the output contract min-max normalises it.

    Args:
        model: the model to explain.
        window: window size in pixels, an int or ``(height, width)``.
        stride: step between windows; ``None`` means half the window (at least 1).
        baseline: the value written into covered pixels.
        batch_size: occluded inputs per forward pass.
        progress: show a tqdm progress bar.
        output, keep_mode: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.Occlusion(net, window=4, stride=2)(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
    """

    cost: ClassVar[str] = "1 forward per window position (729 at 224 px, window 16, stride 8)"
    use_when: ClassVar[str] = (
        "You want a model-agnostic, easily explained map and can afford hundreds of forwards."
    )

    needs_grad = False

    def __init__(
        self,
        model: nn.Module,
        window: int | tuple[int, int] = 16,
        stride: int | tuple[int, int] | None = None,
        *,
        baseline: float = 0.0,
        batch_size: int = 32,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode)
        self.window = _pair("window", window)
        self.stride = _pair("stride", stride) if stride is not None else tuple(max(1, w // 2) for w in self.window)
        self.baseline = float(baseline)
        self.batch_size = check_positive("batch_size", batch_size)
        self.progress = progress
        self._on_device: dict[tuple[object, ...], tuple[Tensor, Tensor]] = {}

    def _indicators(self, height: int, width: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """Row and column window indicators on ``x``'s device, built on the host and copied once."""
        key = (height, width, str(x.device), x.dtype, self.window, self.stride)
        if key not in self._on_device:
            self._on_device.clear()
            self._on_device[key] = tuple(  # type: ignore[assignment]
                window_indicators(n, w, s).to(x.dtype).to(x.device, non_blocking=True)
                for n, w, s in ((height, self.window[0], self.stride[0]), (width, self.window[1], self.stride[1]))
            )
        return self._on_device[key]

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        refuse_extra_inputs(self)
        classes, scores = forward_scores(self, x, target)
        height, width = x.shape[-2:]
        rows, cols = self._indicators(height, width, x)
        b, pr, pc = x.shape[0], rows.shape[0], cols.shape[0]
        total = b * pr * pc
        flat = torch.arange(total, device=x.device)
        b_idx, r_idx, c_idx = flat // (pr * pc), flat // pc % pr, flat % pc
        scorer = RowScorer(target, expand_targets(classes), softmax=False, output=self.output)
        base = (scores if scores.dim() == 2 else scores[:, None]).float()
        occluded = torch.empty(total, base.shape[1], device=x.device)

        def uncovered(part: slice) -> Tensor:
            return 1 - rows[r_idx[part]][:, :, None] * cols[c_idx[part]][:, None, :]  # [n, H, W]

        for part, _, values in masked_forwards(
            self, x, b_idx, uncovered, scorer, batch_size=self.batch_size, baseline=self.baseline,
            progress=self.progress, desc="Occlusion",
        ):
            occluded[part] = values
        drops = (base[b_idx] - occluded).reshape(b, pr, pc, -1).movedim(-1, 1)  # [B, K, Pr, Pc]
        raw = occlusion_map(drops, rows, cols)
        raw = raw if scores.dim() == 2 else raw[:, 0]
        return make_explanation(self.key, [raw], x, classes, scores)


@register_method("rise")
class RISE(Explainer):
    """RISE (Petsiuk et al. 2018): the score-weighted average of random smooth masks.

    ``masks`` binary ``grid x grid`` grids (each cell kept with probability ``p``) are
    upsampled bilinearly, randomly shifted and cropped to the input size (see
    :func:`~camkit.functional.perturbation.rise_masks`); the map is
    ``sum_i s_i M_i / (masks * p)`` with ``s_i`` the softmax probability of the target for
    ``x * M_i`` (a callable target's value for callables). The masks come from a
    ``torch.Generator`` seeded with ``seed``, are the same for every sample, and do not
    depend on ``batch_size``; only ``batch_size`` of them exist at a time.

    Args:
        model: the model to explain.
        masks: number of random masks (the paper uses 4000 for ImageNet).
        seed: seed of the masks.
        grid: cells per side of the small grid.
        p: probability that a cell is kept.
        batch_size: masked inputs per forward pass.
        progress: show a tqdm progress bar.
        output, keep_mode: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.RISE(net, masks=16, seed=0, grid=4)(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
    """

    cost: ClassVar[str] = "1 forward per random mask (masks, default 4000)"
    use_when: ClassVar[str] = (
        "You need a black-box map (no gradients, no layer access) and can afford thousands of forwards."
    )

    needs_grad = False

    def __init__(
        self,
        model: nn.Module,
        masks: int = 4000,
        seed: int = 0,
        *,
        grid: int = 7,
        p: float = 0.5,
        batch_size: int = 32,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode)
        self.masks = check_positive("masks", masks)
        self.seed = int(seed)
        self.grid = check_positive("grid", grid)
        if not 0.0 < p <= 1.0:
            raise InvalidInputError(f"p must be in (0, 1], got {p}")
        self.p = float(p)
        self.batch_size = check_positive("batch_size", batch_size)
        self.progress = progress
        self._on_device: dict[tuple[object, ...], tuple[Tensor, Tensor]] = {}

    def _plan(self, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """The masks' grids [N, s, s] and shifts [N, 2], on the CPU, from the seed."""
        gen = torch.Generator().manual_seed(self.seed)
        grids = (torch.rand(self.masks, self.grid, self.grid, generator=gen) < self.p).float()
        cell = (-(-size[0] // self.grid), -(-size[1] // self.grid))
        shifts = torch.stack(
            [torch.randint(0, c, (self.masks,), generator=gen) for c in cell], dim=1
        )
        return grids, shifts

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        refuse_extra_inputs(self)
        classes, scores = forward_scores(self, x, target)
        size = (x.shape[-2], x.shape[-1])
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

        def masks_of(part: slice) -> Tensor:
            return rise_masks(grids[m_idx[part]], shifts[m_idx[part]], size)  # [n, H, W]

        for part, masks, values in masked_forwards(
            self, x, b_idx, masks_of, scorer, batch_size=self.batch_size, progress=self.progress, desc="RISE"
        ):
            raw.index_add_(0, b_idx[part], values[:, :, None, None] * masks[:, None].float())
        raw = raw / (self.masks * self.p)
        return make_explanation(self.key, [raw if scores.dim() == 2 else raw[:, 0]], x, classes, scores)
