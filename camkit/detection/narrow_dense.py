"""A candidate's score with the backward graph of only what it depends on (ultralytics' dense heads).

An ultralytics detector (YOLOv8, YOLO11 and their segment and pose variants) scores every
position of every pyramid level: a box branch (``cv2``) and a class branch (``cv3``) per level,
both run over the whole feature map. A :class:`~camkit.DetectionTarget` reads one candidate's
class probability, the sigmoid of ``cv3[level]`` at one position: a plain forward builds the
graph of both branches at every position of every level and the backward runs through all of
it. Here the head runs without autograd; the candidate each reference picked is located (its
level, row and column), and the class branch of that level is run again, with a graph, on the
window of the level's feature map that the position sees (a stride-1 branch of 3x3
convolutions sees two rows and columns around it). The window keeps its size at the map's
border by sliding inwards, so the branch's zero padding falls where the full map's does: the
score is the same value and its gradient at any layer before the head is the same.

On the host, only the levels that hold a picked candidate are rerun: a layer that feeds only
the other levels gets the gradient the full graph gives it, zero (see ``unreached_zero`` in
:mod:`camkit.detection.narrow`). On a device, where reading which levels those are would wait
for it, every level's window is scored and each candidate's level selected with
``torch.where``: no host read, and the backward also visits the other levels' windows (with a
zero gradient) and the neck between them.

Used by :mod:`camkit.detection.narrow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import Tensor, nn

from .._internal import syncs as _syncs
from .._internal.state import GradModes
from ..hooks import HookScope
from ..layers.families.ultralytics import is_ultralytics
from .outputs import default_output

__all__ = ["branch_at", "by_level", "dense_head", "narrowed_dense_scores", "reach"]

Narrow = Callable[[Tensor], Tensor]

_HEADS = ("Detect", "Segment", "Pose")
_POINTWISE = (nn.BatchNorm2d, nn.Identity, nn.SiLU, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardswish, nn.Sigmoid,
              nn.GELU, nn.Mish, nn.Tanh)
_WRAPPERS = ("Conv", "DWConv")  # ultralytics' act(bn(conv(x)))


def reach(branch: nn.Module) -> tuple[int, int] | None:
    """How many rows and columns around an output position a branch's value depends on, else ``None``.

    Known for a branch made only of stride-1, zero-padded "same" ``nn.Conv2d`` layers (any
    kernel, dilation and groups), batch norms and pointwise activations, in sequence
    (``nn.Sequential``, a subclass of it that keeps its ``forward`` such as torchvision's
    ``Conv2dNormActivation``, and ultralytics' ``Conv``/``DWConv``); ``None`` for anything else,
    a group norm included (its statistics span every position).

    Example:
        >>> from torch import nn
        >>> from camkit.detection.narrow_dense import reach
        >>> reach(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.SiLU(), nn.Conv2d(4, 2, (1, 5), padding=(0, 2))))
        (1, 3)
        >>> reach(nn.Sequential(nn.Conv2d(4, 4, 3, stride=2, padding=1))) is None
        True
    """
    rows = cols = 0
    for module in branch.modules():
        kind = type(module)
        if _chains(kind) or (kind.__name__ in _WRAPPERS and kind.__module__.startswith("ultralytics")):
            continue
        if kind is nn.Conv2d:
            conv: nn.Conv2d = module  # type: ignore[assignment]
            kernel, dilation = conv.kernel_size, conv.dilation
            same = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))
            if (conv.stride != (1, 1) or conv.padding_mode != "zeros" or conv.padding != same
                    or any(k % 2 == 0 for k in kernel)):
                return None
            rows, cols = rows + same[0], cols + same[1]
        elif not isinstance(module, _POINTWISE) or not kind.__module__.startswith("torch."):
            return None  # anything else, a subclass of a pointwise layer included, may mix positions
    return rows, cols


def _chains(kind: type) -> bool:
    """Whether a container runs its children one after the other: ``nn.Sequential``'s own ``forward``."""
    return issubclass(kind, nn.Sequential) and kind.forward is nn.Sequential.forward


