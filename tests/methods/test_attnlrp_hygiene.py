"""AttnLRP leaves the model as it found it, refuses what it cannot do, and LRP points transformers to it."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import camkit


def _state(model: nn.Module) -> dict[str, object]:
    hooks = sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._backward_pre_hooks)
        for m in model.modules()
    )
    config = getattr(model, "config", None)
    return {
        "hooks": hooks,
        "modules": [(name, type(m), id(m), m.training) for name, m in model.named_modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad is None for p in model.parameters()],
        "attention": getattr(config, "_attn_implementation", None),
        "fused": [getattr(m, "fused_attn", None) for m in model.modules()],
        "forwards": [type(m).__dict__.get("forward") for m in model.modules()],
        "instance_forwards": ["forward" in vars(m) for m in model.modules()],
        "class_forwards": [cls.forward for cls in (nn.MultiheadAttention, nn.LayerNorm, nn.GELU, nn.Linear)],
    }


def _model(name: str) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    if name == "hf":
        import transformers

        config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=32, num_labels=4)  # fmt: skip
        return transformers.ViTForImageClassification(config), "logits"
    if name == "torchvision":
        from torchvision.models import VisionTransformer

        return VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
                                 num_classes=4), None  # fmt: skip
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=16,
                             depth=1, num_heads=2, num_classes=4), None  # fmt: skip


@pytest.mark.parametrize("name", [pytest.param("hf", marks=pytest.mark.heavy), "torchvision", "timm"])
def test_model_untouched_also_after_an_error(name: str) -> None:
    x = torch.rand(2, 3, 32, 32)
    model, output = _model(name)
    model.train()  # explaining runs eval mode and puts train mode back
    next(model.parameters()).requires_grad_(False)
    state, params = _state(model), {k: v.clone() for k, v in model.state_dict().items()}
    copy = x.clone()
    for attention in ("attnlrp", "cp"):
        camkit.AttnLRP(model, attention, "gamma", output=output).explain(x, target=1)
        with pytest.raises(camkit.CamkitError):
            camkit.AttnLRP(model, attention, output=output).explain(x, target=9)
        assert _state(model) == state
        assert torch._C._len_torch_function_stack() == 0
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    assert torch.equal(x, copy) and not x.requires_grad


def test_bad_arguments_are_refused() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(camkit.InvalidInputError, match="attention must be"):
        camkit.AttnLRP(net, "rollout")  # type: ignore[arg-type]
    with pytest.raises(camkit.InvalidInputError, match=r"camkit\.LRP"):
        camkit.AttnLRP(net, rule="zplus")  # type: ignore[arg-type]
    with pytest.raises(camkit.InvalidInputError, match="gamma must be"):
        camkit.AttnLRP(net, gamma=-1.0)
    deconv = nn.Sequential(nn.ConvTranspose2d(3, 2, 2), nn.Flatten(), nn.LazyLinear(2))
    deconv(torch.rand(1, 3, 4, 4))
    with pytest.raises(camkit.InvalidInputError, match="transposed"):
        camkit.AttnLRP(deconv).explain(torch.rand(1, 3, 4, 4), target=0)


def test_unruled_non_linearity_warns_once() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.Mish(), nn.Linear(4, 2))
    with pytest.warns(camkit.NoRuleWarning, match="AttnLRP: no rule for mish"):
        camkit.AttnLRP(net).explain(torch.rand(2, 4, 1), target=0)


def test_lrp_on_a_transformer_says_to_use_attnlrp() -> None:
    from torchvision.models import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=4).eval()  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        camkit.LRP(model).explain(torch.rand(1, 3, 32, 32), target=0)
    rules = [w for w in caught if issubclass(w.category, camkit.NoRuleWarning)]
    assert len(rules) == 1 and "camkit.AttnLRP" in str(rules[0].message), [str(w.message) for w in rules]
    assert "gelu" not in str(rules[0].message)


def test_multihead_attention_options() -> None:
    """Masks, separate projection weights, query unlike key, unbatched inputs: the written-out attention
    gives the module's own output and weights."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, kdim=6, vdim=6, batch_first=True).double().eval()
    q, kv = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    padding = torch.tensor([[False, False, True, False], [False, False, False, False]])
    blocked = torch.tensor([[True, False, False, False], [False, True, False, False], [False, False, False, True]])
    masks = {"bool": (padding, blocked), "float": (torch.zeros(2, 4, dtype=torch.float64).masked_fill(padding, -1e9),
                                                   torch.randn(3, 4, dtype=torch.float64))}  # fmt: skip

    class Net(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.mha, self.kind = mha, kind

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pad, mask = masks[self.kind]
            out, weights = self.mha(x.transpose(1, 2), kv, kv, key_padding_mask=pad, attn_mask=mask)
            return torch.cat([out.flatten(1), weights.flatten(1)], dim=1)

    x = q.transpose(1, 2)
    for kind in masks:
        net = Net(kind).eval()
        with torch.no_grad():
            expected = net(x)
        for attention in ("attnlrp", "cp"):
            e = camkit.AttnLRP(net, attention).explain(x, target=lambda out: out[:, :24].sum(dim=1))
            got = camkit.AttnLRP(net, attention).explain(x, target=lambda out, ref=expected: (out - ref).abs().sum(dim=1))
            assert torch.allclose(got.scores, torch.zeros(2, dtype=torch.float64), atol=1e-12), kind
            assert torch.isfinite(e.raw).all()
            # the input is the query only: CP holds the attention weights constant, so nothing reaches it
            assert (e.raw.abs().amax() > 0) == (attention == "attnlrp")


def test_a_learned_query_is_no_factor_of_the_input() -> None:
    """A query computed from parameters alone (SigLIP's pooling probe repeated over the batch) is on the graph,
    but ``q k^T`` is then linear in the keys: the keys keep all the relevance, as with a constant query."""
    torch.manual_seed(0)

    class Pool(nn.Module):
        def __init__(self, learned: bool) -> None:
            super().__init__()
            probe = torch.randn(1, 1, 8, dtype=torch.float64)
            if learned:
                self.probe = nn.Parameter(probe)
            else:
                self.register_buffer("probe", probe)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True).double()
            self.head = nn.Linear(8, 3).double()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            tokens = x.transpose(1, 2)
            q = self.probe.repeat(tokens.shape[0], 1, 1)
            return self.head(self.attn(q, tokens, tokens, need_weights=False)[0][:, 0])

    learned, constant = Pool(True).eval(), Pool(False).eval()
    constant.load_state_dict(learned.state_dict())
    x = torch.randn(2, 8, 5, dtype=torch.float64)
    for attention in ("attnlrp", "cp"):
        a = camkit.AttnLRP(learned, attention).explain(x, target=1).raw
        b = camkit.AttnLRP(constant, attention).explain(x, target=1).raw
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_written_out_attention_gives_zeros_for_rows_with_nothing_to_attend_to_as_sdpa_does():
    # a padded query under a causal or sliding-window mask has every key masked: SDPA returns zeros
    # there, and the written-out attention must too, with finite gradients (NaN would reach every key)
    from camkit.methods.attribution._attnlrp_attention import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, False, False], [False, False, False, False],
                         [True, True, True, False], [True, True, True, True]])
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, weights = attention(q, k, v, "attnlrp", (True, True, True), mask=mask)
    torch.testing.assert_close(out, expected)
    assert bool((weights[..., 1, :] == 0).all())
    grads = torch.autograd.grad(out.sum(), (q, k, v))  # AttnLRP's modified gradients: finite, none at the dead row
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert bool((grads[0][..., 1, :] == 0).all())
    # the other rows' relevance is that of the same call without the dead query
    keep = [0, 2, 3]
    alive = tuple(t.detach()[..., keep, :].requires_grad_() if i == 0 else t.detach().requires_grad_()
                  for i, t in enumerate((q, k, v)))
    out_alive, _ = attention(*alive, "attnlrp", (True, True, True), mask=mask[keep])
    for mine, theirs in zip((grads[0][..., keep, :], grads[1], grads[2]), torch.autograd.grad(out_alive.sum(), alive)):
        torch.testing.assert_close(mine, theirs)
