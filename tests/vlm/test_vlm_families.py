"""Image tokens land on the right patches: positions, the rows behind each token, and boxes on the original image.

Each layout is checked against what the processor and the model actually do: positions against
``input_ids``, the row behind each token against the model's own image features (projector of
the row, LLaVA-NeXT's unpadding and newlines included), boxes against the processor's pixels (a
block changed in the original image changes the patches whose boxes hold it, and no patch far
from it), and a planted dependence (the language model shown one image token only) found in
that token's box.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from vlm_helpers import picture

import camkit
from camkit.hooks import LayerCapture
from camkit.vlm.families import family_of
from camkit.vlm.methods.gradcam import target_gradients
from camkit.vlm.prompts import prepare, teacher_forced

FAMILIES = ["llava", "llava_next", "paligemma"]


def _built(request, name):
    return request.getfixturevalue(name)


def _layout(model, processor, image, prompt="what is this ?"):
    family = family_of(model)
    (p,) = prepare(model, processor, family, image, prompt)
    return family, p, family.layout(model, processor, p.inputs, [p.size])[0]


@pytest.mark.parametrize(("name", "size"), [(n, (40, 70)) for n in FAMILIES] + [("llava_next", (50, 30)), ("llava", (50, 30))])
def test_positions_are_the_image_tokens_and_rows_feed_them_as_the_model_does(request, name, size):
    model, processor = _built(request, name)
    family, p, layout = _layout(model, processor, picture(*size))
    assert family.name == name
    ids = p.inputs["input_ids"][0]
    assert torch.equal(layout.positions, (ids == family.image_token_id(model)).nonzero()[:, 0])
    layer = family.feature_layer(model)
    extra = {"image_sizes": p.inputs["image_sizes"]} if "image_sizes" in p.inputs else {}
    with torch.no_grad(), LayerCapture([("f", layer)], gradients=False) as cap:
        pooled = model.model.get_image_features(p.inputs["pixel_values"], **extra).pooler_output
        (features,) = cap.activations()
    pooled = torch.cat([f.reshape(-1, f.shape[-1]) for f in pooled]) if isinstance(pooled, (list, tuple)) else pooled.reshape(-1, pooled.shape[-1])
    assert pooled.shape[0] == layout.count
    rows = features.reshape(-1, features.shape[-1])[layout.feature_rows]
    with torch.no_grad():
        projected = model.model.multi_modal_projector(rows)
    torch.testing.assert_close(projected, pooled[layout.feature_token], rtol=1e-5, atol=1e-5)
    newline = torch.ones(layout.count, dtype=torch.bool)
    newline[layout.feature_token] = False
    assert torch.equal(newline, layout.boxes.isnan().any(1))  # only tokens without a row cover no pixels
    if name == "llava_next":
        assert int(newline.sum()) > 0
        torch.testing.assert_close(pooled[newline], model.model.image_newline.expand(int(newline.sum()), -1))
        assert set(layout.view.tolist()) == set(range(3 if size == (50, 30) else 5))  # 64 x 32 or 64 x 64 tiled


def _patch_changes(pixels: torch.Tensor, other: torch.Tensor, patch: int) -> torch.Tensor:
    """|change| per view and patch, flattened as the rows are: [views, gh * gw]."""
    diff = (pixels - other).abs().reshape(-1, *pixels.shape[-3:]).sum(1)  # [views, h, w]
    views, h, w = diff.shape
    return diff.reshape(views, h // patch, patch, w // patch, patch).sum((2, 4)).reshape(views, -1)


@pytest.mark.parametrize("name", [*FAMILIES, "llava_padded"])
def test_a_block_changed_in_the_image_changes_the_patches_whose_boxes_hold_it(request, name):
    if name == "llava_padded":  # LLaVA 1.5's "pad to a square" preprocessing
        import tiny_llava

        model, processor = _built(request, "llava")[0], tiny_llava.processor(do_pad=True)
    else:
        model, processor = _built(request, name)
    base = np.asarray(picture(40, 70, seed=1)).copy()
    changed = base.copy()
    changed[12:18, 23:29] = 255 - changed[12:18, 23:29]  # a 6 x 6 block around (15, 26)
    _, p, layout = _layout(model, processor, Image.fromarray(base))
    _, q, _ = _layout(model, processor, Image.fromarray(changed))
    vision = model.config.vision_config
    patch, cls = vision.patch_size, 1 if name != "paligemma" else 0
    if name == "llava_padded":
        # 40 x 70 padded by 15 rows above to 70 x 70: the first patch row spans [-15, 2.5), clipped to the image
        assert layout.feature_boxes[0].tolist() == [0.0, 0.0, 2.5, 17.5]
    per_view = (vision.image_size // patch) ** 2 + cls
    change = _patch_changes(p.inputs["pixel_values"], q.inputs["pixel_values"], patch).flatten()
    view, cell = layout.feature_rows // per_view, layout.feature_rows % per_view - cls
    moved = change[view * (per_view - cls) + cell]
    boxes = layout.feature_boxes
    near = (boxes[:, 0] < 18 + 6) & (boxes[:, 2] > 12 - 6) & (boxes[:, 1] < 29 + 6) & (boxes[:, 3] > 23 - 6)
    holds = (boxes[:, 0] <= 15) & (boxes[:, 2] > 15) & (boxes[:, 1] <= 26) & (boxes[:, 3] > 26)
    assert bool((moved[~near] == 0).all()), "patches whose boxes are far from the block changed"
    assert bool((moved[holds] > 0).all()) and int(holds.sum()) >= (2 if name == "llava_next" else 1)
    assert torch.bincount(layout.feature_view[holds]).max() == 1  # one patch per view holds a point
    for v in set(layout.feature_view.tolist()):  # in every view it reached, the most changed patch touches the block
        mine = (layout.feature_view == v).nonzero()[:, 0]
        if not bool((moved[mine] > 0).any()):
            continue
        top = mine[moved[mine].argmax()]
        y0, x0, y1, x1 = boxes[top].tolist()
        assert y0 < 18 and y1 > 12 and x0 < 29 and x1 > 23


@pytest.mark.parametrize("name", FAMILIES)
def test_a_language_model_shown_one_image_token_depends_on_that_tokens_box_only(request, name):
    model, processor = _built(request, name)
    family = family_of(model)
    (p,) = prepare(model, processor, family, picture(40, 70), "what is this ?")
    forced = teacher_forced([p], [torch.tensor([20, 21])], family, 0, torch.device("cpu"))
    layout = family.layout(model, processor, forced.inputs, [p.size])[0]
    shown = int(layout.feature_token[-5])  # a token of the last view (a tile for LLaVA-NeXT)
    mask = forced.inputs["attention_mask"].clone()
    mask[0, layout.positions] = 0
    mask[0, layout.positions[shown]] = 1
    layer = family.feature_layer(model)
    with LayerCapture([("f", layer)]) as cap:
        logits = model(**{**forced.inputs, "attention_mask": mask}).logits
        score = logits[0, forced.positions[0][1, 0] - 1].log_softmax(-1)[21]
        (features,) = cap.activations()
        (grad,) = target_gradients(score[None], features, None)
    norms = grad.reshape(-1, grad.shape[-1]).norm(dim=-1)
    assert set(norms.nonzero()[:, 0].tolist()) == set(layout.feature_rows[layout.feature_token == shown].tolist())
    (painted,) = layout.paint(norms[layout.feature_rows][None], units="rows")
    y0, x0, y1, x1 = layout.boxes[shown].tolist()
    inside = torch.zeros(40, 70, dtype=torch.bool)
    inside[int(np.ceil(y0 - 0.5)) : int(np.ceil(y1 - 0.5)), int(np.ceil(x0 - 0.5)) : int(np.ceil(x1 - 0.5))] = True
    assert bool((painted[0][~inside] == 0).all()) and bool((painted[0][inside] > 0).all())


def test_an_unsupported_model_is_refused_naming_the_families():
    from torch import nn

    with pytest.raises(camkit.UnsupportedModelError, match=r"supported families: .*llava.*paligemma"):
        family_of(nn.Linear(2, 2))


@pytest.mark.parametrize("name", FAMILIES)
def test_occlude_sets_the_pixels_of_the_dropped_tokens_only(request, name):
    model, processor = _built(request, name)
    family, p, layout = _layout(model, processor, picture(40, 70))
    keep = torch.zeros(layout.count, dtype=torch.bool)
    kept = int(layout.feature_token[3])
    keep[kept] = True
    before = p.inputs["pixel_values"].clone()
    occluded = family.occlude(model, p.inputs, [keep], 7.0)["pixel_values"]
    assert torch.equal(p.inputs["pixel_values"], before)  # the inputs given are not changed
    untouched = occluded == before
    vision = model.config.vision_config
    side, patch = vision.image_size // vision.patch_size, vision.patch_size
    per_view = side * side + (0 if name == "paligemma" else 1)
    view, cell = divmod(int(layout.feature_rows[3]), per_view)
    r, c = divmod(cell - (0 if name == "paligemma" else 1), side)
    region = untouched.reshape(-1, *untouched.shape[-3:])[view, :, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch]
    assert bool(region.all())  # the kept token's patch is as it was
    covered = torch.zeros_like(untouched.reshape(-1, *untouched.shape[-3:]))
    for row in layout.feature_rows.tolist():
        v, k = divmod(row, per_view)
        rr, cc = divmod(k - (0 if name == "paligemma" else 1), side)
        covered[v, :, rr * patch : (rr + 1) * patch, cc * patch : (cc + 1) * patch] = True
    flat_occluded = occluded.reshape(covered.shape)
    covered[view, :, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = False
    assert bool((flat_occluded[covered] == 7.0).all())  # every other token's patch holds the baseline
    assert bool(untouched.reshape(covered.shape)[~covered].all())  # pixels no token reads stay


def test_llava_with_the_full_feature_strategy_keeps_the_cls_row_as_a_token_without_a_box():
    import tiny_llava
    from transformers import LlavaForConditionalGeneration

    config = tiny_llava.config()
    config.vision_feature_select_strategy = "full"
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    processor = tiny_llava.processor()
    processor.vision_feature_select_strategy = "full"
    _, p, layout = _layout(model, processor, picture(40, 70))
    assert layout.count == 17 and layout.feature_rows.tolist() == list(range(17))
    assert bool(layout.boxes[0].isnan().all()) and not bool(layout.boxes[1:].isnan().any())
    with torch.no_grad(), LayerCapture([("f", family_of(model).feature_layer(model))], gradients=False) as cap:
        pooled = model.model.get_image_features(p.inputs["pixel_values"]).pooler_output
        (features,) = cap.activations()
    projected = model.model.multi_modal_projector(features.reshape(-1, features.shape[-1])[layout.feature_rows])
    torch.testing.assert_close(projected, torch.cat(list(pooled))[layout.feature_token], rtol=1e-5, atol=1e-5)
