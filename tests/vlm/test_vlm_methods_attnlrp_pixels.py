"""AttnLRP onto pixels for every family: each feature row gets the relevance of its own pixels.

Relevance at an input is the input times a (modified) gradient, so pixels set to zero get exactly none:
zeroing the pixels of one unit (a patch of one view or tile; a Qwen-VL token's ``2 x 2`` patch rows)
makes exactly that unit's score zero, which pins the view (LLaVA-NeXT's tiles, Idefics3's crops before
the whole image), the patch within it, and Qwen2.5-VL's window order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from vlm_helpers import picture
from vlm_methods_helpers import State, family_request

from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]
_BUILT: dict[str, tuple[Any, Any]] = {}


def _tiny(family: str) -> tuple[Any, Any]:
    if family not in _BUILT:
        if family == "smolvlm":
            pytest.importorskip("num2words")  # SmolVLM's processor needs it
        crops = family == "gemma3_crops"  # pan-and-scan: the views of the batch concatenated in pixel_values
        builder = pytest.importorskip("tiny_gemma3" if crops else f"tiny_{family}")
        _BUILT[family] = builder.build(pan_and_scan=True) if crops else builder.build()
    return _BUILT[family]


def _plant(family: str, model: Any, req: Any, view: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The inputs with one unit's pixels zeroed, and which of the layout's rows that unit is."""
    inputs = {k: v.clone() for k, v in req.inputs.items()}
    pixels, layout = inputs["pixel_values"], req.layouts[0]
    if family.startswith("qwen"):  # token k's patch rows are 4k .. 4k + 3 (the processor's order)
        k = 5
        pixels[4 * k : 4 * k + 4] = 0
        return inputs, layout.feature_token == k
    patch = int(model.config.vision_config.patch_size)
    grid = pixels.shape[-1] // patch
    if pixels.dim() == 4:  # Gemma 3's views of the batch [V, C, H, W]: the whole image, then its crops
        pixels = pixels[None]
    extra = 1 if family == "llava_next" else 0  # CLIP's class row comes first in each view's rows
    # the layout's view of pixel view `view`: LLaVA-NeXT keeps the order (0 the whole image, then the tiles);
    # Idefics3 / SmolVLM put the crops (1..) first and the whole image (0) last
    named = view if family in ("llava_next", "gemma3_crops") else (view + 1 if view < pixels.shape[1] - 1 else 0)
    row = int(layout.feature_rows[layout.feature_view == named].max())  # a patch the layout keeps (unpadded)
    py, px = divmod(row % (grid * grid + extra) - extra, grid)
    pixels[0, view, :, py * patch : (py + 1) * patch, px * patch : (px + 1) * patch] = 0
    return inputs, layout.feature_rows == row


_HEAVY = pytest.mark.heavy  # the same reading as the cases above it, on one more layout
CASES = [("llava_next", 2), ("idefics3", 1), ("qwen2_5_vl", 0), pytest.param("idefics3", 4, marks=_HEAVY),
         pytest.param("smolvlm", 3, marks=_HEAVY), pytest.param("qwen2_vl", 0, marks=_HEAVY),
         pytest.param("gemma3_crops", 3, marks=_HEAVY)]
SIZES = {"gemma3_crops": (40, 130)}  # wide enough for 3 pan-and-scan crops


@pytest.mark.parametrize(("family", "view"), CASES)
def test_zeroed_pixels_zero_exactly_their_unit(family: str, view: int) -> None:
    model, processor = _tiny(family)
    image = picture(*SIZES.get(family, (40, 70)), seed=5)
    req = family_request(model, processor, [image], PROMPTS[:1], ANSWERS[:1], onto="pixels")
    before = get_vlm_method("attnlrp")(req)
    # (the tiny Gemma 3's sliding window keeps its first views out of the answer's reach: zero there already)
    untouched = (before.scores[0] == 0).all(dim=0)
    assert before.units == "rows" and float(untouched.float().mean()) <= 0.5
    inputs, unit = _plant(family, model, req, view)
    assert int(unit.sum()) == 1 and not bool(untouched[unit].any())
    planted = dataclasses.replace(req, inputs=inputs)
    state = State(model, planted)
    after = get_vlm_method("attnlrp")(planted)
    state.check()
    zero = (after.scores[0] == 0).all(dim=0)
    assert torch.equal(zero, unit | untouched), (zero.nonzero().flatten().tolist(), unit.nonzero().flatten().tolist())


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3", pytest.param("gemma3_crops", marks=_HEAVY)])
def test_batch_equals_one_by_one(family: str) -> None:
    """Two prompts with images of other sizes (other numbers of patch rows, crops) and answers of other lengths."""
    model, processor = _tiny(family)
    pictures = [picture(*SIZES.get(family, (40, 70)), seed=5), picture(50, 30, seed=6)]
    batch = get_vlm_method("attnlrp")(family_request(model, processor, pictures, PROMPTS, ANSWERS))
    assert batch.extras["onto"] == "pixels"
    for b in range(2):
        alone = get_vlm_method("attnlrp")(family_request(model, processor, pictures[b : b + 1], PROMPTS[b : b + 1],
                                                         ANSWERS[b : b + 1]))  # fmt: skip
        torch.testing.assert_close(batch.scores[b], alone.scores[0], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(batch.log_probs[b], alone.log_probs[0], atol=1e-5, rtol=1e-4)
