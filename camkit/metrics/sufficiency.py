"""Sufficiency (Dasgupta et al. 2022): do inputs with similar maps get the same prediction?"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, select_output
from ._common import check_chunk_size, check_model, chunks
from ._perturb import as_features

__all__ = ["sufficiency"]


def sufficiency(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    *,
    threshold: float = 0.6,
    distance: str = "seuclidean",
    relative: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
) -> Tensor:
    """Sufficiency (Dasgupta et al. 2022): among the other inputs of the batch whose maps lie
    within ``threshold`` of a sample's map, the share that the model gives the same top-1 class.

    Distances are between flattened maps: ``"euclidean"``, or ``"seuclidean"`` (each value
    divided by its variance over the batch, as ``scipy.spatial.distance.cdist(A, A,
    "seuclidean")`` computes it: ``var(vstack([A, A]), ddof=1)``; a value constant over the
    batch makes every distance NaN, so no neighbours). A sample without neighbours scores 0.
    The result depends on the batch: call it on the whole evaluation set. Higher is better.
    Cost: ``B`` forward passes and a ``B x B`` distance matrix.

    Args:
        model, x, chunk_size, output, keep_mode: as :func:`pixel_flipping`.
        maps: [B, *S] or [B, C, *S].
        threshold: the largest distance that makes two maps neighbours.
        distance: ``"seuclidean"`` or ``"euclidean"``.
        relative: divide the distances by the largest one of the batch first (Quantus does,
            so its ``threshold`` is a share of the batch's spread).

    Returns:
        Float tensor [B] (float64).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import sufficiency
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]])); _ = net[1].bias.zero_()
        >>> x = torch.tensor([[[1.0, 0.0]], [[2.0, 0.0]], [[0.0, 1.0]]])  # classes 0, 0, 1
        >>> maps = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.2, 0.0]])  # all within 0.25
        >>> sufficiency(net, x, maps, threshold=0.25, distance="euclidean")
        tensor([0.5000, 0.5000, 0.0000], dtype=torch.float64)
    """
    features = as_features(maps, x)
    check_model(model)
    check_chunk_size(chunk_size)
    if distance not in ("seuclidean", "euclidean"):
        raise InvalidInputError(f"distance must be 'seuclidean' or 'euclidean', got {distance!r}")
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        classes = torch.cat([select_output(model(x[a:b]), output).argmax(dim=1) for a, b in chunks(x.shape[0], chunk_size)])
    a = features.values.double()
    if distance == "seuclidean":
        stacked = torch.cat([a, a])
        a = a / stacked.var(dim=0, correction=1).sqrt()
    gaps = (a[:, None] - a[None]).pow(2).sum(dim=2).sqrt()  # [B, B]; NaN stays NaN
    if relative:
        peak = gaps.nan_to_num(nan=0.0).max()
        gaps = gaps / peak if peak > 0 else gaps
    near = gaps <= threshold
    near.fill_diagonal_(False)
    same = classes[:, None] == classes[None]
    count = near.sum(dim=1)
    agree = (near & same).sum(dim=1).double()
    return torch.where(count > 0, agree / count.clamp(min=1), torch.zeros_like(agree))
