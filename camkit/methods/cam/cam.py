"""CAM (Zhou et al. 2016) for networks that end in global average pooling and a linear layer."""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from ..._internal import syncs as _syncs
from ...errors import InvalidInputError, InvalidTargetError, LayerNotFoundError
from ...functional.cam import weighted_maps
from ...layers.names import LayerSpec
from ...layers.resolve import resolve_layers
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.forward import Captured, ForwardCAM, expand_targets
from ..registry import register_method

__all__ = ["CAM"]


def _is_pointwise_conv(module: nn.Module) -> bool:
    return (
        isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
        and all(k == 1 for k in module.kernel_size)
        and module.groups == 1
    )


@register_method("cam")
class CAM(ForwardCAM):
    """Class activation mapping: ``relu(sum_c W[target, c] * A_c)`` with ``W`` the linear head's weight.

    Exact for models whose output is ``fc(global_average_pool(A))`` with ``A`` the target
    layer's output [B, C, *s] (any rank: ``t``; ``h, w``; ``d, h, w``): then it equals
    Grad-CAM up to a positive factor (one over the number of positions), which
    normalisation removes. No backward pass; the bias is left out (it is constant over
    positions). Class targets only: a callable target has no weight row. A class beyond the
    head's outputs raises, except for class tensors on a GPU, where it gets a zero (flat)
    map: checking it there would make the host wait for the device.

    Args:
        model: the model to explain.
        layer: the layer feeding the pooling; ``None``: found as for the other CAMs (:class:`CAMExplainer`).
        fc: the ``nn.Linear`` head (module or dotted name), or a 1x1 convolution head
            (``nn.Conv1d/2d/3d`` with kernel size 1 and one group, as in fully convolutional
            classifiers); ``None`` finds it when the model has exactly one ``nn.Linear`` with
            ``in_features`` equal to the layer's channel count.
        call, output, keep_mode, eigen_smooth, input_index: see :class:`CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> tuple(camkit.CAM(net, "1")(torch.rand(2, 3, 8, 8), target=1).shape)
        (2, 8, 8)
    """

    cost: ClassVar[str] = "1 forward (no autograd)"
    use_when: ClassVar[str] = (
        "The model ends in global average pooling and one linear layer: exact and cheapest."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        fc: str | nn.Module | None = None,
        *,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        eigen_smooth: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index, eigen_smooth=eigen_smooth)
        self.fc: nn.Module | None = None
        self._heads: dict[int, nn.Linear] = {}  # found heads by channel count (one model walk each)
        if fc is not None:
            name, module = resolve_layers(model, fc)[0]
            if not isinstance(module, nn.Linear) and not _is_pointwise_conv(module):
                raise InvalidInputError(
                    f"fc must be an nn.Linear or a 1x1 convolution (one group), but '{name}' is {module!r}"
                )
            self.fc = module

    def _head(self, channels: int) -> nn.Module:
        if self.fc is not None:
            weight = cast(Tensor, self.fc.weight)
            if weight.shape[1] != channels:
                raise InvalidInputError(
                    f"fc reads {weight.shape[1]} channels but the layer has {channels}; pass "
                    "the linear layer that reads the pooled output of this layer."
                )
            return self.fc
        if channels in self._heads:
            return self._heads[channels]
        found = [
            (n, m) for n, m in self.model.named_modules() if isinstance(m, nn.Linear) and m.in_features == channels
        ]
        if len(found) != 1:
            names = [n for n, _ in found] or "none"
            raise LayerNotFoundError(
                f"CAM needs the linear head reading the layer's {channels} pooled channels; candidates: "
                f"{names}. Pass fc= the nn.Linear (or its dotted name)."
            )
        self._heads[channels] = found[0][1]
        return found[0][1]

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        if cap.classes is None:
            raise InvalidTargetError(
                "CAM reads the linear head's weight row of a class; a callable target has none. Pass class "
                "indices, or use GradCAM for a callable target."
            )
        weight = cast(Tensor, self._head(act.shape[1]).weight).detach().flatten(1)  # [K, C], a 1x1 conv's too
        outputs = weight.shape[0]
        classes = cast(Tensor, expand_targets(cap.classes))  # [B, K]; None was refused above
        if _syncs.reads_are_free(classes):
            if classes.max() >= outputs:
                raise InvalidTargetError(
                    f"target class {int(classes.max())} is out of range for the head's {outputs} outputs"
                )
            rows = weight[classes].float()  # [B, K, C]
        else:
            # On a device the check would stall it: a class beyond the head gets a zero row (a flat map).
            inside = (classes < outputs)[..., None]
            rows = torch.where(inside, weight[classes.clamp(max=outputs - 1)].float(), 0.0)
        raw = weighted_maps(
            rows.transpose(1, 2), act.float(), eigen_smooth=self.eigen_smooth, exact=_syncs.reads_are_free(act)
        )
        return raw if cap.multi else raw[:, 0]
