"""torchcam 0.5.0's gradient-based extractors on camkit: GradCAM, GradCAMpp, SmoothGradCAMpp, XGradCAM, LayerCAM,
RefineCAM, FinerCAM and LeGrad (the last two in their own modules, exported here as in torchcam)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....functional.maps import upsample_maps
from ....methods import CAMExplainer
from ._gradient_base import GradCAM, GradCAMpp, LayerCAM, XGradCAM, _GradCAM, _Wrapper
from .core import _CAM, OutputTarget
from .finer import FinerCAM
from .legrad import LeGrad

for _public in (GradCAM, GradCAMpp, LayerCAM, XGradCAM):
    _public.__module__ = __name__  # where torchcam defines them: torchcam.methods.gradient

__all__ = ["FinerCAM", "GradCAM", "GradCAMpp", "LayerCAM", "LeGrad", "RefineCAM", "SmoothGradCAMpp", "XGradCAM"]


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
    _lists_input_hook: ClassVar[bool] = True

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

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The maps averaged over noisy copies of the recorded input (``scores`` is not backpropagated)."""
        return _CAM.compute_cams(self, class_idx, scores, normalized, targets=targets, **kwargs)

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        spread = float((x.amax() - x.amin()).clamp_min(1e-12))
        smooth = _methods.SmoothGrad(self._explainer(), samples=self.num_samples, sigma=self.std / spread)
        raw = smooth.explain(x, target).raw
        return list(raw) if isinstance(raw, tuple) else [raw]

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}, num_samples={self.num_samples}, std={self.std}"


class RefineCAM(_Wrapper):
    """RefineCAM as torchcam 0.5.0 defines it: a base extractor's normalised maps at several layers,
    resized to the largest layer's grid and multiplied (:func:`camkit.functional.multiply_maps`'s rule).

    camkit's own :class:`camkit.RefineCAM` fuses at the input's resolution; this one keeps
    torchcam's (the largest layer's).

    Args:
        model: input model
        target_layer: at least two target layers, as modules or names
        input_shape: shape of the expected input tensor excluding the batch dimension
        base_method: the extractor class producing the per-layer maps (default :class:`GradCAMpp`)
        base_kwargs: keyword arguments for ``base_method``
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: list[nn.Module | str],
        input_shape: tuple[int, ...] = (3, 224, 224),
        *,
        base_method: type[_CAM] = GradCAMpp,
        **base_kwargs: Any,
    ) -> None:
        if not isinstance(target_layer, list) or len(target_layer) < 2:
            raise ValueError("RefineCAM requires at least two target layers")
        if not isinstance(base_method, type) or not issubclass(base_method, _CAM):
            raise TypeError("base_method must be a CAM extractor class")
        self.base_cam = base_method(model, target_layer, input_shape=input_shape, **base_kwargs)

    def __call__(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        target_shape: tuple[int, ...] | None = None,
        *,
        targets: Any = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        cams = self.base_cam(class_idx, scores, normalized=True, targets=targets, **kwargs)
        return [self.fuse_cams(cams, target_shape, normalized)]

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        target_shape: tuple[int, ...] | None = None,
        *,
        targets: Any = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The refined map, without the base extractor's checks."""
        cams = self.base_cam.compute_cams(class_idx, scores, normalized=True, targets=targets, **kwargs)
        return [self.fuse_cams(cams, target_shape, normalized)]

    @staticmethod
    @torch.no_grad()
    def fuse_cams(cams: list[Tensor], target_shape: tuple[int, ...] | None = None, normalized: bool = True) -> Tensor:
        """Normalise each map, resize to ``target_shape`` (default: the largest), multiply, normalise.

        Raises:
            TypeError: if ``cams`` is not a list of tensors
            ValueError: if ``cams`` is empty
        """
        if not isinstance(cams, list) or any(not isinstance(cam, Tensor) for cam in cams):
            raise TypeError("invalid argument type for `cams`")
        if not cams:
            raise ValueError("argument `cams` cannot be an empty list")
        shape = target_shape or tuple(map(max, zip(*[tuple(cam.shape[1:]) for cam in cams], strict=True)))
        product = upsample_maps(_CAM._normalize(cams[0].clone()), shape)
        for cam in cams[1:]:
            product = product * upsample_maps(_CAM._normalize(cam.clone()), shape)
        return _CAM._normalize(product) if normalized else product

    def __repr__(self) -> str:
        return f"RefineCAM(base_method={self.base_cam.__class__.__name__}, target_layer={self.target_names})"
