"""The vision-language case compares like with like: captum's masks are the image tokens' patches, and where camkit's
occlusion is registered its scores equal captum 0.9's LLMAttribution(FeatureAblation)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import _vlm_models as vlm
from benchmarks import case_vlm


@pytest.fixture(scope="module")
def tiny():
    return vlm.build("tiny")


def test_the_masks_are_the_image_tokens_boxes(tiny):
    from camkit.vlm.families import family_of
    from camkit.vlm.prompts import prepare, teacher_forced

    model, processor = tiny
    family = family_of(model)
    prompts = prepare(model, processor, family, vlm.image("tiny"), vlm.PROMPT)
    forced = teacher_forced(prompts, [torch.tensor([5])], family, 0, torch.device("cpu"))
    (layout,) = family.layout(model, processor, forced.inputs, [prompts[0].size])
    masks = case_vlm._patch_masks("tiny")
    assert len(masks) == layout.count
    rows = torch.arange(32, dtype=torch.float32)[:, None] + 0.5
    cols = torch.arange(32, dtype=torch.float32)[None] + 0.5
    for mask, (y0, x0, y1, x1) in zip(masks, layout.boxes.tolist()):
        assert torch.equal(mask, (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1))


@pytest.mark.heavy  # captum's one forward per patch
def test_camkit_occlusion_equals_captums_feature_ablation(tiny):
    from camkit.vlm.methods import list_vlm_methods

    if "occlusion" not in list_vlm_methods():
        pytest.skip("camkit's vision-language occlusion is not registered in this tree")
    pytest.importorskip("captum")
    model, processor = tiny
    ours = case_vlm._occlusion_scores(case_vlm.prepare("camkit occlusion", model, processor, "tiny", 3)())
    theirs = case_vlm.prepare(case_vlm.CAPTUM, model, processor, "tiny", 3)()
    assert ours is not None and ours.shape == theirs.shape == (3, 16)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
