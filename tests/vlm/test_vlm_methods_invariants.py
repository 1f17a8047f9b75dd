"""Every vision-language method of camkit's own: a batch of prompts equals each prompt alone, and hygiene."""

from __future__ import annotations

import pytest
import torch

from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

import tiny_llava
from vlm_methods_helpers import State, images, one, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the big picture"], ["a red cat", "two dogs"]
METHODS = {
    "gradient_input": {},
    "attention": {},
    "chefer": {},
    "legrad": {},
    "attnlrp": {},
    "occlusion": {},
    "rise": {"masks": 6},
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_batch_equals_one_by_one(name: str) -> None:
    model, processor = tiny_llava_pair()
    pictures = images(2)
    req = request(model, processor, pictures, PROMPTS, ANSWERS, **METHODS[name])
    batch = get_vlm_method(name)(req)
    for b in range(2):
        alone = get_vlm_method(name)(one(req, b, model, processor, pictures, PROMPTS, ANSWERS))
        torch.testing.assert_close(batch.scores[b], alone.scores[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(batch.log_probs[b], alone.log_probs[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("frozen", [False, True], ids=["as-loaded", "frozen"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_hygiene(name: str, frozen: bool) -> None:
    model, processor = tiny_llava.build()
    model.requires_grad_(not frozen)
    req = request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1], **METHODS[name])
    state = State(model, req)
    with torch.no_grad():  # an outer no_grad: the gradient methods enable what they need
        out = get_vlm_method(name)(req)
    state.check()
    assert all(torch.isfinite(s).all() and s.dtype == torch.float32 for s in out.scores)
    assert all(not s.requires_grad for s in [*out.scores, *out.log_probs])
