"""camkit.layers.families: timm / transformers families recognised by class name and structure, without importing either."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import camkit
from camkit.errors import OutputSelectionError
from camkit.layers import default_layer, default_layer_table, families, prefix_token_hint
from camkit.targets import select_output

ROOT = Path(__file__).resolve().parents[2]


def _named(name: str, base: type[nn.Module] = nn.Module) -> type[nn.Module]:
    return type(name, (base,), {})


def fake_hf_vit(layers: int = 3, prefix: str = "vit.layers") -> nn.Module:
    """Shaped like transformers 5's ViTForImageClassification (names only)."""
    model = _named("ViTForImageClassification")()
    holder: nn.Module = model
    parts = prefix.split(".")
    for part in parts[:-1]:
        child = nn.Module()
        holder.add_module(part, child)
        holder = child
    blocks = nn.ModuleList()
    for _ in range(layers):
        block = nn.Module()
        block.layernorm_before = nn.LayerNorm(4)
        block.layernorm_after = nn.LayerNorm(4)
        blocks.append(block)
    holder.add_module(parts[-1], blocks)
    model.classifier = nn.Linear(4, 2)
    return model


def test_docs_table_is_generated_from_the_rules():
    text = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")
    start = text.index("<!-- family table:")
    body = text[text.index("\n", start) + 1 : text.index("<!-- end of family table -->")]
    assert body == families.markdown_table()
    assert len(families.rules()) == len(body.splitlines()) - 2


def test_every_rule_library_and_the_required_families_are_covered():
    covered = " ".join(rule.family for rule in families.rules())
    for name in ("ResNet", "EfficientNet", "MobileNetV3", "ConvNeXt", "RegNet", "DenseNet", "VGG", "Inception",
                 "Xception", "ViT / DeiT / EVA / BEiT", "Swin", "LeViT", "MLP-Mixer", "CoAtNet / MaxViT",
                 "EfficientFormer", "MobileViT", "CLIP vision", "DINOv2", "DeiT"):
        assert name in covered, name
    assert {rule.library for rule in families.rules()} == {"timm", "transformers"}


def test_recognised_by_class_name_and_structure():
    assert default_layer(fake_hf_vit(3)) == "vit.layers.2.layernorm_before"
    assert default_layer(fake_hf_vit(2, "vit.encoder.layer")) == "vit.encoder.layer.1.layernorm_before"  # 4.x names
    wrong = _named("ViTForImageClassification")()  # right name, wrong structure: no family default
    wrong.features = nn.Conv2d(3, 4, 3)
    assert default_layer(wrong) is None
    same_structure = fake_hf_vit(2)
    renamed = _named("MyViT")()  # right structure, unknown name
    renamed.vit = same_structure.vit
    assert default_layer(renamed) is None


def test_subclasses_and_wrappers_get_the_family_default():
    subclass = _named("MyResNet", _named("ResNet"))()
    subclass.layer4 = nn.Conv2d(3, 4, 3)
    assert default_layer(subclass) == "layer4"
    model = fake_hf_vit(2)
    assert default_layer(nn.DataParallel(model)) == "vit.layers.1.layernorm_before"


def test_last_relu_and_last_child_patterns():
    vgg = _named("VGG")()
    vgg.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.MaxPool2d(2))
    assert default_layer(vgg) == "features.3"
    mixer = _named("MlpMixer")()
    mixer.blocks = nn.Sequential(*[nn.Linear(4, 4) for _ in range(5)])
    assert families.family_layer(mixer) == "blocks.4"
    empty = _named("MlpMixer")()
    empty.blocks = nn.Sequential()
    assert families.family_layer(empty) is None


def test_torchvision_rules_come_first():
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=1, hidden_dim=4, mlp_dim=8)
    vit.blocks = nn.ModuleList([nn.Module()])  # would fit timm's ViT rule if it were consulted
    vit.blocks[0].norm1 = nn.LayerNorm(4)
    assert default_layer(vit) == "encoder.layers.encoder_layer_0.ln_1"
    rows = dict(default_layer_table())
    assert rows["VisionTransformer"] == "encoder.layers.<last>.ln_1"
    assert rows["VisionTransformer, Eva, Beit"] == "blocks.<last>.norm1"
    assert rows["Xception"] == "act4"


