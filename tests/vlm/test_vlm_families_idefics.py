"""Idefics3 and SmolVLM: crops plus the global image, pixel shuffle; layouts checked against the models."""

from __future__ import annotations

import pytest
import tiny_idefics3
import torch
from family_checks import blank, check_tiling, is_within, lm_embeddings_and_features, localise, planted, prompt_inputs

from camkit.errors import InvalidInputError
from camkit.vlm.families import family_of
from camkit.vlm.families.idefics import Idefics3Family, SmolVLMFamily

pytest.importorskip("num2words")  # SmolVLM's processor needs it
import tiny_smolvlm

BUILDERS = {"idefics3": tiny_idefics3.build, "smolvlm": tiny_smolvlm.build}
#: (size, crops as rows x cols): the longest edge goes to 64 pixels, then both sides up to multiples of 32
SIZES = [((40, 70), (2, 2)), ((20, 70), (1, 2)), ((70, 20), (2, 1)), ((24, 30), (2, 2))]


@pytest.fixture(scope="module", params=list(BUILDERS))
def tiny(request):
    model, processor = BUILDERS[request.param]()
    return request.param, model, processor


def cells(model):
    """A token's and a feature row's (patch's) box in the view's pixels."""
    patch = model.config.vision_config.patch_size
    return patch * model.config.scale_factor, patch


def test_family_of(tiny):
    name, model, _ = tiny
    family = family_of(model)
    assert family.name == name and isinstance(family, SmolVLMFamily if name == "smolvlm" else Idefics3Family)
    assert family.feature_layer(model) is model.model.vision_model.post_layernorm


def test_positions_views_and_tiling(tiny):
    _, model, processor = tiny
    family = family_of(model)
    sizes = [size for size, _ in SIZES]
    inputs = prompt_inputs(processor, [blank(*s) for s in sizes], ["describe the image", "a", "what is this ?", "it"])
    layouts = family.layout(model, processor, inputs, sizes)
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size // model.config.scale_factor
    for b, (layout, (_, (rows, cols))) in enumerate(zip(layouts, SIZES)):
        expected = (inputs["input_ids"][b] == model.config.image_token_id).nonzero().reshape(-1)
        assert torch.equal(layout.positions, expected)
        views = rows * cols + 1
        assert layout.count == views * side * side
        # crops first (views 1..), in row-major order, then the global image (view 0)
        order = [*range(1, views), 0]
        assert layout.view.view(views, -1)[:, 0].tolist() == order
        crop_boxes = layout.boxes[layout.view > 0]
        if rows:
            assert crop_boxes[:, 2].max() == sizes[b][0] and crop_boxes[:, 3].max() == sizes[b][1]
        check_tiling(layout)
        assert torch.equal(layout.feature_token.unique(), torch.arange(layout.count))


def test_two_images_in_one_prompt(tiny):
    _, model, processor = tiny
    family = family_of(model)
    text = processor.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}], add_generation_prompt=True)
    sizes = [(20, 70), (40, 70)]
    inputs = processor(images=[[blank(*s) for s in sizes]], text=[text], return_tensors="pt")
    (layout,) = family.layout(model, processor, inputs, sizes)
    assert torch.equal(layout.positions, (inputs["input_ids"][0] == model.config.image_token_id).nonzero().reshape(-1))
    assert (layout.image == 0).sum() == 3 * (layout.image == 1).sum() / 5
    check_tiling(layout)


#: sizes whose crops need little resampling (bilinear reaches a few pixels; tokens here are 8 view pixels):
#: 2 x 2, 1 x 2 and 2 x 1 crops as they are, 1 x 2 crops of an image shrunk by 1.5, the global image alone
PLANTED = [((64, 64), (0.7, 0.6), {}), ((32, 64), (0.3, 0.8), {}), ((64, 32), (0.8, 0.3), {}),
           ((48, 96), (0.4, 0.3), {}), ((64, 64), (0.4, 0.7), {"do_image_splitting": False})]


