"""Idefics3 and SmolVLM: image splitting into crops plus the global image, pixel shuffle.

The processor stretches an image to ``rows * S`` by ``cols * S`` pixels (``S`` the vision tower's
``image_size``), cuts it into ``rows x cols`` crops of ``S x S`` and adds the whole image stretched
to ``S x S`` (a small image, or one processed without splitting, is the global image alone). In the
text each crop's tokens follow ``<fake_token_around_image><row_i_col_j>``, a line break ends each
row of crops, and the global image's tokens follow ``<fake_token_around_image><global-img>``, so
the layout is read from ``input_ids``: a run of image tokens is one view, the runs that follow the
token before the sample's last run are global images (each closes an image), and a crop run whose
third token back is not an image token starts a new row (for a tokenizer that drops line breaks,
the image processor's own count of rows and columns for the image's size stands in). The vision tower sees each view as
``(S / P) x (S / P)`` patches; the connector's pixel shuffle turns each ``scale x scale`` block of
patches into one language-model token.

Grad-CAM's default layer is the vision tower's last hidden state (its ``post_layernorm``), the
features the connector takes: one row per patch, ``scale**2`` rows (9 for Idefics3, 16 for SmolVLM)
to each token. The connector is a pixel shuffle and a linear map, so its output carries the same
information, but packed ``scale**2`` patches to a row with a separate set of channels for each
place in the block: Grad-CAM's one weight per channel means one weight per channel and sub-position
there, and the map comes out ``scale`` times coarser on each side. The hidden state keeps one set of
channels for every patch, as LLaVA's selected hidden state does; ``layer=`` picks the connector.

Views are numbered 0 for the global image and 1.. for the crops in the processor's (row-major)
order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ._views import Box, View, check_sizes, child, image_positions, keep_masks, occlude_views, runs, sample_tokens
from .base import ImageTokens, config_of, register_family

__all__ = ["Idefics3Family", "SmolVLMFamily"]


def _vision(model: nn.Module) -> nn.Module:
    for owner in (getattr(model, "model", None), model):
        vision = getattr(owner, "vision_model", None)
        if isinstance(vision, nn.Module):
            return vision
    raise UnsupportedModelError(f"{type(model).__name__} has no Idefics3-style vision tower ('vision_model')")


def _image_groups(ids: Tensor, spans: list[Tensor], image_id: int) -> list[list[Tensor]]:
    """The sample's runs of image tokens grouped by image: crops first, the global image's run last."""
    if not spans:
        return []
    global_tag = int(ids[int(spans[-1][0]) - 1])
    groups: list[list[Tensor]] = [[]]
    for span in spans:
        groups[-1].append(span)
        if int(ids[int(span[0]) - 1]) == global_tag:
            groups.append([])
    if groups[-1]:
        raise InvalidInputError("a run of image tokens is not followed by a global image; inputs not from the processor")
    return groups[:-1]


def _columns(ids: Tensor, crops: list[Tensor], image_id: int) -> int | None:
    """The number of crops per row (a crop whose third token back is no image token starts a row); ``None`` when
    the text has no row break to read (a tokenizer that drops line breaks)."""
    starts = [j for j in range(1, len(crops)) if int(ids[int(crops[j][0]) - 3]) != image_id]
    if not starts:
        return None
    cols = starts[0]
    if len(crops) % cols or starts != list(range(cols, len(crops), cols)):
        raise InvalidInputError(
            f"cannot read a grid of crops from {len(crops)} crop runs with row breaks before {starts}; the image "
            "layout needs the processor's text (a line break token after each row of crops)"
        )
    return cols


def _grid_of(processor: Any, size: tuple[int, int], crops: int, cols: int | None) -> tuple[int, int]:
    """``(rows, cols)`` of an image's ``crops``: as read from the text, else as the image processor cuts them."""
    if cols is None and crops > 1:
        count = getattr(getattr(processor, "image_processor", None), "get_number_of_image_patches", None)
        rows, cols = count(int(size[0]), int(size[1]), {})[1:] if count is not None else (1, crops)
        if rows * cols != crops:
            raise InvalidInputError(
                f"{crops} crops without row breaks in the text, and the processor cuts this image into {rows}x{cols}"
            )
        return int(rows), int(cols)
    cols = cols or crops
    return (crops // cols, cols) if crops else (0, 0)


def _views_of(index: int, grid: tuple[int, int], size: tuple[int, int], first_row: int, patches: int,
              side: int) -> list[View]:
    """The views of one image: its crops row-major (views 1..), then the global image (view 0)."""
    (rows, cols), (height, width) = grid, (float(size[0]), float(size[1]))
    boxes: list[tuple[int, Box]] = [
        (1 + i * cols + j, (i * height / rows, j * width / cols, (i + 1) * height / rows, (j + 1) * width / cols))
        for i in range(rows) for j in range(cols)
    ]
    boxes.append((0, (0.0, 0.0, height, width)))
    views, row = [], first_row
    for view, box in boxes:
        views.append(View(index, view, box, (side, side), torch.arange(row, row + patches * patches), (patches, patches)))
        row += patches * patches
    return views


class Idefics3Family:
    """Idefics3: crops and the global image, pixel shuffle; the vision hidden state as features.

    Example:
        >>> from camkit.vlm.families.idefics import Idefics3Family
        >>> Idefics3Family().name
        'idefics3'
    """

    name = "idefics3"
    answer_token_type = 0
    model_types: tuple[str, ...] = ("idefics3",)

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model``'s configuration is of this family's ``model_type``."""
        return getattr(config_of(model), "model_type", None) in self.model_types

    def image_token_id(self, model: nn.Module) -> int:
        """The configuration's ``image_token_id``."""
        return int(config_of(model).image_token_id)

    def feature_layer(self, model: nn.Module) -> nn.Module:
        """The vision tower's ``post_layernorm``: one row per patch of each view."""
        return child(_vision(model), "post_layernorm")

    def geometry(self, model: nn.Module) -> tuple[int, int, int]:
        """``(view pixels S, patches per side, tokens per side)`` of one view."""
        config = config_of(model)
        size, patch = int(config.vision_config.image_size), int(config.vision_config.patch_size)
        return size, size // patch, size // patch // int(config.scale_factor)

    def sample_views(self, model: nn.Module, ids: Tensor, positions: Tensor) -> list[tuple[int, int | None]]:
        """Per image of the sample: ``(crops, crops per row)`` read from the text (``None``: no row break seen)."""
        _, _, side = self.geometry(model)
        spans = runs(positions)
        if any(span.numel() != side * side for span in spans):
            raise InvalidInputError(f"every view should bring {side * side} image tokens, got runs of "
                                    f"{sorted({span.numel() for span in spans})}")
        images = []
        for group in _image_groups(ids, spans, self.image_token_id(model)):
            crops = group[:-1]
            images.append((len(crops), _columns(ids, crops, self.image_token_id(model)) if crops else None))
        return images

    def layout(
        self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], image_sizes: Sequence[tuple[int, int]]
    ) -> list[ImageTokens]:
        """One :class:`ImageTokens` per sample: each image's crops (views 1..) and global image (view 0)."""
        _, patches, side = self.geometry(model)
        ids = inputs["input_ids"].cpu()
        layouts, image, row = [], 0, 0
        for b, positions in enumerate(image_positions(inputs, self.image_token_id(model))):
            images = self.sample_views(model, ids[b], positions)
            if image + len(images) > len(image_sizes):
                raise InvalidInputError(f"the batch's image tokens need more than the {len(image_sizes)} image sizes given")
            views: list[View] = []
            for index, (crops, cols) in enumerate(images):
                size = image_sizes[image + index]
                views += _views_of(index, _grid_of(processor, size, crops, cols), size, row, patches, side)
                row += (crops + 1) * patches * patches
            layouts.append(sample_tokens(positions, views, image_sizes[image : image + len(images)]))
            image += len(images)
        check_sizes(image_sizes, image)
        return layouts

    def occlude(
        self, model: nn.Module, inputs: Mapping[str, Tensor], keep: Sequence[Tensor], baseline: float | Tensor
    ) -> Mapping[str, Tensor]:
        """``inputs`` with each dropped token's pixel block of its view set to ``baseline``."""
        _, _, side = self.geometry(model)
        positions = image_positions(inputs, self.image_token_id(model))
        masks = keep_masks(keep, [p.numel() for p in positions])
        pixels = inputs["pixel_values"]
        drop = torch.zeros(pixels.shape[0], pixels.shape[1], side * side, dtype=torch.bool)
        for b, mask in enumerate(masks):
            if mask.numel() > drop[b].numel() or mask.numel() % (side * side):
                raise InvalidInputError(f"sample {b} has {mask.numel()} image tokens for {pixels.shape[1]} views of "
                                        f"{side * side} tokens")
            drop[b].view(-1)[: mask.numel()] = ~mask
        pixels = occlude_views(pixels.flatten(0, 1), drop.flatten(0, 1), baseline).view(pixels.shape)
        # an all-zero view is taken for batch padding and dropped by the model: keep occluded views apart from it
        views = pixels.flatten(2)
        blank = (views == 0).all(-1) & (inputs["pixel_values"].flatten(2) != 0).any(-1)
        views[..., 0] = torch.where(blank, torch.finfo(pixels.dtype).tiny, views[..., 0])
        out = dict(inputs)
        out["pixel_values"] = pixels
        return out


class SmolVLMFamily(Idefics3Family):
    """SmolVLM: the Idefics3 layout (its processor emits the same text around the views).

    Example:
        >>> from camkit.vlm.families.idefics import SmolVLMFamily
        >>> SmolVLMFamily().name
        'smolvlm'
    """

    name = "smolvlm"
    model_types = ("smolvlm",)


register_family(Idefics3Family())
register_family(SmolVLMFamily())
