"""Concept relevance math: each channel's share of a score, channel masks, reference regions.

Pure tensor functions behind :class:`camkit.ConceptRelevance`; any rank: a layer output
[B, C, *s] may be a signal's [B, C, t], an image's [B, C, h, w] or a volume's [B, C, d, h, w]
(or a vector [B, C] with no positions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError
from .maps import interpolation_mode

__all__ = ["channel_mask", "channel_relevance", "merge_top", "relevance_boxes"]


def channel_relevance(relevance: Tensor) -> Tensor:
    """Each channel's relevance: the relevance at a layer [B, C, *s] summed over its positions, [B, C].

    With the gradient rule the relevance at the layer is ``A * dS/dA``; with an LRP rule it is
    ``A`` times the modified gradient. A vector layer [B, C] is returned as it is.

    Example:
        >>> import torch
        >>> from camkit.functional import channel_relevance
        >>> acts = torch.tensor([[[1.0, 2.0], [3.0, -1.0]]])  # [B=1, C=2, t=2]
        >>> grads = torch.tensor([[[0.5, 1.0], [1.0, 2.0]]])
        >>> channel_relevance(acts * grads).tolist()
        [[2.5, 1.0]]
    """
    if relevance.dim() < 2:
        raise InvalidInputError(f"channel_relevance needs a layer's relevance [B, C, *s], got shape {list(relevance.shape)}")
    return relevance.flatten(2).sum(dim=2) if relevance.dim() > 2 else relevance


def channel_mask(channels: Tensor, count: int, shape: tuple[int, ...]) -> Tensor:
    """One-hot masks of chosen channels broadcasting to a layer output: [K, B, C, 1, ...].

    ``channels`` is [B, K] (per image) LongTensor; ``count`` the layer's channel count C;
    ``shape`` the layer output's shape [B, C, *s]. Mask ``k`` keeps image ``b``'s channel
    ``channels[b, k]``.

    Example:
        >>> import torch
        >>> from camkit.functional import channel_mask
        >>> channel_mask(torch.tensor([[2, 0]]), 3, (1, 3, 4)).squeeze(-1).tolist()
        [[[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]]]
    """
    if channels.dim() != 2 or channels.shape[0] != shape[0]:
        raise InvalidInputError(
            f"channels must be [B, K] with B = {shape[0]} (the batch), got shape {list(channels.shape)}"
        )
    if channels.numel() and (int(channels.min()) < 0 or int(channels.max()) >= count):
        raise InvalidInputError(f"channel indices must lie in 0..{count - 1} (the layer has {count} channels)")
    hot = F.one_hot(channels.t(), count).float()  # [K, B, C]
    return hot.reshape(*hot.shape, *([1] * (len(shape) - 2)))


def relevance_boxes(maps: Tensor, size: tuple[int, ...], level: float = 0.5) -> Tensor:
    """Where each map is most relevant on the input: the bounding box of its values >= ``level`` x its maximum.

    ``maps`` [N, *s] (a channel's relevance at the layer, per image) is upsampled to the
    input's spatial ``size`` (linear, bilinear or trilinear) before the threshold. Returns a
    LongTensor [N, 2 * len(size)]: the start of each axis, then its (exclusive) stop; a map
    without a positive value gives the whole input.

    Example:
        >>> import torch
        >>> from camkit.functional import relevance_boxes
        >>> m = torch.zeros(1, 4, 4); m[0, 1, 2] = 1.0
        >>> relevance_boxes(m, (4, 4)).tolist()  # rows 1..2, columns 2..3
        [[1, 2, 2, 3]]
    """
    _batch, *spatial = maps.shape
    if len(spatial) != len(size):
        raise InvalidInputError(f"maps have {len(spatial)} spatial axes, size has {len(size)}")
    up = maps.float()
    if tuple(spatial) != tuple(size):
        up = F.interpolate(up[:, None], size=size, mode=interpolation_mode(len(size)), align_corners=False)[:, 0]
    peak = up.flatten(1).amax(dim=1)
    hit = (up >= (level * peak).view(-1, *([1] * len(size)))) & (peak > 0).view(-1, *([1] * len(size)))
    starts, stops = [], []
    for axis, side in enumerate(size):
        other = [d for d in range(1, len(size) + 1) if d != axis + 1]
        line = hit.any(dim=other) if other else hit  # [N, side]
        idx = torch.arange(side, device=maps.device)
        first = torch.where(line, idx, side).amin(dim=1)
        last = torch.where(line, idx, -1).amax(dim=1) + 1
        empty = ~line.any(dim=1)
        starts.append(torch.where(empty, 0, first))
        stops.append(torch.where(empty, side, last))
    return torch.stack(starts + stops, dim=1).long()


def merge_top(values: Tensor, indices: Tensor, new_values: Tensor, new_indices: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Keep the ``k`` highest values per row across two lots: ([C, k'], [C, k']) with their indices.

    ``values``/``indices`` are [C, m] (the running best; ``m`` may be 0), ``new_values`` [C, n]
    and ``new_indices`` [C, n] a new batch; ties keep the earlier lot first. Used to collect each
    channel's reference samples while streaming a dataset.

    Example:
        >>> import torch
        >>> from camkit.functional import merge_top
        >>> v, i = merge_top(torch.empty(1, 0), torch.empty(1, 0, dtype=torch.long),
        ...                  torch.tensor([[3.0, 1.0, 5.0]]), torch.tensor([[10, 11, 12]]), 2)
        >>> v.tolist(), i.tolist()
        ([[5.0, 3.0]], [[12, 10]])
    """
    all_values = torch.cat([values, new_values.to(values.dtype)], dim=1)
    all_indices = torch.cat([indices, new_indices.to(indices.dtype)], dim=1)
    keep = min(k, all_values.shape[1])
    order = torch.sort(all_values, dim=1, descending=True, stable=True).indices[:, :keep]
    return all_values.gather(1, order), all_indices.gather(1, order)
