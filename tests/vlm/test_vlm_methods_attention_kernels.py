"""Attention rollout under any attention kernel: camkit recomputes each layer's probabilities from what the
attention module received, so eager, SDPA and a kernel camkit cannot see into give the same rollout."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from vlm_helpers import picture
from vlm_methods_helpers import State, family_request

from camkit.errors import UnsupportedModelError
from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


def _rollout_by_hand(attentions: tuple[Tensor, ...], req: Any, b: int) -> Tensor:
    """Row p - 1 of (0.5 A_n + 0.5 I) ... (0.5 A_1 + 0.5 I) at the image tokens, A the head mean."""
    length = attentions[0].shape[-1]
    product = torch.eye(length)
    for a in attentions:
        product = (0.5 * a[b].mean(dim=0) + 0.5 * torch.eye(length)) @ product
    return product[req.positions[b][:, 0] - 1][:, req.layouts[b].positions]


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3", "idefics3"])  # Qwen2-, Gemma3- and Llama-style LMs
def test_rollout_equals_the_eager_models_own_probabilities(family: str) -> None:
    """camkit on the SDPA model against the eager model's own attention probabilities (output_attentions)."""
    builder = pytest.importorskip(f"tiny_{family}")
    model, processor = builder.build()
    eager, _ = builder.build(attn_implementation="eager")
    pictures = [picture(40, 70, seed=5), picture(50, 30, seed=6)]
    req = family_request(model, processor, pictures, PROMPTS, ANSWERS)
    out = get_vlm_method("attention")(req)
    with torch.no_grad():
        attentions = eager(**req.inputs, output_attentions=True).attentions
    assert len(attentions) == 2
    for b in range(2):
        torch.testing.assert_close(out.scores[b], _rollout_by_hand(attentions, req, b), atol=1e-5, rtol=1e-4)
    assert model.config.get_text_config()._attn_implementation == "sdpa"


@torch.library.custom_op("camkit_tests::opaque_attention", mutates_args=())
def _opaque(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool, window: int) -> Tensor:
    """Attention [B, L, H, E] computed out of camkit's sight (a custom operator: no torch function is seen)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    logits = q.float() @ k.float().transpose(-2, -1) * scale
    rows = torch.arange(q.shape[2])[:, None]
    cols = torch.arange(k.shape[2])[None]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    else:
        keep = (cols <= rows) if causal else torch.ones_like(logits[0, 0], dtype=torch.bool)
        keep = keep & (cols > rows - window) if window > 0 else keep
        logits = logits.masked_fill(~keep, float("-inf"))
    return (logits.softmax(-1).nan_to_num(0.0).to(v.dtype) @ v).transpose(1, 2).contiguous()


@_opaque.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool, window: int) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])


def _opaque_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0, sliding_window: int | None = None,
                      skew: float = 1.0, **kwargs: Any) -> tuple[Tensor, None]:  # fmt: skip
    scale = (query.shape[-1] ** -0.5 if scaling is None else scaling) * skew
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    return _opaque(query, key, value, attention_mask, float(scale), causal, int(sliding_window or 0)), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("camkit_opaque", _opaque_attention)  # no mask function: the kernel gets none
    AttentionInterface.register("camkit_opaque_masked", _opaque_attention)
    AttentionMaskInterface.register("camkit_opaque_masked", sdpa_mask)  # the 4-D boolean mask SDPA gets
    AttentionInterface.register("camkit_skewed", lambda *a, **k: _opaque_attention(*a, **k, skew=2.0))


class _Seen(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("family", "kernel"), [("llava", "camkit_opaque"), ("gemma3", "camkit_opaque_masked")])
def test_a_kernel_camkit_cannot_see_into_gives_sdpas_rollout(family: str, kernel: str) -> None:
    """The language model's attention through a custom operator: no softmax or SDPA call is visible, and the
    rollout equals the SDPA model's (LLaVA: no mask, causal; Gemma 3: its 4-D mask, image tokens bidirectional)."""
    _register()
    builder = pytest.importorskip(f"tiny_{family}")
    model, processor = builder.build()
    opaque, _ = builder.build()
    opaque.config.get_text_config()._attn_implementation = kernel
    pictures = [picture(40, 70, seed=5), picture(50, 30, seed=6)]
    req = family_request(opaque, processor, pictures, PROMPTS, ANSWERS)
    language = opaque.get_decoder()
    seen = _Seen()
    with torch.no_grad(), seen:
        language(inputs_embeds=torch.randn(1, 5, language.config.hidden_size))
    assert not seen.names & {"scaled_dot_product_attention", "softmax"}, seen.names
    state = State(opaque, req)
    got = get_vlm_method("attention")(req)
    state.check()
    want = get_vlm_method("attention")(family_request(model, processor, pictures, PROMPTS, ANSWERS))
    for b in range(2):
        torch.testing.assert_close(got.scores[b], want.scores[b], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.log_probs[b], want.log_probs[b], atol=1e-5, rtol=1e-4)
    assert opaque.config.get_text_config()._attn_implementation == kernel


def test_a_kernel_that_computes_something_else_is_refused() -> None:
    """A kernel that doubles the logits' scale: camkit's recomputed output differs from the module's, so the
    reading is refused with the layer named, not returned wrong."""
    import tiny_llava

    _register()
    model, processor = tiny_llava.build()
    model.config.get_text_config()._attn_implementation = "camkit_skewed"
    req = family_request(model, processor, [picture(40, 70, seed=5)], PROMPTS[:1], ANSWERS[:1])
    with pytest.raises(UnsupportedModelError, match=r"LlamaAttention \(layer 0\)"):
        get_vlm_method("attention")(req)
