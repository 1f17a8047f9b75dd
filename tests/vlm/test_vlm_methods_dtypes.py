"""camkit's vision-language methods on the tiny LLaVA in bfloat16 and float16: float32 scores near float32's."""

from __future__ import annotations

import pytest
import torch
from vlm_methods_helpers import images, request, tiny_llava_pair

from camkit.vlm.methods import get_vlm_method

METHODS = {"gradient_input": {}, "attention": {}, "chefer": {}, "legrad": {}, "attnlrp": {}, "occlusion": {}, "rise": {"masks": 6}}
PROMPTS, ANSWERS = ["what is this ?"], ["a red cat"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_half_precision_follows_float32(name: str, dtype: torch.dtype) -> None:
    import tiny_llava

    reference, processor = tiny_llava_pair()
    model, _ = tiny_llava.build(dtype=dtype)
    picture = images(1)
    full = get_vlm_method(name)(request(reference, processor, picture, PROMPTS, ANSWERS, **METHODS[name]))
    req = request(model, processor, picture, PROMPTS, ANSWERS, **METHODS[name])
    req = type(req)(**{**req.__dict__, "inputs": {k: v.to(dtype) if v.is_floating_point() else v
                                                  for k, v in req.inputs.items()}})  # fmt: skip
    half = get_vlm_method(name)(req)
    assert half.scores[0].dtype == torch.float32 and torch.isfinite(half.scores[0]).all()
    torch.testing.assert_close(half.log_probs[0], full.log_probs[0], atol=0.05, rtol=0.05)
    a, b = half.scores[0].flatten(), full.scores[0].flatten()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.9, (a, b)
