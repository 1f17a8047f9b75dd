"""How concentrated a map is: sparseness (Gini index), complexity (entropy), effective complexity.

These need no model: maps in, one value per map out. Each reads the map's absolute values over
all its positions (and channels, for channel maps); any rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["complexity", "effective_complexity", "sparseness"]


def _flat(maps: Tensor) -> Tensor:
    if not isinstance(maps, Tensor) or maps.dim() < 2 or maps[0].numel() == 0:
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(f"maps must be a tensor [B, *S] (or [B, C, *S]) with at least one value each, got {got}")
    if maps.dtype == torch.bool or maps.is_complex():
        raise InvalidInputError(f"maps must hold real numbers, got dtype {maps.dtype}")
    return maps.detach().flatten(1).double().abs()


def sparseness(maps: Tensor) -> Tensor:
    """Sparseness: the Gini index of ``|a|`` (Chalasani et al. 2020, after Hurley and Rickard 2009).

    With the ``N`` values sorted ascending, ``a_(1) <= ... <= a_(N)``:
    ``G = sum_i (2i - N - 1) a_(i) / (N * sum_i a_(i))``, 0 for a uniform map, ``1 - 1/N`` for a
    single non-zero value. Higher is sparser. An all-zero map gives NaN (its Gini index is
    undefined; Quantus adds 1e-7 to every value first, which makes it 0). Cost: one sort.

    Args:
        maps: [B, *S] or [B, C, *S], any rank.

    Returns:
        Float tensor [B] (float64).

    Example:
        >>> import torch
        >>> from camkit.metrics import sparseness
        >>> sparseness(torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0]]))
        tensor([0.0000, 0.7500], dtype=torch.float64)
    """
    a = torch.sort(_flat(maps), dim=1).values
    n = a.shape[1]
    weights = 2 * torch.arange(1, n + 1, dtype=a.dtype, device=a.device) - n - 1
    total = a.sum(dim=1)
    return (a * weights).sum(dim=1) / (n * total)


def complexity(maps: Tensor) -> Tensor:
    """Complexity: the entropy of the map read as a distribution (Bhatt et al. 2020).

    ``p_i = |a_i| / sum_j |a_j|`` and ``H = -sum_i p_i ln p_i`` (``0 ln 0 = 0``): 0 for a single
    non-zero value, ``ln N`` for a uniform map. Lower is simpler. An all-zero map gives NaN.

    Args:
        maps: [B, *S] or [B, C, *S], any rank.

    Returns:
        Float tensor [B] (float64, nats).

    Example:
        >>> import torch
        >>> from camkit.metrics import complexity
        >>> complexity(torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0]]))  # ln 4, 0
        tensor([1.3863, 0.0000], dtype=torch.float64)
    """
    a = _flat(maps)
    p = a / a.sum(dim=1, keepdim=True)
    return 0.0 - torch.special.xlogy(p, p).sum(dim=1)  # 0.0 - x: no -0.0 for a single value


def effective_complexity(maps: Tensor, eps: float = 1e-5) -> Tensor:
    """Effective complexity (Nguyen and Martinez 2020): how many values have ``|a_i| > eps``.

    Lower is simpler. Use it on maps of a known scale (normalised, say to a maximum of 1).

    Args:
        maps: [B, *S] or [B, C, *S], any rank.
        eps: the threshold below which a value counts as zero.

    Returns:
        Long tensor [B].

    Example:
        >>> import torch
        >>> from camkit.metrics import effective_complexity
        >>> effective_complexity(torch.tensor([[0.5, -0.2, 0.0, 1e-6]]))
        tensor([2])
    """
    if not eps >= 0:
        raise InvalidInputError(f"eps must be a threshold >= 0, got {eps!r}")
    return (_flat(maps) > eps).sum(dim=1)
