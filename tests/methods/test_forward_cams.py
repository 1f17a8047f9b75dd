"""Eigen-CAM, Eigen-Grad-CAM, CAM, Occlusion and RISE: hand-computed values and formula parity."""

from __future__ import annotations

import math

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

import camkit
from camkit.functional.perturbation import eigen_projection, rise_masks, unique_rows, window_indicators


def pooled_linear_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 7, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(7, 5),
    ).eval()


# --- Eigen-CAM ---------------------------------------------------------------------------


def test_eigen_projection_hand_computed_and_sign():
    # Points (A1, A2) per position: (0, 0), (1, 2), (2, 4); centred (-1, -2), (0, 0), (1, 2);
    # first direction (1, 2) / sqrt(5) -> projections -sqrt(5), 0, sqrt(5). Sample 2 is the
    # same activations reversed, so its map is reversed (the sign follows the activations).
    a = torch.tensor([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]], [[[2.0, 1.0, 0.0]], [[4.0, 2.0, 0.0]]]])
    r5 = math.sqrt(5)
    expected = torch.tensor([[[-r5, 0.0, r5]], [[r5, 0.0, -r5]]])
    torch.testing.assert_close(eigen_projection(a), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(eigen_projection(-a), -expected, atol=1e-5, rtol=0)
    assert torch.equal(eigen_projection(torch.ones(1, 3, 2, 2)), torch.zeros(1, 2, 2))


def test_eigencam_projects_the_captured_activations():
    model, x = TinyNet().eval(), tiny_input(batch=3)
    acts = {}
    handle = model.conv2.register_forward_hook(lambda m, i, o: acts.setdefault("a", o.detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    explanation = camkit.EigenCAM(model, "conv2").explain(x)
    # The ReLU of the projection, as pytorch-grad-cam and every other CAM.
    torch.testing.assert_close(explanation.raw, eigen_projection(acts["a"]).clamp_min(0), atol=1e-5, rtol=1e-4)
    assert not camkit.EigenCAM.needs_grad
    multi = camkit.EigenCAM(model, "conv2").explain(x, torch.tensor([[0, 1]] * 3))
    torch.testing.assert_close(multi.maps[:, 1], explanation.maps)  # class-agnostic


def test_eigengradcam_projects_activations_times_gradients():
    model, x = TinyNet().eval(), tiny_input(batch=2)
    acts = {}
    handle = model.conv2.register_forward_hook(lambda m, i, o: acts.setdefault("a", o))
    try:
        out = model(x)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(out[:, 2].sum(), acts["a"])
    expected = eigen_projection(acts["a"].detach() * grad).clamp_min(0)
    got = camkit.EigenGradCAM(model, "conv2").explain(x, target=2).raw
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


# --- CAM ---------------------------------------------------------------------------------


def test_cam_hand_computed():
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
        net[0].bias.copy_(torch.tensor([0.0, 3.0]))  # A0 = x, A1 = 3 - x
        net[3].weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 0.5]]))
        net[3].bias.copy_(torch.tensor([10.0, -10.0]))  # bias plays no part
    x = torch.tensor([[[[0.0, 1.0, 2.0, 3.0]]]])
    # class 0: relu(A0 - 2 A1) = relu(3x - 6) = [0, 0, 0, 3]; class 1: 0.5 (A0 + A1) = 1.5 everywhere
    explanation = camkit.CAM(net, "0").explain(x, torch.tensor([[0, 1]]))
    torch.testing.assert_close(explanation.raw[0], torch.tensor([[[0.0, 0.0, 0.0, 3.0]], [[1.5, 1.5, 1.5, 1.5]]]))
    assert explanation.flat.tolist() == [[False, True]]


@pytest.mark.parametrize("target", [None, 3, torch.tensor([[0, 4], [2, 1], [3, 3]])])
def test_cam_equals_gradcam_on_a_pooled_linear_net(target):
    model, x = pooled_linear_net(), tiny_input(batch=3)
    cam = camkit.CAM(model, "3").explain(x, target)
    grad = camkit.GradCAM(model, "3").explain(x, target)
    torch.testing.assert_close(cam.maps, grad.maps, atol=1e-5, rtol=0)
    # Raw maps differ by the pooling factor 1 / (h * w) only.
    torch.testing.assert_close(cam.raw / 64, grad.raw, atol=1e-6, rtol=1e-4)


def test_cam_finds_the_head_or_says_how_to_choose():
    model = pooled_linear_net()
    assert camkit.CAM(model)._head(7) is model[6]
    two_heads = nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4), nn.Linear(4, 2))
    with pytest.raises(camkit.LayerNotFoundError, match="Pass fc="):
        camkit.CAM(two_heads, "0").explain(tiny_input(batch=1))
    maps = camkit.CAM(two_heads, "0", fc="4").explain(tiny_input(batch=1)).maps
    assert maps.shape == (1, 8, 8)
    with pytest.raises(camkit.InvalidInputError, match=r"nn\.Linear"):
        camkit.CAM(two_heads, "0", fc="1")
    with pytest.raises(camkit.InvalidTargetError, match="callable"):
        camkit.CAM(model, "3").explain(tiny_input(batch=1), target=lambda out: out[:, 0])


# --- Occlusion ---------------------------------------------------------------------------


