"""AttnLRP on every transformer family camkit knows: relevance conserved, batch equal to one by one.

Each model is built from its config with tiny sizes and random weights (no downloads), in float64.
With ``attention="cp"``, ``epsilon=0`` and every additive parameter (biases, position embeddings,
class, distillation and register tokens, relative position bias tables) set to zero, the input's
relevance must equal the score exactly: every op then conserves. With ``attention="attnlrp"`` the
softmax's bias term keeps a share, which ``extras["absorbed"]`` reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import camkit

_MULTIPLICATIVE = ("weight", "lambda1", "lambda2", "gamma", "probe", "scale")


def _bias_free(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.split(".")[-1].endswith(_MULTIPLICATIVE):
                param.zero_()
        for module in model.modules():
            if isinstance(module, nn.Embedding):  # position embeddings are added to the tokens
                module.weight.zero_()
            table = getattr(module, "position_embeddings", None)  # VideoMAE's fixed sinusoids: a plain tensor
            if isinstance(table, torch.Tensor) and not isinstance(table, nn.Parameter):
                table.zero_()
    return model.double().eval()


def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=4, **kwargs)

    return build


def _hf(config: str, model: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**kwargs))

    return build


def _torchvision() -> nn.Module:
    from torchvision.models import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=4)  # fmt: skip
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero
    return model


def _videomae() -> nn.Module:
    import transformers

    config = transformers.VideoMAEConfig(image_size=16, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=16,
                                         num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                         num_labels=4)  # fmt: skip
    return camkit.layers.ChannelsFirstVideo(transformers.VideoMAEForVideoClassification(config))


class _Signal(nn.Module):
    """A 1-D transformer: a strided Conv1d tokeniser, two ``nn.TransformerEncoderLayer`` s (GELU), mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv1d(2, 16, 4, stride=4)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x).transpose(1, 2)).mean(dim=1))


_VIT = dict(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, num_labels=4)  # fmt: skip
_DINO = dict(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
             num_labels=4)  # fmt: skip
_IMAGE = (3, 32, 32)

# name -> (builder, input shape without the batch, output selector)
FAMILIES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Any]] = {
    "torchvision-vit": (_torchvision, _IMAGE, None),
    "timm-vit-fused": (_timm("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2,
                             reg_tokens=2), _IMAGE, None),
    "timm-deit-distilled": (_timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, embed_dim=16,
                                  depth=2, num_heads=2), _IMAGE, None),
    "timm-swin": (_timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=8, depths=(1, 1),
                        num_heads=(1, 2)), _IMAGE, None),
    "hf-vit": (_hf("ViTConfig", "ViTForImageClassification", **_VIT), _IMAGE, "logits"),
    "hf-vit-eager": (_hf("ViTConfig", "ViTForImageClassification", attn_implementation="eager", **_VIT), _IMAGE,
                     "logits"),
    "hf-deit": (_hf("DeiTConfig", "DeiTForImageClassificationWithTeacher", **_VIT), _IMAGE, "logits"),
    "hf-clip-vision": (_hf("CLIPVisionConfig", "CLIPVisionModelWithProjection", projection_dim=8,
                           **{k: v for k, v in _VIT.items() if k != "num_labels"}), _IMAGE, "image_embeds"),
    "hf-dinov2": (_hf("Dinov2Config", "Dinov2ForImageClassification", **_DINO), _IMAGE, "logits"),
    "hf-dinov2-registers": (_hf("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification",
                                num_register_tokens=2, **_DINO), _IMAGE, "logits"),
    "hf-siglip": (_hf("SiglipVisionConfig", "SiglipVisionModel", **{k: v for k, v in _VIT.items()
                                                                      if k != "num_labels"}), _IMAGE, "pooler_output"),
    "hf-swin": (_hf("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=8,
                    depths=[1, 1], num_heads=[1, 2], window_size=2, num_labels=4), _IMAGE, "logits"),
    "hf-videomae": (_videomae, (3, 4, 16, 16), "logits"),  # a video [B, C, T, H, W]
    "signal-transformer": (_Signal, (2, 16), None),
}


def _build(name: str) -> tuple[nn.Module, torch.Tensor, Any]:
    builder, shape, output = FAMILIES[name]
    torch.manual_seed(0)
    model = builder()
    generator = torch.Generator().manual_seed(1)
    return model, torch.randn(2, *shape, generator=generator, dtype=torch.float64), output


_QUICK = ("torchvision-vit", "timm-vit-fused", "signal-transformer")  # the others build in seconds: heavy


@pytest.mark.parametrize(
    "name", [n if n in _QUICK else pytest.param(n, marks=pytest.mark.heavy) for n in sorted(FAMILIES)]
)
def test_conserves_on_a_bias_free_network(name: str) -> None:
    model, x, output = _build(name)
    model = _bias_free(model)
    e = camkit.AttnLRP(model, "cp", epsilon=0.0, output=output).explain(x, target=1)
    assert torch.allclose(e.extras["relevance"], e.scores.double(), rtol=1e-9, atol=1e-12), (
        e.extras["relevance"], e.scores)
    assert e.extras["absorbed"].abs().max() < 1e-8
    assert e.raw.abs().amax() > 0
    # AttnLRP's own rules: the softmax keeps a share; what reaches the input and what is absorbed add up.
    a = camkit.AttnLRP(model, epsilon=0.0, output=output).explain(x, target=1)
    assert torch.allclose(a.extras["relevance"], a.raw.sum(dim=tuple(range(1, a.raw.dim()))))
    assert torch.allclose(a.extras["relevance"] + a.extras["absorbed"] * a.scores.double(), a.scores.double())
    assert torch.isfinite(a.raw).all() and not torch.equal(a.raw, e.raw)


@pytest.mark.parametrize(
    "name", ["torchvision-vit", "timm-vit-fused", "signal-transformer",
             pytest.param("hf-vit", marks=pytest.mark.heavy), pytest.param("hf-swin", marks=pytest.mark.heavy)]
)
def test_batch_equals_one_by_one(name: str) -> None:
    model, x, output = _build(name)
    model = model.double()
    for attention in ("attnlrp", "cp"):
        explainer = camkit.AttnLRP(model, attention, "gamma", gamma=0.1, output=output)
        both = explainer.explain(x, target=torch.tensor([[1, 2], [0, 3]]))
        for i in range(2):
            one = explainer.explain(x[i : i + 1], target=torch.tensor([[1, 2], [0, 3]][i : i + 1]))
            assert torch.allclose(both.raw[i : i + 1], one.raw, rtol=1e-9, atol=1e-12)
            assert torch.allclose(both.extras["delta"][i], one.extras["delta"][0], atol=1e-10)
        single = explainer.explain(x, target=torch.tensor([1, 0]))
        assert torch.allclose(single.raw, both.raw[:, 0], rtol=1e-9, atol=1e-12)
        picked = explainer.explain(x, target=lambda out: out[:, 2] - out[:, 1])
        assert picked.raw.shape == x.shape and torch.isfinite(picked.raw).all()
