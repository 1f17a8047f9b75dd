"""Pure math of pixel-space attributions: channel reduction, ReLU backward rules,
integration rules, baselines and the aggregation of noisy samples.

No hooks, no state, no model: every function maps tensors to tensors and never modifies
its inputs.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError

__all__ = [
    "aggregate_samples",
    "blur",
    "completeness_gap",
    "deconv_relu_grad",
    "filter_axes",
    "guided_relu_grad",
    "integration_points",
    "reduce_channels",
]

IntegrationRule = Literal["gausslegendre", "midpoint", "trapezoid", "left", "right"]
SmoothKind = Literal["smoothgrad", "smoothgrad_sq", "vargrad"]


_AXES = {1: "T", 2: "H, W", 3: "D, H, W"}


def _spatial_dims(spatial_dims: int) -> int:
    if isinstance(spatial_dims, bool) or spatial_dims not in _AXES:
        raise InvalidInputError(
            f"spatial_dims must be 1 (a signal), 2 (an image) or 3 (a volume or a video), got {spatial_dims!r}"
        )
    return int(spatial_dims)


def reduce_channels(raw: Tensor, *, spatial_dims: int = 2) -> Tensor:
    """One map per input from a signed attribution: the maximum over channels of ``|raw|``.

    Args:
        raw: attribution [..., C, *S] with ``spatial_dims`` trailing spatial axes S (any leading
            dimensions, e.g. [B, C, T], [B, C, H, W], [B, K, C, D, H, W]).
        spatial_dims: 1 for signals, 2 for images (the default), 3 for volumes and videos.

    Returns:
        [..., *S], non-negative (Simonyan et al. 2014's rule for colour images).

    Example:
        >>> import torch
        >>> from camkit.functional import reduce_channels
        >>> reduce_channels(torch.tensor([[[[1.0, -2.0]], [[-3.0, 0.5]]]]))
        tensor([[[3., 2.]]])
        >>> reduce_channels(torch.tensor([[[1.0, -2.0], [-3.0, 0.5]]]), spatial_dims=1)  # [B, C, T]
        tensor([[3., 2.]])
    """
    n = _spatial_dims(spatial_dims)
    if raw.dim() < n + 1:
        raise InvalidInputError(f"attributions must be at least [C, {_AXES[n]}], got shape {list(raw.shape)}")
    return raw.abs().amax(dim=-(n + 1))


def guided_relu_grad(grad_output: Tensor, output: Tensor) -> Tensor:
    """Guided backpropagation's ReLU rule (Springenberg et al. 2015).

    Only positive gradients pass, and only where the ReLU was active:
    ``grad_in = max(grad_out, 0) * [output > 0]``.

    Example:
        >>> import torch
        >>> from camkit.functional import guided_relu_grad
        >>> guided_relu_grad(torch.tensor([1.0, -1.0, 2.0]), torch.tensor([0.5, 0.5, 0.0]))
        tensor([1., 0., 0.])
    """
    # ReLU's own backward (where the output is positive), then the sign rule in place: one new buffer.
    return torch.ops.aten.threshold_backward(grad_output, output, 0).clamp_min_(0)


def deconv_relu_grad(grad_output: Tensor) -> Tensor:
    """The DeconvNet ReLU rule (Zeiler & Fergus 2014): ``grad_in = max(grad_out, 0)``.

    The forward activation pattern is ignored.

    Example:
        >>> import torch
        >>> from camkit.functional import deconv_relu_grad
        >>> deconv_relu_grad(torch.tensor([1.0, -1.0, 2.0]))
        tensor([1., 0., 2.])
    """
    return grad_output.clamp_min(0)


def integration_points(
    steps: int, rule: IntegrationRule = "gausslegendre", *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Nodes ``alpha`` in [0, 1] and weights (summing to 1) for integrating over [0, 1].

    Args:
        steps: number of nodes (>= 1; >= 2 for ``"trapezoid"``).
        rule: ``"gausslegendre"`` (exact for polynomials of degree < 2*steps),
            ``"midpoint"`` (nodes (i + 0.5) / steps, equal weights), ``"trapezoid"``
            (nodes i / (steps - 1), end points weighted half), ``"left"`` or ``"right"`` (nodes
            i / steps or (i + 1) / steps, equal weights: the left and right Riemann sums).

    Returns:
        ``(alphas, weights)``, both [steps].

    Example:
        >>> from camkit.functional import integration_points
        >>> alphas, weights = integration_points(4, "midpoint")
        >>> alphas.tolist(), weights.tolist()
        ([0.125, 0.375, 0.625, 0.875], [0.25, 0.25, 0.25, 0.25])
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < (2 if rule == "trapezoid" else 1):
        raise InvalidInputError(f"steps must be an int >= {2 if rule == 'trapezoid' else 1} for rule {rule!r}, got {steps!r}")
    if rule == "gausslegendre":
        nodes, w = np.polynomial.legendre.leggauss(steps)
        alphas = torch.from_numpy((nodes + 1.0) / 2.0)
        weights = torch.from_numpy(w / 2.0)
    elif rule == "midpoint":
        alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
        weights = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    elif rule in ("left", "right"):
        alphas = (torch.arange(steps, dtype=torch.float64) + (rule == "right")) / steps
        weights = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    elif rule == "trapezoid":
        alphas = torch.linspace(0.0, 1.0, steps, dtype=torch.float64)
        weights = torch.full((steps,), 1.0 / (steps - 1), dtype=torch.float64)
        weights[0] = weights[-1] = 0.5 / (steps - 1)
    else:
        raise InvalidInputError(f"rule must be 'gausslegendre', 'midpoint', 'trapezoid', 'left' or 'right', got {rule!r}")
    # non_blocking: a host-to-device copy that does not make the host wait for the device.
    return (
        alphas.to(dtype=dtype).to(device=device, non_blocking=True),
        weights.to(dtype=dtype).to(device=device, non_blocking=True),
    )


@functools.lru_cache(maxsize=16)
def _gaussian_kernel(sigma: float, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Cached per device: built on the host, it reaches a device once, not on every call.
    radius = size // 2
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    return (kernel / kernel.sum()).to(dtype=dtype).to(device=device, non_blocking=True)


_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def filter_axes(flat: Tensor, kernel: Tensor, mode: str = "replicate") -> Tensor:
    """Run one odd 1-D kernel along every spatial axis of ``flat`` [N, 1, *S], the last axis first.

    Each axis is padded by ``len(kernel) // 2`` with ``mode`` (``F.pad``'s: ``"replicate"``,
    ``"reflect"``...) before its pass, so the result has ``flat``'s shape: a separable filter
    for signals, images and volumes alike. The Gaussian blurs of camkit (:func:`blur`, the
    deletion metrics' blur baseline, SESS's map smoothing) all run through it.

    Example:
        >>> import torch
        >>> from camkit.functional.attribution import filter_axes
        >>> filter_axes(torch.tensor([[[0.0, 3.0, 0.0]]]), torch.tensor([1.0, 1.0, 1.0]) / 3)
        tensor([[[1., 1., 1.]]])
    """
    n = flat.dim() - 2
    half = kernel.numel() // 2
    for axis in range(n - 1, -1, -1):  # the last spatial axis first
        pad = [0] * (2 * n)
        pad[2 * (n - 1 - axis)] = pad[2 * (n - 1 - axis) + 1] = half  # F.pad lists the last axis first
        shape = [1] * n
        shape[axis] = -1
        flat = _CONVS[n](F.pad(flat, tuple(pad), mode=mode), kernel.view(1, 1, *shape))
    return flat


def blur(x: Tensor, sigma: float) -> Tensor:
    """Gaussian blur of a batch [B, C, *S] along every spatial axis; ``x`` is unchanged.

    ``x`` is a signal [B, C, T], an image [B, C, H, W] or a volume or video [B, C, D, H, W].
    The blur is separable: one 1-D Gaussian per spatial axis, from the last axis to the first,
    edges replicated (for a video the time axis is blurred too). The kernel spans
    ``ceil(3 * sigma)`` samples on each side. ``sigma <= 0`` returns a copy.

    Example:
        >>> import torch
        >>> from camkit.functional import blur
        >>> out = blur(torch.tensor([[[[0.0, 0.0, 3.0, 0.0, 0.0]]]]), 1.0)
        >>> [round(v, 3) for v in out[0, 0, 0].tolist()]
        [0.162, 0.726, 1.197, 0.726, 0.162]
        >>> [round(v, 3) for v in blur(torch.tensor([[[0.0, 0.0, 3.0, 0.0, 0.0]]]), 1.0)[0, 0].tolist()]  # [B, C, T]
        [0.162, 0.726, 1.197, 0.726, 0.162]
    """
    if x.dim() not in (3, 4, 5):
        raise InvalidInputError(
            "blur expects a batch [B, C, T] (a signal), [B, C, H, W] (an image) or [B, C, D, H, W] (a volume or "
            f"a video), got shape {list(x.shape)}"
        )
    if not math.isfinite(sigma):
        raise InvalidInputError(f"sigma must be a finite number, got {sigma!r}")
    if sigma <= 0:
        return x.clone()
    radius = max(1, math.ceil(3.0 * sigma))
    kernel = _gaussian_kernel(sigma, 2 * radius + 1, x.dtype, x.device)
    b, c, *spatial = x.shape
    return filter_axes(x.reshape(b * c, 1, *spatial), kernel).reshape(b, c, *spatial)


def completeness_gap(attribution: Tensor, score: Tensor, baseline_score: Tensor, *, spatial_dims: int = 2) -> Tensor:
    """Integrated gradients' completeness gap ``sum(attr) - (score - baseline_score)``.

    Args:
        attribution: [..., C, *S] with ``spatial_dims`` spatial axes (e.g. [B, C, T],
            [B, C, H, W] or [B, K, C, D, H, W]); summed over C and S.
        score: the matching scores [...] at the input.
        baseline_score: the matching scores [...] at the baseline.
        spatial_dims: 1 for signals, 2 for images (the default), 3 for volumes and videos.

    Returns:
        [...]: zero for exact integration.

    Example:
        >>> import torch
        >>> from camkit.functional import completeness_gap
        >>> completeness_gap(torch.ones(1, 1, 2, 2), torch.tensor([5.0]), torch.tensor([1.5]))
        tensor([0.5000])
        >>> completeness_gap(torch.ones(2, 1, 3), torch.tensor([5.0, 3.0]), torch.tensor([1.5, 0.0]), spatial_dims=1)
        tensor([-0.5000,  0.0000])
    """
    n = _spatial_dims(spatial_dims)
    if attribution.dim() < n + 1:
        raise InvalidInputError(f"attributions must be at least [C, {_AXES[n]}], got shape {list(attribution.shape)}")
    return attribution.sum(dim=tuple(range(-(n + 1), 0))) - (score - baseline_score)


def aggregate_samples(total: Tensor, total_sq: Tensor, count: int, kind: SmoothKind) -> Tensor:
    """Combine the running sum and sum of squares of ``count`` noisy samples.

    ``"smoothgrad"`` is the mean, ``"smoothgrad_sq"`` the mean of squares and ``"vargrad"``
    the (population) variance ``mean(r**2) - mean(r)**2``, clamped at zero.

    Example:
        >>> import torch
        >>> from camkit.functional import aggregate_samples
        >>> r = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # two samples of a 2-value map
        >>> [aggregate_samples(r.sum(0), (r * r).sum(0), 2, k).tolist() for k in ("smoothgrad", "smoothgrad_sq", "vargrad")]
        [[2.0, 4.0], [5.0, 20.0], [1.0, 4.0]]
    """
    if count < 1:
        raise InvalidInputError(f"count must be >= 1, got {count}")
    mean = total / count
    if kind == "smoothgrad":
        return mean
    if kind == "smoothgrad_sq":
        return total_sq / count
    if kind == "vargrad":
        return (total_sq / count - mean * mean).clamp_min(0)
    raise InvalidInputError(f"kind must be 'smoothgrad', 'smoothgrad_sq' or 'vargrad', got {kind!r}")
