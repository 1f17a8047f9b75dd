"""Forward-only CAMs on token layers and multi-input models."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models import VisionTransformer

import camkit


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3).eval()


@pytest.mark.parametrize("cls", [camkit.ScoreCAM, camkit.EigenCAM])
def test_forward_cams_read_token_layers(vit, cls):
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explanation = cls(vit, "encoder.layers.encoder_layer_0").explain(x, target=1)
    assert explanation.maps.shape == (2, 32, 32)
    assert explanation.raw.shape[-2:] == (4, 4)  # 16 patch tokens, class token dropped
    assert torch.isfinite(explanation.maps).all()


def test_ablation_cam_refuses_token_layers(vit):
    with pytest.raises(camkit.InvalidInputError, match="needs a layer with"):
        camkit.AblationCAM(vit, "encoder.layers.encoder_layer_0").explain(torch.rand(1, 3, 32, 32))


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, image, mask):
        return self.fc((torch.relu(self.conv(image)) * mask).mean(dim=(2, 3)))


def test_single_forward_cams_take_extra_inputs():
    model = Masked().eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 1, 8, 8)
    mask[..., :4] = 1  # the right half of every map is masked out of the score
    for cls in (camkit.EigenCAM, camkit.CAM):
        with_mask = cls(model, "conv").explain(x, 0, inputs=(x, mask))
        assert with_mask.maps.shape == (2, 8, 8)
    # the scores reflect the mask: the same as computing them by hand
    expected = model(x, mask)[:, 0].detach()
    torch.testing.assert_close(camkit.EigenCAM(model, "conv").explain(x, 0, inputs=(x, mask)).scores, expected)
