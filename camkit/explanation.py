"""The immutable result of an explainer call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torch import Tensor

from .errors import InvalidInputError

if TYPE_CHECKING:
    from .viz.canvas import ExplanationFigure

__all__ = ["Explanation"]


@dataclass(frozen=True)
class Explanation:
    """What ``explainer.explain(x, target)`` returns.

    Attributes:
        maps: float32 [B, *S] (or [B, K, *S] for [B, K] targets) in [0, 1] at the input's
            spatial size ``S`` (``T`` for a signal, ``H, W`` for an image, ``D, H, W`` for a
            volume or a video), on the input's device: the raw map upsampled (linear, bilinear
            or trilinear), then min-max normalised per map. A map whose model values stopped
            being finite stays NaN (explainers warn of it on the CPU).
        raw: the unnormalised map: [B, *s] (or [B, K, *s]) at the layer's resolution
            for CAMs; a tuple of them, one per layer, when several layers were fused;
            [B, C, *S] signed attributions for pixel-space methods.
        target: the class indices used, LongTensor [B] or [B, K]; ``None`` for a callable target.
        scores: the target scores of the unperturbed input, [B] or [B, K], detached.
        flat: bool [B] or [B, K], True where a map was constant (e.g. all zero); such maps
            are returned as zeros, never NaN.
        method: the registry key of the method.
        layers: the dotted names of the layers used (empty for pixel-space methods).
        extras: method-specific read-only values (e.g. a completeness gap).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.GradCAM(net, "1").explain(torch.rand(2, 3, 8, 8), target=[0, 1])
        >>> tuple(e.maps.shape), tuple(e.raw.shape), e.target.tolist(), e.method, e.layers
        ((2, 8, 8), (2, 8, 8), [0, 1], 'gradcam', ('1',))
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

    def __repr__(self) -> str:
        """A one-line summary (shapes, not values): what a notebook prints for an explanation."""
        raw = [list(r.shape) for r in self.raw] if isinstance(self.raw, tuple) else list(self.raw.shape)
        target = None if self.target is None else self.target.tolist() if self.target.numel() <= 8 else list(self.target.shape)
        flat = f"{int(self.flat.sum())} of {self.flat.numel()}"
        layers = f", layers={self.layers}" if self.layers else ""
        extras = f", extras={sorted(self.extras)}" if self.extras else ""
        return (
            f"Explanation(method={self.method!r}, maps={list(self.maps.shape)}, raw={raw}, target={target}, "
            f"flat={flat}{layers}{extras})"
        )

    @property
    def spatial_dims(self) -> int:
        """How many spatial axes a map has: 1 for a signal, 2 for an image, 3 for a volume or a video.

        Example:
            >>> import torch
            >>> import camkit
            >>> e = camkit.Explanation(torch.zeros(2, 4, 8, 8), torch.zeros(2, 4, 8, 8), None, torch.zeros(2),
            ...                        torch.zeros(2, dtype=torch.bool), "demo")
            >>> e.spatial_dims
            3
        """
        return self.maps.dim() - self.scores.dim()

    @property
    def frame_share(self) -> Tensor:
        """Each frame's (or slice's) share of the map: [B, T] (or [B, K, T]), rows summing to 1.

        For a video [B, C, T, H, W] this says which moments mattered: the map's mass in each
        frame over its total. The first spatial axis of a volume is its depth, so there it is
        each slice's share. Flat maps give zeros. Only for maps with three spatial axes.

        Example:
            >>> import torch
            >>> import camkit
            >>> maps = torch.zeros(1, 4, 2, 2); maps[0, 1] = 1.0; maps[0, 2, 0, 0] = 1.0
            >>> e = camkit.Explanation(maps, maps, None, torch.zeros(1), torch.zeros(1, dtype=torch.bool), "demo")
            >>> e.frame_share
            tensor([[0.0000, 0.8000, 0.2000, 0.0000]])
        """
        if self.spatial_dims != 3:
            kind = {1: "a signal's map [B, T] is already one value per moment", 2: "an image has no frames"}
            raise InvalidInputError(
                f"frame_share needs maps of a video or volume [B, T, H, W]; these have {self.spatial_dims} "
                f"spatial axes ({kind.get(self.spatial_dims, 'unknown rank')})"
            )
        per_frame = self.maps.sum(dim=(-2, -1))
        total = per_frame.sum(dim=-1, keepdim=True)
        return per_frame / total.masked_fill(total == 0, 1.0)

    def show(
        self,
        images: Tensor,
        classes: Sequence[str] | None = None,
        **options: Any,
    ) -> ExplanationFigure:
        """Draw the explanation over its images: rows of image | map | overlay (needs matplotlib).

        In Jupyter the returned figure displays itself (it has ``_repr_png_``); ``.save(path)``
        writes a PNG and ``.image`` holds the RGB pixels.

        Args:
            images: the explained images [B, 3, H, W] (float in [0, 1] or uint8; normalised
                ones with ``mean=``/``std=``); or signals [B, C, T], volumes or videos
                [B, C, D, H, W], drawn by their own pictures (see :func:`camkit.figure`).
            classes: class names, indexed by ``target``.
            **options: passed on to :func:`camkit.figure` (``sign``, ``outlier_perc``,
                ``colormap``, ``alpha``, ``mean``, ``std``, ``panel``, ``dpi``, ``kind``).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> import camkit
            >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            ...                     nn.Flatten(), nn.Linear(4, 2))
            >>> x = torch.rand(1, 3, 8, 8)
            >>> fig = camkit.GradCAM(net, "1").explain(x, target=[1]).show(x, classes=["cat", "dog"])
            >>> fig.titles[(0, "map: gradcam")].splitlines()[1].split(":")[0]
            'dog'
        """
        from .viz.figures import figure  # pictures load when one is drawn: Explanation is plain data

        return figure(images, self, classes=classes, **options)
