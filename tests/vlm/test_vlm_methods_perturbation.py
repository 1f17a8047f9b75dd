"""The vision-language methods "occlusion" and "rise" against their formulas, by hand, on the tiny LLaVA.

The tiny LLaVA sees a 32 x 32 crop in patches of 8: image token ``i`` is patch ``(i // 4, i % 4)`` of
``pixel_values``, which the hand computations set to the baseline themselves.
"""

from __future__ import annotations

import pytest
import torch

from camkit.vlm.methods import get_vlm_method
from camkit.vlm.methods.perturbation import rise_masks, rise_scores

pytest.importorskip("transformers")

from vlm_methods_helpers import images, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


def _log_probs(model: torch.nn.Module, req, pixels: torch.Tensor) -> torch.Tensor:
    """[B, T]: each answer token's log-probability with ``pixel_values`` replaced."""
    with torch.no_grad():
        logits = model(**{**req.inputs, "pixel_values": pixels}).logits
    out = torch.zeros(len(req.positions), max(p.shape[0] for p in req.positions))
    for b, (pos, tok) in enumerate(zip(req.positions, req.token_ids)):
        out[b, : pos.shape[0]] = logits[b, pos[:, 0] - 1].log_softmax(-1)[torch.arange(pos.shape[0]), tok[:, 0]]
    return out


def _occluded(pixels: torch.Tensor, dropped: list[list[int]], value: float) -> torch.Tensor:
    out = pixels.clone()
    for b, units in enumerate(dropped):
        for i in units:
            r, c = divmod(i, 4)
            out[b, :, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8] = value
    return out


@pytest.mark.parametrize("baseline", [0.0, -1.5])
def test_occlusion_is_the_drop_of_each_patch(baseline: float) -> None:
    model, processor = tiny_llava_pair()
    req = request(model, processor, images(2), PROMPTS, ANSWERS, batch_tokens=6, baseline=baseline)
    out = get_vlm_method("occlusion")(req)
    pixels = req.inputs["pixel_values"]
    base = _log_probs(model, req, pixels)
    for i in range(16):
        drop = base - _log_probs(model, req, _occluded(pixels, [[i], [i]], baseline))
        for b in range(2):
            torch.testing.assert_close(out.scores[b][:, i], drop[b, : req.positions[b].shape[0]], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.log_probs[0], base[0])
    assert out.scores[0].abs().max() > 1e-4


def test_rise_is_its_estimate_on_four_masks_by_hand() -> None:
    model, processor = tiny_llava_pair()
    req = request(model, processor, images(2), PROMPTS, ANSWERS, masks=4, keep=0.5, seed=3)
    out = get_vlm_method("rise")(req)
    generator = torch.Generator().manual_seed(3)
    masks = torch.rand(4, 16, generator=generator) < 0.5  # the same draw for each sample
    assert torch.equal(masks, rise_masks(4, 16, 0.5, 3))
    pixels = req.inputs["pixel_values"]
    scores = torch.stack([
        _log_probs(model, req, _occluded(pixels, [(~m).nonzero()[:, 0].tolist()] * 2, 0.0)) for m in masks
    ])  # [4, B, T]  # fmt: skip
    for b in range(2):
        t = req.positions[b].shape[0]
        s = scores[:, b, :t]  # [4, T]
        expected = torch.stack([
            sum((s[m, j] - s[:, j].mean()) * masks[m].float() for m in range(4)) / (4 * 0.5) for j in range(t)
        ])  # fmt: skip
        torch.testing.assert_close(out.scores[b], expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(rise_scores(s, masks, 0.5), expected, atol=1e-5, rtol=1e-4)
