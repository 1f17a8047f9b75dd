"""``BaseCAM``: pytorch-grad-cam's constructor and call contract over a camkit explainer.

A subclass names the camkit explainer that computes its raw maps (:meth:`BaseCAM.explainer`);
this class translates the arguments, runs it, and finishes the maps as pytorch-grad-cam does
(see :func:`~camkit.compat.pytorch_grad_cam._support.dress_maps`). A user's subclass that only
overrides ``get_cam_weights(input_tensor, target_layer, targets, activations, grads)`` (numpy
in, ``[B, C]`` numpy out), as pytorch-grad-cam's guide suggests, still works: its weights are
applied to the channels by camkit's Grad-CAM pipeline.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from ..._internal.state import eval_mode
from ...errors import CamkitWarning, InvalidInputError
from ...hooks import HookScope
from ...methods import CAMExplainer, Explainer, GradientCAM
from ._support import augmented, camkit_target, category_targets, dress_maps, layer_list, model_device, pop_legacy

__all__ = ["BaseCAM"]


class _Weighted(GradientCAM):
    """Grad-CAM's pipeline with the channel weights of a user's ``get_cam_weights``."""

    key: ClassVar[str] = "pytorch-grad-cam-weights"

    def __init__(self, model: nn.Module, layer: Any, owner: BaseCAM, **kwargs: Any) -> None:
        super().__init__(model, layer, **kwargs)
        self._owner = owner

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor:
        weights = self._owner.get_cam_weights(None, None, None, acts.cpu().numpy(), grads.cpu().numpy())
        w = torch.as_tensor(np.asarray(weights), dtype=acts.dtype, device=acts.device)
        return w.view(*w.shape, *(1,) * (acts.dim() - 2)) * acts

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        return self.contributions(acts, grads).sum(dim=1)  # the ReLU comes with the dressing


class BaseCAM:
    """pytorch-grad-cam's ``BaseCAM`` contract, computed by camkit.

    Args:
        model: the model; unlike the original it is not switched to eval mode for good: each
            call runs it in eval mode and restores every module's flag.
        target_layers: a list of modules; several layers' maps are averaged.
        reshape_transform: turns a layer's output (and gradient) into [B, C, h, w]; usually
            unnecessary with camkit, which lays out tokens and channel-last maps itself.
        compute_input_gradient, uses_gradients, detach: accepted for signature compatibility.
        tta_transforms: a ``ttach.Compose`` for ``aug_smooth=True`` (default: flips times 0.9, 1, 1.1).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import GradCAM
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> with GradCAM(model=net, target_layers=[net[1]]) as cam:
        ...     grayscale = cam(input_tensor=torch.rand(2, 3, 8, 8))
        >>> grayscale.shape, grayscale.dtype
        ((2, 8, 8), dtype('float32'))
    """

    #: whether the method reads gradients (informational, as in the original)
    uses_gradients_default: ClassVar[bool] = True
    #: ``eigen_smooth`` means nothing to the method (it is a projection already, or no channel sum)
    ignores_eigen_smooth: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Callable[[Tensor], Tensor] | None = None,
        compute_input_gradient: bool = False,
        uses_gradients: bool | None = None,
        tta_transforms: Any = None,
        detach: bool = True,
        **legacy: Any,
    ) -> None:
        translated = pop_legacy(legacy, type(self).__name__)
        if target_layers is None:
            target_layers = translated.get("target_layers", [])
        self.model = model
        self.target_layers = layer_list(target_layers)
        self.reshape_transform = reshape_transform
        self.compute_input_gradient = compute_input_gradient
        self.uses_gradients = self.uses_gradients_default if uses_gradients is None else uses_gradients
        self.tta_transforms = tta_transforms
        self.detach = detach
        self.device = model_device(model)
        self.batch_size = 32
        self.outputs: Tensor | None = None

    def explainer(self, eigen_smooth: bool) -> Explainer:
        """The camkit explainer that computes this method's raw maps."""
        return _Weighted(self.model, self.target_layers, self, eigen_smooth=eigen_smooth)

    def _build(self, eigen_smooth: bool) -> Explainer:
        explainer = self.explainer(eigen_smooth and not self.ignores_eigen_smooth)
        if self.reshape_transform is not None and isinstance(explainer, CAMExplainer):
            explainer.reshape = self.reshape_transform
        return explainer

    def get_cam_weights(
        self, input_tensor: Any, target_layers: Any, targets: Any, activations: np.ndarray, grads: np.ndarray
    ) -> np.ndarray:
        """Channel weights [B, C] from activations and gradients [B, C, *s] (numpy); methods with weights define it."""
        raise NotImplementedError(f"{type(self).__name__} defines no channel weights")

    def forward(self, input_tensor: Tensor, targets: Any = None, eigen_smooth: bool = False) -> np.ndarray:
        """Maps float32 [B, *S] in [0, 1] for a batch [B, C, *S]; ``targets=None``: each image's top class.

        A target layer whose output has one position for this input (a ResNet's last block on a
        32 x 32 image) gives the original a constant map, which its scaling turns into zeros:
        camkit refuses such a layer, so here it is left out with a :class:`~camkit.CamkitWarning`
        (its zero map does not change the others' normalised mean), and a call whose every layer
        is such a layer returns zero maps, as the original does.
        """
        x = input_tensor.detach().to(self.device)
        target = camkit_target(targets, x.shape[0])
        try:
            explanation = self._build(eigen_smooth).explain(x, target)
        except InvalidInputError:
            points = self._single_position_layers(x)
            if not points:
                raise
            warnings.warn(
                f"{type(self).__name__}: {len(points)} of {len(self.target_layers)} target layer(s) have one position "
                f"for this {'x'.join(map(str, x.shape[2:]))} input; their maps are constant (zero after scaling, as in "
                "pytorch-grad-cam). Pick earlier layers or a larger input for maps that say where.",
                CamkitWarning,
                stacklevel=3,
            )
            layers = self.target_layers
            kept = [layer for layer in layers if all(layer is not p for p in points)]
            if not kept:
                return np.zeros((x.shape[0], *x.shape[2:]), dtype=np.float32)
            self.target_layers = kept
            try:
                explanation = self._build(eigen_smooth).explain(x, target)
            finally:
                self.target_layers = layers
        self.outputs = explanation.scores
        return self.finish(explanation, x)

    def _single_position_layers(self, x: Tensor) -> list[nn.Module]:
        """The target layers whose output (after ``reshape_transform``) is a map of one position for ``x``."""
        spatial = x.dim() - 2
        outputs: dict[int, Any] = {}

        def record(index: int) -> Callable[..., None]:
            def hook(_: nn.Module, _args: Any, out: Any) -> None:
                outputs.setdefault(index, out)

            return hook

        with torch.no_grad(), eval_mode(self.model), HookScope() as hooks:
            for index, layer in enumerate(self.target_layers):
                hooks.forward(layer, record(index))
            self.model(x)
        points = []
        for index, layer in enumerate(self.target_layers):
            out = outputs.get(index)
            if isinstance(out, Tensor) and self.reshape_transform is not None:
                out = self.reshape_transform(out)
            if isinstance(out, Tensor) and out.dim() == spatial + 2 and math.prod(out.shape[2:]) == 1:
                points.append(layer)
        return points

    def finish(self, explanation: Any, x: Tensor) -> np.ndarray:
        """The original's map dressing of the explanation's raw maps."""
        return dress_maps(explanation.raw, tuple(x.shape[2:]))

    def __call__(
        self,
        input_tensor: Tensor,
        targets: Any = None,
        aug_smooth: bool = False,
        eigen_smooth: bool = False,
        **legacy: Any,
    ) -> np.ndarray:
        """See :meth:`forward`; ``aug_smooth=True`` averages over test-time augmentations."""
        translated = pop_legacy(legacy, type(self).__name__)
        if targets is None and "target_category" in translated:
            targets = category_targets(translated["target_category"], input_tensor.shape[0])
        if aug_smooth:
            return augmented(lambda x: self.forward(x, targets, eigen_smooth), input_tensor, self.tta_transforms)
        return self.forward(input_tensor, targets, eigen_smooth)

    def __enter__(self) -> BaseCAM:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to release: camkit's hooks live only during a call. Exceptions propagate."""
        return None
