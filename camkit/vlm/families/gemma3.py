"""Gemma 3: the image stretched to one square view (plus pan-and-scan crops when enabled), pooled into tokens.

The processor stretches each image to ``S x S`` (``S`` the vision tower's ``image_size``). With
pan-and-scan on, an image whose aspect ratio passes the processor's threshold also gets ``n``
crops cut along its longer side (``ceil(W / n)`` pixels wide each, the last one narrower), each
stretched to ``S x S`` too and placed after the whole image. Each view brings
``mm_tokens_per_image`` tokens in a run of its own (between ``<start_of_image>`` and
``<end_of_image>``): the projector average-pools the vision tower's ``(S / P) x (S / P)`` patches in
``k x k`` blocks (``k = 4`` for the released models), row-major.

Grad-CAM's default layer is the projector's input, the vision tower's last hidden state (its
``post_layernorm``): one row per patch, ``k**2`` rows to each token. The projector's output is
what the language model receives, but it is the block mean of those rows after an RMS norm and a
linear map, and ``k`` times coarser on each side (16 x 16 cells for 896 pixels); the hidden state is
the finest grid where the vision features live, as LLaVA's selected hidden state is.

How many crops each image has is not in the processed inputs (the processor drops its
``num_crops``): it is read from the runs of image tokens. With one image per sample (or crops off)
the runs say it directly; several images with crops in one sample are laid out with the crop
rule and the processor's pan-and-scan settings, and an error says so when those do not account for
the runs (settings passed to the processor's call are not seen).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ._views import Box, View, check_sizes, child, image_positions, keep_masks, occlude_views, runs, sample_tokens
from .base import ImageTokens, config_of, register_family

__all__ = ["Gemma3Family", "pan_and_scan_boxes"]


def pan_and_scan_boxes(height: int, width: int, crops: int) -> list[Box]:
    """The boxes of ``crops`` pan-and-scan crops of an ``height x width`` image, as Gemma 3's processor cuts them.

    Example:
        >>> from camkit.vlm.families.gemma3 import pan_and_scan_boxes
        >>> pan_and_scan_boxes(40, 130, 3)
        [(0.0, 0.0, 40.0, 44.0), (0.0, 44.0, 40.0, 88.0), (0.0, 88.0, 40.0, 130.0)]
    """
    along_width = width >= height
    length = width if along_width else height
    step = math.ceil(length / crops)
    boxes = []
    for i in range(crops):
        low, high = float(i * step), float(min((i + 1) * step, length))
        boxes.append((0.0, low, float(height), high) if along_width else (low, 0.0, high, float(width)))
    return boxes


_SETTINGS = ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")


def _pan_and_scan_settings(processor: Any) -> dict[str, float]:
    """The processor's pan-and-scan settings: its image processor's, overridden by the processor's own defaults."""
    from transformers import Gemma3Processor

    settings: dict[str, Any] = dict(Gemma3Processor.images_kwargs)
    image_processor = getattr(processor, "image_processor", None)
    settings.update({k: getattr(image_processor, k) for k in _SETTINGS if getattr(image_processor, k, None) is not None})
    settings.update({k: v for k, v in getattr(processor, "images_kwargs", {}).items() if v is not None})
    return {k: float(settings[k]) for k in _SETTINGS}


def _expected_crops(height: int, width: int, settings: Mapping[str, float]) -> int:
    """The number of crops Gemma 3's processor cuts from an image with pan-and-scan on (0: none)."""
    least, most = settings["pan_and_scan_min_crop_size"], int(settings["pan_and_scan_max_num_crops"])
    long_side, short_side = max(height, width), min(height, width)
    if long_side / short_side < settings["pan_and_scan_min_ratio_to_activate"]:
        return 0
    crops = min(math.floor(long_side / least), math.floor(long_side / short_side + 0.5))
    crops = min(most, max(2, crops))
    return crops if min(math.ceil(long_side / crops), short_side) >= least else 0


