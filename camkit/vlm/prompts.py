"""Images and prompts through a model's processor, and the teacher-forced batch of prompts with answers.

A prompt is used as written when it holds the processor's image token (``"<image>"``); otherwise,
when the processor has a chat template, it is wrapped in one user turn holding the image and the
text, with the generation prompt added (what the model's card asks for); a PaliGemma prompt gets its
image token in front, where PaliGemma's processor would put it. A processed prompt without any image
token is refused with the fix.

The teacher-forced batch (:func:`teacher_forced`) puts each prompt's answer tokens after its own
tokens and pads on the right, so that every real token keeps the position it has alone: a batch of
prompts scores as each prompt does by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..io import check_unit_range, read_rgb
from .families.base import Family

__all__ = ["Prompt", "TeacherForced", "as_image", "prepare", "teacher_forced"]

#: Keys a processor returns that are not model inputs.
_NOT_INPUTS = ("labels",)


@dataclass(frozen=True)
class Prompt:
    """One image and its prompt, processed: ``inputs`` (batch of one) and the image's original ``size`` (H, W)."""

    inputs: Mapping[str, Tensor]
    size: tuple[int, int]
    text: str


@dataclass(frozen=True)
class TeacherForced:
    """Prompts with their answers as one right-padded batch.

    Attributes:
        inputs: ``model(**inputs)`` ready, on the model's device.
        positions: per sample, LongTensor [T_b, 1], the position of each answer token.
        token_ids: per sample, LongTensor [T_b, 1], the answer's tokens.
        lengths: per sample, the prompt's length (the first answer token's position).
    """

    inputs: Mapping[str, Tensor]
    positions: list[Tensor]
    token_ids: list[Tensor]
    lengths: list[int]


def as_image(image: Any) -> tuple[Any, tuple[int, int]]:
    """An image the processor takes, and its (H, W): a PIL image, a tensor [3, H, W], an array [H, W, 3], a path.

    A float tensor holds values in [0, 1] (as camkit reads images) and is handed on as uint8; a
    normalised one is refused.

    Example:
        >>> import torch
        >>> from camkit.vlm.prompts import as_image
        >>> as_image(torch.zeros(3, 4, 6, dtype=torch.uint8))[1]
        (4, 6)
        >>> as_image(torch.full((3, 1, 1), 0.5))[0].flatten().tolist()
        [128, 128, 128]
    """
    if isinstance(image, (str, os.PathLike)):
        image = read_rgb(image)
    if isinstance(image, Tensor):
        if image.dim() != 3 or image.shape[0] not in (1, 3):
            raise InvalidInputError(
                f"an image tensor must be [3, H, W] (one image, channels first), got shape {list(image.shape)}"
            )
        image = image.detach().cpu()
        if image.is_floating_point():  # values in [0, 1], as camkit reads images; the processor rescales uint8 itself
            check_unit_range(image)
            image = (image.clamp(0, 1) * 255).round().to(torch.uint8)
        return image, (int(image.shape[1]), int(image.shape[2]))
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
            raise InvalidInputError(f"an image array must be [H, W, 3], got shape {list(image.shape)}")
        return image, (int(image.shape[0]), int(image.shape[1]))
    size = getattr(image, "size", None)
    if hasattr(image, "convert") and isinstance(size, tuple) and len(size) == 2:  # a PIL image: size is (W, H)
        return image.convert("RGB"), (int(size[1]), int(size[0]))
    raise InvalidInputError(
        f"cannot read {type(image).__name__} as an image: give a PIL image, a tensor [3, H, W], an array [H, W, 3] or a path"
    )


def _text(processor: Any, prompt: str, family: Family) -> str:
    token = getattr(processor, "image_token", None)
    if isinstance(token, str) and token in prompt:
        return prompt
    if getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return str(processor.apply_chat_template(messages, add_generation_prompt=True))
    if isinstance(token, str) and family.name == "paligemma":
        return token + prompt  # the image tokens open a PaliGemma prompt (its processor would put them there too)
    return prompt


