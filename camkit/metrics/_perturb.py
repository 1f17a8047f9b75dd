"""The machinery the perturbation metrics share: features, perturbation plans, chunked scoring.

Private: the public names live in :mod:`camkit.metrics`. The contract every metric of the
faithfulness, axiomatic and complexity families follows:

* **Call.** ``metric(model, x, maps, target=None, *, baseline=..., generator=None,
  chunk_size=32, softmax=..., output=None, keep_mode=False, ...) -> Tensor [B]`` (one value per
  sample; a metric with a curve returns the curve ``[B, P]``). Metrics that need no model
  (complexity) take ``maps`` alone.
* **Ranks.** Inputs ``x`` are ``[B, C, *S]`` with one to three spatial axes (signals, images,
  volumes and videos through the same code). Maps are ``[B, *S]`` or ``[B, 1, *S]``: a
  *feature* is then one position (all channels perturbed together); or ``[B, C, *S]``:
  a feature is one element (one channel of one position), the layout Quantus uses once it
  has broadcast a map to the input's shape. :func:`as_features` reads either.
* **Targets, baselines, the model run.** Targets are those of :func:`camkit.metrics.deletion_curve`
  (resolved on the clean inputs); baselines are :data:`camkit.metrics.Baseline` (default
  0.0: Quantus's "black" is each sample's minimum, which camkit's compat layer passes as a
  callable). The model runs through :class:`~camkit.metrics._common.ChunkScorer`, without
  gradients, in eval mode with every module's flag restored after (:func:`run_plan`).
* **Plans.** A metric describes its perturbations as a plan: ``count`` perturbations per sample
  and a function ``build(owner, index) -> images [M, C, *S]`` that makes perturbation
  ``index[m]`` of sample ``owner[m]``. :func:`run_plan` packs all ``B * count`` (sample,
  perturbation) pairs, sample-major, into model batches of at most ``chunk_size`` and returns
  the target's scores ``[B, count]``. Results never depend on ``chunk_size``.
* **Randomness.** Every random draw comes from an explicit ``torch.Generator`` and is drawn
  before the model runs (so the plan, not the chunking, fixes the draws); a metric with
  random perturbations also accepts the drawn plan itself (feature subsets, noise), which
  is how its tests replay Quantus's numpy draws.
* **Results** are on ``x``'s device; a map holding NaN gives NaN for that sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import ChunkScorer, check_images, check_maps, chunks

__all__ = [
    "Features", "Perturb", "as_features", "check_count", "pearson", "run_plan", "spearman_rows", "step_indices", "step_masks",
    "stepwise",
]  # fmt: skip

#: A caller's perturbation: ``perturb(images [B, C, *S], indices LongTensor [B, k]) -> images [B, C, *S]``
#: replaces the ``k`` features ``indices`` (into each sample's flattened features) of the whole batch
Perturb = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Features:
    """Maps read as features: ``values`` [B, F] and the per-sample shape a feature mask takes.

    ``shape`` is ``(1, *S)`` when a feature is a position (perturbed in every channel) and
    ``(C, *S)`` when it is one element; :meth:`mask` turns boolean [M, F] into [M, *shape],
    which broadcasts against inputs [M, C, *S].
    """

    values: Tensor
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.values.shape[1]

    def mask(self, chosen: Tensor) -> Tensor:
        return chosen.view(chosen.shape[0], *self.shape)

    def nan(self) -> Tensor:
        """Bool [B]: True where a map holds NaN."""
        return torch.isnan(self.values).any(dim=1)


def as_features(maps: Tensor, x: Tensor) -> Features:
    """Check maps against inputs [B, C, *S] and read them as :class:`Features`.

    Maps [B, *S] and [B, 1, *S] give one feature per position; [B, C, *S] one per element.
    """
    check_images(x)
    if isinstance(maps, Tensor) and maps.dim() == x.dim():
        channels = x.shape[1]
        if maps.shape[1] not in (1, channels) or maps.shape[0] != x.shape[0] or maps.shape[2:] != x.shape[2:]:
            raise InvalidInputError(
                f"maps {list(maps.shape)} do not match the inputs {list(x.shape)}: expected "
                f"{[x.shape[0], *x.shape[2:]]}, {[x.shape[0], 1, *x.shape[2:]]} or {list(x.shape)} "
                "(one value per channel). Resize maps with camkit.functional.upsample_maps."
            )
        if maps.dtype == torch.bool or maps.is_complex():
            raise InvalidInputError(f"maps must hold real numbers, got dtype {maps.dtype}")
        values = maps.detach().to(x.device)
        values = values if values.is_floating_point() else values.float()
        return Features(values.flatten(1), tuple(values.shape[1:]))
    values = check_maps(maps, x).detach()
    return Features(values.flatten(1), (1, *x.shape[2:]))


def check_count(value: int, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def step_masks(order: Tensor, step: Tensor, size: int, *, cumulative: bool) -> Tensor:
    """Bool [M, F]: the features perturbed at ``step`` [M] of an ordering.

    ``order`` [M, F] holds each feature's rank (0 is perturbed first); step ``k`` takes ranks
    ``[k * size, (k + 1) * size)``, or ``[0, (k + 1) * size)`` when ``cumulative``.
    """
    stop = ((step + 1) * size)[:, None]
    if cumulative:
        return order < stop
    return (order >= stop - size) & (order < stop)


def run_plan(
    model: nn.Module,
    x: Tensor,
    target: Target,
    build: Callable[[Tensor, Tensor], Tensor],
    count: int,
    *,
    softmax: bool,
    chunk_size: int,
    output: OutputSelector,
    keep_mode: bool,
    clean: bool = True,
    steps: Callable[[int], Tensor] | None = None,
) -> tuple[Tensor | None, Tensor]:
    """Score ``count`` perturbations of every sample, chunk by chunk, without gradients.

    Args:
        build: ``build(owner, index) -> images [M, C, *S]``: perturbation ``index[m]`` of
            sample ``owner[m]`` (both LongTensor [M], on ``x``'s device).
        clean: also score the unperturbed inputs (always done for ``target=None``, whose
            class is the clean top-1).
        steps: instead of ``build``, ``steps(k) -> images [B, C, *S]``, perturbation ``k`` of the
            whole batch, called once for each ``k`` in order (a caller's perturbation that carries
            state from step to step, see :func:`stepwise`); its images are scored in chunks.

    Returns:
        ``(clean_scores [B] or None, scores [B, count])``.
    """
    scorer = ChunkScorer(model, target, softmax=softmax, output=output, chunk_size=chunk_size)
    batch = x.shape[0]
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        base: Tensor | None = None
        if clean or target is None:
            base = scorer.clean(x)
        else:
            scorer.defer(batch)
        scores: Tensor | None = None
        if steps is not None:
            scores = _score_steps(scorer, steps, batch, count, x)
        for start, stop in chunks(0 if steps is not None else batch * count, chunk_size):
            pair = torch.arange(start, stop, device=x.device)
            owner, index = pair // count, pair % count
            images = build(owner, index)
            got = scorer.score(images, owner)
            if scores is None:
                scores = torch.empty(batch, count, dtype=got.dtype, device=x.device)
            scores[owner, index] = got.to(scores.dtype)
        if scores is None:  # count == 0
            dtype = base.dtype if base is not None else x.dtype
            scores = torch.empty(batch, 0, dtype=dtype, device=x.device)
    return (None if not clean else base), scores


def _score_steps(scorer: ChunkScorer, steps: Callable[[int], Tensor], batch: int, count: int, x: Tensor) -> Tensor | None:
    scores: Tensor | None = None
    for k in range(count):
        images = steps(k)
        if not isinstance(images, Tensor) or images.shape != x.shape:
            shape = list(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise InvalidInputError(f"a perturbation must return images shaped like the inputs {list(x.shape)}, got {shape}")
        for start, stop in chunks(batch, scorer.chunk_size):
            owner = torch.arange(start, stop, device=x.device)
            got = scorer.score(images[start:stop].to(x.device, x.dtype), owner)
            if scores is None:
                scores = torch.empty(batch, count, dtype=got.dtype, device=x.device)
            scores[start:stop, k] = got.to(scores.dtype)
    return scores


def step_indices(features: Features, step: int, *, descending: bool | None) -> Callable[[int], Tensor]:
    """``indices(k)``: the features [B, <= step] of step ``k``, in the order they are taken.

    ``descending``: by decreasing (True) or increasing (False) map value, ties in index order
    (a stable sort); None: in index order.
    """
    values = features.values
    if descending is None:
        perm = torch.arange(features.count, device=values.device).expand(values.shape[0], -1)
    else:
        perm = torch.sort(values, dim=1, descending=descending, stable=True).indices
    return lambda k: perm[:, k * step : (k + 1) * step]


def stepwise(
    perturb: Perturb, start: Tensor, indices: Callable[[int], Tensor], *, cumulative: bool, repeat: int = 1
) -> Callable[[int], Tensor]:
    """:func:`run_plan`'s ``steps`` from a caller's perturbation: step ``k`` perturbs ``indices(k // repeat)``.

    ``cumulative``: each step perturbs the previous step's images (the first ``start``);
    otherwise every step perturbs ``start``. ``repeat`` calls the perturbation that many times
    per group of features (independent draws of a random perturbation).
    """
    state = [start]

    def images(k: int) -> Tensor:
        out = perturb(state[0], indices(k // repeat))
        if cumulative:
            state[0] = out
        return out

    return images


def pearson(a: Tensor, b: Tensor) -> Tensor:
    """Pearson's correlation of each row pair of [B, N] tensors, [B] (NaN for a constant row)."""
    a = a.double() - a.double().mean(dim=1, keepdim=True)
    b = b.double() - b.double().mean(dim=1, keepdim=True)
    den = a.norm(dim=1) * b.norm(dim=1)
    num = (a * b).sum(dim=1)
    r = (num / den).clamp(-1.0, 1.0)
    return torch.where(den > 0, r, torch.full_like(r, float("nan")))


def _average_ranks(v: Tensor) -> Tensor:
    """Ranks 1..N of each row of [B, N], ties given their average rank (as scipy.stats.rankdata)."""
    sorted_v, order = torch.sort(v, dim=1, stable=True)
    n = v.shape[1]
    pos = torch.arange(1, n + 1, dtype=torch.float64, device=v.device).expand(v.shape[0], n)
    new_group = torch.ones_like(sorted_v, dtype=torch.bool)
    new_group[:, 1:] = sorted_v[:, 1:] != sorted_v[:, :-1]
    group = new_group.long().cumsum(dim=1) - 1  # group id per sorted position
    sums = torch.zeros(v.shape[0], n, dtype=torch.float64, device=v.device).scatter_add_(1, group, pos)
    sizes = torch.zeros(v.shape[0], n, dtype=torch.float64, device=v.device).scatter_add_(
        1, group, torch.ones_like(pos)
    )
    mean_rank = (sums / sizes.clamp(min=1)).gather(1, group)
    return torch.empty_like(mean_rank).scatter_(1, order, mean_rank)


def spearman_rows(a: Tensor, b: Tensor) -> Tensor:
    """Spearman's rank correlation of each row pair of [B, N] tensors, [B] (ties: average ranks)."""
    return pearson(_average_ranks(a.double()), _average_ranks(b.double()))
