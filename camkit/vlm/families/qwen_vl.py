"""Qwen2-VL and Qwen2.5-VL: dynamic resolution, 2x2 merged patches.

The processor resizes each image (keeping its aspect ratio, no padding) to a multiple of
``patch_size * merge_size`` on both sides and flattens it into patches, one row of ``pixel_values``
``[C * T * P * P]`` per patch, the patches of each ``merge x merge`` block consecutive and the
blocks row-major. Each block becomes one language-model token through the vision tower's merger,
so the image's tokens tile it row-major on a ``(h / merge) x (w / merge)`` grid, and a token's box
in the original image is its cell of that grid stretched back to the image's size.

Grad-CAM's default layer is the merger's output: the vision features exactly as the language
model receives them, one row per image token. Qwen2.5-VL's vision tower runs its blocks on the
patches reordered window by window and puts the merger's rows back in order afterwards, so there a
token's feature row is the row its block holds in window order (``feature_rows`` says which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ._views import View, check_sizes, child, image_positions, keep_masks, sample_tokens, view_baseline
from .base import ImageTokens, config_of, register_family

__all__ = ["Qwen2VLFamily", "Qwen25VLFamily"]


def _visual(model: nn.Module) -> nn.Module:
    """The vision tower of a Qwen-VL model (with or without its generation head)."""
    for owner in (getattr(model, "model", None), model):
        visual = getattr(owner, "visual", None)
        if isinstance(visual, nn.Module):
            return visual
    raise UnsupportedModelError(f"{type(model).__name__} has no Qwen-VL vision tower ('visual')")


def _grid(inputs: Mapping[str, Tensor]) -> Tensor:
    grid = inputs.get("image_grid_thw")
    if not isinstance(grid, Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
        raise InvalidInputError("Qwen-VL inputs need 'image_grid_thw' [n_images, 3] as the processor returns it")
    return grid.detach().cpu().long()


class Qwen2VLFamily:
    """Qwen2-VL: one view per image, ``merge x merge`` patches per token, the merger's output as features.

    Example:
        >>> from camkit.vlm.families.qwen_vl import Qwen2VLFamily
        >>> Qwen2VLFamily().name
        'qwen2_vl'
    """

    name = "qwen2_vl"
    answer_token_type = 0
    model_types: tuple[str, ...] = ("qwen2_vl",)

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model``'s configuration is of this family's ``model_type``."""
        return getattr(config_of(model), "model_type", None) in self.model_types

    def image_token_id(self, model: nn.Module) -> int:
        """The configuration's ``image_token_id``."""
        return int(config_of(model).image_token_id)

    def feature_layer(self, model: nn.Module) -> nn.Module:
        """The vision tower's merger: one output row per image token."""
        return child(_visual(model), "merger")

    def merger_rows(self, model: nn.Module, grid: Tensor) -> Tensor:
        """For each image token of the batch (in sequence order), the merger's output row that feeds it."""
        merge = int(config_of(model).vision_config.spatial_merge_size)
        return torch.arange(int((grid.prod(-1) // merge**2).sum()))

    def layout(
        self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], image_sizes: Sequence[tuple[int, int]]
    ) -> list[ImageTokens]:
        """One :class:`ImageTokens` per sample: each image one view, its tokens on the merged-patch grid."""
        merge = int(config_of(model).vision_config.spatial_merge_size)
        grid = _grid(inputs)
        rows = self.merger_rows(model, grid)
        layouts, image, start = [], 0, 0
        for positions in image_positions(inputs, self.image_token_id(model)):
            views: list[View] = []
            first = image
            while sum(v.grid[0] * v.grid[1] for v in views) < positions.numel():
                if image >= len(grid) or image >= len(image_sizes):
                    raise InvalidInputError("the batch has more image tokens than its image_grid_thw and sizes describe")
                t, h, w = (int(x) for x in grid[image])
                if t != 1:
                    raise InvalidInputError(f"image {image} has {t} temporal patches; only still images are laid out")
                cells = (h // merge, w // merge)
                height, width = image_sizes[image]
                n = cells[0] * cells[1]
                views.append(View(image - first, 0, (0.0, 0.0, float(height), float(width)), cells,
                                  rows[start : start + n], cells))
                image, start = image + 1, start + n
            layouts.append(sample_tokens(positions, views, image_sizes[first:image]))
        if image != len(grid):
            raise InvalidInputError(f"image_grid_thw describes {len(grid)} images but the tokens use {image}")
        check_sizes(image_sizes, image)
        return layouts

    def occlude(
        self, model: nn.Module, inputs: Mapping[str, Tensor], keep: Sequence[Tensor], baseline: float | Tensor
    ) -> Mapping[str, Tensor]:
        """``inputs`` with the patch rows of each dropped token's ``merge x merge`` block set to ``baseline``."""
        vision = config_of(model).vision_config
        merge, patch, frames = int(vision.spatial_merge_size), int(vision.patch_size), int(vision.temporal_patch_size)
        grid = _grid(inputs)
        counts = [p.numel() for p in image_positions(inputs, self.image_token_id(model))]
        masks = keep_masks(keep, counts)
        drop = ~torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)
        pixels = inputs["pixel_values"]
        if drop.numel() * merge**2 != pixels.shape[0]:
            raise InvalidInputError(
                f"pixel_values has {pixels.shape[0]} patch rows for {drop.numel()} image tokens of {merge}x{merge} patches"
            )
        fills = []
        for t, h, w in grid.tolist():
            like = pixels.new_empty(pixels.shape[1] // (frames * patch * patch), h * patch, w * patch)
            fills.append(_patchify(view_baseline(baseline, like), patch, merge, frames).repeat(t, 1))
        rows = drop.to(pixels.device).repeat_interleave(merge**2)
        out = dict(inputs)
        out["pixel_values"] = torch.where(rows[:, None], torch.cat(fills), pixels)
        return out


class Qwen25VLFamily(Qwen2VLFamily):
    """Qwen2.5-VL: as Qwen2-VL, with the merger's rows in the vision tower's window order.

    Example:
        >>> from camkit.vlm.families.qwen_vl import Qwen25VLFamily
        >>> Qwen25VLFamily().name
        'qwen2_5_vl'
    """

    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)

    def merger_rows(self, model: nn.Module, grid: Tensor) -> Tensor:
        from transformers.vision_utils import get_vision_window_index

        vision = config_of(model).vision_config
        window_index, _ = get_vision_window_index(
            grid, spatial_merge_size=int(vision.spatial_merge_size), window_size=int(vision.window_size),
            patch_size=int(vision.patch_size),
        )
        return torch.argsort(window_index.cpu())


def _patchify(view: Tensor, patch: int, merge: int, frames: int) -> Tensor:
    """One view [C, h, w] as the processor's patch rows [h * w / patch**2, C * frames * patch * patch]."""
    channels, height, width = view.shape
    gh, gw = height // patch, width // patch
    blocks = view.reshape(channels, gh // merge, merge, patch, gw // merge, merge, patch)
    blocks = blocks.permute(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
    blocks = blocks.unsqueeze(5).expand(-1, -1, -1, -1, -1, frames, -1, -1)
    return blocks.reshape(gh * gw, channels * frames * patch * patch)


register_family(Qwen2VLFamily())
register_family(Qwen25VLFamily())
