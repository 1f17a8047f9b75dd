"""SS-CAM, IS-CAM, Seg-Eigen-CAM and RefineCAM against their formulas, computed by hand on tiny fixed-weight models."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import camkit
from camkit.functional import integration_coefficients, multiply_maps, score_masks


class Linear2(nn.Module):
    """``feat`` is the input itself; score_k = sum_c W[k, c] * sum_p x[c, p]: linear, so gains are hand-computable."""

    def __init__(self, spatial_dims: int = 2) -> None:
        super().__init__()
        self.feat = nn.Identity()
        self.head = nn.Linear(2, 2, bias=False)
        self.spatial = tuple(range(2, 2 + spatial_dims))
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.feat(x).sum(dim=self.spatial))


def _x(shape=(1, 2)) -> torch.Tensor:
    # channel 0 = [1, 3] (mask [0, 1]); channel 1 = [2, 2] (constant: a zero mask)
    return torch.tensor([[1.0, 3.0], [2.0, 2.0]]).view(1, 2, *shape)


def _score_cam_raw(gains: list[float]) -> torch.Tensor:
    w = torch.tensor(gains).softmax(dim=0)
    return w[0] * torch.tensor([1.0, 3.0]) + w[1] * torch.tensor([2.0, 2.0])


def test_integration_coefficients_are_the_running_sums():
    n = 5
    running, expected = 0.0, []
    for i in range(n):
        running += (i + 1) / n
        expected.append(running)
    torch.testing.assert_close(integration_coefficients(n, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))
    with pytest.raises(camkit.InvalidInputError, match="positive int"):
        integration_coefficients(0)


def test_score_masks_normalise_at_the_layer_then_upsample():
    acts = torch.tensor([[[[0.0, 2.0]], [[5.0, 5.0]]]])
    masks = score_masks(acts, (1, 4))
    torch.testing.assert_close(masks, torch.tensor([[[[0.0, 0.25, 0.75, 1.0]], [[0.0, 0.0, 0.0, 0.0]]]]))
    # a signal and a volume go through the same code
    assert score_masks(torch.rand(2, 3, 4), (8,)).shape == (2, 3, 8)
    assert score_masks(torch.rand(2, 3, 2, 2, 2), (4, 4, 4)).shape == (2, 3, 4, 4, 4)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_iscam_weights_are_the_softmax_of_mean_integrated_gains(steps):
    x = _x()
    e = camkit.ISCAM(Linear2(), "feat", samples=steps).explain(x, 0)
    # S(x) = 4 + 4 = 8; S(c M0 x) = c (3 + 2) = 5c; S(c M1 x) = 0 (channel 1 is constant: zero mask)
    mean_c = sum((i + 1) * (i + 2) / (2 * steps) for i in range(steps)) / steps
    expected = _score_cam_raw([5 * mean_c - 8, -8.0]).view(1, 1, 2)
    torch.testing.assert_close(e.raw, expected)
    assert e.extras["scored"] == 2 * steps
    torch.testing.assert_close(e.maps, ((expected - expected.min()) / (expected.max() - expected.min())))


def test_sscam_without_noise_is_iscam_with_one_step_and_a_second_class_changes_the_gains():
    x = _x()
    quiet = camkit.SSCAM(Linear2(), "feat", samples=3, std=0.0, seed=0).explain(x, 1)
    one = camkit.ISCAM(Linear2(), "feat", samples=1).explain(x, 1)
    # class 1 reads channel 1 only: S(x) = 4; S(M0 x) = 2; S(M1 x) = 0
    torch.testing.assert_close(quiet.raw, _score_cam_raw([2 - 4.0, -4.0]).view(1, 1, 2))
    torch.testing.assert_close(one.raw, quiet.raw)


def test_sscam_noise_enters_as_the_formula_says():
    x = _x()
    std, steps, seed = 0.7, 4, 3
    e = camkit.SSCAM(Linear2(), "feat", samples=steps, std=std, seed=seed).explain(x, 0)
    gen = torch.Generator().manual_seed(seed)
    masks = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    gains = torch.zeros(2)
    for _ in range(steps):
        noisy = masks + std * torch.randn((1, 2, 1, 2), generator=gen)[0, :, 0]
        masked = x[0, :, 0] * noisy[:, None, :]  # [mask k, input channel, position]
        gains += masked.sum(dim=(1, 2)) - 8.0  # class 0 sums both channels
    expected = _score_cam_raw((gains / steps).tolist()).view(1, 1, 2)
    torch.testing.assert_close(e.raw, expected)


def test_sscam_seed_repeats_generator_advances_and_shared_noise_is_batch_invariant():
    model, x = Linear2(), torch.rand(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    a = camkit.SSCAM(model, "feat", samples=3, seed=1).explain(x, 0).raw
    b = camkit.SSCAM(model, "feat", samples=3, seed=1).explain(x, 0).raw
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    gen = torch.Generator().manual_seed(1)
    explainer = camkit.SSCAM(model, "feat", samples=3, generator=gen)
    torch.testing.assert_close(explainer.explain(x, 0).raw, a, rtol=0, atol=0)  # the same first draws
    assert not torch.equal(explainer.explain(x, 0).raw, a)  # the generator moved on
    # shared noise: the batch equals its images one by one
    for i in range(3):
        single = camkit.SSCAM(model, "feat", samples=3, seed=1).explain(x[i : i + 1], 0).raw
        torch.testing.assert_close(single[0], a[i], rtol=0, atol=1e-6)
    # torchcam's draws ([B, C, *S] per step): with one step the first image draws first either way
    shared = camkit.SSCAM(model, "feat", samples=1, seed=1).explain(x, 0).raw
    own = camkit.SSCAM(model, "feat", samples=1, seed=1, shared_noise=False).explain(x, 0).raw
    torch.testing.assert_close(own[0], shared[0], rtol=0, atol=1e-6)
    assert not torch.allclose(own[1:], shared[1:])
    with pytest.raises(camkit.InvalidInputError, match="not both"):
        camkit.SSCAM(model, "feat", seed=1, generator=gen)
    with pytest.raises(camkit.InvalidInputError, match="std"):
        camkit.SSCAM(model, "feat", std=-1.0)


@pytest.mark.parametrize("spatial_dims", [1, 3])
def test_iscam_any_rank_equals_the_image_formula(spatial_dims):
    shape = (2,) if spatial_dims == 1 else (1, 1, 2)
    e = camkit.ISCAM(Linear2(spatial_dims), "feat", samples=2, reshape=lambda t: t).explain(_x(shape), 0)
    torch.testing.assert_close(e.raw, _score_cam_raw([5 * 1.0 - 8, -8.0]).view(1, *shape))


class SegNet(nn.Module):
    """``feat`` is the input; score_k = sum_c W[k, c] sum_p A[c, p], so dS/dA[c, p] = W[k, c]."""

    def __init__(self) -> None:
        super().__init__()
        self.feat = nn.Identity()
        self.head = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0, -2.0], [1.0, 1.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.feat(x).sum(dim=(2, 3)))


def test_segeigencam_weighs_by_gradient_magnitude_and_makes_the_larger_extreme_positive():
    f = torch.tensor([3.0, 3.0, 0.0])
    x = torch.stack([f, f]).view(1, 2, 1, 3)
    e = camkit.SegEigenCAM(SegNet(), "feat").explain(x, 0)
    # |G| * A has channels (1 f, 2 f): rank one, projection sqrt(5) (f - mean f) = sqrt(5) [1, 1, -2];
    # |min| > |max| flips it to sqrt(5) [-1, -1, 2]; the ReLU keeps the third position.
    torch.testing.assert_close(e.raw, torch.tensor([[[0.0, 0.0, 2 * math.sqrt(5)]]]), atol=1e-5, rtol=1e-5)
    # Eigen-CAM's sign rule (correlation with the channel sum) keeps the other side
    eigen = camkit.EigenCAM(SegNet(), "feat").explain(x, 0)
    torch.testing.assert_close(eigen.raw, torch.tensor([[[math.sqrt(2), math.sqrt(2), 0.0]]]), atol=1e-5, rtol=1e-5)
    with pytest.raises(camkit.InvalidInputError, match="eigen_smooth"):
        camkit.SegEigenCAM(SegNet(), "feat", eigen_smooth=True)(x, 0)


class TwoConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 5, 3, stride=2, padding=1)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).mean(dim=(2, 3)))


def test_refinecam_is_the_normalised_product_of_the_layers_maps():
    model = TwoConv().eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    e = camkit.RefineCAM(model, ["conv1", "conv2"], base="gradcam").explain(x, [0, 2])
    one = camkit.GradCAM(model, "conv1")(x, [0, 2])
    two = camkit.GradCAM(model, "conv2")(x, [0, 2])  # 4 x 4, upsampled to 8 x 8
    product = one * two
    low = product.amin(dim=(1, 2), keepdim=True)
    expected = (product - low) / (product.amax(dim=(1, 2), keepdim=True) - low)
    torch.testing.assert_close(e.maps, expected)
    assert e.layers == ("conv1", "conv2") and len(e.raw) == 2 and e.method == "refinecam"
    # the default base is Grad-CAM++; a registry key or a class both work
    torch.testing.assert_close(
        camkit.RefineCAM(model, ["conv1", "conv2"])(x, 1),
        camkit.RefineCAM(model, ["conv1", "conv2"], base=camkit.GradCAMPlusPlus)(x, 1),
    )
    with pytest.raises(camkit.InvalidInputError, match="CAMExplainer"):
        camkit.RefineCAM(model, ["conv1"], base=camkit.Saliency)


def test_multiply_maps_flags_layers_that_agree_nowhere():
    fused, flat = multiply_maps([torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[0.0, 1.0]]])])
    assert flat.tolist() == [True] and fused.tolist() == [[[0.0, 0.0]]]
    with pytest.raises(camkit.InvalidInputError, match="share one shape"):
        multiply_maps([torch.zeros(1, 2, 2), torch.zeros(1, 3, 3)])
