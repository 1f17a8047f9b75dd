"""Eigen-CAM, Eigen-Grad-CAM and Seg-Eigen-CAM: the first principal component of a layer's activations."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from ..._internal import syncs as _syncs
from ...functional.perturbation import eigen_projection
from ...targets.classes import Target
from .._core.cam_base import GradientCAM
from .._core.forward import Captured, ForwardCAM
from ..registry import register_method

__all__ = ["EigenCAM", "EigenGradCAM", "SegEigenCAM"]


@register_method("eigencam")
class EigenCAM(ForwardCAM):
    """Eigen-CAM (Muhammad & Yeasin 2020): activations projected on their first principal component.

    One forward pass without autograd; a batched SVD (on a GPU, the same component from
    matrix products, which need no sync: see :func:`~camkit.functional.perturbation.eigen_projection`); the sign of
    the component is fixed so that the map correlates positively with the channel-summed
    activations (see :func:`camkit.functional.perturbation.eigen_projection`), then the ReLU,
    as in pytorch-grad-cam and every other camkit CAM (only the positive side of the
    component is shown). The map does not depend on the target: with [B, K] targets the same
    map is returned K times (the target still selects ``scores``). ``eigen_smooth`` has no
    meaning here and is refused. Any rank: the positions of a [B, C, t], [B, C, h, w] or
    [B, C, d, h, w] layer are the points of the principal component analysis.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.EigenCAM(net, "1")(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd) + a batched SVD"
    use_when: ClassVar[str] = (
        "You want the layer's dominant pattern without gradients or a target (the same map for every class)."
    )

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        self._refuse_eigen_smooth()
        raw = eigen_projection(act.float(), exact=_syncs.reads_are_free(act)).clamp_min(0)
        if cap.multi:
            return raw[:, None].expand(-1, cap.scores.shape[1], *raw.shape[1:]).contiguous()
        return raw


@register_method("eigengradcam")
class EigenGradCAM(GradientCAM):
    """Eigen-Grad-CAM: the first principal component of activations times gradients.

    Like :class:`GradCAM` it costs one forward and a backward through the layers after the
    target layer; the map is the ReLU of :func:`~camkit.functional.perturbation.eigen_projection`
    of ``A * dS/dA``, so it depends on the target (``eigen_smooth`` changes nothing).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.EigenGradCAM(net, "1")(torch.rand(2, 3, 8, 8)).shape)
        (2, 8, 8)
    """

    cost: ClassVar[str] = "1 forward + 1 backward after the target layer + a batched SVD"
    use_when: ClassVar[str] = (
        "You want a class-specific, less noisy principal-component view of activations times gradients."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        return eigen_projection(acts * grads, exact=_syncs.reads_are_free(acts)).clamp_min(0)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return acts * grads


@register_method("segeigencam")
class SegEigenCAM(GradientCAM):
    """Seg-Eigen-CAM (Chung & Ying 2025): the first principal component of ``|dS/dA| * A``.

    Made for segmentation models (give a :mod:`camkit.targets.tasks` segmentation target),
    it works on any target: each position's activations are weighted by the magnitude of
    their gradient (eq. 10: negative gradients count too, unlike Grad-CAM), projected on
    their first principal component, and the sign of the component is fixed so that the
    larger extreme is positive (eq. 13: flipped when ``|min| > |max|``; see
    :func:`~camkit.functional.perturbation.eigen_projection` with ``sign="extremes"``); then
    the ReLU, as in pytorch-grad-cam 1.5.7. Any rank. ``eigen_smooth`` has no meaning here
    (the map is a principal component already) and is refused.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.SegEigenCAM(net, "1")(torch.rand(2, 3, 8, 8), target=1).shape)
        (2, 8, 8)
    """

    cost: ClassVar[str] = "1 forward + 1 backward after the target layer + a batched SVD"
    use_when: ClassVar[str] = (
        "You explain a segmentation model and want each position's gradient magnitude kept (Seg-Eigen-CAM)."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        weighted = grads.abs() * acts
        return eigen_projection(weighted, exact=_syncs.reads_are_free(acts), sign="extremes").clamp_min(0)
