"""The output contract every explainer applies to its raw maps (private).

A raw map is checked before it is dressed: its batch size is the input's, and a flat map is
decided at the layer's resolution, before upsampling and normalisation can invent contrast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._internal import syncs as _syncs
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.maps import FLAT_RTOL, interpolation_mode, normalize_maps, upsample_maps

__all__ = ["crop_window", "finish_maps", "make_explanation"]


def _check_batch(raws: Sequence[Tensor], batch: int, names: Sequence[str], spatial_dims: int) -> None:
    for index, raw in enumerate(raws):
        if raw.dim() not in (spatial_dims + 1, spatial_dims + 2) or raw.shape[0] != batch:
            name = f"layer '{names[index]}'" if index < len(names) else "the method"
            raise InvalidInputError(
                f"{name} gave a raw map of shape {list(raw.shape)} for a batch of {batch}: its output does not "
                "follow the batch (a parameter, a position table or a pooled summary?). Pick a layer on the "
                "image's path (see camkit.list_layers(model, x))."
            )


def crop_window(raw: Tensor, window: Sequence[int]) -> Tensor:
    """The part of a raw map [..., h, w] that covers the image, when the layer saw it resized and padded.

    ``window`` is ``(image_h, image_w, padded_h, padded_w)``: the layer's map covers a
    ``padded_h x padded_w`` image whose top-left ``image_h x image_w`` is the input, resized
    (torchvision's detectors: :func:`camkit.layers.families.torchvision.transform_window`).
    The map is upsampled to the padded size and cropped there; :func:`finish_maps` then
    resizes the crop to the input's size.

    Example:
        >>> import torch
        >>> from camkit.methods._core.output import crop_window
        >>> crop_window(torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), (2, 2, 4, 4))  # the top-left quarter
        tensor([[[1.0000, 1.2500],
                 [1.5000, 1.7500]]])
    """
    height, width, padded_h, padded_w = (int(v) for v in window)
    return upsample_maps(raw, (padded_h, padded_w))[..., :height, :width]


def finish_maps(
    raws: Sequence[Tensor],
    size: Sequence[int],
    *,
    batch: int | None = None,
    names: Sequence[str] = (),
    window: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Apply the output contract to raw maps: check, decide flatness, upsample, normalise.

    ``size`` is the input's spatial size, one entry per axis: ``(T,)``, ``(H, W)`` or
    ``(D, H, W)``. Each raw map [B, *s] (or [B, K, *s]) with as many spatial axes must have the batch's size (``batch``, when
    given; else the first map's). Flatness is decided on the raw map, at the layer's own
    resolution and before upsampling, with a tolerance relative to the map's magnitude
    (:func:`camkit.functional.flat_maps`): a map that is constant up to float rounding is
    flat and comes back as zeros with ``flat=True``, however upsampling and min-max
    normalisation would have stretched its rounding noise. Other maps are upsampled to
    ``size`` (linear, bilinear or trilinear by rank) and min-max normalised.

    Several raw maps (one per layer) are fused by this rule: each is finished as above,
    the results are averaged, and the average is normalised again; the fused map is flat
    when every layer's map is.

    ``window``: the layers saw the input resized and padded (a torchvision detector's
    transform); each raw map is first cropped to the image (:func:`crop_window`).

    Example:
        >>> import torch
        >>> from camkit.methods._core.output import finish_maps
        >>> maps, flat = finish_maps([torch.tensor([[[1.0, 1.0 + 1e-9]], [[0.0, 2.0]]])], (1, 3))
        >>> maps.tolist(), flat.tolist()
        ([[[0.0, 0.0, 0.0]], [[0.0, 0.5, 1.0]]], [True, False])
    """
    raws = [r.float() for r in raws]
    n = len(size)
    _check_batch(raws, raws[0].shape[0] if batch is None else batch, names, n)
    if window is not None:
        raws = [crop_window(raw, window) for raw in raws]
    size = tuple(int(side) for side in size)
    finished = []
    flats = []
    for raw in raws:
        maps, flat = _finish_one(raw, size)
        finished.append(maps)
        flats.append(flat)
    if len(raws) == 1:
        return finished[0], flats[0]
    fused, _ = normalize_maps(torch.stack(finished).mean(dim=0), spatial_dims=n)
    flat = torch.stack(flats).all(dim=0)
    return fused.masked_fill_(flat.view(*flat.shape, *(1,) * n), 0.0), flat  # fused is new, as above


