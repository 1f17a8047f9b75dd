"""Views on a grid: the shared arithmetic of the families whose image tokens tile views of the image.

A *view* is the whole image or one crop of it, as the processor resized it to a grid of
language-model tokens (row-major). The feature layer's rows for that view lie on a finer or equal
grid (row-major too) whose ``k x k`` blocks feed one token (Qwen-VL's 2x2 merger, Idefics3's pixel
shuffle, Gemma 3's pooling). :func:`sample_tokens` turns a sample's views into an
:class:`~camkit.vlm.families.base.ImageTokens`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from .base import ImageTokens

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class View:
    """One view of one image: its box in the original image, its token grid and its feature rows.

    Attributes:
        image: which of the sample's images.
        view: 0 for the whole image, 1.. for crops in the processor's order.
        box: ``(y0, x0, y1, x1)`` the view covers in the original image.
        grid: ``(rows, cols)`` of its language-model tokens, row-major.
        rows: LongTensor [fh * fw], the feature layer's row of each cell of the feature grid (row-major).
        row_grid: ``(fh, fw)``, the feature grid; a multiple of ``grid`` on both axes.
    """

    image: int
    view: int
    box: Box
    grid: tuple[int, int]
    rows: Tensor
    row_grid: tuple[int, int]


def child(module: nn.Module, name: str) -> nn.Module:
    """``module``'s submodule ``name``, or an error that names what the model lacks."""
    found = getattr(module, name, None)
    if not isinstance(found, nn.Module):
        raise UnsupportedModelError(f"{type(module).__name__} has no submodule {name!r} where this family expects one")
    return found


def grid_boxes(box: Box, rows: int, cols: int) -> Tensor:
    """The ``rows x cols`` cells tiling ``box``, row-major: float64 [rows * cols, 4].

    Example:
        >>> from camkit.vlm.families._views import grid_boxes
        >>> grid_boxes((0.0, 0.0, 4.0, 6.0), 1, 2).tolist()
        [[0.0, 0.0, 4.0, 3.0], [0.0, 3.0, 4.0, 6.0]]
    """
    y0, x0, y1, x1 = box
    ys = torch.linspace(y0, y1, rows + 1, dtype=torch.float64)
    xs = torch.linspace(x0, x1, cols + 1, dtype=torch.float64)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    return torch.stack([ys[r], xs[c], ys[r + 1], xs[c + 1]], dim=1)