def linear_pixels() -> nn.Sequential:
    """logit0 = 1 x00 + 2 x01 + 3 x10 + 4 x11 for a [B, 1, 2, 2] input; logit1 = 0."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]))
    return net


def test_occlusion_hand_computed():
    x = torch.ones(1, 1, 2, 2)
    single = camkit.Occlusion(linear_pixels(), window=1, stride=1).explain(x, target=0)
    torch.testing.assert_close(single.raw[0], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # window 1 x 2: row 0 loses 1 + 2 = 3, row 1 loses 3 + 4 = 7; baseline 0.5 halves the loss.
    rows = camkit.Occlusion(linear_pixels(), window=(1, 2), stride=1, baseline=0.5).explain(x, target=0)
    torch.testing.assert_close(rows.raw[0], torch.tensor([[1.5, 1.5], [3.5, 3.5]]))
    assert camkit.Occlusion.needs_grad is False


def test_window_indicators_cover_the_edge():
    # length 5, window 2, stride 2: starts 0, 2 and a last one flush with the end at 3.
    assert window_indicators(5, 2, 2).argmax(dim=1).tolist() == [0, 2, 3]
    with pytest.raises(camkit.InvalidInputError, match="window"):
        window_indicators(4, 5, 1)


# --- RISE --------------------------------------------------------------------------------


def test_rise_with_all_masks_open_is_the_probability():
    # p = 1 keeps every cell: every mask is 1, so the map is softmax(model(x))[target] everywhere.
    model, x = TinyNet().eval(), tiny_input(batch=2)
    explanation = camkit.RISE(model, masks=5, p=1.0, grid=2, batch_size=3).explain(x, target=1)
    probability = model(x).softmax(dim=1)[:, 1].detach()
    torch.testing.assert_close(explanation.raw, probability[:, None, None].expand(2, 8, 8), atol=1e-6, rtol=0)


def test_rise_matches_its_formula():
    model, x = TinyNet().eval(), tiny_input(batch=2)
    explainer = camkit.RISE(model, masks=12, seed=4, grid=3, p=0.5, batch_size=5)
    got = explainer.explain(x, target=torch.tensor([0, 3])).raw
    grids, shifts = explainer._plan((8, 8))
    masks = rise_masks(grids, shifts, (8, 8))  # [12, 8, 8]
    expected = torch.zeros(2, 8, 8)
    with torch.no_grad():
        for b, cls in enumerate([0, 3]):
            for i in range(12):
                prob = model(x[b : b + 1] * masks[i]).softmax(dim=1)[0, cls]
                expected[b] += prob * masks[i]
    torch.testing.assert_close(got, expected / (12 * 0.5), atol=1e-5, rtol=1e-5)
    again = camkit.RISE(model, masks=12, seed=4, grid=3, batch_size=7).explain(x, target=torch.tensor([0, 3]))
    torch.testing.assert_close(again.raw, got, atol=1e-6, rtol=0)  # seeded: same masks


def test_rise_masks_shift_and_crop():
    # Columns [1, 0]: a vertical edge; a 2 x 2 grid on 4 x 4 (cells of 2) is upsampled to 6 x 6.
    grid = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    left = rise_masks(grid, torch.tensor([[0, 0]]), (4, 4))[0, 0]
    shifted = rise_masks(grid, torch.tensor([[0, 1]]), (4, 4))[0, 0]
    # Bilinear 2 -> 6 columns samples at (j + 0.5) / 3 - 0.5 = -1/3 (clamped), 0, 1/3, 2/3, 1, 4/3:
    # [1, 1, 2/3, 1/3, 0, 0]; the shift starts the crop one column later.
    torch.testing.assert_close(left, torch.tensor([1.0, 1.0, 2 / 3, 1 / 3]))
    torch.testing.assert_close(shifted, torch.tensor([1.0, 2 / 3, 1 / 3, 0.0]))


def test_unique_rows_first_occurrence_order():
    first, inverse = unique_rows(torch.tensor([[2.0], [1.0], [2.0], [0.0], [1.0]]))
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cam_reads_a_pointwise_convolution_head_as_its_linear_twin(rank):
    """A fully convolutional classifier (pool, then a 1x1 conv) has the same CAM as pool then nn.Linear."""
    torch.manual_seed(0)
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[rank]
    pool = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[rank]
    body = nn.Sequential(conv(2, 4, 3, padding=1), nn.ReLU())
    head = conv(4, 3, 1)
    fully_conv = nn.Sequential(body, pool(1), head, nn.Flatten(1)).eval()
    linear = nn.Linear(4, 3)
    with torch.no_grad():
        linear.weight.copy_(head.weight.flatten(1))
        linear.bias.copy_(head.bias)
    pooled_linear = nn.Sequential(body, pool(1), nn.Flatten(1), linear).eval()
    x = torch.rand(2, 2, *(5,) * rank, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fully_conv(x), pooled_linear(x))
    mine = camkit.CAM(fully_conv, "0.1", fc="2").explain(x, target=[0, 2]).raw
    twin = camkit.CAM(pooled_linear, "0.1", fc="3").explain(x, target=[0, 2]).raw
    assert mine.shape == (2, *(5,) * rank) and mine.amax() > 0
    torch.testing.assert_close(mine, twin, atol=1e-6, rtol=0)
    grouped = nn.Sequential(body, pool(1), conv(4, 2, 1, groups=2), nn.Flatten(1))
    with pytest.raises(camkit.InvalidInputError, match="1x1 convolution"):
        camkit.CAM(grouped, "0.1", fc="2")
