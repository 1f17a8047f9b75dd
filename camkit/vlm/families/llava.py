"""LLaVA 1.5 and LLaVA-NeXT: a CLIP-style vision tower, a projector, and a language model.

LLaVA 1.5 sees one view per image: the image padded to a square (``do_pad``), resized and
centre-cropped as its image processor says; each patch of the vision tower's grid is one image
token (the CLS row dropped with the ``"default"`` feature strategy).

LLaVA-NeXT ("any resolution") sees the whole image squashed to a square (view 0) and tiles of
the image resized to the best of its grid pinpoints and padded (views 1, 2, ... in row-major
order). Its language model reads the base view's patches, then the tiles' patches as one big
grid with the padding cut off ("unpadding") and an ``image_newline`` token closing each row.
Which feature row feeds which image token is read from the model's own packing function, run on
row indices instead of features, so the layout is the model's by construction.

The default feature layer is the vision encoder layer whose output is the hidden state
``config.vision_feature_layer`` selects (``hidden_states[k]`` is the output of encoder layer
``k - 1``; ``hidden_states[0]`` the input of the first layer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError
from .base import ImageTokens, config_of, register_family
from .geometry import ViewMap, centre_crop_offset, patch_boxes, resized_size, size_dict

__all__ = ["Llava", "LlavaNext"]


def inner_model(model: nn.Module) -> nn.Module:
    """The module that holds ``vision_tower`` (the generation model's ``.model``, or the model itself)."""
    if hasattr(model, "vision_tower"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "vision_tower"):
        return inner
    raise InvalidInputError(f"{type(model).__name__} has no vision_tower; is it a LLaVA model?")


def encoder_layer(tower: nn.Module, index: int) -> nn.Module:
    """The module whose output is ``hidden_states[index]`` of a CLIP or SigLIP vision tower."""
    core: Any = getattr(tower, "vision_model", tower)
    layers: Any = core.encoder.layers
    position = index + len(layers) + 1 if index < 0 else index
    if not 0 <= position <= len(layers):
        raise InvalidInputError(f"vision_feature_layer {index} is out of range for {len(layers)} encoder layers")
    before: Any = getattr(core, "pre_layrnorm", None)  # CLIP normalises the embeddings before the first layer
    chosen: nn.Module = layers[position - 1] if position > 0 else before if before is not None else core.embeddings
    return chosen


@dataclass(frozen=True)
class _View:
    image: int  # global image index
    view: int
    map: ViewMap


class _LlavaBase:
    name = "llava"
    model_type = "llava"
    answer_token_type = 0

    def matches(self, model: nn.Module) -> bool:
        return getattr(config_of(model), "model_type", None) == self.model_type

    def image_token_id(self, model: nn.Module) -> int:
        config = config_of(model)
        value = getattr(config, "image_token_id", None)
        return int(value if value is not None else config.image_token_index)

    def _feature_index(self, model: nn.Module) -> int:
        index = config_of(model).vision_feature_layer
        if not isinstance(index, int):
            raise InvalidInputError(
                f"vision_feature_layer is {index!r}: features concatenated from several layers have no single "
                "layer to explain by default; pass layer= (one vision encoder layer)"
            )
        return index

    def feature_layer(self, model: nn.Module) -> nn.Module:
        tower: Any = inner_model(model).vision_tower
        return encoder_layer(tower, self._feature_index(model))

    def _geometry(self, model: nn.Module) -> tuple[int, int, int]:
        """(patch size, rows per view, CLS rows per view) of the vision tower."""
        vision = config_of(model).vision_config
        patch = int(vision.patch_size)
        side = int(vision.image_size) // patch
        tower = inner_model(model).vision_tower
        embeddings = getattr(getattr(tower, "vision_model", tower), "embeddings", None)
        rows = int(getattr(embeddings, "num_positions", side * side))
        return patch, rows, rows - side * side

    def _skip(self, model: nn.Module) -> int:
        return 1 if config_of(model).vision_feature_select_strategy == "default" else 0

    @staticmethod
    def _finish(view: ViewMap, ip: Any, h: int, w: int) -> ViewMap:
        """The map after the resize and centre crop a view goes through (LLaVA 1.5's image, each LLaVA-NeXT view)."""
        if getattr(ip, "do_resize", True):
            new = resized_size(ip.size, h, w)
            view, (h, w) = view.then_resized((h, w), new), new
        if getattr(ip, "do_center_crop", False):
            crop = size_dict(ip.crop_size)
            view = view.then_cropped(*centre_crop_offset(h, w, crop["height"], crop["width"]))
        return view

    def _views(self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], sizes: Sequence[tuple[int, int]]) -> list[_View]:
        raise NotImplementedError

    def _token_rows(self, model: nn.Module, inputs: Mapping[str, Tensor]) -> list[Tensor]:
        """Per global image, the feature row (global) feeding each of its image tokens in order; -1: none."""
        raise NotImplementedError

    def layout(
        self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], image_sizes: Sequence[tuple[int, int]]
    ) -> list[ImageTokens]:
        views = self._views(model, processor, inputs, image_sizes)
        token_rows = self._token_rows(model, inputs)
        patch, per_view, cls = self._geometry(model)
        side = int(config_of(model).vision_config.image_size) // patch
        row_boxes = [
            torch.cat([torch.full((cls, 4), float("nan")), patch_boxes((side, side), patch, v.map, (int(image_sizes[v.image][0]), int(image_sizes[v.image][1])))])
            for v in views
        ]
        view_of = torch.tensor([v.view for v in views])
        ids = inputs["input_ids"]
        token = self.image_token_id(model)
        out, image = [], 0
        for b in range(ids.shape[0]):
            positions = (ids[b] == token).nonzero()[:, 0].cpu()
            mine, used = [], 0
            while used < positions.numel():
                if image >= len(token_rows):
                    raise InvalidInputError("the prompts have more image tokens than the images given make")
                mine.append(image)
                used += token_rows[image].numel()
                image += 1
            if used != positions.numel():
                raise InvalidInputError(
                    f"sample {b} has {positions.numel()} image tokens, which the images' {used} features do not match"
                )
            out.append(self._sample(positions, mine, token_rows, row_boxes, view_of, per_view, image_sizes))
        if image != len(token_rows):
            raise InvalidInputError(f"{len(token_rows)} images were given but the prompts hold image tokens for {image}")
        return out

    @staticmethod
    def _sample(
        positions: Tensor, images: list[int], token_rows: list[Tensor], row_boxes: list[Tensor], view_of: Tensor,
        per_view: int, sizes: Sequence[tuple[int, int]],
    ) -> ImageTokens:
        rows = torch.cat([token_rows[i] for i in images])
        local_image = torch.cat([torch.full_like(token_rows[i], k) for k, i in enumerate(images)])
        fed = rows >= 0
        safe = rows.clamp(min=0)
        all_boxes = torch.cat(row_boxes)
        boxes = torch.where(fed[:, None], all_boxes[safe], torch.full((1, 4), float("nan")))
        view = torch.where(fed, view_of[safe // per_view], 0)
        index = fed.nonzero()[:, 0]
        return ImageTokens(
            positions=positions, boxes=boxes, image=local_image, view=view,
            feature_rows=rows[index], feature_token=index, feature_boxes=all_boxes[rows[index]],
            feature_image=local_image[index], feature_view=view[index],
            sizes=tuple((int(sizes[i][0]), int(sizes[i][1])) for i in images),
        )

    def occlude(
        self, model: nn.Module, inputs: Mapping[str, Tensor], keep: Sequence[Tensor], baseline: float | Tensor
    ) -> Mapping[str, Tensor]:
        patch, per_view, cls = self._geometry(model)
        side = int(config_of(model).vision_config.image_size) // patch
        views = self._pixel_views(model, inputs)
        token_rows = self._token_rows(model, inputs)
        pixels = inputs["pixel_values"].clone()
        flat = torch.cat(token_rows)
        dropped = ~torch.cat([k.to(torch.bool).cpu() for k in keep])
        if dropped.numel() != flat.numel():
            raise InvalidInputError(f"keep covers {dropped.numel()} image tokens, the batch has {flat.numel()}")
        fill = torch.as_tensor(baseline, dtype=pixels.dtype, device=pixels.device)
        fill = fill.reshape(-1, 1, 1) if fill.dim() == 1 else fill
        for row in flat[dropped & (flat >= 0)].tolist():
            view, cell = divmod(row, per_view)
            if cell < cls:
                continue
            r, c = divmod(cell - cls, side)
            pixels[views[view]][..., r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = fill
        return {**inputs, "pixel_values": pixels}

    def _pixel_views(self, model: nn.Module, inputs: Mapping[str, Tensor]) -> list[tuple[int, ...]]:
        """The index of each global view in ``pixel_values``."""
        return [(i,) for i in range(inputs["pixel_values"].shape[0])]


class Llava(_LlavaBase):
    """LLaVA 1.5 (``model_type == "llava"``): one view per image, one token per patch.

    Example:
        >>> from camkit.vlm.families.llava import Llava
        >>> Llava().name
        'llava'
    """

    def _views(self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], sizes: Sequence[tuple[int, int]]) -> list[_View]:
        pixels = inputs["pixel_values"]
        if len(sizes) != pixels.shape[0]:
            raise InvalidInputError(f"{len(sizes)} image sizes for {pixels.shape[0]} images in pixel_values")
        ip = processor.image_processor
        views = []
        for index, (height, width) in enumerate(sizes):
            view, h, w = ViewMap(), int(height), int(width)
            if getattr(ip, "do_pad", False) and h != w:
                side = max(h, w)
                view = view.then_cropped(-((side - h) // 2), -((side - w) // 2))
                h = w = side
            views.append(_View(index, 0, self._finish(view, ip, h, w)))
        return views

    def _token_rows(self, model: nn.Module, inputs: Mapping[str, Tensor]) -> list[Tensor]:
        _, per_view, _ = self._geometry(model)
        skip = self._skip(model)
        return [torch.arange(i * per_view + skip, (i + 1) * per_view) for i in range(inputs["pixel_values"].shape[0])]


class LlavaNext(_LlavaBase):
    """LLaVA-NeXT (``model_type == "llava_next"``): a base view and any-resolution tiles, unpadded, with newlines.

    Example:
        >>> from camkit.vlm.families.llava import LlavaNext
        >>> LlavaNext().name
        'llava_next'
    """

    name = "llava_next"
    model_type = "llava_next"

    @staticmethod
    def _view_count(model: nn.Module, size: Sequence[int]) -> int:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        config = config_of(model)
        return int(image_size_to_num_patches(list(size), config.image_grid_pinpoints, config.vision_config.image_size))

    def _views(self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], sizes: Sequence[tuple[int, int]]) -> list[_View]:
        import numpy as np
        from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
        from transformers.image_utils import ChannelDimension

        ip = processor.image_processor
        size, crop = size_dict(ip.size), size_dict(getattr(ip, "crop_size", None) or {})
        square = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
        tile = crop.get("height") or square[0]
        views = []
        for index, (height, width) in enumerate(sizes):
            h, w = int(height), int(width)
            base = ViewMap().then_resized((h, w), square)
            views.append(_View(index, 0, self._finish(base, ip, *square)))
            best = select_best_resolution((h, w), ip.image_grid_pinpoints)
            probe = np.broadcast_to(np.zeros((1, 1, 1), dtype=np.uint8), (3, h, w))
            new_h, new_w = get_patch_output_size(probe, best, ChannelDimension.FIRST)
            paste = ((best[0] - new_h) // 2, (best[1] - new_w) // 2)
            resized = ViewMap().then_resized((h, w), (new_h, new_w)).then_cropped(-paste[0], -paste[1])
            across = -(-best[1] // tile)
            for t in range(self._view_count(model, (h, w)) - 1):
                r, c = divmod(t, across)
                views.append(_View(index, t + 1, self._finish(resized.then_cropped(r * tile, c * tile), ip, tile, tile)))
        return views

    def _image_sizes(self, inputs: Mapping[str, Tensor]) -> list[list[int]]:
        sizes = inputs.get("image_sizes")
        if sizes is None:
            raise InvalidInputError("LLaVA-NeXT inputs need image_sizes (the processor makes them)")
        return [[int(v) for v in s] for s in torch.as_tensor(sizes).tolist()]

    def _token_rows(self, model: nn.Module, inputs: Mapping[str, Tensor]) -> list[Tensor]:
        _, per_view, _ = self._geometry(model)
        skip = self._skip(model)
        sizes = self._image_sizes(inputs)
        features, offset = [], 0
        for size in sizes:
            count = self._view_count(model, size)
            rows = (offset + torch.arange(count))[:, None] * per_view + torch.arange(skip, per_view)[None]
            features.append(rows[..., None].double())
            offset += count
        newline = torch.tensor([-1.0], dtype=torch.float64)
        inner: Any = inner_model(model)
        packed, _ = inner.pack_image_features(
            features, torch.tensor(sizes), config_of(model).vision_feature_select_strategy, image_newline=newline
        )
        return [p[:, 0].round().long() for p in packed]

    def _pixel_views(self, model: nn.Module, inputs: Mapping[str, Tensor]) -> list[tuple[int, ...]]:
        return [(k, v) for k, size in enumerate(self._image_sizes(inputs)) for v in range(self._view_count(model, size))]


register_family(Llava())
register_family(LlavaNext())