def block_index(row_grid: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """For each cell of the fine ``row_grid`` (row-major), the cell of the coarse ``grid`` it falls in.

    Example:
        >>> from camkit.vlm.families._views import block_index
        >>> block_index((2, 4), (1, 2)).tolist()
        [0, 0, 1, 1, 0, 0, 1, 1]
    """
    (fh, fw), (gh, gw) = row_grid, grid
    if fh % gh or fw % gw:
        raise InvalidInputError(f"a feature grid {fh}x{fw} does not divide into {gh}x{gw} tokens")
    r, c = torch.meshgrid(torch.arange(fh), torch.arange(fw), indexing="ij")
    return ((r // (fh // gh)) * gw + c // (fw // gw)).reshape(-1)


def image_positions(inputs: Mapping[str, Tensor], token_id: int) -> list[Tensor]:
    """Per sample, the ascending positions where ``input_ids`` is the image token."""
    ids = inputs.get("input_ids")
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise InvalidInputError("the processed inputs need 'input_ids' [B, L] to lay out the image tokens")
    return [torch.nonzero(row == token_id).reshape(-1).cpu() for row in ids]


def runs(positions: Tensor) -> list[Tensor]:
    """``positions`` (ascending) split where they stop being consecutive.

    Example:
        >>> import torch
        >>> from camkit.vlm.families._views import runs
        >>> [r.tolist() for r in runs(torch.tensor([3, 4, 5, 9, 10]))]
        [[3, 4, 5], [9, 10]]
    """
    if positions.numel() == 0:
        return []
    breaks = torch.nonzero(positions[1:] != positions[:-1] + 1).reshape(-1) + 1
    return list(torch.tensor_split(positions, breaks.tolist()))


def sample_tokens(positions: Tensor, views: Sequence[View], sizes: Sequence[tuple[int, int]]) -> ImageTokens:
    """The :class:`ImageTokens` of a sample whose image tokens are ``views``' tokens in order."""
    count = sum(v.grid[0] * v.grid[1] for v in views)
    if count != positions.numel():
        raise InvalidInputError(
            f"the sample has {positions.numel()} image tokens but its images' views make {count}; pass the inputs "
            "exactly as the model's processor returned them"
        )
    boxes, image, view, rows, token, fboxes, fimage, fview = ([] for _ in range(8))
    offset = 0
    for v in views:
        n = v.grid[0] * v.grid[1]
        boxes.append(grid_boxes(v.box, *v.grid))
        image.append(torch.full((n,), v.image))
        view.append(torch.full((n,), v.view))
        rows.append(v.rows.reshape(-1).cpu())
        token.append(block_index(v.row_grid, v.grid) + offset)
        fboxes.append(grid_boxes(v.box, *v.row_grid))
        r = v.row_grid[0] * v.row_grid[1]
        fimage.append(torch.full((r,), v.image))
        fview.append(torch.full((r,), v.view))
        offset += n
    cat = torch.cat
    return ImageTokens(
        positions=positions.long(), boxes=cat(boxes).float(), image=cat(image).long(), view=cat(view).long(),
        feature_rows=cat(rows).long(), feature_token=cat(token).long(), feature_boxes=cat(fboxes).float(),
        feature_image=cat(fimage).long(), feature_view=cat(fview).long(),
        sizes=tuple((int(h), int(w)) for h, w in sizes),
    )


def check_sizes(image_sizes: Sequence[tuple[int, int]], used: int) -> None:
    """Raise unless every one of ``image_sizes`` was used by the batch's image tokens."""
    if used != len(image_sizes):
        raise InvalidInputError(
            f"the batch's image tokens come from {used} images but {len(image_sizes)} image sizes were given"
        )


def keep_masks(keep: Sequence[Tensor], counts: Sequence[int]) -> list[Tensor]:
    """``keep`` checked against each sample's number of image tokens: one bool [N_b] per sample, on the CPU."""
    if len(keep) != len(counts):
        raise InvalidInputError(f"keep needs one mask per sample: {len(counts)} samples, {len(keep)} masks")
    masks = []
    for b, (mask, count) in enumerate(zip(keep, counts)):
        mask = torch.as_tensor(mask).reshape(-1).bool().cpu()
        if mask.numel() != count:
            raise InvalidInputError(f"keep[{b}] has {mask.numel()} entries for the sample's {count} image tokens")
        masks.append(mask)
    return masks


def view_baseline(baseline: float | Tensor, like: Tensor) -> Tensor:
    """``baseline`` broadcast to one view's pixels ``like`` [C, h, w], in its dtype and device."""
    value = torch.as_tensor(baseline, dtype=like.dtype, device=like.device)
    try:
        return value.expand_as(like)
    except RuntimeError as err:
        raise InvalidInputError(
            f"baseline must be a number or broadcast to one view's pixels {list(like.shape)}, got {list(value.shape)}"
        ) from err


def occlude_views(views: Tensor, drop: Tensor, baseline: float | Tensor) -> Tensor:
    """Views [V, C, S, S] with the cells of a ``side x side`` token grid where ``drop`` [V, side * side] is True
    set to ``baseline`` (broadcast to one view). A new tensor; ``views`` is not changed.

    Example:
        >>> import torch
        >>> from camkit.vlm.families._views import occlude_views
        >>> out = occlude_views(torch.ones(1, 1, 4, 4), torch.tensor([[True, False, False, False]]), 0.0)
        >>> out[0, 0].tolist()
        [[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    count, _, size, _ = views.shape
    side = math.isqrt(drop.shape[1])
    cell = size // side
    mask = drop.to(views.device).view(count, side, side).repeat_interleave(cell, 1).repeat_interleave(cell, 2)
    fill = view_baseline(baseline, views[0]) if count else views
    return torch.where(mask[:, None], fill, views)