@pytest.mark.parametrize(("size", "near", "split"), PLANTED)
def test_planted_dependence(tiny, size, near, split):
    name, _, processor = tiny
    model, _ = BUILDERS[name]()
    family = family_of(model)
    got, want, got_rows, must, may = planted(model, processor, family, size, cells(model), near, radius=1.0, **split)
    assert want.numel() == (1 if split else 2)  # the spot's token in its crop and in the global image
    assert torch.equal(got, want)
    assert must.numel() == want.numel() and is_within(must, got_rows) and is_within(got_rows, may)


def test_occlude_changes_exactly_the_chosen_tokens(tiny):
    name, _, processor = tiny
    model, _ = BUILDERS[name]()
    localise(model)
    family = family_of(model)
    sizes = [(40, 70), (24, 30)]
    images = [torch.randint(0, 256, (3, *s), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i, s in enumerate(sizes)]
    inputs = prompt_inputs(processor, images)
    layouts = family.layout(model, processor, inputs, sizes)
    keep = [torch.ones(layout.count, dtype=torch.bool) for layout in layouts]
    keep[0][[0, 5, 17, 40, layouts[0].count - 1]] = False
    keep[1][:] = False  # a whole view at 0 must not be taken for padding
    before = inputs["pixel_values"].clone()
    occluded = family.occlude(model, inputs, keep, 0.0)
    assert torch.equal(inputs["pixel_values"], before)
    layer = family.feature_layer(model)
    a, _ = lm_embeddings_and_features(model, layer, inputs)
    b, _ = lm_embeddings_and_features(model, layer, occluded)
    for s, layout in enumerate(layouts):
        moved = ((a[s] - b[s]).abs().amax(-1) > 1e-6).nonzero().reshape(-1)
        assert torch.equal(moved, layout.positions[~keep[s]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_loads_and_runs(tiny, dtype):
    name, _, processor = tiny
    model, _ = BUILDERS[name](dtype=dtype)
    family = family_of(model)
    inputs = prompt_inputs(processor, [blank(40, 70)])
    (layout,) = family.layout(model, processor, inputs, [(40, 70)])
    embeds, rows = lm_embeddings_and_features(model, family.feature_layer(model), inputs)
    assert rows.dtype == dtype and torch.isfinite(rows).all() and torch.isfinite(embeds).all()
    assert rows.shape[0] == layout.feature_rows.numel()
    assert model.config._attn_implementation == "sdpa"


def test_without_line_break_tokens_the_processor_gives_the_rows(tiny):
    """A tokenizer that drops line breaks leaves no row break in the text: the image processor's grid stands in."""
    _, model, processor = tiny
    family = family_of(model)
    sizes = [(40, 70), (70, 20)]
    inputs = prompt_inputs(processor, [blank(*s) for s in sizes])
    layouts = family.layout(model, processor, inputs, sizes)
    newline = processor.tokenizer.convert_tokens_to_ids("\n")
    ids = inputs["input_ids"]
    kept = [row[row != newline] for row in ids]
    width = max(len(row) for row in kept)
    pad = processor.tokenizer.pad_token_id
    squeezed = dict(inputs, input_ids=torch.stack([torch.cat([r, r.new_full((width - len(r),), pad)]) for r in kept]))
    for before, after in zip(layouts, family.layout(model, processor, squeezed, sizes)):
        assert torch.equal(before.boxes, after.boxes) and torch.equal(before.view, after.view)
        assert torch.equal(before.feature_rows, after.feature_rows)


def test_bad_input_is_refused_clearly(tiny):
    _, model, processor = tiny
    family = family_of(model)
    inputs = prompt_inputs(processor, [blank(40, 70)])
    with pytest.raises(InvalidInputError, match="image sizes"):
        family.layout(model, processor, inputs, [(40, 70), (10, 10)])
    with pytest.raises(InvalidInputError, match="keep"):
        family.occlude(model, inputs, [torch.ones(3, dtype=torch.bool)], 0.0)
    cut = dict(inputs, input_ids=inputs["input_ids"][:, :-30])  # a view's tokens cut short
    with pytest.raises(InvalidInputError):
        family.layout(model, processor, cut, [(40, 70)])
