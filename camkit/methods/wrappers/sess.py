"""SESS (Tursun et al. 2022): any explainer run on patches of several scales, fused back."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import InvalidInputError, InvalidTargetError
from ...explanation import Explanation
from ...functional.attribution import filter_axes
from ...functional.maps import interpolation_mode, normalize_maps
from ...targets.classes import Target, select_output
from .._core.explainer import Explainer
from .._core.forward import check_positive, chunks
from .smooth import _Wrapper

__all__ = ["SESS", "gaussian_blur", "window_starts"]


def window_starts(length: int, stride: int, window: int) -> list[int]:
    """Starts of windows of size ``window`` every ``stride`` along ``length``; the last one flush with the end.

    Example:
        >>> from camkit.methods.wrappers.sess import window_starts
        >>> window_starts(10, 4, 4), window_starts(8, 4, 4), window_starts(4, 4, 4)
        ([0, 4, 6], [0, 4], [0])
    """
    starts = []
    for start in range(0, length, stride):
        if start + window >= length:
            starts.append(max(length - window, 0))
            break
        starts.append(start)
    return starts


def gaussian_blur(maps: Tensor, size: int = 11, sigma: float = 5.0) -> Tensor:
    """Separable Gaussian blur of maps [B, *S], mirrored at the border without repeating the edge.

    ``S`` is one to three spatial axes (a signal's ``T``, an image's ``H, W``, a volume's
    ``D, H, W``); the same 1-D kernel runs along each of them in turn, the last axis first.
    Where a side is not longer than ``size // 2`` the border is repeated instead of mirrored.

    Example:
        >>> import torch
        >>> from camkit.methods.wrappers.sess import gaussian_blur
        >>> torch.allclose(gaussian_blur(torch.ones(1, 8, 8)), torch.ones(1, 8, 8))
        True
        >>> torch.allclose(gaussian_blur(torch.ones(2, 16)), torch.ones(2, 16))  # two signals
        True
    """
    n = maps.dim() - 1
    interpolation_mode(n)  # checks the rank
    half = size // 2
    offsets = torch.arange(size, dtype=torch.float64) - half
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).to(device=maps.device, dtype=maps.dtype)
    mode = "reflect" if min(maps.shape[1:]) > half else "replicate"
    return filter_axes(maps[:, None], kernel, mode)[:, 0]


def _rescale(x: Tensor, size: tuple[int, ...], antialias: bool) -> Tensor:
    """``x`` [B, C, *S] resized to ``size`` (linear, bilinear or trilinear, ``align_corners=False``).

    ``antialias`` (for a shrinking resize) widens the linear kernel as PyTorch does for
    bilinear resizes, which it supports only on images: a signal is resized as a one-row
    image, a volume as two image resizes (each plane's ``H, W``, then ``D`` against the
    flattened plane, left as it is). Linear filters are separable, so both are the
    antialiased linear and trilinear resize.
    """
    n = len(size)
    if not antialias or n == 2:
        return F.interpolate(x, size=size, mode=interpolation_mode(n), align_corners=False, antialias=antialias)
    b, c, *spatial = x.shape
    if n == 1:
        return F.interpolate(x[:, :, None], size=(1, size[0]), mode="bilinear", align_corners=False, antialias=True)[
            :, :, 0
        ]
    depth, height, width = spatial
    planes = F.interpolate(
        x.reshape(b, c * depth, height, width), size=size[1:], mode="bilinear", align_corners=False, antialias=True
    )
    columns = planes.reshape(b, c, depth, size[1] * size[2])
    out = F.interpolate(columns, size=(size[0], size[1] * size[2]), mode="bilinear", align_corners=False, antialias=True)
    return out.reshape(b, c, *size)


class SESS(_Wrapper):
    """SESS, Saliency Enhancing with Scaling and Sliding, around any camkit explainer.

    Each image is resized so that its shorter side takes each of ``scales``; a square window
    of side ``window`` slides over every scaled image with ``stride`` (the last window of a
    row or column flush with the border). Every patch is scored by the target's softmax
    probability (``softmax=False``: the raw score; negative scores count as 0); the lowest
    ``pre_filter`` share of patches is dropped; the wrapped explainer's maps of the others
    are multiplied by ``score / max score``, pasted back where the patch came from and
    resized to the input size. Fusion, per pixel: ``"mean"`` averages the values above
    ``theta`` (pixels no patch covers stay 0), ``"max"`` takes the maximum. Then an optional
    11 x 11 Gaussian blur (sigma 5) and min-max normalisation. The defaults are
    pytorch-grad-cam's (its ``SESS``): window = the shorter side, stride = window, 12 scales
    from the window up in steps of ``round(window * 2 / 7)``.

    Patches of all images and scales are scored and explained in batches of ``max_batch``.
    The target is resolved once on the clean input (class targets [B] only; a callable
    target gets no patch score). ``raw`` is the fused map before normalisation.

    Any rank, with the same rules on every spatial axis: a signal [B, C, T] is rescaled so
    that its length takes each scale and cut into windows of ``window`` steps; a volume or
    a video [B, C, D, H, W] is rescaled by one factor on all three axes (its shortest side
    takes each scale) and cut into cubes of side ``window``, pasted back with trilinear
    interpolation and blurred along all three axes. Scaling and sliding make sense there as
    they do on images: a lesion or an event may be small at the input's scale, and a patch
    zooms in on it. For a video that includes time: a patch is ``window`` frames of
    ``window x window`` pixels, and time is resampled by the same factor as space, so the
    model must take clips of ``window`` frames. Shrinking resizes are antialiased on every
    rank.

    Args:
        explainer: any camkit explainer (e.g. ``camkit.GradCAM(model, "layer4")``); the model
            must accept ``window x window`` inputs (``window`` steps for a signal,
            ``window x window x window`` for a volume or a video).
        scales: shortest-side sizes in pixels (steps, voxels), each at least ``window``; ``None``: see above.
        num_scales, scale_step: the default scales' count and step (a fraction of ``window``).
        window, stride: in pixels (steps, voxels), the same on every axis; ``None``: the shortest side,
            and ``window``.
        pre_filter: share in [0, 1) of the lowest-scoring patches to drop.
        theta: the ``"mean"`` fusion ignores values at or below it.
        pool: ``"mean"`` or ``"max"``.
        smooth: blur the fused map.
        softmax: score patches by softmax probability (True) or raw score.
        max_batch: patches per forward / per call of the wrapped explainer.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> sess = camkit.SESS(camkit.GradCAM(net, "0"), num_scales=3, window=8)
        >>> e = sess.explain(torch.rand(2, 3, 12, 12))
        >>> tuple(e.maps.shape), e.method, e.extras["patches"]
        ((2, 12, 12), 'sess(gradcam)', 9)
    """

    cost: ClassVar[str] = "patches x (1 forward) to score + patches x the wrapped method"
    use_when: ClassVar[str] = (
        "Objects are small or repeated and a single-scale CAM misses them; you can afford tens of patches."
    )

    def __init__(
        self,
        explainer: Explainer,
        *,
        scales: Sequence[int] | None = None,
        num_scales: int = 12,
        scale_step: float = 2.0 / 7.0,
        window: int | None = None,
        stride: int | None = None,
        pre_filter: float = 0.0,
        theta: float = 0.0,
        pool: Literal["mean", "max"] = "mean",
        smooth: bool = True,
        softmax: bool = True,
        max_batch: int = 32,
    ) -> None:
        super().__init__(explainer)
        if pool not in ("mean", "max"):
            raise InvalidInputError(f"pool must be 'mean' or 'max', got {pool!r}")
        if not 0.0 <= pre_filter < 1.0:
            raise InvalidInputError(f"pre_filter must be in [0, 1), got {pre_filter!r}")
        self.num_scales = check_positive("num_scales", num_scales)
        self.scales = None if scales is None else [check_positive("scales[i]", int(s)) for s in scales]
        self.scale_step = float(scale_step)
        self.window = None if window is None else check_positive("window", window)
        self.stride = None if stride is None else check_positive("stride", stride)
        self.pre_filter = float(pre_filter)
        self.theta = float(theta)
        self.pool = pool
        self.smooth = bool(smooth)
        self.softmax = bool(softmax)
        self.max_batch = check_positive("max_batch", max_batch)

    def _scales(self, window: int) -> list[int]:
        if self.scales is not None:
            return self.scales
        step = round(window * self.scale_step)
        return [window + step * i for i in range(self.num_scales)]

    def _patches(
        self, x: Tensor, window: int, stride: int
    ) -> tuple[list[Tensor], list[tuple[int, tuple[int, ...], tuple[int, ...]]]]:
        """Per scale the scaled batch, and per patch (scale index, its start on each axis, the scaled size)."""
        spatial = tuple(int(side) for side in x.shape[2:])
        short = min(spatial)
        scaled, where = [], []
        for index, side in enumerate(self._scales(window)):
            if side < window:
                raise InvalidInputError(f"every scale must be at least the window ({window} px), got {side}")
            size = tuple(int(side * length / short) for length in spatial)  # the shortest side becomes `side`
            image = x if size == spatial else _rescale(x, size, antialias=side < short)
            scaled.append(image)
            for starts in itertools.product(*(window_starts(length, stride, window) for length in size)):
                where.append((index, starts, size))
        return scaled, where

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        if callable(target) and not isinstance(target, Tensor):
            raise InvalidTargetError("SESS scores patches by class; pass class targets (None, ints), not a callable")
        classes, scores = self._clean_target(x, target)
        assert classes is not None
        if classes.dim() != 1:
            raise InvalidTargetError(f"SESS takes one class per image ([B]), got targets of shape {list(classes.shape)}")
        batch, spatial = x.shape[0], tuple(int(side) for side in x.shape[2:])
        n = len(spatial)
        window = self.window if self.window is not None else min(spatial)
        stride = self.stride if self.stride is not None else window
        scaled, where = self._patches(x, window, stride)
        count = len(where)
        # Rows: every (image, patch) pair, image-major.
        image_of = torch.arange(batch, device=x.device).repeat_interleave(count)
        patch_of = torch.arange(count, device=x.device).repeat(batch)

        def crop(rows: slice | Tensor) -> Tensor:
            parts = []
            for b, p in zip(image_of[rows].tolist(), patch_of[rows].tolist()):
                s, starts, _ = where[p]
                parts.append(scaled[s][(b, slice(None), *(slice(a, a + window) for a in starts))])
            return torch.stack(parts)

        patch_scores = torch.empty(batch * count, device=x.device)
        with torch.no_grad():
            for rows in chunks(batch * count, self.max_batch):
                out = select_output(self._call_model_rows(crop(rows), image_of[rows]), self.output)
                values = out.softmax(dim=1) if self.softmax else out
                patch_scores[rows] = values.gather(1, classes[image_of[rows], None])[:, 0].float().clamp_min(0)
        keep = []
        weights = torch.zeros(batch * count, device=x.device)
        for b in range(batch):
            own = patch_scores[b * count : (b + 1) * count]
            order = own.argsort(stable=True)[int(count * self.pre_filter) :] + b * count
            top = patch_scores[order].max()
            weights[order] = patch_scores[order] / top if top > 0 else 1.0
            keep.append(order)
        kept = torch.cat(keep)
        total = x.new_zeros((batch, *spatial), dtype=torch.float32)
        counts = torch.zeros_like(total)
        layers: tuple[str, ...] = ()
        scale_of = torch.tensor([w[0] for w in where], device=x.device)
        for part in chunks(len(kept), self.max_batch):
            picked = kept[part]
            explanation = self._inner(crop(picked), classes[image_of[picked]], image_of[picked])
            layers = explanation.layers
            maps = explanation.maps.float() * weights[picked].view(-1, *(1,) * n)
            scales = scale_of[patch_of[picked]]
            for s in scales.unique().tolist():  # one resize per scale: the canvases share its size
                members = (scales == s).nonzero()[:, 0]
                first = where[int(patch_of[picked[members[0]]])]
                canvas = maps.new_zeros((len(members), 1, *first[2]))
                for i, m in enumerate(members.tolist()):
                    _, starts, _ = where[int(patch_of[picked[m]])]
                    spot: tuple[int | slice, ...] = (i, 0, *(slice(a, a + window) for a in starts))
                    canvas[spot] = maps[m]
                back = F.interpolate(canvas, size=spatial, mode=interpolation_mode(n), align_corners=False)[:, 0]
                owners = image_of[picked[members]]
                if self.pool == "max":
                    total.index_reduce_(0, owners, back, "amax")
                else:
                    above = back > self.theta
                    total.index_add_(0, owners, torch.where(above, back, torch.zeros_like(back)))
                    counts.index_add_(0, owners, above.float())
        fused = total if self.pool == "max" else torch.where(counts > 0, total / counts.clamp_min(1), total.new_zeros(()))
        if self.smooth:
            fused = gaussian_blur(fused)
        maps, flat = normalize_maps(fused, spatial_dims=n)
        return Explanation(
            maps=maps,
            raw=fused,
            target=classes,
            scores=scores,
            flat=flat,
            method=f"sess({self.explainer.key})",
            layers=layers,
            extras={"patches": count, "scales": tuple(self._scales(window)), "window": window, "stride": stride},
        )
