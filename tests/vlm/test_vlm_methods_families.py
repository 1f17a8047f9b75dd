"""camkit's vision-language methods on every family with a tiny model here, through ``explain_generation``.

Each method gives finite, non-constant scores for every token, and a batch of two prompts (images of
different sizes, answers of different lengths) equals each prompt alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vlm_helpers import picture

import camkit

FAMILIES = ("llava", "llava_next", "paligemma", "qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "gemma3")
_BUILT: dict[str, tuple[Any, Any]] = {}


def _tiny(family: str) -> tuple[Any, Any]:
    """The family's tiny model and processor (skipped where its builder is not in this tree), built once."""
    if family not in _BUILT:
        if family == "smolvlm":
            pytest.importorskip("num2words")  # SmolVLM's processor needs it
        _BUILT[family] = pytest.importorskip(f"tiny_{family}").build()
    return _BUILT[family]


METHODS = {"gradient_input": {}, "attention": {}, "chefer": {}, "legrad": {}, "attnlrp": {}, "occlusion": {}, "rise": {"masks": 8}}
IMAGES = ((40, 70, 5), (50, 30, 6))
PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


@pytest.mark.heavy  # cases of three explain_generation calls; test_vlm_methods_invariants covers LLaVA in make test
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_batch_equals_one_by_one(family: str, method: str) -> None:
    model, processor = _tiny(family)
    images = [picture(h, w, seed=s) for h, w, s in IMAGES]
    options = METHODS[method]
    batch = camkit.explain_generation(model, processor, images, PROMPTS, answer=ANSWERS, method=method, **options)
    for b in range(2):
        alone = camkit.explain_generation(model, processor, images[b], PROMPTS[b], answer=ANSWERS[b], method=method,
                                          **options)  # fmt: skip
        units, single = batch.explanations[b].extras["unit_scores"], alone.explanations[0].extras["unit_scores"]
        assert torch.isfinite(units).all() and float(units.std()) > 0
        torch.testing.assert_close(units, single, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(batch.scores[b], alone.scores[0], rtol=1e-4, atol=1e-5)
        assert batch.maps[b].shape == (len(batch.tokens[b]), *IMAGES[b][:2])


@pytest.mark.parametrize("family", [f if f in ("llava", "paligemma", "gemma3", "qwen2_5_vl", "idefics3")
                                    else pytest.param(f, marks=pytest.mark.heavy) for f in FAMILIES])
def test_attnlrp_pixels_receive_what_the_image_tokens_received(family: str) -> None:
    """Bias-free (biases, position and class embeddings zero), ``attention="cp"``, ``epsilon=0``: the relevance
    that reaches the image tokens' embeddings flows on, whole, through the projector and the vision tower (Qwen-VL's
    patch rows and merger, Idefics3's crops and pixel shuffle, LLaVA-NeXT's tiles included)."""
    if family == "smolvlm":
        pytest.importorskip("num2words")
    model, processor = pytest.importorskip(f"tiny_{family}").build()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "position_embedding" in name or "class_embedding" in name:
                param.zero_()
    image, common = picture(40, 70, seed=5), dict(answer=ANSWERS[0], method="attnlrp", attention="cp", epsilon=0.0)
    tokens = camkit.explain_generation(model, processor, image, PROMPTS[0], onto="tokens", **common)
    pixels = camkit.explain_generation(model, processor, image, PROMPTS[0], **common)
    assert pixels.explanations[0].extras["units"] == "rows" and tokens.explanations[0].extras["units"] == "tokens"
    from vlm_methods_helpers import family_request

    # tokens that cover no pixel (LLaVA-NeXT's image_newline, a learned parameter) pass nothing on
    boxes = family_request(model, processor, [image], PROMPTS[:1], ANSWERS[:1]).layouts[0].boxes
    into_tokens = tokens.explanations[0].extras["unit_scores"][:, ~boxes.isnan().any(-1)].sum(-1)
    at_pixels = pixels.explanations[0].extras["relevance"][0]  # the relevance found at every pixel
    torch.testing.assert_close(at_pixels, into_tokens, rtol=1e-3, atol=1e-5)
    into_rows = pixels.explanations[0].extras["unit_scores"].sum(-1)
    if family != "llava_next":  # every patch feeds a token, so the rows hold it all (LLaVA-NeXT unpads tiles)
        torch.testing.assert_close(into_rows, at_pixels, rtol=1e-3, atol=1e-5)
    assert float(into_tokens.abs().min()) > 1e-4
