"""pytorch-grad-cam's CAM classes, each on the camkit explainer of the same method.

The module paths the original uses (``pytorch_grad_cam.grad_cam``, ``.xgrad_cam``...) re-export
these classes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from ... import functional as CF
from ... import methods as _m
from ...errors import CamkitWarning
from ...methods import Explainer
from ._support import dress_maps, to_numpy
from .base_cam import BaseCAM

__all__ = [
    "FEM",
    "KPCA_CAM",
    "AblationCAM",
    "EigenCAM",
    "EigenGradCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "RandomCAM",
    "ScoreCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "XGradCAM",
]


def _weights(fn: Callable[..., Tensor], *arrays: np.ndarray) -> np.ndarray:
    """A camkit weight function on numpy activations/gradients [B, C, *s]: numpy [B, C]."""
    return fn(*(torch.as_tensor(np.asarray(a, dtype=np.float32)) for a in arrays)).numpy()


class _Simple(BaseCAM):
    """A CAM that is one camkit explainer class taking ``(model, layers, eigen_smooth=...)``."""

    camkit_class: ClassVar[type[Explainer]]

    def __init__(self, model: nn.Module, target_layers: Any = None, reshape_transform: Any = None, **legacy: Any):
        super().__init__(model, target_layers, reshape_transform, **legacy)

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return self.camkit_class(self.model, self.target_layers, eigen_smooth=eigen_smooth)  # type: ignore[call-arg,arg-type]


class GradCAM(_Simple):
    """Grad-CAM on :class:`camkit.GradCAM`; ``get_cam_weights`` is the mean gradient per channel (numpy)."""

    camkit_class = _m.GradCAM

    def get_cam_weights(self, input_tensor: Any, target_layer: Any, targets: Any, activations: Any, grads: Any) -> Any:
        return _weights(CF.gradcam_weights, grads)


class GradCAMPlusPlus(_Simple):
    """Grad-CAM++ on :class:`camkit.GradCAMPlusPlus` (the closed-form alpha, without the original's 1e-6)."""

    camkit_class = _m.GradCAMPlusPlus

    def get_cam_weights(self, input_tensor: Any, target_layers: Any, targets: Any, activations: Any, grads: Any) -> Any:
        return _weights(CF.gradcampp_weights, activations, grads)


class XGradCAM(_Simple):
    """XGrad-CAM on :class:`camkit.XGradCAM` (without the original's 1e-7)."""

    camkit_class = _m.XGradCAM

    def get_cam_weights(self, input_tensor: Any, target_layer: Any, targets: Any, activations: Any, grads: Any) -> Any:
        return _weights(CF.xgradcam_weights, activations, grads)


class HiResCAM(_Simple):
    """HiResCAM on :class:`camkit.HiResCAM`."""

    camkit_class = _m.HiResCAM


class GradCAMElementWise(_Simple):
    """Grad-CAM element-wise on :class:`camkit.GradCAMElementWise`."""

    camkit_class = _m.GradCAMElementWise

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.GradCAMElementWise(self.model, self.target_layers)  # its map is no channel sum of weights


class LayerCAM(_Simple):
    """LayerCAM on :class:`camkit.LayerCAM`."""

    camkit_class = _m.LayerCAM


class EigenGradCAM(_Simple):
    """Eigen-Grad-CAM on :class:`camkit.EigenGradCAM` (its sign fixed by the activations)."""

    camkit_class = _m.EigenGradCAM
    ignores_eigen_smooth = True

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.EigenGradCAM(self.model, self.target_layers)


class SegEigenCAM(_Simple):
    """Seg-Eigen-CAM on :class:`camkit.SegEigenCAM`: the first component of ``|dS/dA| * A``, sign by its larger extreme."""

    camkit_class = _m.SegEigenCAM

    ignores_eigen_smooth = True

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.SegEigenCAM(self.model, self.target_layers)


class ShapleyCAM(_Simple):
    """ShapleyCAM on :class:`camkit.ShapleyCAM`."""

    camkit_class = _m.ShapleyCAM


class EigenCAM(_Simple):
    """Eigen-CAM on :class:`camkit.EigenCAM`; ``eigen_smooth`` changes nothing (it is the projection)."""

    camkit_class = _m.EigenCAM

    uses_gradients_default = False
    ignores_eigen_smooth = True

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.EigenCAM(self.model, self.target_layers)


class KPCA_CAM(_Simple):
    """Kernel PCA CAM on :class:`camkit.KPCACAM` (``kernel``, ``gamma`` as in the original)."""

    camkit_class = _m.KPCACAM

    uses_gradients_default = False
    ignores_eigen_smooth = True

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Any = None,
        kernel: str = "sigmoid",
        gamma: float | None = None,
        **legacy: Any,
    ) -> None:
        super().__init__(model, target_layers, reshape_transform, **legacy)
        self.kernel = kernel
        self.gamma = gamma

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.KPCACAM(self.model, self.target_layers, kernel=self.kernel, gamma=self.gamma)  # type: ignore[arg-type]


