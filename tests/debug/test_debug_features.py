import numpy as np
import pytest
import torch
from debug_helpers import hook_count
from models import TinyNet, tiny_input
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import camkit
from camkit.debug import extract_features, extract_features_batched, feature_grid, tile_maps


def test_extract_features_equal_manual_forward_and_leave_no_trace(device):
    model = TinyNet().to(device)
    model.train()
    x = tiny_input().to(device)
    x0 = x.clone()
    feats = camkit.extract_features(model, x, ["bn1", "conv2", "fc"])
    assert list(feats) == ["bn1", "conv2", "fc"]
    model.eval()
    with torch.no_grad():
        bn = model.bn1(model.conv1(x))
        conv2 = model.conv2(torch.relu(bn))
        fc = model.fc(model.pool(torch.relu(conv2)).flatten(1))
    model.train()
    # bn1 is recorded as it left the layer, before the in-place ReLU
    assert torch.allclose(feats["bn1"], bn, atol=1e-6) and feats["bn1"].min() < 0
    assert torch.allclose(feats["conv2"], conv2, atol=1e-6)
    assert torch.allclose(feats["fc"], fc, atol=1e-6)
    assert all(not t.requires_grad and t.device == x.device for t in feats.values())
    assert all(m.training for m in model.modules()) and hook_count(model) == 0
    assert torch.equal(x, x0)
    cpu = extract_features(model, x, "conv2", to_cpu=True)
    assert cpu["conv2"].device.type == "cpu" and torch.allclose(cpu["conv2"], conv2.cpu(), atol=1e-6)


def test_call_selects_the_call_of_a_shared_module():
    lin = nn.Linear(2, 2)
    net = nn.Sequential(lin, nn.Tanh(), lin)
    x = torch.randn(3, 2)
    first = extract_features(net, x, ["0"], call=0)["0"]
    last = extract_features(net, x, ["0"])["0"]
    with torch.no_grad():
        assert torch.allclose(first, lin(x)) and torch.allclose(last, lin(torch.tanh(lin(x))))


def test_batched_equals_one_call_on_everything():
    model = TinyNet()
    x = tiny_input(batch=5)
    loader = DataLoader(TensorDataset(x, torch.arange(5)), batch_size=2)
    batched = extract_features_batched(model, loader, ["conv2", "fc"])
    whole = extract_features(model, x, ["conv2", "fc"])
    assert batched["conv2"].shape == (5, 6, 8, 8)
    for name in whole:
        assert torch.allclose(batched[name], whole[name], atol=1e-6)
    limited = extract_features_batched(model, loader, "fc", limit=2)
    assert limited["fc"].shape == (4, 5)
    dicts = [{"image": x[:3]}, {"image": x[3:]}]
    picked = extract_features_batched(model, dicts, "fc", select=lambda b: b["image"])
    assert torch.allclose(picked["fc"], whole["fc"], atol=1e-6)
    with pytest.raises(ValueError, match="select="):
        extract_features_batched(model, dicts, "fc")


class _Grab(nn.Module):
    """The layer output is the input itself, so the maps are known exactly."""

    def __init__(self):
        super().__init__()
        self.id = nn.Identity()

    def forward(self, x):
        return self.id(x)


def test_tile_maps_layout_pixel_exact():
    maps = torch.tensor(
        [
            [[0.0, 1.0], [2.0, 3.0]],  # -> 0, 85, 170, 255
            [[5.0, 5.0], [5.0, 5.0]],  # constant -> 0
            [[-1.0, 1.0], [1.0, 1.0]],  # -> 0, 255, 255, 255
        ]
    )
    img = tile_maps(maps, columns=2, padding=1, pad_value=200)
    P = 200
    expected = [
        [P, P, P, P, P, P, P],
        [P, 0, 85, P, 0, 0, P],
        [P, 170, 255, P, 0, 0, P],
        [P, P, P, P, P, P, P],
        [P, 0, 255, P, P, P, P],
        [P, 255, 255, P, P, P, P],
        [P, P, P, P, P, P, P],
    ]
    assert img.dtype == torch.uint8 and img.tolist() == expected
    # normalize="all": one range over all maps (-1 .. 5)
    together = tile_maps(maps[:1], padding=0, normalize="all")
    assert together.tolist() == [[0, 85], [170, 255]]
    # scale 2: each pixel becomes a 2x2 block
    big = tile_maps(maps[:1], padding=0, scale=2)
    assert big.tolist() == [[0, 0, 85, 85], [0, 0, 85, 85], [170, 170, 255, 255], [170, 170, 255, 255]]


def test_feature_grid_first_and_top_order_pixel_exact():
    x = torch.zeros(1, 4, 1, 2)
    x[0, 0] = torch.tensor([[0.0, 1.0]])  # mean 0.5
    x[0, 1] = torch.tensor([[3.0, 5.0]])  # mean 4
    x[0, 2] = torch.tensor([[2.0, 0.0]])  # mean 1
    x[0, 3] = torch.tensor([[4.0, 4.0]])  # mean 4 (tie with channel 1: channel order)
    grid = feature_grid(_Grab(), x, "id", n=3, order="top", columns=3, padding=1, pad_value=255, scale=1)
    assert grid.channels == [1, 3, 2]
    assert grid.columns == 3 and grid.tile == (1, 2)
    row = [255, 0, 255, 255, 0, 0, 255, 255, 0, 255]
    assert grid.image.shape == (3, 10, 3) and grid.image.dtype == np.uint8
    assert grid.image[1, :, 0].tolist() == row
    assert (grid.image[0] == 255).all() and (grid.image[2] == 255).all()
    assert (grid.image[..., 0] == grid.image[..., 1]).all() and (grid.image[..., 0] == grid.image[..., 2]).all()
    first = feature_grid(_Grab(), x[0], "id", n=10, padding=0, scale=1)  # [C, H, W] accepted; n capped at C
    assert first.channels == [0, 1, 2, 3] and first.columns == 2
    assert first.image[:, :, 0].tolist() == [[0, 255, 0, 255], [255, 0, 0, 0]]


def test_feature_grid_default_scale_and_png(tmp_path):
    model = TinyNet()
    grid = feature_grid(model, tiny_input(batch=1), "conv2")  # 6 maps of 8x8 -> scale 4, 3 columns, 2 rows
    assert grid.tile == (32, 32) and grid.columns == 3
    assert grid.image.shape == (2 * 33 + 1, 3 * 33 + 1, 3)
    camkit.save_png(tmp_path / "grid.png", grid.image)
    assert np.array_equal(camkit.read_rgb(tmp_path / "grid.png"), grid.image)


def test_feature_grid_rejects_batches_and_flat_layers():
    with pytest.raises(ValueError, match="one input"):
        feature_grid(TinyNet(), tiny_input(batch=2), "conv2")
    with pytest.raises(ValueError, match=r"\[1, C, h, w\]"):
        feature_grid(TinyNet(), tiny_input(batch=1), "fc")
    with pytest.raises(ValueError, match="order"):
        feature_grid(TinyNet(), tiny_input(batch=1), "conv2", order="random")
