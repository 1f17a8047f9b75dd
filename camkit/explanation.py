"""The immutable result of an explainer call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import Tensor

__all__ = ["Explanation"]


@dataclass(frozen=True)
class Explanation:
    """What ``explainer.explain(x, target)`` returns.

    Attributes:
        maps: float32 [B, H, W] (or [B, K, H, W] for [B, K] targets) in [0, 1] at the
            input's size, on the input's device: the raw map upsampled (bilinear), then
            min-max normalised per map.
        raw: the unnormalised map: [B, h, w] (or [B, K, h, w]) at the layer's resolution
            for CAMs; a tuple of them, one per layer, when several layers were fused;
            [B, C, H, W] signed attributions for pixel-space methods.
        target: the class indices used, LongTensor [B] or [B, K]; ``None`` for a callable target.
        scores: the target scores of the unperturbed input, [B] or [B, K], detached.
        flat: bool [B] or [B, K], True where a map was constant (e.g. all zero); such maps
            are returned as zeros, never NaN.
        method: the registry key of the method.
        layers: the dotted names of the layers used (empty for pixel-space methods).
        extras: method-specific read-only values (e.g. a completeness gap).
    """

    maps: Tensor
    raw: Tensor | tuple[Tensor, ...]
    target: Tensor | None
    scores: Tensor
    flat: Tensor
    method: str
    layers: tuple[str, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))