def _dinov2(registers: object) -> nn.Module:
    model = _named("Dinov2ForImageClassification")()
    model.config = SimpleNamespace(num_register_tokens=registers)
    model.dinov2 = nn.Module()
    model.dinov2.encoder = nn.Module()
    model.dinov2.encoder.layer = nn.ModuleList([nn.Module()])
    model.dinov2.encoder.layer[0].norm1 = nn.LayerNorm(4)
    return model


def test_prefix_tokens_from_class_and_config():
    assert prefix_token_hint(fake_hf_vit(1)) == 1
    assert prefix_token_hint(_dinov2(0)) == 1
    assert prefix_token_hint(_dinov2(4)) == 5
    assert prefix_token_hint(_dinov2(None)) == 1  # no registers configured
    timm_like = _named("VisionTransformer")()
    timm_like.num_prefix_tokens = 3  # timm's own attribute wins
    assert prefix_token_hint(timm_like) == 3
    assert prefix_token_hint(nn.Conv2d(3, 4, 3)) is None


def test_layer_layout_only_for_the_family_default():
    regnet = _named("RegNet")()
    regnet.s4 = nn.Conv2d(3, 4, 1)
    regnet.head = nn.Linear(4, 2)
    assert families.layer_layout(regnet, "s4") is False
    assert families.layer_layout(regnet, "head") is None
    swin = _named("SwinTransformer")()
    swin.layers = nn.ModuleList([nn.Module()])
    swin.layers[0].blocks = nn.ModuleList([nn.Module()])
    swin.layers[0].blocks[0].norm1 = nn.LayerNorm(4)
    assert families.layer_layout(swin, "layers.0.blocks.0.norm1") is True
    assert families.layer_layout(fake_hf_vit(1), "vit.layers.0.layernorm_before") is None  # tokens


@pytest.mark.heavy
def test_camkit_does_not_import_timm_or_transformers():
    code = (
        "import sys, camkit, camkit.layers.families; "
        "camkit.default_layer(__import__('torch').nn.Linear(2, 2)); "
        "print(sorted(m for m in ('timm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


class ModelOutput(OrderedDict):
    """Shaped like transformers' ModelOutput: an OrderedDict with attribute access."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def test_logits_are_selected_by_default_from_dicts_and_model_outputs():
    logits = torch.randn(2, 3)
    assert select_output({"logits": logits, "hidden_states": None}) is logits
    assert select_output(ModelOutput(loss=None, logits=logits)) is logits
    assert select_output(logits) is logits
    assert select_output(ModelOutput(logits=logits, other=logits + 1), "other") is not logits  # explicit wins


def test_outputs_without_logits_ask_for_output():
    hidden = torch.randn(2, 5, 4)
    with pytest.raises(OutputSelectionError, match=r"ModelOutput with keys 'last_hidden_state'.*pass output="):
        select_output(ModelOutput(last_hidden_state=hidden))
    with pytest.raises(OutputSelectionError, match="output='out'"):
        select_output({"out": hidden})
    with pytest.raises(OutputSelectionError, match="not a tensor"):
        select_output({"logits": [1, 2]})


def test_gradcam_on_a_model_returning_a_logits_dict():
    class DictNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return ModelOutput(logits=self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3))))

    torch.manual_seed(0)
    net = DictNet().eval()
    x = torch.rand(2, 3, 8, 8)
    default = camkit.GradCAM(net, "conv").explain(x, 1)
    named = camkit.GradCAM(net, "conv", output="logits").explain(x, 1)
    torch.testing.assert_close(default.maps, named.maps)
    torch.testing.assert_close(default.scores, net(x).logits[:, 1].detach())
