"""Score-CAM variants' pure pieces: channel masks normalised at the layer, integration steps.

SS-CAM and IS-CAM (as torchcam 0.5.0 defines them) build their masks by min-max normalising
each channel at the layer's own resolution and only then upsampling it; the integration of
IS-CAM scales the masked input by growing coefficients. Any rank: maps are [..., *s] with one
to three spatial axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InvalidInputError
from .maps import normalize_maps, upsample_maps

__all__ = ["integration_coefficients", "score_masks"]


def score_masks(acts: Tensor, size: Sequence[int]) -> Tensor:
    """Channel masks normalised at the layer's resolution, then upsampled to the input's size.

    Each map [*s] is min-max normalised to [0, 1] (a constant map gives a zero mask) and then
    resized to ``size`` with linear interpolation (``align_corners=False``); the upsampled
    mask stays in [0, 1]. This is the order torchcam uses for Score-CAM, SS-CAM and IS-CAM;
    :func:`camkit.functional.perturbation.channel_masks` (Score-CAM's paper and
    pytorch-grad-cam) upsamples first, so its masks always reach 0 and 1 exactly.

    Args:
        acts: activation maps [..., *s] (for example [B, C, h, w]).
        size: the input's spatial size, ``(T,)``, ``(H, W)`` or ``(D, H, W)``.

    Returns:
        Masks [..., *size] in the dtype of ``acts``.

    Example:
        >>> import torch
        >>> from camkit.functional import score_masks
        >>> score_masks(torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]]]), (1, 4)).tolist()
        [[[0.0, 0.25, 0.75, 1.0]], [[0.0, 0.0, 0.0, 0.0]]]
    """
    size = tuple(int(s) for s in size)
    masks, _ = normalize_maps(acts, spatial_dims=len(size))
    return upsample_maps(masks, size)


def integration_coefficients(steps: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """IS-CAM's scales of the masked input: ``c_i = sum_{j=1..i} j / N`` for ``i = 1..N``.

    IS-CAM (Naidu et al. 2020, as torchcam 0.5.0 computes it) scores the masked input
    ``c_i * (M_k * x)`` at each of ``N = steps`` steps, the scale growing by ``i / N`` at step
    ``i``: ``c_i = i (i + 1) / (2 N)``, so the last step scales by ``(N + 1) / 2``, not 1.

    Args:
        steps: the number of steps ``N`` (at least 1).
        dtype: the floating dtype of the result.

    Returns:
        [N] coefficients.

    Example:
        >>> from camkit.functional import integration_coefficients
        >>> integration_coefficients(4).tolist()
        [0.25, 0.75, 1.5, 2.5]
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"steps must be a positive int, got {steps!r}")
    i = torch.arange(1, steps + 1, dtype=torch.float64)
    return (i * (i + 1) / (2 * steps)).to(dtype)
