"""Each Grad-CAM-family method against its formula evaluated by hand.

The model is a fixed-weight 1x1 convolution (the target layer) followed by a linear head,
so the activations are ``A_k = w_k * x + b_k`` and the gradient of class c's score is the
head's weight row ``W[c]`` reshaped to [K, H, W]: both are known without autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import camkit

X = np.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]])  # one 1-channel 2x3 image
CONV_W = np.array([1.0, -0.5])
CONV_B = np.array([0.1, 0.2])
HEAD_W = np.array(
    [
        [0.3, -0.2, 0.5, 0.1, 0.0, -0.4, 0.2, 0.6, -0.1, 0.3, -0.3, 0.05],
        [-0.1, 0.4, 0.2, -0.3, 0.25, 0.1, 0.5, -0.2, 0.3, 0.0, 0.15, -0.05],
    ]
)


class LinearHeadNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.fc = nn.Linear(12, 2, bias=True)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor(CONV_B))
            self.fc.weight.copy_(torch.tensor(HEAD_W))
            self.fc.bias.fill_(0.7)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def hand_inputs(cls: int):
    acts = np.stack([CONV_W[k] * X + CONV_B[k] for k in range(2)])  # [K, H, W]
    grads = HEAD_W[cls].reshape(2, 2, 3)
    return acts, grads


def relu(v):
    return np.maximum(v, 0)


def hand_gradcam(a, g):
    return relu(sum(g[k].mean() * a[k] for k in range(2)))


def hand_gradcampp(a, g):
    out = np.zeros(a.shape[1:])
    for k in range(2):
        denom = 2 * g[k] ** 2 + a[k].sum() * g[k] ** 3
        alpha = np.where(denom == 0, 0.0, g[k] ** 2 / np.where(denom == 0, 1, denom))
        out += (alpha * relu(g[k])).sum() * a[k]
    return relu(out)


def hand_xgradcam(a, g):
    return relu(sum((a[k] / a[k].sum() * g[k]).sum() * a[k] for k in range(2)))


def hand_hirescam(a, g):
    return relu(sum(g[k] * a[k] for k in range(2)))


def hand_layercam(a, g):
    return relu(sum(relu(g[k]) * a[k] for k in range(2)))


CASES = {
    "gradcam": hand_gradcam,
    "gradcam++": hand_gradcampp,
    "xgradcam": hand_xgradcam,
    "hirescam": hand_hirescam,
    "layercam": hand_layercam,
}


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("cls", [0, 1])
def test_method_equals_hand_formula(key, cls):
    model = LinearHeadNet()
    x = torch.tensor(X, dtype=torch.float32).view(1, 1, 2, 3)
    explanation = camkit.get_method(key)(model, "conv").explain(x, target=cls)
    expected_raw = CASES[key](*hand_inputs(cls))
    np.testing.assert_allclose(explanation.raw[0].numpy(), expected_raw, rtol=1e-5, atol=1e-6)
    # Layer and input share the 2x3 size, so the map is the min-max normalised raw map.
    span = expected_raw.max() - expected_raw.min()
    expected_map = (expected_raw - expected_raw.min()) / span if span > 0 else np.zeros_like(expected_raw)
    np.testing.assert_allclose(explanation.maps[0].numpy(), expected_map, rtol=0, atol=1e-5)  # float32
    score = HEAD_W[cls] @ np.stack([CONV_W[k] * X + CONV_B[k] for k in range(2)]).ravel() + 0.7
    np.testing.assert_allclose(explanation.scores.item(), score, rtol=1e-5)
    assert explanation.target.tolist() == [cls]


def test_known_values_gradcam_spelled_out():
    # class 0, written out as a second, literal check of the mean gradients.
    _a, g = hand_inputs(0)
    w0, w1 = g[0].mean(), g[1].mean()
    assert np.isclose(w0, (0.3 - 0.2 + 0.5 + 0.1 + 0.0 - 0.4) / 6)
    assert np.isclose(w1, (0.2 + 0.6 - 0.1 + 0.3 - 0.3 + 0.05) / 6)
    model = LinearHeadNet()
    x = torch.tensor(X, dtype=torch.float32).view(1, 1, 2, 3)
    raw = camkit.GradCAM(model, "conv").explain(x, target=0).raw[0]
    # top-left pixel: relu(w0 * (0.5 + 0.1) + w1 * (-0.25 + 0.2))
    assert raw[0, 0].item() == pytest.approx(max(0.0, w0 * 0.6 + w1 * -0.05), rel=1e-5)


class ScaledTinyCNN(nn.Module):
    """A small nonlinear CNN whose logits are multiplied by ``scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.features = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.Conv2d(5, 6, 3, padding=1))
        self.head = nn.Sequential(nn.ReLU(), nn.Conv2d(6, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))
        self.scale = scale

    def forward(self, x):
        return self.head(self.features(x)) * self.scale


def eq19_float64(model: nn.Module, x: torch.Tensor, cls: int) -> np.ndarray:
    """Grad-CAM++ eq. 19 evaluated in float64 with a plain autograd pass, for comparison."""
    m64 = ScaledTinyCNN(model.scale).double()
    m64.load_state_dict(model.state_dict())
    acts = m64.features(x.double()).detach().requires_grad_(True)
    score = (m64.head(acts) * m64.scale)[:, cls].sum()
    (grads,) = torch.autograd.grad(score, acts)
    out = []
    for a, g in zip(acts.detach().numpy(), grads.numpy()):
        out.append(hand_gradcampp(a, g) if a.shape[0] == 2 else _gradcampp_many(a, g))
    return np.stack(out)


def _gradcampp_many(a, g):
    total = np.zeros(a.shape[1:])
    for k in range(a.shape[0]):
        denom = 2 * g[k] ** 2 + a[k].sum() * g[k] ** 3
        alpha = np.where(denom == 0, 0.0, g[k] ** 2 / np.where(denom == 0, 1, denom))
        total += (alpha * relu(g[k])).sum() * a[k]
    return relu(total)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_gradcampp_equals_eq19_in_float64(scale):
    model = ScaledTinyCNN(scale).eval()
    x = torch.randn(3, 3, 6, 6, generator=torch.Generator().manual_seed(5))
    explanation = camkit.GradCAMPlusPlus(model, "features.2").explain(x, target=1)
    expected = eq19_float64(model, x, 1)
    got = explanation.raw.double().numpy()
    # compare shapes of the maps (normalised), which is what eq. 19 fixes up to exp(S)
    for g, e in zip(got, expected):
        e_n = (e - e.min()) / (e.max() - e.min())
        g_n = (g - g.min()) / (g.max() - g.min())
        np.testing.assert_allclose(g_n, e_n, atol=1e-4)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-6 * scale**2)


def test_gradcampp_scale_matters_only_as_the_formula_says():
    # An additive epsilon would make tiny-gradient maps drift; exact eq. 19 keeps them equal
    # to the float64 reference however small the logits are (checked above) -- and here the
    # map at scale 1e-3 is not simply the map at scale 1, since alpha is not scale invariant.
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(6))
    big = camkit.GradCAMPlusPlus(ScaledTinyCNN(1.0).eval(), "features.2")(x, 0)
    small = camkit.GradCAMPlusPlus(ScaledTinyCNN(1e-3).eval(), "features.2")(x, 0)
    expected_small = eq19_float64(ScaledTinyCNN(1e-3), x, 0)
    expected_small = camkit.functional.normalize_maps(torch.from_numpy(expected_small).float())[0]
    torch.testing.assert_close(small, expected_small, atol=1e-4, rtol=0)
    assert big.shape == small.shape