def _finish_one(raw: Tensor, size: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """One raw map [*lead, *s] finished: ``(maps [*lead, *size], flat [*lead])``, in as few kernels as it takes.

    The values of :func:`camkit.functional.flat_maps` on ``raw``, then
    :func:`camkit.functional.upsample_maps` and :func:`camkit.functional.normalize_maps`, then the
    flat maps set to zero, bit for bit: each map's extremes are read once at the layer's resolution
    (for the flatness) and once at the input's (for the normalisation), and the subtraction, the
    division and the zero fill run on one new tensor. No host sync.
    """
    n = len(size)
    lead, grid = raw.shape[: raw.dim() - n], tuple(raw.shape[raw.dim() - n :])
    cells = raw.reshape(*lead, -1)
    # One reduction for both extremes: they may differ from amin's and amax's in the sign of a zero
    # only, which the flatness rule below cannot see (the normalisation's extremes are amin's and amax's).
    low, high = torch.aminmax(cells, dim=-1, keepdim=True)
    flat = (high - low) <= torch.maximum(high, -low).mul_(_RTOL)  # flat_maps' rule, [*lead, 1]
    up = cells  # never written to: ``raw`` itself when it has the input's size
    if grid != size:  # upsample_maps' interpolation
        up = _upsample(raw.reshape(-1, 1, *grid), size).view(*lead, -1)
    top, bottom = up.amax(dim=-1, keepdim=True), up.amin(dim=-1, keepdim=True)
    span = top - bottom
    zero = (span <= _ZERO).logical_or_(flat)  # constant after upsampling, or flat before it
    maps = torch.sub(up, bottom).div_(span)
    # 0 / 0 and inf / inf filled with zeros. On the host, where reading ``zero`` is free, the fill (a
    # slow kernel with its mask broadcast) runs only when some map needs it.
    if not _syncs.reads_are_free(zero) or any(zero.view(-1).tolist()):
        maps.masked_fill_(zero, 0.0)
    return maps.view(*lead, *size), flat.view(lead)


# The constants of the rule as float32 scalars: a Python number would be converted on every call.
_RTOL = torch.tensor(FLAT_RTOL, dtype=torch.float32)
_ZERO = torch.tensor(0.0, dtype=torch.float32)


#: The kernels ``F.interpolate`` calls for linear, bilinear and trilinear resizing (by spatial rank).
_LINEAR = {1: torch._C._nn.upsample_linear1d, 2: torch._C._nn.upsample_bilinear2d, 3: torch._C._nn.upsample_trilinear3d}


def _upsample(batch: Tensor, size: tuple[int, ...]) -> Tensor:
    """``F.interpolate(batch, size, linear mode by rank, align_corners=False)``, the same kernel and values.

    On the CPU the kernel is called directly, without ``F.interpolate``'s argument checks (a few
    microseconds a call, on every explained batch). Elsewhere, and for tensor subclasses, it runs
    as it is: on an accelerator with deterministic algorithms on it swaps in another implementation.
    """
    if batch.is_cpu and type(batch) is Tensor:
        return _LINEAR[len(size)](batch, size, False, None)
    return F.interpolate(batch, size=size, mode=interpolation_mode(len(size)), align_corners=False)


def make_explanation(
    key: str,
    raws: Sequence[Tensor],
    x: Tensor,
    classes: Tensor | None,
    scores: Tensor,
    layers: tuple[str, ...] = (),
    window: Sequence[int] | None = None,
    **extras: Any,
) -> Explanation:
    """Apply the output contract (:func:`finish_maps`) to raw maps and wrap them in an :class:`Explanation`.

    ``window``: see :func:`finish_maps`. On an accelerator, where camkit does not stop the device to
    look at values, samples whose input holds NaN or Inf get NaN maps and ``flat=False`` (on the CPU such inputs
    are refused before anything runs; see :func:`camkit._internal.checks.check_finite`).
    """
    maps, flat = finish_maps(raws, tuple(x.shape[2:]), batch=x.shape[0], names=layers, window=window)
    if maps.device != x.device:
        maps, flat = maps.to(x.device), flat.to(x.device)
    if not _syncs.reads_are_free(x):
        bad = x.mul(0).flatten(1).sum(dim=1).isnan()  # 0 * v is NaN exactly where v is NaN or infinite
        shape = (-1,) + (1,) * (maps.dim() - 1)
        maps = maps.masked_fill(bad.view(shape), float("nan"))
        flat = flat & ~bad.view((-1,) + (1,) * (flat.dim() - 1))
    return Explanation(
        maps=maps,
        raw=raws[0] if len(raws) == 1 else tuple(raws),
        target=classes,
        scores=scores,
        flat=flat,
        method=key,
        layers=layers,
        extras=extras,
    )
