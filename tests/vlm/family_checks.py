"""Checks shared by the family tests: image tokens laid out against the model itself.

The planted-dependence check makes every vision token depend on its own patches only (the vision
tower's attention output projections zeroed, so each block is a per-patch map) and then asks the
model, not the layout's arithmetic, which tokens and feature rows change when one spot of a blank
image changes: exactly those whose boxes hold the spot.
"""

from __future__ import annotations

import torch
from camkit.vlm.paint import paint

PROMPT = "describe the image"


def prompt_inputs(processor, images, prompts=None, **kwargs):
    """The processor's batch for ``images`` (one per prompt) with the chat template applied."""
    prompts = prompts or [PROMPT] * len(images)
    texts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}], add_generation_prompt=True
        )
        for p in prompts
    ]
    return processor(images=list(images), text=texts, return_tensors="pt", padding=True, **kwargs)


def blank(height, width, value=128):
    return torch.full((3, height, width), value, dtype=torch.uint8)


def localise(model, names=("attn.proj", "self_attn.out_proj")):
    """Zero the vision tower's attention output projections: each patch's features then depend on it alone."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if ("visual" in name or "vision" in name) and name.endswith(names):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
    return model


def lm_embeddings_and_features(model, layer, inputs):
    """The language model's input embeddings [B, L, D] and ``layer``'s output rows [R, D] for ``inputs``."""
    seen = {}
    lm = model.model.language_model

    def grab_lm(_module, args, kwargs):
        seen["embeds"] = kwargs.get("inputs_embeds", args[0] if args else None).detach().clone()

    def grab_layer(_module, _args, output):
        seen["rows"] = output.detach().reshape(-1, output.shape[-1]).clone()

    handles = [lm.register_forward_pre_hook(grab_lm, with_kwargs=True), layer.register_forward_hook(grab_layer)]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen["embeds"], seen["rows"]


def changed(a, b, tol=1e-5):
    return ((a - b).abs().amax(-1) > tol * (1 + a.abs().amax())).nonzero().reshape(-1)


def safe_spot(boxes, size, margin, near=(0.7, 0.6)):
    """A pixel whose centre lies deep inside every box that holds it, depth measured in units of each box's
    ``margin`` (a tensor [U]: how far that box's resampling reaches, in original pixels): of the pixels at depth
    1 or more, the nearest to the fraction ``near`` of the image's height and width. Returns ``(spot, depth)``."""
    height, width = size
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    cy, cx = ys.reshape(-1, 1).double(), xs.reshape(-1, 1).double()
    gap = torch.stack([cy - boxes[:, 0], boxes[:, 2] - cy, cx - boxes[:, 1], boxes[:, 3] - cx]).amin(0)
    depth = torch.where(gap > 0, gap / margin, torch.inf).amin(1)
    far = torch.hypot(cy[:, 0] / height - near[0], cx[:, 0] / width - near[1])
    best = int(torch.where(depth >= 1, far, torch.inf).argmin()) if (depth >= 1).any() else int(depth.argmax())
    return divmod(best, width), float(depth[best])


def holding(boxes, spot):
    cy, cx = spot[0] + 0.5, spot[1] + 0.5
    inside = (boxes[:, 0] <= cy) & (cy < boxes[:, 2]) & (boxes[:, 1] <= cx) & (cx < boxes[:, 3])
    return inside.nonzero().reshape(-1)


def planted(model, processor, family, size, margin, near=(0.7, 0.6), **kwargs):
    """The tokens and feature rows the model changes for a one-pixel change of a blank image, and the expected.

    ``margin(layout)`` gives each feature row's needed distance from the spot to its box's edges (the
    resampling's reach in original pixels). Returns ``(changed positions, expected positions, changed rows,
    expected rows, layout)``.
    """
    localise(model)
    height, width = size
    plain = prompt_inputs(processor, [blank(height, width)], **kwargs)
    layout = family.layout(model, processor, plain, [size])[0]
    spot, best = safe_spot(layout.feature_boxes.double(), size, margin(layout), near)
    assert best >= 1.0, f"no spot far enough from the feature cells' edges in a {size} image ({best:.2f})"
    image = blank(height, width)
    image[:, spot[0], spot[1]] = 255
    marked = prompt_inputs(processor, [image], **kwargs)
    layer = family.feature_layer(model)
    embeds_a, rows_a = lm_embeddings_and_features(model, layer, plain)
    embeds_b, rows_b = lm_embeddings_and_features(model, layer, marked)
    got_positions = changed(embeds_a[0], embeds_b[0])
    got_rows = changed(rows_a, rows_b)
    want_positions = layout.positions[holding(layout.boxes.double(), spot)]
    want_rows = layout.feature_rows[holding(layout.feature_boxes.double(), spot)]
    return got_positions.sort().values, want_positions.sort().values, got_rows.sort().values, want_rows.sort().values


def check_tiling(layout):
    """Every box inside its image; the boxes of each view tile the view's bounding box without overlap."""
    for boxes, image, view in ((layout.boxes, layout.image, layout.view),
                               (layout.feature_boxes, layout.feature_image, layout.feature_view)):
        for index, (height, width) in enumerate(layout.sizes):
            mine = image == index
            b = boxes[mine].double()
            assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all(), "a box starts outside its image"
            assert (b[:, 2] <= height + 1e-6).all() and (b[:, 3] <= width + 1e-6).all(), "a box ends outside"
            assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all(), "an empty box"
            for v in view[mine].unique():
                vb = b[view[mine] == v]
                outer = torch.stack([vb[:, 0].min(), vb[:, 1].min(), vb[:, 2].max(), vb[:, 3].max()])
                cover = paint(torch.ones(1, len(vb)), vb, (height, width))[0]
                y0, x0, y1, x1 = (int(torch.ceil(t - 0.5)) for t in outer)
                inner = torch.zeros_like(cover)
                inner[y0:y1, x0:x1] = 1
                assert torch.equal(cover, inner), "the boxes of a view overlap or leave gaps"
                if int(v) == 0:
                    assert torch.allclose(outer, torch.tensor([0.0, 0.0, height, width], dtype=outer.dtype))