def prepare(model: nn.Module, processor: Any, family: Family, images: Any, prompt: str | Sequence[str]) -> list[Prompt]:
    """Each image with its prompt through the processor (one prompt for all images, or one per image)."""
    listed = list(images) if isinstance(images, (list, tuple)) else [images]
    prompts = [prompt] * len(listed) if isinstance(prompt, str) else list(prompt)
    if not listed:
        raise InvalidInputError("no image given: pass one image or a list of them")
    if len(prompts) != len(listed) or not all(isinstance(p, str) for p in prompts):
        raise InvalidInputError(f"give one prompt (a str) for all images, or one per image: {len(listed)} images, {len(prompts)} prompts")
    token = family.image_token_id(model)
    out = []
    for index, (image, text) in enumerate(zip(listed, prompts)):
        picture, size = as_image(image)
        text = _text(processor, text, family)
        marker = getattr(processor, "image_token", None)
        if isinstance(marker, str) and marker not in text:
            raise InvalidInputError(
                f"prompt {index} has no image token ({text!r}); put the processor's image token ({marker!r}) where "
                "the image goes, or use a processor with a chat template"
            )
        try:
            encoded = processor(images=picture, text=text, return_tensors="pt")
        except (ValueError, TypeError, RuntimeError, IndexError, ArithmeticError) as err:
            raise InvalidInputError(f"the processor refused image {index} (size {size[0]}x{size[1]}): {err}") from err
        inputs = {k: v for k, v in encoded.items() if isinstance(v, Tensor) and k not in _NOT_INPUTS}
        if not bool((inputs["input_ids"] == token).any()):
            raise InvalidInputError(
                f"prompt {index} has no image token after processing ({text!r}); put the processor's image token "
                f"({getattr(processor, 'image_token', '<image>')!r}) where the image goes, or use a processor with a chat template"
            )
        out.append(Prompt(inputs, size, text))
    return out


def _pad(values: list[Tensor], fill: list[float]) -> Tensor:
    """Right-pad [1, L_b] rows to the longest, each with its own fill value."""
    longest = max(v.shape[1] for v in values)
    rows = [torch.cat([v, v.new_full((1, longest - v.shape[1]), f)], dim=1) for v, f in zip(values, fill)]
    return torch.cat(rows)


def _stack(values: list[Tensor]) -> Tensor:
    """Concatenate over dim 0, zero-padding every other dimension to the largest (LLaVA-NeXT's tile count)."""
    shape = [max(v.shape[d] for v in values) for d in range(1, values[0].dim())]
    padded = []
    for v in values:
        pad: list[int] = []
        for d in reversed(range(1, v.dim())):
            pad += [0, shape[d - 1] - v.shape[d]]
        padded.append(torch.nn.functional.pad(v, pad) if any(pad) else v)
    return torch.cat(padded)


def teacher_forced(
    prompts: Sequence[Prompt], answers: Sequence[Tensor], family: Family, pad_id: int, device: torch.device
) -> TeacherForced:
    """The batch of each prompt followed by its answer [T_b], right-padded, on ``device``."""
    sequence: dict[str, list[Tensor]] = {}
    other: dict[str, list[Tensor]] = {}
    lengths = []
    for prompt, answer in zip(prompts, answers):
        ids = prompt.inputs["input_ids"]
        lengths.append(int(ids.shape[1]))
        answer = answer.to(ids.dtype).reshape(1, -1)
        for key, value in prompt.inputs.items():
            if value.dim() == 2 and value.shape == ids.shape:
                extra = {"input_ids": answer, "attention_mask": torch.ones_like(answer)}.get(key)
                if extra is None:
                    extra = torch.full_like(answer, family.answer_token_type if key == "token_type_ids" else 0)
                sequence.setdefault(key, []).append(torch.cat([value, extra.to(value.dtype)], dim=1))
            else:
                other.setdefault(key, []).append(value)
    inputs: dict[str, Tensor] = {}
    for key, values in sequence.items():
        fill = [float(pad_id) if key == "input_ids" else 0.0 if key == "attention_mask" else float(v[0, -1]) for v in values]
        inputs[key] = _pad(values, fill).to(device)
    for key, values in other.items():
        inputs[key] = _stack(values).to(device)
    positions = [torch.arange(n, n + a.numel()).reshape(-1, 1) for n, a in zip(lengths, answers)]
    tokens = [a.reshape(-1, 1).long().cpu() for a in answers]
    return TeacherForced(inputs, positions, tokens, lengths)
