"""The greedy answer to a prompt, with the key-value cache, through the model's own ``generate``.

Each prompt is generated alone (no padding, so the tokens are exactly those ``model.generate(**inputs,
do_sample=False)`` writes for it), under ``torch.no_grad()``, with the cache on for that call only
(``config.use_cache`` is left as loaded). The end-of-sequence token and anything after it are not
part of the answer.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from .prompts import Prompt

__all__ = ["answer_ids", "generate_answers", "stop_ids"]


def stop_ids(model: nn.Module, processor: Any) -> set[int]:
    """The token ids that end an answer: the generation config's and the tokenizer's end of sequence.

    Example:
        >>> from types import SimpleNamespace
        >>> from torch import nn
        >>> from camkit.vlm.generate import stop_ids
        >>> model = nn.Linear(1, 1)
        >>> model.generation_config = SimpleNamespace(eos_token_id=[2, 7])
        >>> sorted(stop_ids(model, SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=2))))
        [2, 7]
    """
    found: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), getattr(getattr(processor, "tokenizer", None), "eos_token_id", None)):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(int(v) for v in value)
    return found


def _until_stop(tokens: Tensor, stops: set[int]) -> Tensor:
    for index, token in enumerate(tokens.tolist()):
        if token in stops:
            return tokens[:index]
    return tokens


def generate_answers(model: nn.Module, processor: Any, prompts: Sequence[Prompt], max_new_tokens: int) -> list[Tensor]:
    """The greedy answer to each prompt: LongTensors [T_b] on the CPU (end-of-sequence excluded)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not callable(getattr(model, "generate", None)):
        raise InvalidInputError(f"{type(model).__name__} has no generate(); load the model with its generation head")
    device = next(model.parameters()).device
    stops = stop_ids(model, processor)
    pad = getattr(getattr(processor, "tokenizer", None), "pad_token_id", None)
    answers = []
    for prompt in prompts:
        inputs = {k: v.to(device) for k, v in prompt.inputs.items()}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(generation flags|do_sample|temperature|top_p|top_k).*")
            generate: Any = model.generate
            out = generate(
                **inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                pad_token_id=pad if pad is not None else next(iter(stops), 0),
            )
        answers.append(_until_stop(out[0, inputs["input_ids"].shape[1] :].cpu(), stops))
    return answers


def answer_ids(processor: Any, answers: str | Sequence[str], count: int) -> list[Tensor]:
    """Given answers (one for all prompts, or one per prompt) as token ids [T_b], without special tokens added.

    Example:
        >>> from types import SimpleNamespace
        >>> from camkit.vlm.generate import answer_ids
        >>> tok = SimpleNamespace(tokenizer=lambda text, add_special_tokens: {"input_ids": [len(w) for w in text.split()]})
        >>> [a.tolist() for a in answer_ids(SimpleNamespace(tokenizer=tok.tokenizer), "a cat", 2)]
        [[1, 3], [1, 3]]
    """
    listed = [answers] * count if isinstance(answers, str) else list(answers)
    if len(listed) != count or not all(isinstance(a, str) for a in listed):
        raise InvalidInputError(f"give one answer (a str) for all prompts, or one per prompt: {count} prompts, {len(listed)} answers")
    out = []
    for index, text in enumerate(listed):
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise InvalidInputError(f"answer {index} ({text!r}) has no tokens to explain")
        out.append(torch.tensor(ids, dtype=torch.long))
    return out
