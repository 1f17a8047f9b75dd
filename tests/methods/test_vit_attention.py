"""Attention rollout, Chefer's gradient rollout and LeGrad against their formulas, computed here by hand.

The probabilities are computed in :func:`vit_helpers.hand_forward` from each attention module's
own weights, unfused, and the gradients by plain autograd on that forward (LeGrad: one backward
per layer, as its authors and torchcam do), on tiny timm (with and without register tokens, and
mean-pooled without class token), torchvision and Hugging Face ViT / DeiT / DINOv2 models.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from vit_helpers import SIZE, assert_maps_close, blocks_of, hand_forward, hf_vit, logits, timm_vit, torchvision_vit

import camkit

pytest.importorskip("timm")
pytest.importorskip("transformers")

BUILDERS = {
    "timm": lambda: timm_vit(),
    "timm-registers": lambda: timm_vit(reg_tokens=4),
    "timm-avg-no-class-token": lambda: timm_vit(global_pool="avg", class_token=False),
    "torchvision": torchvision_vit,
    "hf-vit": lambda: hf_vit("vit"),
    "hf-deit": lambda: hf_vit("deit"),
    "hf-dinov2-registers": lambda: hf_vit("dinov2"),
}
PREFIX = {"timm": 1, "timm-registers": 5, "timm-avg-no-class-token": 0, "torchvision": 1, "hf-vit": 1, "hf-deit": 2,
          "hf-dinov2-registers": 3}


def _x(batch: int) -> Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(batch))


def _dress(rows: Tensor) -> Tensor:
    """Patch rows [B, 16] to camkit's maps: 4 x 4 grid, bilinear to 32 x 32, min-max per map."""
    grid = rows.reshape(rows.shape[0], 1, 4, 4)
    up = F.interpolate(grid, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[:, 0]
    low = up.amin(dim=(1, 2), keepdim=True)
    return (up - low) / (up.amax(dim=(1, 2), keepdim=True) - low)


def _row(relevance: Tensor, key: str) -> Tensor:
    row = relevance.mean(dim=1) if key == "timm-avg-no-class-token" else relevance[:, 0]
    return row[:, PREFIX[key]:]


def _rollout_by_hand(attentions: list[Tensor], fusion: str) -> Tensor:
    r = None
    for a in attentions:
        fused = {"mean": a.mean(1), "max": a.amax(1), "min": a.amin(1)}[fusion]
        bar = 0.5 * fused + 0.5 * torch.eye(a.shape[-1])
        bar = bar / bar.sum(dim=-1, keepdim=True)
        r = bar if r is None else bar @ r
    return r


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("key", list(BUILDERS))
def test_hand_forward_is_the_model(key, batch):
    model = BUILDERS[key]()
    x = _x(batch)
    with torch.no_grad():
        expected = logits(model(x))
    got, attentions, _ = hand_forward(model, x)
    torch.testing.assert_close(logits(got), expected, atol=1e-5, rtol=1e-5)
    assert len(attentions) == 3 and attentions[0].shape == (batch, 2, 16 + PREFIX[key], 16 + PREFIX[key])


@pytest.mark.heavy
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("key", list(BUILDERS))
def test_rollout_is_its_formula(key, batch, fusion):
    model = BUILDERS[key]()
    x = _x(batch)
    _, attentions, _ = hand_forward(model, x)
    rows = _row(_rollout_by_hand([a.detach() for a in attentions], fusion), key)
    e = camkit.AttentionRollout(model, head_fusion=fusion).explain(x)
    torch.testing.assert_close(e.raw, rows.reshape(batch, 4, 4), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(e.maps, _dress(rows), atol=1e-4, rtol=0)


def test_rollout_discard_ratio_by_hand():
    model = timm_vit()
    x = _x(2)
    _, attentions, _ = hand_forward(model, x)
    r = None
    for a in attentions:
        fused = a.detach().mean(1)
        n = fused.shape[-1]
        for b in range(fused.shape[0]):  # zero the lowest 30% of entries, diagonal kept
            flat = fused[b].clone()
            flat.fill_diagonal_(float("inf"))
            cut = flat.flatten().argsort()[: int(n * n * 0.3)]
            keep = fused[b].diagonal().clone()
            fused[b].view(-1)[cut] = 0.0
            fused[b].diagonal().copy_(keep)
        bar = 0.5 * fused + 0.5 * torch.eye(n)
        bar = bar / bar.sum(dim=-1, keepdim=True)
        r = bar if r is None else bar @ r
    e = camkit.AttentionRollout(model, discard_ratio=0.3).explain(x)
    torch.testing.assert_close(e.raw, r[:, 0, 1:].reshape(2, 4, 4), atol=1e-6, rtol=1e-4)


@pytest.mark.heavy
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("key", list(BUILDERS))
def test_chefer_is_its_formula(key, batch):
    model = BUILDERS[key]()
    x = _x(batch)
    target = torch.arange(batch) % 4
    out, attentions, _ = hand_forward(model, x)
    score = logits(out).gather(1, target[:, None]).sum()
    grads = torch.autograd.grad(score, attentions)
    n = attentions[0].shape[-1]
    r = torch.eye(n).expand(batch, n, n)
    for a, g in zip(attentions, grads):
        r = r + (g * a).clamp_min(0).mean(dim=1) @ r
    rows = _row(r.detach(), key)
    e = camkit.CheferRollout(model).explain(x, target)
    assert not e.flat.any()
    torch.testing.assert_close(e.raw, rows.reshape(batch, 4, 4), atol=1e-6, rtol=1e-4)
    assert_maps_close(e.maps, _dress(rows), rows.reshape(batch, 4, 4), 1e-4)


def _head(model, key):
    if key.startswith("timm"):
        return lambda t: model.head(model.fc_norm(model.norm(t.mean(1))))
    if key == "torchvision":
        return lambda t: model.heads(model.encoder.ln(t.mean(1)))
    if key == "hf-vit":
        return lambda t: model.classifier(model.vit.layernorm(t.mean(1)))
    if key == "hf-deit":
        return lambda t: (model.cls_classifier(model.deit.layernorm(t.mean(1)))
                          + model.distillation_classifier(model.deit.layernorm(t.mean(1)))) / 2
    z = lambda t: model.dinov2_with_registers.layernorm(t.mean(1))  # noqa: E731
    return lambda t: model.classifier(torch.cat([z(t), z(t)], dim=1))


@pytest.mark.heavy
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("key", list(BUILDERS))
def test_legrad_is_its_formula(key, batch):
    model = BUILDERS[key]()
    x = _x(batch)
    target = (torch.arange(batch) + 1) % 4
    _, attentions, outputs = hand_forward(model, x, blocks_of(model))
    head = _head(model, key)
    layers = []
    for a, tokens in zip(attentions, outputs):  # one backward per layer: ds_l / dA_l
        (g,) = torch.autograd.grad(head(tokens).gather(1, target[:, None]).sum(), a, retain_graph=True)
        layers.append(g.clamp_min(0).mean(dim=(1, 2))[:, PREFIX[key]:])
    rows = torch.stack(layers).mean(0).detach()
    e = camkit.LeGrad(model).explain(x, target)
    assert not e.flat.any()
    torch.testing.assert_close(e.raw, rows.reshape(batch, 4, 4), atol=1e-7, rtol=1e-4)
    torch.testing.assert_close(e.maps, _dress(rows), atol=1e-4, rtol=0)
    picked = camkit.LeGrad(model, layers=[-1]).explain(x, target)
    torch.testing.assert_close(picked.raw, layers[-1].detach().reshape(batch, 4, 4), atol=1e-7, rtol=1e-4)


def test_legrad_equals_torchcam_on_torchvision():
    torchcam = pytest.importorskip("torchcam.methods")
    model = torchvision_vit()
    x = _x(3)
    target = [1, 3, 0]
    ours = camkit.LeGrad(model).explain(x, torch.tensor(target))
    with torchcam.LeGrad(model, list(model.encoder.layers)) as extractor:
        scores = model(x)
        (theirs,) = extractor(target, scores, normalized=False)
    torch.testing.assert_close(ours.raw, theirs.detach(), atol=1e-7, rtol=1e-4)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("cls", [camkit.AttentionRollout, camkit.CheferRollout, camkit.LeGrad])
def test_clip_similarity_batch_equals_one_by_one(cls):
    model = hf_vit("clip")
    text = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    x = _x(3)
    batched = cls(model, output="image_embeds").explain(x, camkit.SimilarityTarget(text))
    for i in range(3):
        single = cls(model, output="image_embeds").explain(x[i : i + 1], camkit.SimilarityTarget(text[i : i + 1]))
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.scores[i], single.scores[0], atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        embeds = model(x).image_embeds
    torch.testing.assert_close(batched.scores, F.cosine_similarity(embeds, text, dim=1), atol=1e-6, rtol=1e-5)


def test_clip_legrad_scores_the_text_similarity_at_each_layer():
    model = hf_vit("clip")
    x = _x(2)
    text = torch.randn(8, generator=torch.Generator().manual_seed(3))
    _, attentions, outputs = hand_forward(model, x, blocks_of(model))
    layers = []
    for a, tokens in zip(attentions, outputs):
        embed = model.visual_projection(model.vision_model.post_layernorm(tokens.mean(1)))
        (g,) = torch.autograd.grad(F.cosine_similarity(embed, text[None], dim=1).sum(), a, retain_graph=True)
        layers.append(g.clamp_min(0).mean(dim=(1, 2))[:, 1:])
    e = camkit.LeGrad(model, output="image_embeds").explain(x, camkit.SimilarityTarget(text))
    torch.testing.assert_close(e.raw, torch.stack(layers).mean(0).detach().reshape(2, 4, 4), atol=1e-7, rtol=1e-4)


def _masked(model):
    """torchvision's ViT whose blocks pass an all-zero additive mask to their attention (as the module's own code runs them)."""
    for block in model.encoder.layers:
        def forward(tokens, block=block):
            y = block.ln_1(tokens)
            y, _ = block.self_attention(y, y, y, need_weights=False, attn_mask=tokens.new_zeros(tokens.shape[1], tokens.shape[1]))
            y = block.dropout(y) + tokens
            return y + block.mlp(block.ln_2(y))

        block.forward = forward
    return model


@pytest.mark.parametrize("cls", [camkit.AttentionRollout, camkit.CheferRollout, camkit.LeGrad])
def test_torchvision_attention_with_a_mask_takes_the_modules_own_path(cls, monkeypatch):
    """A mask sends nn.MultiheadAttention to its own unfused path (weights asked for, output mixed again from
    them); with a zero mask that path's maps equal those of camkit's own computation of the probabilities."""
    x, target = _x(3), torch.tensor([2, 0, 1])
    calls: list[bool] = []  # need_weights of each call of the module's own code
    original = F.multi_head_attention_forward
    monkeypatch.setattr(F, "multi_head_attention_forward", lambda *a, **k: calls.append(k["need_weights"]) or original(*a, **k))
    plain = cls(torchvision_vit()).explain(x, target)
    assert not any(calls)  # without a mask camkit computes the probabilities itself
    model = _masked(torchvision_vit())
    masked = cls(model).explain(x, target)
    assert any(calls)
    torch.testing.assert_close(masked.raw, plain.raw, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(masked.maps, plain.maps, atol=1e-5, rtol=0)
    mhas = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    assert all("forward" not in m.__dict__ and not m._forward_hooks and not m._forward_pre_hooks for m in mhas)
