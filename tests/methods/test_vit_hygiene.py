"""The attention methods leave the model as they found it: settings, hooks, flags, gradients, inputs.

The generated invariant tests (``test_invariants.py``, ``test_rank_invariants.py``, ``test_syncs.py``)
run every method on a small CNN, which has no attention: they skip the attention methods, and the
same invariants are checked here on tiny vision transformers of each family.
"""

from __future__ import annotations

import pytest
import torch
from test_invariants import _assert_same_state, _hook_count, _state
from torch import nn
from vit_helpers import SIZE, hf_vit, timm_vit, torchvision_vit

import camkit
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs

pytest.importorskip("timm")
pytest.importorskip("transformers")

METHODS = {
    "attentionrollout": lambda m: camkit.AttentionRollout(m, discard_ratio=0.2),
    "cheferrollout": camkit.CheferRollout,
    "legrad": camkit.LeGrad,
}
MODELS = {"timm": timm_vit, "torchvision": torchvision_vit, "hf-vit": lambda: hf_vit("vit")}


def _x(batch: int = 3) -> torch.Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(11))


def _messy(model: nn.Module) -> nn.Module:
    """Mixed training flags, a frozen parameter and existing gradients."""
    model.train()
    params = list(model.parameters())
    params[0].requires_grad_(False)
    params[-1].grad = torch.randn_like(params[-1])
    for module in list(model.modules())[::3]:
        module.eval()
    return model


def _settings(model: nn.Module):
    return (
        [getattr(m, "fused_attn", None) for m in model.modules()],
        [getattr(getattr(m, "config", None), "_attn_implementation", None) for m in model.modules()],
        [m.__dict__.get("forward") for m in model.modules()],  # a forward replaced for the call is removed after
    )


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("key", list(METHODS))
def test_contract_and_hygiene(key, family):
    model = _messy(MODELS[family]())
    x = _x()
    x_before = x.clone()
    before, settings = _state(model), _settings(model)
    explanation = METHODS[key](model).explain(x)
    assert explanation.maps.shape == (3, SIZE, SIZE) and explanation.maps.dtype == torch.float32
    assert torch.isfinite(explanation.maps).all()
    assert explanation.maps.min() >= 0 and explanation.maps.max() <= 1
    assert explanation.method == key
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled()
    assert torch.equal(x, x_before) and not x.requires_grad
    _assert_same_state(before, _state(model))
    assert _settings(model) == settings


def test_fused_settings_are_on_before_and_restored():
    timm = timm_vit()
    hf = hf_vit("clip")
    assert all(b.attn.fused_attn for b in timm.blocks)
    assert hf.config._attn_implementation == "sdpa"
    camkit.LeGrad(timm).explain(_x())
    camkit.AttentionRollout(hf, output="image_embeds").explain(_x(), camkit.SimilarityTarget(torch.ones(8)))
    assert all(b.attn.fused_attn for b in timm.blocks)
    assert hf.config._attn_implementation == "sdpa"
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in hf.vision_model.encoder.layers)


class _Boom(Exception):
    pass


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("key", list(METHODS))
def test_settings_restored_after_an_exception_mid_forward(key, family):
    model = _messy(MODELS[family]())
    before, settings = _state(model), _settings(model)
    # the second attention layer has run when the failure comes: settings were switched by then
    blocks = [m for m in model.modules() if type(m).__name__ in ("Block", "EncoderBlock", "ViTLayer")]
    failing = blocks[-1]
    original = failing.forward

    def boom(*args, **kwargs):
        raise _Boom("boom mid-forward")

    failing.forward = boom
    try:
        with pytest.raises(_Boom):
            METHODS[key](model).explain(_x())
    finally:
        del failing.forward
    assert failing.forward == original
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled()
    _assert_same_state(before, _state(model))
    assert _settings(model) == settings
    with torch.no_grad():  # and the model computes as before
        model.eval()
        fresh = MODELS[family]().eval()
        fresh.load_state_dict(model.state_dict())
        out = model(_x())
        ref = fresh(_x())
    torch.testing.assert_close(getattr(out, "logits", out), getattr(ref, "logits", ref))


@pytest.mark.parametrize("key", list(METHODS))
def test_hygiene_after_bad_target(key):
    model = timm_vit()
    before = _state(model)
    with pytest.raises(camkit.InvalidTargetError):
        METHODS[key](model).explain(_x(), target=99)
    with pytest.raises(camkit.InvalidTargetError):
        METHODS[key](model).explain(_x(3), target=[0, 1])
    assert _hook_count(model) == 0
    _assert_same_state(before, _state(model))


