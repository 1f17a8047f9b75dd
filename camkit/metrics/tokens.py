"""Deletion and insertion for generated text: a token's log-probability as image units are removed or put back.

The units are whatever a model's image can be cut into and hidden one by one (for a
vision-language model, the image tokens its language model reads: each covers a box of the
image). The model is reached through one callable, ``score(keep, tokens)``: the log-probability of
answer token ``tokens[m]`` when only the units where ``keep[m]`` is true are shown (the others
replaced by a baseline). Each token has its own ranking of the units, from its own map, so one
answer gives ``T`` curves. The metric never sees the model: the caller builds ``score``
(:mod:`camkit.evaluation.generation` builds it for the loaded model families).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import InvalidInputError
from ._common import chunks, pixel_ranks
from .deletion import _counts

__all__ = ["TokenScorer", "token_deletion_curve", "token_insertion_curve", "unit_scores"]

TokenScorer = Callable[[Tensor, Tensor], Tensor]
"""``score(keep, tokens) -> Tensor [M]``: ``keep`` bool [M, N] (the units shown), ``tokens`` LongTensor [M]
(which answer token, 0..T-1); the log-probability of each row's token with only its kept units shown.

Example:
    >>> import torch
    >>> from camkit.metrics.tokens import TokenScorer
    >>> weights = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # token t depends on unit t
    >>> score: TokenScorer = lambda keep, tokens: -(weights[tokens] * ~keep).sum(dim=1)
    >>> score(torch.tensor([[True, False]]), torch.tensor([1])).tolist()
    [-2.0]
