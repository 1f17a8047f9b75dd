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
    return processor(images=[[image] for image in images], text=texts, return_tensors="pt", padding=True, **kwargs)


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
    lm = getattr(model.model, "language_model", None) or model.model.text_model

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


def reach(boxes, cell, radius=2.0):
    """How far resampling carries a one-pixel change, per box and axis [U, 2], in original pixels.

    ``cell`` is a box's size in the processed view's pixels; a box ``s`` times larger in the original is
    downsampled ``s`` times: an output pixel then takes inputs within ``radius * s`` original pixels of its
    centre and itself spans ``s / 2`` either side (``s`` taken as 1 when upsampling), plus half the changed
    pixel itself."""
    scale = torch.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], 1).double() / cell
    return (radius + 0.5) * scale.clamp(min=1) + 0.5


def _gaps(boxes, cy, cx):
    """Per pixel and box: inside (half-open) and the distances to the edges per axis [P, U, 2]."""
    inside = (boxes[:, 0] <= cy) & (cy < boxes[:, 2]) & (boxes[:, 1] <= cx) & (cx < boxes[:, 3])
    gy = torch.minimum(cy - boxes[:, 0], boxes[:, 2] - cy)
    gx = torch.minimum(cx - boxes[:, 1], boxes[:, 3] - cx)
    return inside, torch.stack([gy, gx], -1)


def safe_spot(boxes, size, margin, near=(0.7, 0.6)):
    """Of the pixels lying at least ``margin`` [U, 2] (per box and axis) inside every box that holds them, the one
    nearest the fraction ``near`` of the image's height and width. Returns ``(spot, found)``."""
    height, width = size
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    cy, cx = ys.reshape(-1, 1).double(), xs.reshape(-1, 1).double()
    inside, gap = _gaps(boxes.double(), cy, cx)
    deep = torch.where(inside, (gap / margin).amin(-1), torch.inf).amin(1) >= 1
    far = torch.hypot(cy[:, 0] / height - near[0], cx[:, 0] / width - near[1])
    best = int(torch.where(deep, far, torch.inf).argmin())
    return divmod(best, width), bool(deep[best])


def holding(boxes, spot, margin=None):
    """The boxes holding the pixel ``spot``; with ``margin`` [U, 2], those within that distance of holding it."""
    cy, cx = torch.tensor([[spot[0] + 0.5]]).double(), torch.tensor([[spot[1] + 0.5]]).double()
    if margin is None:
        return _gaps(boxes.double(), cy, cx)[0][0].nonzero().reshape(-1)
    grown = boxes.double() + torch.cat([-margin, margin], 1)
    return _gaps(grown, cy, cx)[0][0].nonzero().reshape(-1)


def planted(model, processor, family, size, cells, near=(0.7, 0.6), radius=2.0, **kwargs):
    """What the model changes for a one-pixel change of a blank image, and what the layout says it should.

    ``cells = (token cell, feature cell)``: the size of a token's and of a feature row's box in the processed
    view's pixels. The spot lies deeper inside its tokens' boxes than resampling reaches, so the changed image
    tokens must be exactly those whose boxes hold it; feature rows (smaller boxes) must include every row holding
    the spot and no row farther than resampling reaches. Returns ``(changed positions, expected positions,
    changed rows, rows that must change, rows that may change)``.
    """
    localise(model)
    height, width = size
    plain = prompt_inputs(processor, [blank(height, width)], **kwargs)
    layout = family.layout(model, processor, plain, [size])[0]
    spot, found = safe_spot(layout.boxes, size, reach(layout.boxes, cells[0], radius), near)
    assert found, f"no spot far enough from the token cells' edges in a {size} image"
    image = blank(height, width)
    image[:, spot[0], spot[1]] = 255
    marked = prompt_inputs(processor, [image], **kwargs)
    layer = family.feature_layer(model)
    embeds_a, rows_a = lm_embeddings_and_features(model, layer, plain)
    embeds_b, rows_b = lm_embeddings_and_features(model, layer, marked)
    got = changed(embeds_a[0], embeds_b[0]).sort().values
    want = layout.positions[holding(layout.boxes, spot)].sort().values
    got_rows = changed(rows_a, rows_b).sort().values
    must = layout.feature_rows[holding(layout.feature_boxes, spot)].sort().values
    may = layout.feature_rows[holding(layout.feature_boxes, spot, reach(layout.feature_boxes, cells[1], radius))]
    return got, want, got_rows, must, may.sort().values


def is_within(small, large):
    return bool(torch.isin(small, large).all())


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