@pytest.mark.heavy
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("key", list(METHODS))
def test_batch_equals_one_by_one(key, family):
    model = MODELS[family]()
    x = _x(3)
    target = torch.tensor([0, 3, 1])
    batched = METHODS[key](model).explain(x, target)
    for i in range(3):
        single = METHODS[key](model).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.scores[i], single.scores[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", list(METHODS))
def test_k_targets_equal_single_calls(key):
    model = timm_vit()
    x = _x(2)
    targets = torch.tensor([[0, 2], [3, 1]])
    multi = METHODS[key](model).explain(x, targets)
    assert multi.maps.shape == (2, 2, SIZE, SIZE)
    for k in range(2):
        single = METHODS[key](model).explain(x, targets[:, k])
        torch.testing.assert_close(multi.maps[:, k], single.maps, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", list(METHODS))
def test_outer_no_grad_and_inference_mode(key):
    model = timm_vit()
    x = _x()
    expected = METHODS[key](model).explain(x).maps
    with torch.no_grad():
        inside = METHODS[key](model).explain(x).maps
        assert not torch.is_grad_enabled()
    torch.testing.assert_close(inside, expected, atol=1e-6, rtol=0)
    explainer = METHODS[key](model)
    if explainer.needs_grad:
        with torch.inference_mode(), pytest.raises(camkit.InferenceModeError):
            explainer.explain(x)


@pytest.mark.heavy
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("key", list(METHODS))
def test_no_host_sync(key, family, monkeypatch):
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    explainer = METHODS[key](MODELS[family]())
    x, target = _x(), torch.tensor([0, 1, 2])
    explainer.explain(x, target)
    with record_syncs() as syncs:
        explainer.explain(x, target)
    assert [str(s) for s in syncs] == []


def test_rollout_is_class_agnostic_and_says_so():
    model = timm_vit()
    x = _x(2)
    a = camkit.AttentionRollout(model).explain(x, 0)
    b = camkit.AttentionRollout(model).explain(x, 3)
    assert torch.equal(a.maps, b.maps) and not torch.equal(a.scores, b.scores)
    assert "class-agnostic" in camkit.AttentionRollout.__doc__


def test_chefer_explains_a_neuron_and_legrad_refuses_one():
    model = timm_vit()
    x = _x(2)
    neuron = camkit.NeuronTarget("blocks.2", 0, position=(5,))  # the class token's feature 5 after the last block
    e = camkit.CheferRollout(model).explain(x, neuron)
    assert not e.flat.any()
    with torch.no_grad():
        feats = model.blocks(model._pos_embed(model.patch_embed(x)))[:, 0, 5]
    torch.testing.assert_close(e.scores, feats, atol=1e-5, rtol=1e-5)
    with pytest.raises(camkit.InvalidTargetError, match="CheferRollout"):
        camkit.LeGrad(model).explain(x, neuron)


def test_clip_image_tower_pooled_output():
    import transformers as hf

    torch.manual_seed(0)
    config = hf.CLIPVisionConfig(image_size=SIZE, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32)
    tower = hf.CLIPVisionModel(config).eval()
    reference = torch.randn(16)
    for cls in (camkit.AttentionRollout, camkit.CheferRollout, camkit.LeGrad):
        e = cls(tower, output="pooler_output").explain(_x(2), camkit.SimilarityTarget(reference))
        assert e.maps.shape == (2, SIZE, SIZE) and not e.flat.any()


def test_windowed_attention_is_refused_with_the_alternatives():
    import timm

    swin = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=56, embed_dim=8,
                             depths=(1, 1), num_heads=(1, 1), window_size=7, num_classes=2)
    for cls in (camkit.AttentionRollout, camkit.CheferRollout, camkit.LeGrad):
        with pytest.raises(camkit.InvalidInputError, match=r"WindowAttention.*Swin.*GradCAM") as info:
            cls(swin)
        assert "IntegratedGradients" in str(info.value)


def test_unknown_attention_class_is_named():
    class MyAttention(nn.Module):
        def forward(self, x):
            return x

    model = nn.Sequential(nn.Flatten(), MyAttention(), nn.Linear(3 * SIZE * SIZE, 2))
    with pytest.raises(camkit.InvalidInputError, match=r"MyAttention.*at '1'"):
        camkit.LeGrad(model)
    with pytest.raises(camkit.InvalidInputError, match="no attention module"):
        camkit.AttentionRollout(nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 2)))


def test_legrad_needs_a_head_it_knows_or_head():
    from torchvision.models import VisionTransformer

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = VisionTransformer(image_size=SIZE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                         mlp_dim=32, num_classes=4)

        def forward(self, x):
            return self.vit(x)

    model = Custom().eval()
    with pytest.raises(camkit.InvalidInputError, match="head="):
        camkit.LeGrad(model)
    head = lambda t: model.vit.heads(model.vit.encoder.ln(t.mean(1)))  # noqa: E731
    nn.init.normal_(model.vit.heads.head.weight)
    ours = camkit.LeGrad(model, head=head).explain(_x(2), 1)
    known = camkit.LeGrad(model.vit).explain(_x(2), 1)
    torch.testing.assert_close(ours.raw, known.raw, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("key", list(METHODS))
def test_on_the_device_equals_the_cpu(key, device):
    for build in (timm_vit, torchvision_vit, lambda: hf_vit("vit")):
        model = build()
        x, target = _x(2), torch.tensor([1, 2])
        expected = METHODS[key](model).explain(x, target)
        got = METHODS[key](model.to(device)).explain(x.to(device), target.to(device))
        assert got.maps.device.type == device.type
        torch.testing.assert_close(got.maps.cpu(), expected.maps, atol=1e-4, rtol=0)
