"""The Grad-CAM family: Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM, LayerCAM.

Every method here takes a signal [B, C, T], an image [B, C, H, W] or a volume or video
[B, C, D, H, W]: the layer's activations and gradients are [B, C, *s] with as many spatial
axes, channel weights are reduced over all of them, ``raw`` is [B, *s] and ``maps`` are
upsampled to the input's size (linear, bilinear or trilinear).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ... import functional as CF
from .._core.cam_base import GradientCAM
from ..registry import register_method

__all__ = ["GradCAM", "GradCAMPlusPlus", "HiResCAM", "LayerCAM", "XGradCAM"]


def _per_channel(weights: Tensor, acts: Tensor) -> Tensor:
    """Channel weights [B, C] times activations [B, C, *s]: [B, C, *s], for any number of spatial axes."""
    return weights.view(*weights.shape, *(1,) * (acts.dim() - 2)) * acts


@register_method("gradcam")
class GradCAM(GradientCAM):
    """Grad-CAM (Selvaraju et al. 2017): channels weighted by their mean gradient.

    ``map = relu(sum_c mean_s(dS/dA_c) * A_c)``, the mean over every spatial axis ``s`` of the
    layer's grid (``t``; ``h, w``; or ``d, h, w``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> maps = camkit.GradCAM(net, "1")(torch.rand(2, 3, 8, 8))
        >>> tuple(maps.shape), bool(maps.min() >= 0), bool(maps.max() <= 1)
        ((2, 8, 8), True, True)
        >>> ecg = nn.Sequential(nn.Conv1d(1, 4, 5, stride=2, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.GradCAM(ecg, "0").explain(torch.rand(2, 1, 64))  # signals [B, C, T]
        >>> tuple(e.raw.shape), tuple(e.maps.shape)  # raw at the layer's 32 steps, maps at the input's 64
        ((2, 32), (2, 64))
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "Start here: the standard class-specific map, at the target layer's resolution."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        if self.eigen_smooth:
            return super().raw_map(acts, grads)
        return CF.gradcam(acts, grads)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return _per_channel(CF.gradcam_weights(grads), acts)


@register_method("gradcam++")
class GradCAMPlusPlus(GradientCAM):
    """Grad-CAM++ (Chattopadhay et al. 2018), with the closed-form alpha of eq. 19.

    See :func:`camkit.functional.gradcampp_weights`: no epsilon, so maps do not move
    with the scale of the gradients.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(2, 3, 8, 8)
        >>> maps = camkit.GradCAMPlusPlus(net, "1")(x, target=1)
        >>> tuple(maps.shape), bool(maps.min() >= 0), bool(maps.max() <= 1)
        ((2, 8, 8), True, True)
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "Several instances of the class are in the image and Grad-CAM highlights only one."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        if self.eigen_smooth:
            return super().raw_map(acts, grads)
        return CF.weighted_sum(CF.gradcampp_weights(acts, grads), acts)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return _per_channel(CF.gradcampp_weights(acts, grads), acts)


@register_method("xgradcam")
class XGradCAM(GradientCAM):
    """XGrad-CAM (Fu et al. 2020): gradients weighted by each channel's normalised activation.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> camkit.XGradCAM(net, "1")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "You want Grad-CAM with channel weights that satisfy XGrad-CAM's sensitivity and conservation axioms."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        if self.eigen_smooth:
            return super().raw_map(acts, grads)
        return CF.weighted_sum(CF.xgradcam_weights(acts, grads), acts)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return _per_channel(CF.xgradcam_weights(acts, grads), acts)


@register_method("hirescam")
class HiResCAM(GradientCAM):
    """HiResCAM (Draelos & Carin 2020): the element-wise product of gradients and activations, summed over channels.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.HiResCAM(net, "1").explain(torch.rand(2, 3, 8, 8))
        >>> tuple(e.raw.shape), tuple(e.maps.shape)  # raw at the layer's size, maps at the input's
        ((2, 8, 8), (2, 8, 8))
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "You want each position's own evidence (exact for pooled linear heads) rather than averaged gradients."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        if self.eigen_smooth:
            return super().raw_map(acts, grads)
        return CF.hirescam(acts, grads)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return grads * acts


@register_method("layercam")
class LayerCAM(GradientCAM):
    """LayerCAM (Jiang et al. 2021): positive gradients times activations, summed over channels.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> maps = camkit.LayerCAM(net, ["0", "1"])(torch.rand(2, 3, 8, 8))  # two layers fused
        >>> maps.shape
        torch.Size([2, 8, 8])
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "You want finer maps from earlier layers, or several layers fused."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        if self.eigen_smooth:
            return super().raw_map(acts, grads)
        return CF.layercam(acts, grads)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        return grads.clamp_min(0) * acts
