"""Qwen2-VL and Qwen2.5-VL: image tokens laid out on the merged patch grid, checked against the models."""

from __future__ import annotations

import pytest
import tiny_qwen2_5_vl
import tiny_qwen2_vl
import torch
from family_checks import blank, check_tiling, lm_embeddings_and_features, localise, planted, prompt_inputs

from camkit.errors import InvalidInputError
from camkit.vlm.families import family_of
from camkit.vlm.families.qwen_vl import Qwen2VLFamily, Qwen25VLFamily

BUILDERS = {"qwen2_vl": tiny_qwen2_vl.build, "qwen2_5_vl": tiny_qwen2_5_vl.build}
SIZES = [(40, 70), (90, 30), (33, 33), (17, 130)]


@pytest.fixture(scope="module", params=list(BUILDERS))
def tiny(request):
    model, processor = BUILDERS[request.param]()
    return request.param, model, processor


def cells(model):
    """A token's (and merger row's) box in the resized image's pixels."""
    vision = model.config.vision_config
    cell = vision.patch_size * vision.spatial_merge_size
    return cell, cell


def test_family_of(tiny):
    name, model, _ = tiny
    family = family_of(model)
    assert family.name == name
    assert isinstance(family, Qwen25VLFamily if name == "qwen2_5_vl" else Qwen2VLFamily)
    assert family.feature_layer(model) is model.model.visual.merger
    assert family.image_token_id(model) == model.config.image_token_id


def test_positions_boxes_and_tiling(tiny):
    _, model, processor = tiny
    family = family_of(model)
    images = [blank(*size) for size in SIZES]
    inputs = prompt_inputs(processor, images, ["describe the image", "what is this ?", "a", "the red car"])
    layouts = family.layout(model, processor, inputs, SIZES)
    assert len(layouts) == len(SIZES)
    merge = model.config.vision_config.spatial_merge_size
    for b, (layout, (t, h, w)) in enumerate(zip(layouts, inputs["image_grid_thw"].tolist())):
        expected = (inputs["input_ids"][b] == model.config.image_token_id).nonzero().reshape(-1)
        assert torch.equal(layout.positions, expected)
        assert layout.count == t * h * w // merge**2
        assert layout.sizes == (SIZES[b],)
        assert (layout.view == 0).all() and (layout.image == 0).all()
        check_tiling(layout)
    rows = torch.cat([layout.feature_rows for layout in layouts])
    assert torch.equal(rows.sort().values, torch.arange(rows.numel()))  # every merger row reaches one token


def test_two_images_in_one_prompt(tiny):
    _, model, processor = tiny
    family = family_of(model)
    text = processor.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "left right"}]}], add_generation_prompt=True)
    sizes = [(40, 70), (64, 24)]
    inputs = processor(images=[blank(*s) for s in sizes], text=[text], return_tensors="pt")
    (layout,) = family.layout(model, processor, inputs, sizes)
    assert torch.equal(layout.positions, (inputs["input_ids"][0] == model.config.image_token_id).nonzero().reshape(-1))
    assert layout.image.unique().tolist() == [0, 1]
    check_tiling(layout)


@pytest.mark.parametrize(("size", "near"), [((40, 70), (0.7, 0.6)), ((70, 36), (0.2, 0.9)), ((23, 57), (0.5, 0.3))])
def test_planted_dependence(tiny, size, near):
    name, _, processor = tiny
    model, _ = BUILDERS[name]()
    family = family_of(model)
    got, want, got_rows, must, may = planted(model, processor, family, size, cells(model), near)
    assert want.numel() == 1 and torch.equal(got, want)
    assert must.numel() == 1 and torch.equal(must, may)  # one merger row per token: the spot is deep in it too
    assert torch.equal(got_rows, must)


def test_occlude_changes_exactly_the_chosen_tokens(tiny):
    name, _, processor = tiny
    model, _ = BUILDERS[name]()
    localise(model)
    family = family_of(model)
    sizes = [(40, 70), (48, 48)]
    images = [torch.randint(0, 256, (3, *s), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i, s in enumerate(sizes)]
    inputs = prompt_inputs(processor, images)
    layouts = family.layout(model, processor, inputs, sizes)
    keep = [torch.ones(layout.count, dtype=torch.bool) for layout in layouts]
    keep[0][[0, 5, 17]] = False
    keep[1][-1] = False
    before = inputs["pixel_values"].clone()
    occluded = family.occlude(model, inputs, keep, 0.0)
    assert torch.equal(inputs["pixel_values"], before)  # inputs untouched
    layer = family.feature_layer(model)
    a, _ = lm_embeddings_and_features(model, layer, inputs)
    b, _ = lm_embeddings_and_features(model, layer, occluded)
    for s, layout in enumerate(layouts):
        moved = ((a[s] - b[s]).abs().amax(-1) > 1e-6).nonzero().reshape(-1)
        assert torch.equal(moved, layout.positions[~keep[s]])
    per_channel = family.occlude(model, inputs, keep, torch.tensor([-1.0, 0.0, 1.0])[:, None, None])
    dropped = ~torch.cat(keep).repeat_interleave(4)
    rows = per_channel["pixel_values"][dropped].view(-1, 3, 2 * 4 * 4)
    assert torch.equal(rows[:, 0], torch.full_like(rows[:, 0], -1.0)) and (rows[:, 2] == 1).all()
    assert torch.equal(per_channel["pixel_values"][~dropped], before[~dropped])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_loads_and_runs(tiny, dtype):
    name, _, processor = tiny
    model, _ = BUILDERS[name](dtype=dtype)
    family = family_of(model)
    inputs = prompt_inputs(processor, [blank(40, 70)])
    (layout,) = family.layout(model, processor, inputs, [(40, 70)])
    embeds, rows = lm_embeddings_and_features(model, family.feature_layer(model), inputs)
    assert rows.dtype == dtype and torch.isfinite(rows).all() and torch.isfinite(embeds).all()
    assert rows.shape[0] == layout.count
    assert model.config._attn_implementation == "sdpa"


def test_bad_input_is_refused_clearly(tiny):
    _, model, processor = tiny
    family = family_of(model)
    inputs = prompt_inputs(processor, [blank(40, 70)])
    with pytest.raises(InvalidInputError, match=r"image sizes|images"):
        family.layout(model, processor, inputs, [(40, 70), (10, 10)])
    with pytest.raises(InvalidInputError, match="image_grid_thw"):
        family.layout(model, processor, {k: v for k, v in inputs.items() if k != "image_grid_thw"}, [(40, 70)])
    with pytest.raises(InvalidInputError, match="keep"):
        family.occlude(model, inputs, [torch.ones(3, dtype=torch.bool)], 0.0)
    with pytest.raises(InvalidInputError, match="baseline"):
        family.occlude(model, inputs, [torch.zeros(45, dtype=torch.bool)], torch.zeros(2, 2))