def _crops_per_image(counts: list[int], image_sizes: Sequence[tuple[int, int]], processor: Any) -> list[list[int]]:
    """Per sample, the number of crops of each of its images, from its number of views."""
    total = sum(counts)
    if total == len(image_sizes):  # one view per image: no crops anywhere
        return [[0] * n for n in counts]
    if len(counts) == len(image_sizes):  # one image per sample: its views are the image and its crops
        return [[n - 1] for n in counts]
    settings = _pan_and_scan_settings(processor)
    crops = [_expected_crops(int(h), int(w), settings) for h, w in image_sizes]
    grouped, start = [], 0
    for views in counts:
        mine = []
        while views > 0 and start < len(crops):
            mine.append(crops[start])
            views -= crops[start] + 1
            start += 1
        grouped.append(mine)
        if views != 0:
            break
    if start != len(crops) or sum(len(g) + sum(g) for g in grouped) != total:
        raise InvalidInputError(
            "cannot tell how many pan-and-scan crops each image has: several images per prompt with crops made "
            "with settings other than the processor's own; explain one image per prompt"
        )
    return grouped


class Gemma3Family:
    """Gemma 3: one view per image plus pan-and-scan crops, patches pooled into tokens.

    Example:
        >>> from camkit.vlm.families.gemma3 import Gemma3Family
        >>> Gemma3Family().name
        'gemma3'
    """

    name = "gemma3"
    answer_token_type = 0

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model``'s configuration is of this family's ``model_type``."""
        return getattr(config_of(model), "model_type", None) == "gemma3"

    def image_token_id(self, model: nn.Module) -> int:
        """The configuration's ``image_token_id``."""
        return int(config_of(model).image_token_id)

    def feature_layer(self, model: nn.Module) -> nn.Module:
        """The vision tower's ``post_layernorm`` (the projector's input): one row per patch."""
        for owner in (getattr(model, "model", None), model):
            tower = getattr(owner, "vision_tower", None)
            if isinstance(tower, nn.Module):
                return child(getattr(tower, "vision_model", tower), "post_layernorm")
        raise UnsupportedModelError(f"{type(model).__name__} has no Gemma 3 vision tower ('vision_tower')")

    def geometry(self, model: nn.Module) -> tuple[int, int, int]:
        """``(view pixels S, patches per side, tokens per side)`` of one view."""
        config = config_of(model)
        size, patch = int(config.vision_config.image_size), int(config.vision_config.patch_size)
        return size, size // patch, math.isqrt(int(config.mm_tokens_per_image))

    def layout(
        self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], image_sizes: Sequence[tuple[int, int]]
    ) -> list[ImageTokens]:
        """One :class:`ImageTokens` per sample: each image's whole view (0) and pan-and-scan crops (1..)."""
        _, patches, side = self.geometry(model)
        positions = image_positions(inputs, self.image_token_id(model))
        spans = [runs(p) for p in positions]
        for sample in spans:
            if any(span.numel() != side * side for span in sample):
                raise InvalidInputError(f"every view should bring {side * side} image tokens, got runs of "
                                        f"{sorted({span.numel() for span in sample})}")
        crops = _crops_per_image([len(s) for s in spans], image_sizes, processor)
        layouts, image, row = [], 0, 0
        for b, counts in enumerate(crops):
            views = []
            for index, n in enumerate(counts):
                height, width = (int(x) for x in image_sizes[image + index])
                boxes = [(0.0, 0.0, float(height), float(width))]
                boxes += pan_and_scan_boxes(height, width, n) if n else []
                for view, box in enumerate(boxes):
                    feature = torch.arange(row, row + patches * patches)
                    views.append(View(index, view, box, (side, side), feature, (patches, patches)))
                    row += patches * patches
            layouts.append(sample_tokens(positions[b], views, image_sizes[image : image + len(counts)]))
            image += len(counts)
        check_sizes(image_sizes, image)
        return layouts

    def occlude(
        self, model: nn.Module, inputs: Mapping[str, Tensor], keep: Sequence[Tensor], baseline: float | Tensor
    ) -> Mapping[str, Tensor]:
        """``inputs`` with each dropped token's pooled pixel block of its view set to ``baseline``."""
        _, _, side = self.geometry(model)
        positions = image_positions(inputs, self.image_token_id(model))
        masks = keep_masks(keep, [p.numel() for p in positions])
        pixels = inputs["pixel_values"]
        drop = ~torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)
        if drop.numel() != pixels.shape[0] * side * side:
            raise InvalidInputError(f"pixel_values holds {pixels.shape[0]} views for {drop.numel()} image tokens")
        pixels = occlude_views(pixels, drop.view(-1, side * side), baseline)
        out = dict(inputs)
        out["pixel_values"] = pixels
        return out


register_family(Gemma3Family())
