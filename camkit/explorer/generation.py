"""The explorer's session for a vision-language model: a prompt about an image, its answer explained word by word.

Plain Python, no web library (:mod:`camkit.explorer.generation_tab` puts it on the page). A live
explanation is exactly what :func:`camkit.explain_generation` gives for the same image, prompt,
method and answer: ``GenerationSession.explain(image, prompt).explanation.maps[0]`` equals
``camkit.explain_generation(model, processor, image, prompt).maps[0]``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import InvalidInputError
from ..explain.generation import answer_text, load_generation_model, token_records
from ..explain.tokens_page import token_page
from ..viz.overlay import overlay
from ..viz.tokens import shown_word, token_strip
from .inputs import read_image
from .session import settings_key

__all__ = ["GenerationResult", "GenerationSession"]


@dataclass(frozen=True)
class GenerationResult:
    """One live explanation of an answer.

    Attributes:
        strip: uint8 [H, W, 3], the strip of overlays (one per generated token, the token beneath).
        page: the self-contained HTML page (pointing at a word shows its map).
        tokens: per generated token ``{"index", "token", "id", "log_prob"}``.
        answer: the answer as the tokenizer decodes it.
        image: the uint8 RGB image [H, W, 3] explained.
        explanation: the :class:`camkit.GenerationExplanation` (one prompt).
        prompt: the prompt; ``method`` the method's key.
    """

    strip: np.ndarray
    page: str
    tokens: list[dict[str, Any]]
    answer: str
    image: np.ndarray
    explanation: Any
    prompt: str
    method: str

    def words(self) -> list[str]:
        """Each token as shown under its overlay, numbered: ``"0: A"``, ``"1: cat"``..."""
        return [f"{t['index']}: {shown_word(t['token'])}" for t in self.tokens]

    def word_overlay(self, index: int, alpha: float = 0.5) -> np.ndarray:
        """The map of token ``index`` over the image, uint8 [H, W, 3]."""
        maps = self.explanation.maps[0]
        if not 0 <= index < maps.shape[0]:
            raise InvalidInputError(f"token {index} is out of range: the answer has {maps.shape[0]} tokens")
        return overlay(self.image, maps[index].detach().float().cpu().numpy(), alpha=alpha)


class GenerationSession:
    """A vision-language model and its processor, loaded once, with a cache of explained answers.

    Args:
        model: ``"hf:PATH"`` (a local ``save_pretrained`` folder with its processor) or a loaded
            transformers model (then give ``processor``).
        processor: the model's processor, with a loaded model.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (default: as saved).
        device: where to run (default: where the model loads).
        cache_size: answers kept (least recently used dropped first).
    """

    def __init__(self, model: str | nn.Module, processor: Any = None, *, dtype: str | None = None,
                 device: str | torch.device | None = None, cache_size: int = 16) -> None:  # fmt: skip
        self.model, self.processor, self.description = load_generation_model(model, processor, dtype=dtype, device=device)
        self.spec = str(self.description["spec"])
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[Any, ...], GenerationResult] = OrderedDict()
        self._lock = threading.RLock()  # one model run at a time

    @staticmethod
    def methods() -> list[str]:
        """The vision-language methods' keys, sorted."""
        from ..vlm.methods import list_vlm_methods

        return sorted(list_vlm_methods())

    def explain(self, image: Any, prompt: str, method: str = "gradcam", *, answer: str | None = None,
                max_new_tokens: int = 20, **settings: Any) -> GenerationResult:  # fmt: skip
        """Explain the answer to ``prompt`` about ``image`` (a path, uint8 [H, W, 3] or PIL image), cached."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("type a prompt: the question or instruction the model answers about the image")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        rgb = read_image(image)
        answer = answer if answer else None
        key = (hashlib.sha256(rgb.tobytes()).hexdigest(), rgb.shape, prompt, method, answer, max_new_tokens,
               settings_key(settings))  # fmt: skip
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            result = self._run(rgb, prompt, method, answer, max_new_tokens, settings)
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return result

    def _run(self, rgb: np.ndarray, prompt: str, method: str, answer: str | None, max_new_tokens: int,
             settings: dict[str, Any]) -> GenerationResult:  # fmt: skip
        from ..vlm.explain import explain_generation

        pixels = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
        explained = explain_generation(self.model, self.processor, pixels, prompt, method=method, answer=answer,
                                       max_new_tokens=max_new_tokens, **settings)  # fmt: skip
        tokens = token_records(explained)
        strip = token_strip(rgb, explained).image if tokens else rgb.copy()
        page = token_page(rgb, explained, prompt=prompt)
        return GenerationResult(strip=strip, page=page, tokens=tokens, answer=answer_text(self.processor, explained), image=rgb, explanation=explained, prompt=prompt,
                                method=method)  # fmt: skip
