"""Shared pieces of the perturbation metrics: input checks, pixel ranking, chunked scoring.

Private: the public names live in :mod:`camkit.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from .._internal.checks import BATCH_SHAPES, check_input_batch
from ..errors import InvalidInputError, InvalidTargetError
from ..targets.classes import OutputSelector, Target, resolve_target, select_output

__all__ = [
    "ANY_MAPS",
    "MAP_SHAPES",
    "ChunkScorer",
    "average_ranks",
    "check_chunk_size",
    "check_images",
    "check_maps",
    "check_model",
    "chunks",
    "nan_maps",
    "pixel_ranks",
]


#: What a batch of maps may be, by its number of dimensions (one less than the inputs').
MAP_SHAPES = {2: "[B, T]", 3: "[B, H, W]", 4: "[B, D, H, W]"}
ANY_MAPS = "[B, T] (signals), [B, H, W] (images) or [B, D, H, W] (volumes or videos)"


def check_model(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def check_images(x: Tensor) -> None:
    """Check inputs [B, C, *S] with 1 to 3 spatial axes, none of them empty."""
    check_input_batch(x)
    if x.shape[0] == 0 or any(size == 0 for size in x.shape[2:]):
        raise InvalidInputError(f"x holds no pixels to measure: shape {list(x.shape)}")


def check_maps(maps: Tensor, x: Tensor | None = None) -> Tensor:
    """Check maps [B, *S] (against inputs [B, C, *S] when given); return them as float.

    Without ``x`` the rank is read from the maps: [B, T], [B, H, W] or [B, D, H, W].
    Maps are moved to ``x``'s device when ``x`` is given. Never modifies ``maps``.
    """
    if not isinstance(maps, Tensor):
        raise InvalidInputError(f"maps must be a tensor {ANY_MAPS}, got {type(maps).__name__}")
    if x is not None:
        expected = MAP_SHAPES[x.dim() - 1]
        if maps.dim() == x.dim() and maps.shape[1] == 1:
            raise InvalidInputError(
                f"maps must be {expected}, got shape {list(maps.shape)}; drop the channel axis with maps[:, 0]"
            )
        if maps.dim() != x.dim() - 1:
            hint = " (add a batch dimension with maps[None])" if tuple(maps.shape) == tuple(x.shape[2:]) else ""
            raise InvalidInputError(
                f"maps must be {expected} for inputs {BATCH_SHAPES[x.dim()]}, got shape {list(maps.shape)}{hint}"
            )
    elif maps.dim() not in MAP_SHAPES:
        raise InvalidInputError(f"maps must be {ANY_MAPS}, got shape {list(maps.shape)}")
    if maps.dtype == torch.bool or maps.is_complex():
        raise InvalidInputError(f"maps must hold real numbers, got dtype {maps.dtype}")
    if x is not None:
        if maps.shape[0] != x.shape[0] or tuple(maps.shape[1:]) != tuple(x.shape[2:]):
            raise InvalidInputError(
                f"maps {list(maps.shape)} do not match the inputs {list(x.shape)}: expected "
                f"{[x.shape[0], *x.shape[2:]]}. Resize maps to the input with "
                "camkit.functional.upsample_maps(maps, x.shape[2:])."
            )
        maps = maps.to(x.device)
    return maps if maps.is_floating_point() else maps.float()


def check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidInputError(f"chunk_size must be a positive int (images per forward pass), got {chunk_size!r}")


def nan_maps(maps: Tensor) -> Tensor:
    """Bool [B]: True where a map [B, *S] holds any NaN."""
    return torch.isnan(maps).flatten(1).any(dim=1)


def pixel_ranks(maps: Tensor) -> Tensor:
    """Rank of every position of maps [B, *S], LongTensor [B, N] (N = T, H*W or D*H*W): 0 for the most relevant.

    Positions are ordered by map value, highest first; equal values keep row-major order
    over all spatial axes (the position nearer the start of the flattened map, the top-left
    pixel of an image, comes first). A stable sort gives exactly this.
    """
    flat = maps.flatten(1)
    order = torch.sort(flat, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    positions = torch.arange(flat.shape[1], device=flat.device).expand_as(order)
    return ranks.scatter_(1, order, positions)


def average_ranks(values: Tensor) -> Tensor:
    """Ranks [B, N] of each row of ``values``, ties given their mean rank (as Spearman needs)."""
    batch, n = values.shape
    sorted_vals, order = torch.sort(values, dim=1, stable=True)
    new_group = torch.ones_like(sorted_vals, dtype=torch.bool)
    new_group[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    group = torch.cumsum(new_group.flatten(), 0).view(batch, n) - 1  # unique ids across rows
    position = torch.arange(n, device=values.device, dtype=torch.float64).expand(batch, n)
    groups = int(group[-1, -1]) + 1
    first = torch.full((groups,), float(n), dtype=torch.float64, device=values.device)
    last = torch.zeros(groups, dtype=torch.float64, device=values.device)
    first.scatter_reduce_(0, group.flatten(), position.flatten(), reduce="amin")
    last.scatter_reduce_(0, group.flatten(), position.flatten(), reduce="amax")
    mean_rank = ((first + last) / 2)[group]
    return torch.empty_like(mean_rank).scatter_(1, order, mean_rank)


def count_for_fraction(fraction: float, n: int) -> int:
    """ceil(fraction * n), with float noise (0.3 * 10 = 3.0000000000000004) rounded away."""
    return math.ceil(round(fraction * n, 9))


def chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(start + size, total)


class ChunkScorer:
    """Score images for fixed per-image targets, chunk by chunk, without gradients.

    Built from the unperturbed batch: :meth:`clean` runs it (in chunks), resolves the
    target there (``None`` is the top-1 class of the unperturbed image) and returns its
    scores [B]. :meth:`score` then scores any chunk of images whose rows belong to the
    images ``owners`` (LongTensor [M]).
    """

    def __init__(
        self, model: nn.Module, target: Target, *, softmax: bool, output: OutputSelector, chunk_size: int
    ) -> None:
        check_model(model)
        check_chunk_size(chunk_size)
        if not isinstance(softmax, bool):
            raise InvalidInputError(f"softmax must be True or False, got {softmax!r}")
        self.model = model
        self.target = target
        self.softmax = softmax
        self.output = output
        self.chunk_size = chunk_size
        self.classes: Tensor | None = None
        self._callable: Callable[[Tensor], Tensor] | None = None
        self._deferred = 0

    def _outputs(self, images: Tensor) -> Tensor:
        out = select_output(self.model(images), self.output)
        return out.softmax(dim=1) if self.softmax else out

    def clean(self, x: Tensor) -> Tensor:
        outs = torch.cat([self._outputs(x[a:b]) for a, b in chunks(x.shape[0], self.chunk_size)])
        classes, scores = resolve_target(self.target, outs)
        if scores.dim() != 1:
            raise InvalidTargetError(
                f"metrics score one target per image, got targets of shape {list(scores.shape)}; "
                "pass one class per image ([B]) and call the metric once per column of a [B, K] target."
            )
        self.classes = classes
        if classes is None:
            self._callable = self.target  # type: ignore[assignment]
        return scores

    def defer(self, batch: int) -> None:
        """Resolve the target from the first scored chunk instead of a clean pass.

        Only for targets that do not need the clean images (anything but ``None``): the
        classes are checked against the width of the first chunk's output.
        """
        if self.target is None:
            raise RuntimeError("target=None needs the clean pass: call clean(x)")
        self._deferred = batch

    def _resolve_deferred(self, out: Tensor) -> None:
        batch, self._deferred = self._deferred, 0
        if callable(self.target) and not isinstance(self.target, Tensor):
            self._callable = self.target
            return
        probe = out.new_zeros(batch, *out.shape[1:])  # only its shape is read: no extra forward
        classes, scores = resolve_target(self.target, probe)
        if scores.dim() != 1:
            raise InvalidTargetError(
                f"metrics score one target per image, got targets of shape {list(scores.shape)}; "
                "pass one class per image ([B]) and call the metric once per column of a [B, K] target."
            )
        self.classes = classes

    def hits(self, images: Tensor, owners: Tensor) -> Tensor:
        """1.0 where an image's top-1 class is its target class, else 0.0 [M] (class targets only)."""
        out = self._outputs(images)
        if self._deferred:
            self._resolve_deferred(out)
        if self.classes is None:
            raise InvalidTargetError(
                "scoring whether the top-1 class is the target needs class targets (None, an int or B ints), "
                "not a callable"
            )
        return (out.argmax(dim=1) == self.classes[owners]).to(out.dtype)

    def score(self, images: Tensor, owners: Tensor) -> Tensor:
        out = self._outputs(images)
        if self._deferred:
            self._resolve_deferred(out)
        if self._callable is not None:
            scores = self._callable(out)
            if not isinstance(scores, Tensor) or scores.shape != (images.shape[0],):
                got = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                raise InvalidTargetError(
                    f"a callable target must return one score per row of the output it is given, "
                    f"[{images.shape[0]}] here, got {got}; metrics call it on chunks of perturbed images."
                )
            return scores
        if self.classes is None:
            raise RuntimeError("ChunkScorer.clean(x) must run before score()")
        return out.gather(1, self.classes[owners][:, None])[:, 0]
