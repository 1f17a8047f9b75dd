"""The vision-language method "gradient_input" against gradient x input computed by hand on the tiny LLaVA."""

from __future__ import annotations

import pytest
import torch

from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

from vlm_methods_helpers import images, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


def _merged_embeddings(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The language model's input embeddings, assembled by hand: projected CLIP features at the image tokens."""
    inner, config = model.model, model.config
    hidden = inner.vision_tower(inputs["pixel_values"], output_hidden_states=True).hidden_states
    features = inner.multi_modal_projector(hidden[config.vision_feature_layer][:, 1:])  # the CLS row dropped
    embeds = model.get_input_embeddings()(inputs["input_ids"]).clone()
    for b in range(embeds.shape[0]):
        embeds[b, inputs["input_ids"][b] == config.image_token_id] = features[b]
    return embeds


def test_equals_gradient_times_input_by_hand() -> None:
    model, processor = tiny_llava_pair()
    pictures = images(2)
    req = request(model, processor, pictures, PROMPTS, ANSWERS)
    out = get_vlm_method("gradient_input")(req)
    with torch.no_grad():
        embeds = _merged_embeddings(model, req.inputs)
    for b in range(2):
        for t, (p, token) in enumerate(zip(req.positions[b][:, 0].tolist(), req.token_ids[b][:, 0].tolist())):
            leaf = embeds.detach().clone().requires_grad_(True)
            logits = model(inputs_embeds=leaf, attention_mask=req.inputs["attention_mask"]).logits
            score = logits[b, p - 1].log_softmax(-1)[token]
            (grad,) = torch.autograd.grad(score, leaf)
            expected = (grad * leaf.detach()).sum(-1)[b, req.layouts[b].positions]
            torch.testing.assert_close(out.scores[b][t], expected, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(out.log_probs[b][t], score.detach(), atol=1e-6, rtol=1e-5)
    assert out.units == "tokens" and out.scores[0].shape == (3, 16) and out.scores[1].shape == (2, 16)
    assert all(s.abs().sum() > 0 for s in out.scores)


def test_batch_tokens_bounds_each_backward_without_changing_the_result() -> None:
    model, processor = tiny_llava_pair()
    pictures = images(2)
    whole = get_vlm_method("gradient_input")(request(model, processor, pictures, PROMPTS, ANSWERS))
    bounded = get_vlm_method("gradient_input")(request(model, processor, pictures, PROMPTS, ANSWERS, batch_tokens=1))
    for a, b in zip(whole.scores, bounded.scores):
        torch.testing.assert_close(a, b)