"""


def unit_scores(maps: Tensor, boxes: Tensor) -> Tensor:
    """Each unit's share of a word's map: the mean of maps [T, H, W] over each unit's box, [T, N].

    A pixel ``(i, j)`` belongs to the box ``(y0, x0, y1, x1)`` when its centre
    ``(i + 0.5, j + 0.5)`` lies in ``[y0, y1) x [x0, x1)`` (boxes in the image's pixels, as a
    model family's layout gives them). A box holding no pixel centre, or a NaN box (a unit that
    covers no pixels), gets NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics.tokens import unit_scores
        >>> maps = torch.tensor([[[1.0, 3.0], [5.0, 7.0]]])
        >>> unit_scores(maps, torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 2.0]])).tolist()
        [[2.0, 5.0]]
    """
    if not isinstance(maps, Tensor) or maps.dim() != 3:
        raise InvalidInputError(f"maps must be [T, H, W], got {list(maps.shape) if isinstance(maps, Tensor) else maps!r}")
    if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[1] != 4:
        raise InvalidInputError(f"boxes must be [N, 4] (y0, x0, y1, x1), got {list(boxes.shape) if isinstance(boxes, Tensor) else boxes!r}")
    height, width = maps.shape[-2:]
    boxes = boxes.to(device=maps.device, dtype=torch.float32)
    rows = torch.arange(height, device=maps.device, dtype=torch.float32) + 0.5
    cols = torch.arange(width, device=maps.device, dtype=torch.float32) + 0.5
    in_rows = (rows[None] >= boxes[:, 0:1]) & (rows[None] < boxes[:, 2:3])  # [N, H]
    in_cols = (cols[None] >= boxes[:, 1:2]) & (cols[None] < boxes[:, 3:4])  # [N, W]
    inside = (in_rows[:, :, None] & in_cols[:, None, :]).flatten(1).to(maps.dtype)  # [N, H*W]
    count = inside.sum(dim=1)
    sums = maps.flatten(1) @ inside.T  # [T, N]
    return torch.where(count > 0, sums / count.clamp(min=1), torch.full_like(sums, float("nan")))


def _token_curve(score: TokenScorer, scores: Tensor, steps: int, insert: bool, spacing: str,
                 chunk_size: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    if not isinstance(scores, Tensor) or scores.dim() != 2 or scores.shape[1] < 1:
        raise InvalidInputError(f"unit scores must be [T, N] (one row per answer token), got {list(getattr(scores, 'shape', []))}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"steps must be a positive int, got {steps!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidInputError(f"chunk_size must be a positive int, got {chunk_size!r}")
    tokens, n = scores.shape
    counts = _counts(n, steps, spacing)
    unranked = scores.isnan()
    if bool(unranked.any()):  # units without a score are never ranked first: ranked last, kept order
        scores = scores.masked_fill(unranked, float("-inf"))
    ranks = pixel_ranks(scores.float())  # [T, N], 0 = the unit the token's map weighs most
    points = len(counts)
    curve = torch.empty(tokens, points, dtype=torch.float32)
    step_counts = torch.tensor(counts, device=scores.device)
    with torch.no_grad():
        for start, stop in chunks(tokens * points, chunk_size):
            pair = torch.arange(start, stop, device=scores.device)
            token, step = pair // points, pair % points
            chosen = ranks[token] < step_counts[step][:, None]  # the top units at this step [M, N]
            keep = chosen if insert else ~chosen
            got = score(keep, token)
            if not isinstance(got, Tensor) or got.shape != (stop - start,):
                raise InvalidInputError(
                    f"score(keep, tokens) must return one log-probability per row, a tensor [{stop - start}]; got "
                    f"{list(got.shape) if isinstance(got, Tensor) else type(got).__name__}"
                )
            curve[token.cpu(), step.cpu()] = got.detach().float().cpu()
    fractions = torch.tensor(counts, dtype=torch.float32) / n
    return fractions, curve


def token_deletion_curve(
    score: TokenScorer, scores: Tensor, *, steps: int = 20, spacing: str = "even", chunk_size: int = 16
) -> tuple[Tensor, Tensor]:
    """Each answer token's log-probability as the units its map ranks highest are removed.

    Units are ranked per token by ``scores`` (highest first; equal scores in unit order; NaN
    scores last). At step ``k = 0..steps`` the top ``ceil(k * N / steps)`` of the ``N`` units are
    hidden (``spacing="block"``: ``ceil(N / steps)`` more a step, as for
    :func:`camkit.metrics.deletion_curve`) and ``score`` gives the token's log-probability. Step 0
    shows the whole image and the last hides every unit. A faithful map makes the log-probability
    fall fast: a low :func:`camkit.metrics.auc`.

    Args:
        score: ``score(keep, tokens)`` (see :data:`TokenScorer`), called on at most ``chunk_size``
            rows at a time, with gradients off.
        scores: unit scores [T, N], one row per answer token (see :func:`unit_scores`).
        steps: removal steps; the curves have ``steps + 1`` points (``spacing="even"``).
        spacing: ``"even"`` or ``"block"``.
        chunk_size: rows per call of ``score``.

    Returns:
        ``(fractions, curves)``: the fraction of units hidden [S] and log-probabilities [T, S] (CPU, float32).

    Example:
        >>> import torch
        >>> from camkit.metrics import auc
        >>> from camkit.metrics.tokens import token_deletion_curve
        >>> weights = torch.tensor([[3.0, 1.0], [0.0, 2.0]])  # what each token loses when a unit is hidden
        >>> score = lambda keep, tokens: (weights[tokens] * keep).sum(dim=1) - weights[tokens].sum(dim=1)
        >>> fractions, curves = token_deletion_curve(score, weights, steps=2)
        >>> fractions.tolist(), curves.tolist()
        ([0.0, 0.5, 1.0], [[0.0, -3.0, -4.0], [0.0, -2.0, -2.0]])
        >>> auc(fractions, curves).tolist()
        [-2.5, -1.5]
    """
    return _token_curve(score, scores, steps, False, spacing, chunk_size)


def token_insertion_curve(
    score: TokenScorer, scores: Tensor, *, steps: int = 20, spacing: str = "even", chunk_size: int = 16
) -> tuple[Tensor, Tensor]:
    """Each answer token's log-probability as the units its map ranks highest are put back.

    The same ranking and counts as :func:`token_deletion_curve`, from the other end: step 0
    hides every unit, step ``k`` shows only the top ``ceil(k * N / steps)``. A faithful map makes
    the log-probability rise fast: a high :func:`camkit.metrics.auc`.

    Example:
        >>> import torch
        >>> from camkit.metrics.tokens import token_insertion_curve
        >>> weights = torch.tensor([[3.0, 1.0]])
        >>> score = lambda keep, tokens: (weights[tokens] * keep).sum(dim=1) - weights[tokens].sum(dim=1)
        >>> token_insertion_curve(score, weights, steps=2)[1].tolist()
        [[-4.0, -1.0, 0.0]]
    """
    return _token_curve(score, scores, steps, True, spacing, chunk_size)