class FEM(_Simple):
    """FEM on :class:`camkit.FEM` (``k``: the threshold is mean + k std)."""

    camkit_class = _m.FEM

    uses_gradients_default = False
    ignores_eigen_smooth = True

    def __init__(
        self, model: nn.Module, target_layers: Any = None, reshape_transform: Any = None, k: float = 2, **legacy: Any
    ) -> None:
        super().__init__(model, target_layers, reshape_transform, **legacy)
        self.k = k

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.FEM(self.model, self.target_layers, k=float(self.k))


class RandomCAM(_Simple):
    """Random channel weights in U(-1, 1) on :class:`camkit.RandomCAM`, a fresh draw each call."""

    camkit_class = _m.RandomCAM

    ignores_eigen_smooth = True

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.RandomCAM(self.model, self.target_layers, seed=int(np.random.randint(0, 2**31 - 1)))

    def get_cam_weights(self, input_tensor: Any, target_layer: Any, targets: Any, activations: Any, grads: Any) -> Any:
        return np.random.uniform(-1, 1, size=(grads.shape[0], grads.shape[1]))


class ScoreCAM(_Simple):
    """Score-CAM on :class:`camkit.ScoreCAM`; the ``batch_size`` attribute sets the masked images per forward."""

    camkit_class = _m.ScoreCAM

    uses_gradients_default = False

    def __init__(self, model: nn.Module, target_layers: Any = None, reshape_transform: Any = None, **legacy: Any):
        super().__init__(model, target_layers, reshape_transform, **legacy)
        self.batch_size = 16

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.ScoreCAM(self.model, self.target_layers, batch_size=int(self.batch_size), eigen_smooth=eigen_smooth)


class AblationCAM(_Simple):
    """Ablation-CAM on :class:`camkit.AblationCAM`, which zeroes each channel through a hook.

    ``ablation_layer`` is accepted and not needed (camkit ablates channels of tokens and of
    detector features itself); ``ratio_channels_to_ablate`` below 1 is ignored with a warning:
    every channel is ablated, so no channel keeps the original score by default.
    """

    camkit_class = _m.AblationCAM

    uses_gradients_default = False

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Any = None,
        ablation_layer: Any = None,
        batch_size: int = 32,
        ratio_channels_to_ablate: float = 1.0,
        **legacy: Any,
    ) -> None:
        super().__init__(model, target_layers, reshape_transform, **legacy)
        self.batch_size = batch_size
        self.ablation_layer = ablation_layer
        self.ratio_channels_to_ablate = ratio_channels_to_ablate
        if ratio_channels_to_ablate < 1.0:
            warnings.warn(
                "ratio_channels_to_ablate < 1 is ignored: camkit ablates every channel, which is exact "
                "(the original gives the skipped channels the unablated score). Use a larger batch_size to go faster.",
                CamkitWarning,
                stacklevel=2,
            )

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.AblationCAM(
            self.model, self.target_layers, batch_size=int(self.batch_size), eigen_smooth=eigen_smooth
        )


class FullGrad(_Simple):
    """FullGrad on :class:`camkit.FullGrad`: the input gradient and every bias gradient; ``target_layers`` is ignored.

    Its per-channel normalisation has no epsilon, so the map does not change with the scale of the scores.
    """

    ignores_eigen_smooth = True

    def __init__(self, model: nn.Module, target_layers: Any = None, reshape_transform: Any = None, **legacy: Any):
        super().__init__(model, target_layers, reshape_transform, compute_input_gradient=True, **legacy)
        if self.target_layers:
            warnings.warn(
                "target_layers is ignored by FullGrad: it reads the gradients of every layer with a bias.",
                CamkitWarning,
                stacklevel=2,
            )

    def explainer(self, eigen_smooth: bool) -> Explainer:
        return _m.FullGrad(self.model)

    def finish(self, explanation: Any, x: Tensor) -> np.ndarray:
        return (
            dress_maps(explanation.maps, tuple(x.shape[2:]))
            if explanation.maps.dim() > 1
            else to_numpy(explanation.maps)
        )
