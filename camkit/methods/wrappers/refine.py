"""RefineCAM: one CAM method's maps at several layers, fused by their product."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.maps import multiply_maps
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.cam_base import CAMExplainer, Reshape
from .._core.output import finish_maps
from ..cam.gradcam import GradCAMPlusPlus
from ..registry import get_method, register_method

__all__ = ["RefineCAM"]


@register_method("refinecam")
class RefineCAM(CAMExplainer):
    """RefineCAM (pytorch-grad-cam 1.5.7): a base CAM at several layers, fused by the product of their maps.

    Each layer's map of the base method is finished as every camkit map (ReLU, upsampled to
    the input's size, min-max normalised); the maps are multiplied position by position and
    the product normalised again (:func:`camkit.functional.multiply_maps`). Where a plain
    multi-layer CAM averages its layers, the product keeps only what every layer shows: the
    coarse deep layer tells *where*, the early layers sharpen *which pixels*, and their noise
    away from the object is cancelled. A product that is zero everywhere (layers that agree
    nowhere) is flat: zeros with ``flat=True``. All layers are read in one call of the base
    method (one forward and one backward for a gradient CAM), not one call per layer.

    Args:
        model: the model to explain.
        layer: the layers to fuse, a list (early layers first or not: a product does not care).
        base: the CAM run at each layer: a :class:`CAMExplainer` subclass or its registry key
            (default :class:`GradCAMPlusPlus`, as pytorch-grad-cam).
        call, output, keep_mode, reshape, input_index, eigen_smooth: see :class:`CAMExplainer`;
            passed on to the base method.
        **options: further keyword arguments of the base method (``batch_size=`` for
            ScoreCAM...).

    ``explanation.raw`` holds the base method's raw map of each layer, ``extras`` its extras.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
        ...                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.RefineCAM(net, ["1", "3"]).explain(torch.rand(2, 3, 8, 8), target=1)
        >>> tuple(e.maps.shape), e.layers, len(e.raw)
        ((2, 8, 8), ('1', '3'), 2)
    """

    family: ClassVar[str | None] = "CAM (multi-layer)"
    needs_grad = False  # the base method checks what it needs
    cost: ClassVar[str] = "the base method's passes once for all layers (Grad-CAM++: 1 forward + 1 backward)"
    use_when: ClassVar[str] = (
        "You want the detail of early layers without their noise: a deep layer's map gates the early ones."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        base: type[CAMExplainer] | str = GradCAMPlusPlus,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Reshape | None = None,
        input_index: InputIndex = 0,
        eigen_smooth: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(
            model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape, input_index=input_index
        )
        cls = get_method(base) if isinstance(base, str) else base
        if not (isinstance(cls, type) and issubclass(cls, CAMExplainer)) or issubclass(cls, RefineCAM):
            raise InvalidInputError(
                f"base must be a CAM method that reads layers (a CAMExplainer subclass such as camkit.GradCAM, or its "
                f"registry key such as 'gradcam++'), got {base!r}"
            )
        if reshape is not None:
            options["reshape"] = reshape
        if input_index != 0:
            options["input_index"] = input_index
        if eigen_smooth:
            options["eigen_smooth"] = True
        self.base = cls(model, layer, call=call, output=output, keep_mode=keep_mode, **options)

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        """The base method's layers (see :meth:`CAMExplainer.layers`)."""
        return self.base.layers(x)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        with self._lend_call(self.base):
            inner = self.base._explain(x, target)
        raws = inner.raw if isinstance(inner.raw, tuple) else (inner.raw,)
        size = tuple(x.shape[2:])
        window = self.base._window(x)
        per_layer = [finish_maps([raw], size, batch=x.shape[0], window=window)[0] for raw in raws]
        maps, flat = multiply_maps(per_layer, spatial_dims=len(size))
        return Explanation(
            maps=maps.to(x.device),
            raw=inner.raw,
            target=inner.target,
            scores=inner.scores,
            flat=flat.to(x.device),
            method=self.key,
            layers=inner.layers,
            extras=inner.extras,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base={type(self.base).__name__}, model={type(self.model).__name__})"
