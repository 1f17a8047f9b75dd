"""Tiny Hugging Face causal language models and vision towers for the AttnLRP tests, and LXT 2.1 as the anchor.

Every model is built from its config with random seeded weights (no download). LXT's efficient
patches change classes and module globals of transformers for the whole process; :func:`lxt_relevance`
puts every one of them back before it returns.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

_SIZES = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
LANGUAGE_MODELS = ("llama", "qwen2", "gemma3")


def causal_lm(kind: str, attn_implementation: str = "sdpa", seed: int = 0) -> nn.Module:
    """A tiny ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``Gemma3ForCausalLM`` (grouped-query attention)."""
    import transformers as tf

    extra: dict[str, Any] = {}
    if kind == "gemma3":  # sliding and full attention, query and key norms, four norms a layer
        extra = dict(head_dim=8, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    model_class, config_class = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config),
        "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig),
    }[kind]
    torch.manual_seed(seed)
    config = config_class(**_SIZES, **extra, attn_implementation=attn_implementation)
    model = model_class(config).eval()
    with torch.no_grad():  # norms start at one (zero for Gemma's 1 + w): give them values
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5) if kind != "gemma3" else param.uniform_(-0.5, 0.5)
    return model


def zero_biases(model: nn.Module) -> nn.Module:
    """Qwen2's query, key and value projections carry biases: zero them (a bias takes relevance)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
    return model


def token_logit(positions: Tensor, token_ids: Tensor) -> Callable[[Tensor], Tensor]:
    """The target of the token at ``positions[b]``: its logit, read at the position before it."""

    def score(logits: Tensor) -> Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, positions - 1, token_ids]

    return score


def token_log_prob(positions: Tensor, token_ids: Tensor) -> Callable[[Tensor], Tensor]:
    """The same token's log-probability: ``log_softmax`` of the logits before it."""

    def score(logits: Tensor) -> Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, positions - 1].log_softmax(-1)[rows, token_ids]

    return score


@contextmanager
def _lxt_efficient() -> Iterator[types.ModuleType]:
    """``lxt.efficient.patches`` loaded without the package ``__init__`` (whose BERT patches need names
    transformers 5 dropped), taken out of ``sys.modules`` afterwards."""
    import lxt

    root = Path(lxt.__file__).parent / "efficient"
    before = set(sys.modules)
    for name, path in (("lxt.efficient", root), ("lxt.efficient.models", root / "models")):
        stand_in = types.ModuleType(name)
        stand_in.__path__ = [str(path)]
        sys.modules[name] = stand_in
    try:
        yield importlib.import_module("lxt.efficient.patches")
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("lxt.efficient"):
                del sys.modules[name]


def lxt_relevance(kind: str, model: nn.Module, embeds: Tensor, score: Callable[[Tensor], Tensor]) -> Tensor:
    """LXT's AttnLRP on ``model`` (eager attention): its patch map of the family for the MLP and the norms,
    its attention wrapper (query and key gradients / 4, value / 2) on ``eager_attention_forward``, and
    gradient x input at the input embeddings.

    LXT's own ``patch_attention`` replaces the module's ``ALL_ATTENTION_FUNCTIONS`` by a plain dict, which
    transformers 5 cannot call (``get_interface``); its wrapper is applied to the eager function instead.
    """
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    with _lxt_efficient() as patches:
        family = importlib.import_module(f"lxt.efficient.models.{kind}")
        classes = [target for target in family.attnLRP if isinstance(target, type)]
        saved = [(cls, dict(vars(cls))) for cls in classes]
        eager = module.eager_attention_forward
        try:
            for cls in classes:
                family.attnLRP[cls](cls)
            module.eager_attention_forward = patches.wrap_attention_forward(eager)
            leaf = embeds.detach().clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(score(model(inputs_embeds=leaf).logits).sum(), leaf)
        finally:
            module.eager_attention_forward = eager
            for cls, attributes in saved:
                for name in set(vars(cls)) - set(attributes):
                    delattr(cls, name)
                for name in ("forward", "_norm"):
                    if name in attributes:
                        setattr(cls, name, attributes[name])
    return leaf.detach() * grad


class PatchBatch(nn.Module):
    """Qwen2-VL's vision tower on a batch [N, C, T, P, P] of its patches (one image of ``grid``), scored by a
    fixed projection of the merged features: the output is [N, 1], the whole score on the first row."""

    def __init__(self, tower: nn.Module, grid: Tensor, probe: Tensor) -> None:
        super().__init__()
        self.tower, self.grid, self.probe = tower, grid, probe

    def forward(self, x: Tensor) -> Tensor:
        merged = self.tower(x.reshape(x.shape[0], -1), grid_thw=self.grid)
        merged = merged.pooler_output if hasattr(merged, "pooler_output") else merged
        total = (merged @ self.probe).sum()
        first = torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device)
        first[0] = 1.0
        return first * total
