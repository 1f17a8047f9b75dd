"""torchcam 0.5.0's gradient-based extractors on camkit: GradCAM, GradCAMpp, SmoothGradCAMpp, XGradCAM, LayerCAM."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....methods.base import CAMExplainer
from .core import _CAM

__all__ = ["GradCAM", "GradCAMpp", "LayerCAM", "SmoothGradCAMpp", "XGradCAM"]


class _GradCAM(_CAM):
    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, input_shape, **kwargs)
        self._score_used = True


class GradCAM(_GradCAM):
    """Grad-CAM on :class:`camkit.GradCAM`: channels weighted by their mean gradient."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAM


class GradCAMpp(_GradCAM):
    """Grad-CAM++ on :class:`camkit.GradCAMPlusPlus` (the paper's closed-form alpha; torchcam's differs)."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAMPlusPlus


class XGradCAM(_GradCAM):
    """XGrad-CAM on :class:`camkit.XGradCAM`."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.XGradCAM


class LayerCAM(_GradCAM):
    """LayerCAM on :class:`camkit.LayerCAM`; :meth:`fuse_cams` scales each map by ``tanh(2 m)`` first (eq. 9)."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.LayerCAM

    @staticmethod
    def _scale_cams(cams: list[Tensor], gamma: float = 2.0) -> list[Tensor]:
        return [torch.tanh(gamma * cam) for cam in cams]


class SmoothGradCAMpp(_GradCAM):
    """Smooth Grad-CAM++ on :class:`camkit.SmoothGrad` around :class:`camkit.GradCAMPlusPlus`.

    camkit averages the Grad-CAM++ maps of ``num_samples`` noisy copies of the input; the noise
    standard deviation ``std`` is absolute, as torchcam's (camkit's ``sigma`` is set to
    ``std`` over the batch's value range).

    Args:
        model: input model
        target_layer: the target layer(s)
        num_samples: noisy copies of the input
        std: standard deviation of the noise added to the input
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAMPlusPlus

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        num_samples: int = 4,
        std: float = 0.3,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, input_shape, **kwargs)
        self._score_used = False
        self.num_samples = num_samples
        self.std = std

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        spread = float((x.amax() - x.amin()).clamp_min(1e-12))
        smooth = _methods.SmoothGrad(self._explainer(), samples=self.num_samples, sigma=self.std / spread)
        raw = smooth.explain(x, target).raw
        return list(raw) if isinstance(raw, tuple) else [raw]

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}, num_samples={self.num_samples}, std={self.std}"
