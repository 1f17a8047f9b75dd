"""The vision-language method "attnlrp" on the tiny LLaVA: conservation, and pixels agreeing with tokens.

With ``attention="cp"``, ``epsilon=0`` and every additive parameter zero (biases, position and class
embeddings), every rule conserves: the relevance at the language model's input embeddings sums to the
target's logit, and the relevance that reaches the image tokens' embeddings flows on, whole, through the
projector and the vision tower to the pixels.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.errors import InvalidInputError
from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

import tiny_llava
from vlm_methods_helpers import images, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


def _bias_free(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "position_embedding" in name or "class_embedding" in name:
                param.zero_()
    return model


def _logits(model: nn.Module, req) -> list[torch.Tensor]:
    with torch.no_grad():
        logits = model(**req.inputs).logits
    return [logits[b, pos[:, 0] - 1, tok[:, 0]] for b, (pos, tok) in enumerate(zip(req.positions, req.token_ids))]


def test_tokens_conserve_the_logit() -> None:
    model, processor = tiny_llava.build()
    model = _bias_free(model)
    req = request(model, processor, images(2), PROMPTS, ANSWERS, onto="tokens", attention="cp", epsilon=0.0)
    out = get_vlm_method("attnlrp")(req)
    for b, logit in enumerate(_logits(model, req)):
        torch.testing.assert_close(out.extras["logits"][b], logit)
        torch.testing.assert_close(out.extras["relevance"][b], logit, atol=1e-5, rtol=1e-4)
        assert out.scores[b].shape == (req.positions[b].shape[0], 16)
        # the image tokens take a share of it, not all of it: the text tokens take the rest
        assert (out.scores[b].sum(-1) - logit).abs().max() > 1e-6


def test_pixels_receive_what_the_image_tokens_received() -> None:
    model, processor = tiny_llava.build()
    model = _bias_free(model)
    pictures = images(2)
    common = dict(attention="cp", epsilon=0.0)
    tokens = get_vlm_method("attnlrp")(request(model, processor, pictures, PROMPTS, ANSWERS, onto="tokens", **common))
    pixels = get_vlm_method("attnlrp")(request(model, processor, pictures, PROMPTS, ANSWERS, onto="pixels", **common))
    assert pixels.units == "rows" and tokens.units == "tokens"
    for b in range(2):
        torch.testing.assert_close(pixels.scores[b].sum(-1), tokens.scores[b].sum(-1), atol=1e-5, rtol=1e-3)
        assert pixels.scores[b].shape == tokens.scores[b].shape  # LLaVA 1.5: one feature row per image token


def test_log_probs_are_reported_beside_the_logits() -> None:
    model, processor = tiny_llava_pair()
    req = request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1], onto="tokens")
    out = get_vlm_method("attnlrp")(req)
    with torch.no_grad():
        logits = model(**req.inputs).logits[0, req.positions[0][:, 0] - 1]
    torch.testing.assert_close(out.log_probs[0], logits.log_softmax(-1)[torch.arange(3), req.token_ids[0][:, 0]])


def test_unknown_onto_is_refused() -> None:
    model, processor = tiny_llava_pair()
    with pytest.raises(InvalidInputError, match="onto"):
        get_vlm_method("attnlrp")(request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1], onto="patches"))
