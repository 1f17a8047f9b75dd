"""The vision-language method "attention": rollout by hand from eager attention, against camkit's from SDPA."""

from __future__ import annotations

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.vlm.methods import get_vlm_method
from camkit.vlm.methods.attention import attention_probabilities, attention_rollout

pytest.importorskip("transformers")

import tiny_llava
from vlm_methods_helpers import images, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


@pytest.mark.parametrize("layers", [1, 2])
def test_rollout_equals_eager_attention_by_hand(layers: int) -> None:
    """Â_l = (A_l averaged over heads + I) / 2, the product Â_n ... Â_1; row p - 1 at the image tokens."""
    model, processor = tiny_llava_pair(layers=layers)
    eager, _ = tiny_llava.build(layers=layers, attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    pictures = images(2)
    req = request(model, processor, pictures, PROMPTS, ANSWERS)
    out = get_vlm_method("attention")(req)
    with torch.no_grad():
        attentions = eager(**req.inputs, output_attentions=True).attentions  # the eager model's own probabilities
    assert len(attentions) == layers
    length = req.inputs["input_ids"].shape[1]
    product = torch.eye(length).expand(2, -1, -1)
    for a in attentions:
        product = (0.5 * a.mean(dim=1) + 0.5 * torch.eye(length)) @ product  # Â_n ... Â_1
    for b in range(2):
        rows = product[b, req.positions[b][:, 0] - 1]  # [T, L]
        expected = rows[:, req.layouts[b].positions]
        torch.testing.assert_close(out.scores[b], expected, atol=1e-5, rtol=1e-4)
    assert model.config._attn_implementation == "sdpa"
    assert all(((s > 0) & (s < 1)).all() for s in out.scores)


def test_rollout_on_eager_attention_reads_the_same() -> None:
    model, processor = tiny_llava.build(attn_implementation="eager")
    sdpa, _ = tiny_llava_pair()
    req = request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1])
    a = get_vlm_method("attention")(req)
    b = get_vlm_method("attention")(request(sdpa, processor, images(1), PROMPTS[:1], ANSWERS[:1]))
    torch.testing.assert_close(a.scores[0], b.scores[0], atol=1e-5, rtol=1e-4)


def test_attention_probabilities_by_hand() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 5, 3), torch.randn(2, 2, 5, 3)  # grouped heads: 2 query heads per key head
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True
    expected = torch.stack([
        ((q[:, h] @ k[:, h // 2].transpose(-2, -1)) * 0.5).masked_fill(~mask[:, 0], float("-inf")).softmax(-1)
        for h in range(4)
    ]).mean(0)  # fmt: skip
    torch.testing.assert_close(attention_probabilities(q, k, mask, scale=0.5), expected)
    additive = torch.zeros(2, 1, 5, 5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(attention_probabilities(q, k, additive, scale=0.5), expected)


def test_rollout_residual_zero_is_the_plain_product() -> None:
    a, b = torch.rand(1, 3, 3).softmax(-1), torch.rand(1, 3, 3).softmax(-1)
    rows = torch.eye(3)[None]
    torch.testing.assert_close(attention_rollout([a, b], rows, residual=0.0), (b @ a))


def test_residual_out_of_range_is_refused() -> None:
    model, processor = tiny_llava_pair()
    with pytest.raises(InvalidInputError, match="residual"):
        get_vlm_method("attention")(request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1], residual=2.0))


@pytest.mark.heavy  # transformers compiles flex attention (tens of seconds on a CPU)
def test_flex_attention_gives_sdpas_rollout() -> None:
    """Flex attention (a compiled kernel, as flash attention is one camkit cannot read): the same rollout, the
    model as loaded."""
    model, processor = tiny_llava.build(attn_implementation="flex_attention")
    sdpa, _ = tiny_llava_pair()
    got = get_vlm_method("attention")(request(model, processor, images(2), PROMPTS, ANSWERS))
    want = get_vlm_method("attention")(request(sdpa, processor, images(2), PROMPTS, ANSWERS))
    for b in range(2):
        torch.testing.assert_close(got.scores[b], want.scores[b], atol=1e-5, rtol=1e-4)
    assert model.config._attn_implementation == "flex_attention"
