"""Requests for the vision-language methods on the tiny models, built by hand, and the hygiene checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from camkit.vlm.methods.registry import MethodRequest


def images(count: int, size: tuple[int, int] = (32, 32), seed: int = 0) -> list[Tensor]:
    """``count`` random uint8 images [3, H, W]."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, *size), generator=generator, dtype=torch.uint8) for _ in range(count)]


def request(model: nn.Module, processor: Any, pictures: Sequence[Tensor], prompts: Sequence[str],
            answers: Sequence[str], *, batch_tokens: int | None = None, **options: Any) -> MethodRequest:  # fmt: skip
    """A teacher-forced batch (prompt, image and answer per sample, right-padded) and one target per answer token."""
    from camkit.vlm.families import family_of

    texts = [f"USER: <image> {p} ASSISTANT : {a}" for p, a in zip(prompts, answers)]
    inputs = dict(processor(text=texts, images=list(pictures), return_tensors="pt", padding=True))
    lengths = inputs["attention_mask"].sum(dim=1).tolist()
    positions, token_ids = [], []
    for b, (answer, length) in enumerate(zip(answers, lengths)):
        count = len(processor.tokenizer(answer, add_special_tokens=False)["input_ids"])
        pos = torch.arange(length - count, length)[:, None]
        positions.append(pos)
        token_ids.append(inputs["input_ids"][b, pos[:, 0]][:, None])
    family = family_of(model)
    sizes = [(int(p.shape[-2]), int(p.shape[-1])) for p in pictures]
    layouts = family.layout(model, processor, inputs, sizes)
    return MethodRequest(model=model, family=family, inputs=inputs, layouts=layouts, positions=positions,
                         token_ids=token_ids, batch_tokens=batch_tokens, options=options)  # fmt: skip


def one(req: MethodRequest, b: int, model: nn.Module, processor: Any, pictures: Sequence[Tensor],
        prompts: Sequence[str], answers: Sequence[str]) -> MethodRequest:  # fmt: skip
    """Sample ``b`` of a batch built by :func:`request`, alone."""
    return request(model, processor, [pictures[b]], [prompts[b]], [answers[b]], batch_tokens=req.batch_tokens,
                   **dict(req.options))  # fmt: skip


class State:
    """What a method must leave as it found it: hooks, flags, ``requires_grad``, ``.grad``, settings, inputs."""

    def __init__(self, model: nn.Module, req: MethodRequest) -> None:
        self.model, self.req = model, req
        with torch.no_grad():  # transformers installs its own output-recording hooks on a model's first forward
            model(**req.inputs)
        self.snapshot = self._take()

    def _take(self) -> dict[str, Any]:
        model = self.model
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                    + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())  # fmt: skip
        return {
            "hooks": hooks,
            "training": [m.training for m in model.modules()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "grads": [p.grad is None for p in model.parameters()],
            "attention": model.config._attn_implementation,
            "text attention": model.config.get_text_config()._attn_implementation,
            "use_cache": (model.config.get_text_config().use_cache, model.generation_config.use_cache),
            "inputs": {k: v.clone() for k, v in self.req.inputs.items() if isinstance(v, Tensor)},
            "grad mode": torch.is_grad_enabled(),
        }

    def check(self) -> None:
        now = self._take()
        for key, value in self.snapshot.items():
            if key == "inputs":
                assert all(torch.equal(now[key][k], v) for k, v in value.items()), "inputs changed"
            else:
                assert now[key] == value, f"{key} changed: {value} -> {now[key]}"


def tiny_llava_pair(**sizes: Any) -> tuple[nn.Module, Any]:
    """The tiny LLaVA and its processor, built once per set of sizes (the methods leave them as they were)."""
    key = tuple(sorted(sizes.items()))
    if key not in _BUILT:
        import tiny_llava

        _BUILT[key] = tiny_llava.build(**sizes)
    return _BUILT[key]


_BUILT: dict[tuple[Any, ...], tuple[nn.Module, Any]] = {}


def family_request(model: nn.Module, processor: Any, pictures: Sequence[Any], prompts: Sequence[str],
                   answers: Sequence[str], **options: Any) -> MethodRequest:  # fmt: skip
    """As :func:`request` for any family: the prompts through its chat template, as ``explain_generation`` does."""
    from camkit.vlm.families import family_of
    from camkit.vlm.prompts import prepare, teacher_forced

    family = family_of(model)
    prompted = prepare(model, processor, family, list(pictures), list(prompts))
    tokenizer = processor.tokenizer
    ids = [torch.tensor(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    forced = teacher_forced(prompted, ids, family, int(tokenizer.pad_token_id or 0), torch.device("cpu"))
    layouts = family.layout(model, processor, forced.inputs, [p.size for p in prompted])
    return MethodRequest(model=model, family=family, inputs=forced.inputs, layouts=layouts, positions=forced.positions,
                         token_ids=forced.token_ids, options=options)  # fmt: skip