def branch_at(
    branch: nn.Module, feature: Tensor, image: Tensor, row: Tensor, col: Tensor, *, cheapest: bool = False
) -> Tensor:
    """``branch(feature)[image, :, row, col]`` [M, C_out], computed from the window each position reads.

    ``feature`` is [B, C, H, W]; ``image``, ``row`` and ``col`` are [M] and must lie in it. Where
    :func:`reach` knows the branch's reach, it runs on one window per position, of ``2 * reach + 1``
    rows and columns (the whole extent where the map is smaller); the window keeps its size at the
    border by sliding inwards, so the branch's zero padding falls where the whole map's does and the
    value is the one the whole map gives. Otherwise, and with ``cheapest=True`` where the M windows
    hold more positions than the B maps (many positions on a small map), the branch runs on every
    image's whole map: the same values.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.detection.narrow_dense import branch_at
        >>> branch = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 1, 3, padding=1))
        >>> x = torch.rand(2, 2, 9, 9)
        >>> image, row, col = torch.tensor([0, 1]), torch.tensor([0, 4]), torch.tensor([8, 4])
        >>> torch.allclose(branch_at(branch, x, image, row, col), branch(x)[image, :, row, col], atol=1e-6)
        True
    """
    seen = reach(branch)
    height, width = int(feature.shape[-2]), int(feature.shape[-1])
    rows, cols = (height, width) if seen is None else (min(2 * seen[0] + 1, height), min(2 * seen[1] + 1, width))
    if seen is None or (cheapest and row.shape[0] * rows * cols >= feature.shape[0] * height * width):
        return branch(feature)[image, :, row, col]
    top = (row - (rows - 1) // 2).clamp(0, height - rows)  # the window slides inwards at the border
    left = (col - (cols - 1) // 2).clamp(0, width - cols)
    index_rows = (top[:, None] + torch.arange(rows, device=row.device))[:, :, None]  # [M, rows, 1]
    index_cols = (left[:, None] + torch.arange(cols, device=row.device))[:, None, :]  # [M, 1, cols]
    windows = feature[image[:, None, None], :, index_rows, index_cols]  # [M, rows, cols, C]
    out = branch(windows.permute(0, 3, 1, 2).contiguous())  # [M, C_out, rows, cols]
    each = torch.arange(row.shape[0], device=row.device)
    return out[each, :, row - top, col - left]


def dense_head(model: nn.Module, target: Any, layers: Sequence[str], output: Any) -> nn.Module | None:
    """The ultralytics head whose class branch can be rerun for the picked candidates, else ``None``.

    ``None`` when the model is not an ultralytics detector (or its segment or pose variant) in
    eval mode, the head is end-to-end (NMS-free: the output is post-processed), an ``output=``
    selector is set, the target does not report the candidates it picked, or a layer lies inside
    the head (its gradient then needs the head's whole graph).
    """
    if output not in (None, default_output(model)) or model.training:
        return None  # the target must read the raw candidates, as camkit's default output gives them
    if not callable(getattr(target, "picked_labels", None)):
        return None
    if is_ultralytics(model) not in ("DetectionModel", "SegmentationModel", "PoseModel"):
        return None
    head = cast(nn.Module, model.model[-1])  # type: ignore[index]
    if type(head).__name__ not in _HEADS or not type(head).__module__.startswith("ultralytics"):
        return None
    if getattr(head, "end2end", False) or getattr(head, "export", False):
        return None
    branches = getattr(head, "cv3", None)
    if not isinstance(branches, nn.ModuleList) or len(branches) != getattr(head, "nl", -1):
        return None
    name = next(n for n, m in model.named_modules() if m is head)
    if any(layer == name or layer.startswith(name + ".") for layer in layers):
        return None
    return head


@contextmanager
def narrowed_dense_scores(head: nn.Module, target: Any) -> Iterator[Narrow]:
    """Inside the block, ``head`` runs without autograd; yields ``narrow(scores)`` (see the module docstring)."""
    seen: dict[str, Any] = {}
    modes = GradModes()

    def off(module: nn.Module, args: Any) -> None:
        modes.enter(False)
        seen["features"] = list(args[0])  # [B, C_l, H_l, W_l] per level, attached to the neck's graph

    def back(module: nn.Module, args: Any, out: Any) -> None:
        modes.leave()

    with modes, HookScope() as scope:
        scope.forward_pre(head, off)
        scope.forward(head, back)
        yield lambda scores: _rescore(head, seen["features"], target, scores)


def _rescore(head: nn.Module, features: list[Tensor], target: Any, scores: Tensor) -> Tensor:
    """The target's scores [B] or [B, N], recomputed with a graph from the picked candidates' windows alone."""
    picked, labels = target.picked(), target.picked_labels()  # [B, N] each
    batch, count = picked.shape
    image = torch.arange(batch, device=picked.device).repeat_interleave(count)  # [M], M = B * N
    candidate, label = picked.reshape(-1), labels.reshape(-1)
    branches = cast(nn.ModuleList, head.cv3)
    rescored = by_level(
        candidate,
        [int(f.shape[-2]) * int(f.shape[-1]) for f in features],
        lambda level, local: _window_score(features[level], branches[level], image, local, label),
    )
    assert rescored is not None  # no check to fail
    return rescored.view(batch, count) if scores.dim() == 2 else rescored.view(scores.shape)


def by_level(
    candidate: Tensor, counts: Sequence[int], score: Callable[[int, Tensor], Tensor], check: Tensor | None = None
) -> Tensor | None:
    """Each candidate's score [M], computed with a graph on the level it lies on.

    ``candidate`` [M] indexes the head's outputs laid out level after level, ``counts[l]`` entries
    for level ``l``; ``score(level, local)`` gives [M] scores from the positions ``local`` [M] within
    that level (values for candidates of other levels are discarded). On the host only the levels
    holding a candidate are scored, and ``check`` (bool [M], optional) is read in the same read:
    ``None`` if any of it is false. On a device every level is scored, merged with ``torch.where``,
    and nothing is read: a candidate whose ``check`` is false scores NaN, with no gradient (its map
    comes out flat), rather than a score that may be another candidate's.
    """
    starts = [sum(counts[:level]) for level in range(len(counts))]
    inside = [(candidate >= start) & (candidate < start + n) for start, n in zip(starts, counts)]
    levels = list(range(len(counts)))
    on_host = _syncs.reads_are_free(candidate)
    if on_host:
        extra = [] if check is None else [check.all()]
        read = torch.stack([mask.any() for mask in inside] + extra).tolist()
        if check is not None and not read[-1]:
            return None
        levels = [level for level in levels if read[level]]
    rescored: Tensor | None = None
    with torch.enable_grad():
        for level in levels:
            value = score(level, candidate - starts[level])
            rescored = value if rescored is None else torch.where(inside[level], value, rescored)
        rescored = cast(Tensor, rescored)  # every candidate lies on one level
        if check is not None and not on_host:
            rescored = torch.where(check, rescored, torch.full_like(rescored, math.nan))
    return rescored


def _window_score(feature: Tensor, branch: nn.Module, image: Tensor, local: Tensor, label: Tensor) -> Tensor:
    """sigmoid(branch(feature))[image, label, row, col] [M] from a window around each position ``local`` [M].

    Positions outside ``[0, H * W)`` (candidates of another level) give a value to be discarded.
    """
    height, width = int(feature.shape[-2]), int(feature.shape[-1])
    local = local.clamp(0, height * width - 1)
    logits = branch_at(branch, feature, image, local // width, local % width)  # [M, K]
    return logits.gather(1, label[:, None])[:, 0].sigmoid()
