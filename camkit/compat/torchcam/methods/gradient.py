"""torchcam 0.5.0's gradient-based extractors on camkit: GradCAM, GradCAMpp, SmoothGradCAMpp, XGradCAM, LayerCAM."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....errors import CamkitError
from ....functional.maps import upsample_maps
from ....methods.base import CAMExplainer
from .core import _CAM

__all__ = ["CompatNotTranslatedError", "FinerCAM", "GradCAM", "GradCAMpp", "LayerCAM", "LeGrad", "RefineCAM", "SmoothGradCAMpp", "XGradCAM"]


class CompatNotTranslatedError(CamkitError, NotImplementedError):
    """A torchcam name that camkit.compat.torchcam does not translate yet."""


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
        self._targets_supported = True


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

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        spread = float((x.amax() - x.amin()).clamp_min(1e-12))
        smooth = _methods.SmoothGrad(self._explainer(), samples=self.num_samples, sigma=self.std / spread)
        raw = smooth.explain(x, target).raw
        return list(raw) if isinstance(raw, tuple) else [raw]

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}, num_samples={self.num_samples}, std={self.std}"


class RefineCAM:
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

    @property
    def model(self) -> nn.Module:
        """The base extractor's model."""
        return self.base_cam.model

    @property
    def target_names(self) -> list[str]:
        """The base extractor's layer names."""
        return self.base_cam.target_names

    def enable_hooks(self) -> None:
        """Enable the base extractor's hooks."""
        self.base_cam.enable_hooks()

    def disable_hooks(self) -> None:
        """Disable the base extractor's hooks."""
        self.base_cam.disable_hooks()

    def reset_hooks(self) -> None:
        """Clear the base extractor's stored activations."""
        self.base_cam.reset_hooks()

    def remove_hooks(self) -> None:
        """Remove the base extractor's hooks."""
        self.base_cam.remove_hooks()

    def _hooks_off(self) -> AbstractContextManager[None]:
        return self.base_cam._hooks_off()

    def __enter__(self) -> RefineCAM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.base_cam.__exit__(None, None, None)

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


class FinerCAM:
    """Not translated: torchcam 0.5.0's Finer-CAM wrapper has no counterpart here yet.

    Use camkit's :class:`camkit.FinerCAM` natively. Constructing this class raises, so that a
    script learns it at once; it exists so that modules importing the name still load.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise CompatNotTranslatedError(
            "torchcam's FinerCAM is not translated by camkit.compat.torchcam; use camkit.FinerCAM(model, layer) "
            "natively (see docs/migration/torchcam.md)"
        )


class LeGrad:
    """Not translated: torchcam 0.5.0's LeGrad has no counterpart here yet.

    Use :class:`camkit.LeGrad` natively. Constructing this class raises; it exists so that
    modules importing the name still load.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise CompatNotTranslatedError(
            "torchcam's LeGrad is not translated by camkit.compat.torchcam; use camkit.LeGrad(model) natively "
            "(see docs/migration/torchcam.md)"
        )
