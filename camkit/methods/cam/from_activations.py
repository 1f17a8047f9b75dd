"""CAMs from one layer's activations alone, without gradients: FEM (each channel weighted by its
share of positions above its own mean plus ``k`` standard deviations), KPCA-CAM (a kernel
principal component) and RandomCAM (random channel weights, a baseline). The math is in
:mod:`camkit.functional.cam_extra`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ... import functional as CF
from ..._internal.syncs import to_device
from ...errors import InvalidInputError
from ...functional import cam_extra as CX
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.forward import Captured, ForwardCAM
from ..registry import register_method

__all__ = ["FEM", "KPCACAM", "RandomCAM"]


def _same_for_every_target(raw: Tensor, cap: Captured) -> Tensor:
    """A target-independent map [B, *s], repeated K times for [B, K] targets."""
    if cap.multi:
        return raw[:, None].expand(-1, cap.scores.shape[1], *raw.shape[1:]).contiguous()
    return raw


@register_method("fem")
class FEM(ForwardCAM):
    """FEM (Fuad et al. 2020): channels weighted by the share of positions above ``mean + k std``.

    ``w_c = mean_s(A_c > mean_s(A_c) + k * std_s(A_c))``, over every spatial axis ``s`` of the
    layer, and the map is ``relu(sum_c w_c A_c)``: channels with a few strong peaks count. One
    forward pass without autograd; the map does not depend on the target (with [B, K] targets it is
    returned K times).

    Args:
        model, layer, call, output, keep_mode, input_index: see :class:`CAMExplainer`.
        k: the threshold in standard deviations (default 2).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.FEM(net, "1", k=1.0)(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd)"
    use_when: ClassVar[str] = "You want a cheap, class-agnostic map of the layer's outstanding peaks (no gradients)."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        k: float = 2.0,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index)
        self.k = float(k)

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        act = act.float()
        return _same_for_every_target(CF.weighted_sum(CX.fem_weights(act, self.k), act), cap)


@register_method("kpcacam")
class KPCACAM(ForwardCAM):
    """KPCA-CAM (Karmani et al. 2024): the first kernel principal component of the activations.

    See :func:`camkit.functional.cam_extra.kpca_projection` (pytorch-grad-cam's
    ``KPCA_CAM``). One forward without autograd plus a batched eigendecomposition of an
    ``N x N`` kernel matrix per image (float64), ``N`` the layer's positions (``t`` for a
    signal, ``h w`` for an image, ``d h w`` for a volume: mind the cost of a large 3-D layer);
    the map does not depend on the target. Its sign is fixed to agree with the
    channel-summed activations.

    Args:
        model, layer, call, output, keep_mode, input_index: see :class:`CAMExplainer`.
        kernel: ``"sigmoid"`` (default), ``"rbf"``, ``"poly"``, ``"cosine"`` or ``"linear"``.
        gamma: kernel coefficient; ``None`` means ``1 / C``.
        degree, coef0: of the ``"poly"`` and ``"sigmoid"`` kernels.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.KPCACAM(net, "1", kernel="rbf")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd) + an (h*w) x (h*w) eigendecomposition per image"
    use_when: ClassVar[str] = (
        "You want Eigen-CAM's class-agnostic dominant pattern with a non-linear kernel; mind the cost at large layers."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        kernel: CX.Kernel = "sigmoid",
        gamma: float | None = None,
        degree: int = 3,
        coef0: float = 1.0,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index)
        if kernel not in CX.KERNELS:
            raise InvalidInputError(f"kernel must be one of {', '.join(map(repr, CX.KERNELS))}, got {kernel!r}")
        self.kernel: CX.Kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        raw = CX.kpca_projection(act.float(), self.kernel, self.gamma, self.degree, self.coef0)
        return _same_for_every_target(raw, cap)


@register_method("randomcam")
class RandomCAM(ForwardCAM):
    """Random-CAM, the sanity baseline: ``relu(sum_c w_c A_c)`` with ``w_c ~ U(-1, 1)``.

    A map that knows the layer but nothing of the target or the model's decision: a method
    (or a metric) that cannot beat it says little. The weights are drawn on the CPU from
    ``seed`` once per call, one per channel, and shared by every image and target of the
    call, so a batch equals its images one by one and the result does not depend on the
    device. Without a seed it is drawn from torch's global generator. No gradients are
    computed (pytorch-grad-cam's ``RandomCAM`` runs a backward pass it does not use).

    Args:
        model, layer, call, output, keep_mode, input_index: see :class:`CAMExplainer`.
        seed: the weights' seed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> x = torch.rand(2, 3, 8, 8)
        >>> torch.equal(camkit.RandomCAM(net, "1", seed=3)(x), camkit.RandomCAM(net, "1", seed=3)(x))
        True
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd)"
    use_when: ClassVar[str] = (
        "You need a baseline that ignores the model's decision, to check that a method or metric beats chance."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        seed: int | None = None,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index)
        self.seed = seed

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)))
        generator = torch.Generator().manual_seed(seed + index)
        weights = torch.rand(act.shape[1], generator=generator, dtype=torch.float64) * 2 - 1
        weights = to_device(weights, act.device, torch.float32)
        extras.setdefault("seed", seed)
        raw = torch.einsum("c,bc...->b...", weights, act.float()).clamp_min(0)
        return _same_for_every_target(raw, cap)
