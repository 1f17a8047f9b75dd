"""Gemma 3: one square view per image plus pan-and-scan crops, 4 x 4 pooled patches; checked against the model."""

from __future__ import annotations

import pytest
import tiny_gemma3
import torch
from family_checks import (
    blank,
    check_tiling,
    is_within,
    lm_embeddings_and_features,
    localise,
    planted,
    prompt_inputs,
)

from camkit.errors import InvalidInputError
from camkit.vlm.families import family_of
from camkit.vlm.families.gemma3 import Gemma3Family, pan_and_scan_boxes

#: (size, crops with the tiny processor's pan-and-scan: at least 16 pixels, at most 3, from a 1.2 aspect ratio)
SIZES = [((40, 130), 3), ((130, 40), 3), ((40, 60), 2), ((50, 50), 0)]


@pytest.fixture(scope="module")
def tiny():
    return tiny_gemma3.build(pan_and_scan=True)


def cells(model):
    """A token's and a feature row's (patch's) box in the view's pixels."""
    patch = model.config.vision_config.patch_size
    side = model.config.vision_config.image_size // patch
    return patch * side // int(model.config.mm_tokens_per_image**0.5), patch


def test_family_of(tiny):
    model, _ = tiny
    family = family_of(model)
    assert isinstance(family, Gemma3Family) and family.name == "gemma3"
    assert family.feature_layer(model) is model.model.vision_tower.post_layernorm
    assert family.image_token_id(model) == model.config.image_token_id


def test_pan_and_scan_boxes_cover_the_image():
    assert pan_and_scan_boxes(130, 40, 3) == [(0.0, 0.0, 44.0, 40.0), (44.0, 0.0, 88.0, 40.0), (88.0, 0.0, 130.0, 40.0)]
    assert pan_and_scan_boxes(50, 101, 2) == [(0.0, 0.0, 50.0, 51.0), (0.0, 51.0, 50.0, 101.0)]


@pytest.mark.parametrize("pan_and_scan", [True, False])
def test_positions_views_and_tiling(tiny, pan_and_scan):
    model, processor = tiny
    family = family_of(model)
    sizes = [size for size, _ in SIZES]
    inputs = prompt_inputs(processor, [blank(*s) for s in sizes], ["describe the image", "a", "what is this ?", "it"],
                           do_pan_and_scan=pan_and_scan)
    layouts = family.layout(model, processor, inputs, sizes)
    tokens = model.config.mm_tokens_per_image
    for b, (layout, (_, crops)) in enumerate(zip(layouts, SIZES)):
        expected = (inputs["input_ids"][b] == model.config.image_token_id).nonzero().reshape(-1)
        assert torch.equal(layout.positions, expected)
        views = 1 + (crops if pan_and_scan else 0)
        assert layout.count == views * tokens
        assert layout.view.view(views, -1)[:, 0].tolist() == list(range(views))  # the whole image first
        check_tiling(layout)
    assert sum(layout.count for layout in layouts) == inputs["pixel_values"].shape[0] * tokens


def test_two_images_with_crops_in_one_prompt(tiny):
    model, processor = tiny
    family = family_of(model)
    text = processor.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}], add_generation_prompt=True)
    sizes = [(40, 130), (40, 60)]
    inputs = processor(images=[[blank(*s) for s in sizes]], text=[text], return_tensors="pt")
    (layout,) = family.layout(model, processor, inputs, sizes)
    assert torch.equal(layout.positions, (inputs["input_ids"][0] == model.config.image_token_id).nonzero().reshape(-1))
    assert layout.view[layout.image == 0].max() == 3 and layout.view[layout.image == 1].max() == 2
    check_tiling(layout)
    # crops the processor's settings do not predict cannot be laid out: a clear error, not a wrong map
    with pytest.raises(InvalidInputError, match="pan-and-scan"):
        family.layout(model, processor, inputs, [(40, 130), (40, 40)])


@pytest.mark.parametrize(("size", "near", "crops"), [
    ((48, 48), (0.7, 0.6), False), ((96, 48), (0.3, 0.7), True), ((48, 144), (0.6, 0.8), True),
    ((40, 70), (0.5, 0.3), False)])
def test_planted_dependence(size, near, crops):
    model, processor = tiny_gemma3.build(pan_and_scan=crops)
    family = family_of(model)
    got, want, got_rows, must, may = planted(model, processor, family, size, cells(model), near, radius=1.0)
    assert want.numel() == (2 if crops else 1)  # the spot's token in the whole image and in its crop
    assert torch.equal(got, want)
    assert must.numel() == want.numel() and is_within(must, got_rows) and is_within(got_rows, may)


def test_occlude_changes_exactly_the_chosen_tokens(tiny):
    model, processor = tiny_gemma3.build(pan_and_scan=True)
    localise(model)
    family = family_of(model)
    sizes = [(40, 130), (50, 50)]
    images = [torch.randint(0, 256, (3, *s), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i, s in enumerate(sizes)]
    inputs = prompt_inputs(processor, images)
    layouts = family.layout(model, processor, inputs, sizes)
    keep = [torch.ones(layout.count, dtype=torch.bool) for layout in layouts]
    keep[0][[0, 4, 11, 30, layouts[0].count - 1]] = False
    keep[1][:] = False
    before = inputs["pixel_values"].clone()
    occluded = family.occlude(model, inputs, keep, torch.tensor([0.5, 0.0, -0.5])[:, None, None])
    assert torch.equal(inputs["pixel_values"], before)
    layer = family.feature_layer(model)
    a, _ = lm_embeddings_and_features(model, layer, inputs)
    b, _ = lm_embeddings_and_features(model, layer, occluded)
    for s, layout in enumerate(layouts):
        moved = ((a[s] - b[s]).abs().amax(-1) > 1e-6).nonzero().reshape(-1)
        assert torch.equal(moved, layout.positions[~keep[s]])
    assert (occluded["pixel_values"][-1, 0] == 0.5).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_loads_and_runs(dtype):
    model, processor = tiny_gemma3.build(dtype=dtype)
    family = family_of(model)
    inputs = prompt_inputs(processor, [blank(40, 70)])
    (layout,) = family.layout(model, processor, inputs, [(40, 70)])
    embeds, rows = lm_embeddings_and_features(model, family.feature_layer(model), inputs)
    assert rows.dtype == dtype and torch.isfinite(rows).all() and torch.isfinite(embeds).all()
    assert rows.shape[0] == layout.feature_rows.numel()
    assert model.config._attn_implementation == "sdpa"
