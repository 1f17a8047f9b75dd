"""The family protocol: where a vision-language model's image tokens are, and what each covers.

A *family* recognises a loaded Hugging Face transformers model (LLaVA, PaliGemma, Qwen-VL...)
and answers three questions for it: which token id stands for an image in the language
model's sequence, which module's output are the vision features the language model receives
(Grad-CAM's default layer), and, for a processed batch, which positions of the sequence are
image tokens and which box of the original image each one covers (:class:`ImageTokens`).
Each family module registers one instance with :func:`register_family`;
:func:`family_of` finds the family of a model.

Decisions this module fixes for every family:

* **Boxes** are ``(y0, x0, y1, x1)`` floats in the pixels of the *original* image (before the
  processor resized, padded or tiled it), half-open: a pixel belongs to a box when its centre
  lies inside (see :mod:`camkit.vlm.paint`). A token that covers no pixel (LLaVA-NeXT's
  ``image_newline``, a tile's padding) has a NaN row.
* **Views**: 0 is the whole image as the processor resized it; 1, 2, ... the tiles or crops in
  the order the processor emits them. A pixel's value in a map is the sum, over the views that
  cover it, of the unit that covers it there.
* **Feature rows** are the rows of ``feature_layer``'s output flattened over all its dimensions
  but the last (``[n_views, P, D]`` gives ``n_views * P`` rows, numbered across the whole
  batch). ``feature_rows`` lists, for one sample, the rows that reach its language-model tokens
  (a CLS row a model drops is not listed), ``feature_token`` says which of the sample's image
  tokens each row feeds (an index into ``positions``; several rows share one token where the
  model merges patches, as Qwen-VL's 2x2 merger, Idefics3's pixel shuffle and Gemma 3's pooling
  do), and ``feature_boxes`` / ``feature_image`` / ``feature_view`` give each row's box, image
  and view.
* **Inputs** are the mapping the processor returns for one sample, batched: ``input_ids``
  and every tensor of the same ``[B, L]`` shape right-padded (the answer's tokens appended
  before the padding), the other tensors (``pixel_values``, ``image_sizes``...) concatenated
  over the batch (a tile dimension zero-padded). ``image_sizes`` passed to :meth:`Family.layout`
  (with the processor that made the inputs)
  are the ``(H, W)`` of the original images, in the order their images appear in the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ..paint import paint

__all__ = [
    "FAMILIES",
    "Family",
    "ImageTokens",
    "config_of",
    "family_of",
    "list_families",
    "module_name",
    "paint",
    "register_family",
]


@dataclass(frozen=True)
class ImageTokens:
    """Where one sample's image tokens are in the sequence and what part of its images each covers.

    Attributes:
        positions: LongTensor [N], the positions of the image tokens in the language model's
            sequence (exactly those where ``input_ids`` is the image token), ascending.
        boxes: float [N, 4] ``(y0, x0, y1, x1)`` of each token in its original image's pixels;
            NaN rows for tokens that cover no pixel.
        image: LongTensor [N], which of the sample's images (0, 1, ...) each token belongs to.
        view: LongTensor [N], which view (0: the whole image; 1..: tiles or crops).
        feature_rows: LongTensor [R], the rows of the feature layer's output (flattened over all
            its dimensions but the last, numbered across the batch) that reach this sample's tokens.
        feature_token: LongTensor [R], the image token (an index into ``positions``) each row feeds.
        feature_boxes: float [R, 4], each row's box in its original image's pixels.
        feature_image: LongTensor [R], which of the sample's images each row belongs to.
        feature_view: LongTensor [R], which view each row belongs to.
        sizes: ``(H, W)`` of each of the sample's original images.

    Example:
        >>> import torch
        >>> from camkit.vlm.families.base import ImageTokens
        >>> one = torch.zeros(2, dtype=torch.long)
        >>> boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0], [0.0, 2.0, 4.0, 4.0]])
        >>> t = ImageTokens(torch.tensor([1, 2]), boxes, one, one, torch.tensor([0, 1]), torch.tensor([0, 1]),
        ...                 boxes, one, one, ((4, 4),))
        >>> t.count, [tuple(m.shape) for m in t.paint(torch.tensor([[1.0, 3.0]]))]
        (2, [(1, 4, 4)])
    """

    positions: Tensor
    boxes: Tensor
    image: Tensor
    view: Tensor
    feature_rows: Tensor
    feature_token: Tensor
    feature_boxes: Tensor
    feature_image: Tensor
    feature_view: Tensor
    sizes: tuple[tuple[int, int], ...] = field(default=())

    @property
    def count(self) -> int:
        """N, the number of image tokens."""
        return int(self.positions.shape[0])

    def paint(self, scores: Tensor, *, units: str = "tokens") -> list[Tensor]:
        """Scores [T, N] over the tokens (``units="tokens"``) or [T, R] over the feature rows (``"rows"``) as maps.

        Returns one float32 map [T, H, W] per image of the sample, at that image's original size.
        """
        if units not in ("tokens", "rows"):
            raise InvalidInputError(f"units must be 'tokens' or 'rows', got {units!r}")
        boxes, image = (self.boxes, self.image) if units == "tokens" else (self.feature_boxes, self.feature_image)
        if scores.dim() != 2 or scores.shape[1] != boxes.shape[0]:
            raise InvalidInputError(
                f"scores over {units} must be [T, {boxes.shape[0]}] for this sample, got {list(scores.shape)}"
            )
        image = image.to(scores.device)
        maps = []
        for index, size in enumerate(self.sizes):
            mine = image == index
            maps.append(paint(scores[:, mine], boxes.to(scores.device)[mine], size))
        return maps


@runtime_checkable
class Family(Protocol):
    """What camkit needs to know of a vision-language model family (see the module docstring).

    Attributes:
        name: the family's registry key (``"llava"``, ``"paligemma"``...).
        answer_token_type: the ``token_type_ids`` value of answer tokens appended to a prompt
            (PaliGemma's suffix is 1; 0 elsewhere), for processors that return token types.
    """

    name: str
    answer_token_type: int

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model`` (a transformers model, with or without its generation head) is of this family."""
        ...

    def image_token_id(self, model: nn.Module) -> int:
        """The id of the image placeholder token in the language model's sequence."""
        ...

    def feature_layer(self, model: nn.Module) -> nn.Module:
        """The module whose output are the vision features the language model receives (Grad-CAM's default)."""
        ...

    def layout(
        self, model: nn.Module, processor: Any, inputs: Mapping[str, Tensor], image_sizes: Sequence[tuple[int, int]]
    ) -> list[ImageTokens]:
        """One :class:`ImageTokens` per sample of the processed batch ``inputs``.

        ``processor`` is the transformers processor that made ``inputs`` (its image processor's
        resize, crop, pad and tiling settings place the views on the original image).
        """
        ...

    def occlude(self, model: nn.Module, inputs: Mapping[str, Tensor], keep: Sequence[Tensor], baseline: float | Tensor) -> Mapping[str, Tensor]:
        """``inputs`` with the pixels of each image token ``i`` of sample ``b`` where ``keep[b][i]`` is False set to ``baseline``.

        ``keep[b]`` is a bool [N_b] over the sample's image tokens; ``baseline`` a value or a
        tensor broadcastable to one view's pixels [C, h, w], in the processor's (normalised)
        pixel space. The inputs given are never changed; tensors that change are copies.
        """
        ...


#: The registered families, by name, in registration order.
FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry (under ``family.name``) and return it.

    Example:
        >>> from camkit.vlm.families.base import FAMILIES
        >>> all(name == family.name for name, family in FAMILIES.items())
        True
    """
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"a vision-language family named {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def list_families() -> list[str]:
    """The names of the registered families.

    Example:
        >>> from camkit.vlm.families import list_families
        >>> {"llava", "llava_next", "paligemma"} <= set(list_families())
        True
    """
    return list(FAMILIES)


def config_of(model: nn.Module) -> Any:
    """The model's transformers configuration, or ``None`` for a module that has none.

    Example:
        >>> from torch import nn
        >>> from camkit.vlm.families.base import config_of
        >>> config_of(nn.Linear(1, 1)) is None
        True
    """
    return getattr(model, "config", None)


def module_name(model: nn.Module, module: nn.Module) -> str:
    """The dotted name of ``module`` inside ``model`` (``""`` for the model itself).

    Example:
        >>> from torch import nn
        >>> from camkit.vlm.families.base import module_name
        >>> net = nn.Sequential(nn.Linear(1, 1), nn.Sequential(nn.ReLU()))
        >>> module_name(net, net[1][0])
        '1.0'
    """
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    raise InvalidInputError(f"{type(module).__name__} is not a submodule of the model")


def family_of(model: nn.Module) -> Family:
    """The registered family that recognises ``model``.

    Raises:
        UnsupportedModelError: no family matches; the message lists the supported ones.

    Example:
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.vlm.families import family_of
        >>> try:
        ...     family_of(nn.Linear(2, 2))
        ... except camkit.UnsupportedModelError as err:
        ...     print(str(err).split(";")[0])
        Linear is not a vision-language model camkit knows
    """
    for family in FAMILIES.values():
        if family.matches(model):
            return family
    config = config_of(model)
    kind = getattr(config, "model_type", None)
    what = type(model).__name__ + (f" (model_type {kind!r})" if kind else "")
    raise UnsupportedModelError(
        f"{what} is not a vision-language model camkit knows; supported families: {', '.join(FAMILIES)}. "
        "Load one of them with transformers (AutoModelForImageTextToText), or explain its vision tower "
        "alone with camkit's image explainers."
    )
