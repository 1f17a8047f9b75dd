"""The CAM family on signals [B, C, T] and volumes or videos [B, C, D, H, W] (issue 26).

Hand-computed formulas in 1-D and 3-D (Grad-CAM and Grad-CAM++ with their weights written
out, linear and trilinear upsampling; the other gradient CAMs, FullGrad, the layer
attributions and DFF on fixed-weight nets), every CAM-family method's batch against its
images one by one with raw maps at the layer's grid, and parity with pytorch-grad-cam's 3-D
GradCAM and MONAI's GradCAM. 2-D results are pinned by the existing tests, which run
unchanged.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from models import RankNet, rank_input
from test_gradcam_formulas import CASES, CONV_B, CONV_W, HEAD_W, X, hand_inputs
from torch import nn

import camkit
from camkit.functional import normalize_maps
from camkit.functional.perturbation import eigen_projection
from camkit.methods.wrappers.sess import _rescale, gaussian_blur

RANKS = (1, 3)
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
POOL = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
GLOBAL = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}


def minmax(t: torch.Tensor) -> torch.Tensor:
    return (t - t.min()) / (t.max() - t.min())


# --- Grad-CAM and Grad-CAM++ with their weights worked out by hand -----------------------------


class Readout(nn.Module):
    """``score_k = sum(V[k] * A)`` with ``A = avgpool_2(x)``: the layer ``pool`` halves every side and
    the gradient of class k's score at it is ``V[k]``, written out in the tests."""

    def __init__(self, n: int, v: torch.Tensor) -> None:
        super().__init__()
        self.pool = POOL[n](2)
        self.register_buffer("v", v)

    def forward(self, x):
        return self.pool(x).flatten(1) @ self.v.flatten(1).T


def _from_acts(acts: torch.Tensor) -> torch.Tensor:
    # An input whose 2-wide average pooling is exactly ``acts`` [C, *s]: each value repeated on every axis.
    x = acts[None]
    for axis in range(2, x.dim()):
        x = x.repeat_interleave(2, dim=axis)
    return x


# 1-D: two channels of 4 steps at the layer, a signal of 8.
A1 = torch.tensor([[1.0, 4.0, 1.0, 3.0], [1.0, 1.0, 4.0, 2.0]])  # sums 9 and 8
V1 = torch.tensor([[[1.0, 2.0, 3.0, 2.0], [-2.0, 1.0, -1.0, -2.0]]])  # class 0's gradient: means 2 and -1


def test_gradcam_1d_by_hand_with_linear_upsampling():
    e = camkit.GradCAM(Readout(1, V1), "pool").explain(_from_acts(A1), target=0)
    raw = torch.tensor([1.0, 7.0, 0.0, 4.0])  # relu(2 * A1[0] - 1 * A1[1]) = relu([1, 7, -2, 4])
    torch.testing.assert_close(e.raw[0], raw)
    # linear, align_corners=False: output i reads the raw map at i / 2 - 0.25 (clamped to [0, 3])
    up = torch.tensor([1.0, 2.5, 5.5, 5.25, 1.75, 1.0, 3.0, 4.0])
    torch.testing.assert_close(F.interpolate(raw[None, None], size=8, mode="linear", align_corners=False)[0, 0], up)
    torch.testing.assert_close(e.maps[0], (up - 1.0) / 4.5)
    assert e.maps.shape == (1, 8) and e.spatial_dims == 1


def test_gradcampp_1d_by_hand():
    e = camkit.GradCAMPlusPlus(Readout(1, V1), "pool").explain(_from_acts(A1), target=0)
    # alpha = g^2 / (2 g^2 + sum(A) g^3) = 1 / (2 + sum(A) g) where g != 0; w_c = sum alpha relu(g)
    w0 = 1 / (2 + 9 * 1) * 1 + 1 / (2 + 9 * 2) * 2 + 1 / (2 + 9 * 3) * 3 + 1 / (2 + 9 * 2) * 2
    w1 = 1 / (2 + 8 * 1) * 1  # only the positive gradient (1) counts
    raw = (w0 * A1[0] + w1 * A1[1]).clamp_min(0)
    torch.testing.assert_close(e.raw[0], raw)
    up = F.interpolate(raw[None, None], size=8, mode="linear", align_corners=False)[0, 0]
    torch.testing.assert_close(e.maps[0], minmax(up))


# 3-D: two channels of 2 x 2 x 2 at the layer, a volume of 4 x 4 x 4.
A3 = torch.tensor(
    [
        [[[1.0, 2.0], [0.0, 3.0]], [[4.0, 1.0], [2.0, 2.0]]],  # sum 15
        [[[0.0, 1.0], [1.0, 0.0]], [[2.0, 0.0], [3.0, 1.0]]],  # sum 8
    ]
)
V3 = torch.tensor(
    [
        [
            [[[1.0, 1.0], [2.0, 0.0]], [[1.0, 3.0], [0.0, 0.0]]],  # mean 1
            [[[1.0, -2.0], [-1.0, -2.0]], [[0.0, -1.0], [-2.0, -1.0]]],  # mean -1
        ],
        [
            [[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]],
            [[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]],
        ],
    ]
)


def test_gradcam_3d_by_hand_with_trilinear_upsampling():
    e = camkit.GradCAM(Readout(3, V3), "pool").explain(_from_acts(A3), target=0)
    raw = torch.tensor([[[1.0, 1.0], [0.0, 3.0]], [[2.0, 1.0], [0.0, 1.0]]])  # relu(1 * A3[0] - 1 * A3[1])
    torch.testing.assert_close(e.raw[0], raw)
    up = F.interpolate(raw[None, None], size=(4, 4, 4), mode="trilinear", align_corners=False)[0, 0]
    torch.testing.assert_close(e.maps[0], minmax(up))
    # one value by hand: voxel (0, 0, 1) reads the raw map at (-0.25 -> 0, -0.25 -> 0, 0.25)
    assert up[0, 0, 1].item() == pytest.approx(0.75 * 1.0 + 0.25 * 1.0)
    assert e.maps.shape == (1, 4, 4, 4) and e.spatial_dims == 3


def test_gradcampp_3d_by_hand():
    e = camkit.GradCAMPlusPlus(Readout(3, V3), "pool").explain(_from_acts(A3), target=0)
    # channel 0: gradients 1, 1, 2, 0, 1, 3, 0, 0 with sum(A) = 15; channel 1: only one positive gradient (1), sum 8
    w0 = 3 * (1 / (2 + 15 * 1)) + 2 / (2 + 15 * 2) + 3 / (2 + 15 * 3)
    w1 = 1 / (2 + 8 * 1)
    raw = (w0 * A3[0] + w1 * A3[1]).clamp_min(0)
    torch.testing.assert_close(e.raw[0], raw)
    up = F.interpolate(raw[None, None], size=(4, 4, 4), mode="trilinear", align_corners=False)[0, 0]
    torch.testing.assert_close(e.maps[0], minmax(up))


@pytest.mark.parametrize("key", ["gradcam", "gradcam++", "xgradcam"])
@pytest.mark.parametrize("n", RANKS)
def test_eigen_smooth_weights_every_position(key, n):
    # eigen_smooth: the first principal component of w_c * A_c (the weights broadcast over every spatial axis)
    acts, v = (A1, V1) if n == 1 else (A3, V3)
    e = camkit.get_method(key)(Readout(n, v), "pool", eigen_smooth=True).explain(_from_acts(acts), target=0)
    a, g = acts[None], v[:1]
    weights = {
        "gradcam": camkit.functional.gradcam_weights(g),
        "gradcam++": camkit.functional.gradcampp_weights(a, g),
        "xgradcam": camkit.functional.xgradcam_weights(a, g),
    }[key]
    expected = eigen_projection(weights.view(1, 2, *(1,) * n) * a).clamp_min(0)
    torch.testing.assert_close(e.raw, expected)


# --- every gradient CAM's formula on the fixed 1x1-conv net of test_gradcam_formulas, as a signal and a volume ---

SHAPES = {1: (6,), 3: (1, 2, 3)}  # the 2 x 3 image's six values, laid out on one or three axes


class RankLinearHeadNet(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.conv = CONV[n](1, 2, 1)
        self.fc = nn.Linear(12, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, *(1,) * n))
            self.conv.bias.copy_(torch.tensor(CONV_B))
            self.fc.weight.copy_(torch.tensor(HEAD_W))
            self.fc.bias.fill_(0.7)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def _hand_elementwise(a, g):
    return np.maximum(g * a, 0).sum(axis=0)


@pytest.mark.parametrize("key", [*sorted(CASES), "gradcamelementwise"])
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("cls", [0, 1])
def test_gradient_cams_equal_their_formulas_on_every_rank(key, n, cls):
    x = torch.tensor(X, dtype=torch.float32).view(1, 1, *SHAPES[n])
    e = camkit.get_method(key)(RankLinearHeadNet(n), "conv").explain(x, target=cls)
    a, g = hand_inputs(cls)  # [2, 2, 3]: the same numbers as in 2-D, in the same (row-major) order
    expected = (CASES.get(key) or _hand_elementwise)(a, g).reshape(SHAPES[n])
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.maps[0].numpy(), minmax(torch.from_numpy(expected)).numpy(), atol=1e-5)


# --- FullGrad: the biases of the input's rank ------------------------------------------------------


class RankBiasNet(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.conv = CONV[n](1, 2, 1)
        self.bn = NORM[n](2, affine=False)
        self.fc = nn.Linear(12, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, *(1,) * n))
            self.conv.bias.copy_(torch.tensor(CONV_B))
            self.bn.running_mean.copy_(torch.tensor([0.3, -0.2]))
            self.bn.running_var.copy_(torch.tensor([0.5, 2.0]))
            self.fc.weight.copy_(torch.tensor(HEAD_W))
            self.fc.bias.fill_(0.7)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).flatten(1))


def _np_minmax(v):
    return (v - v.min()) / (v.max() - v.min()) if v.max() > v.min() else np.zeros_like(v)


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("cls", [0, 1])
def test_fullgrad_by_hand_on_every_rank(n, cls):
    model = RankBiasNet(n).eval()
    inv = 1 / np.sqrt(np.array([0.5, 2.0]) + model.bn.eps)
    bn_bias = -np.array([0.3, -0.2]) * inv
    d_bn = HEAD_W[cls].reshape(2, 6)  # dS/d(bn output), six positions per channel
    d_conv = d_bn * inv[:, None]
    d_x = (d_conv * CONV_W[:, None]).sum(0)
    expected = _np_minmax(np.abs(X.ravel() * d_x))
    for bias, grad in ((CONV_B, d_conv), (bn_bias, d_bn)):
        for c in range(2):
            expected = expected + _np_minmax(np.abs(bias[c] * grad[c]))
    x = torch.tensor(X, dtype=torch.float32).view(1, 1, *SHAPES[n])
    e = camkit.FullGrad(model).explain(x, target=cls)
    assert e.layers == ("conv", "bn")  # a Conv1d/BatchNorm1d (Conv3d/BatchNorm3d) bias counts
    np.testing.assert_allclose(e.raw[0].numpy(), expected.reshape(SHAPES[n]), rtol=1e-5, atol=1e-5)


def test_fullgrad_reads_only_the_input_ranks_biases():
    class Mixed(nn.Module):  # a channel-attention Conv1d inside a volume model adds no bias over positions
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv3d(1, 4, 3, padding=1)
            self.gate = nn.Conv1d(1, 1, 3, padding=1)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            a = self.conv(x)
            pooled = a.mean(dim=(2, 3, 4))
            return self.fc(pooled * torch.sigmoid(self.gate(pooled[:, None]))[:, 0])

    model = Mixed().eval()
    assert camkit.FullGrad(model).explain(torch.rand(2, 1, 4, 6, 6)).layers == ("conv",)
    with pytest.raises(camkit.InvalidInputError, match=r"\(3 spatial axes\).*\['gate'\] take \[1\] spatial axes"):
        camkit.FullGrad(model, layers=["conv", "gate"]).explain(torch.rand(2, 1, 4, 6, 6))


# --- the layer attributions on a two-position layer: A = 2 x, S = 3 A_0 - A_1 ---------------------


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize(
    "make",
    [
        lambda m: camkit.LayerGradientXActivation(m, "0"),
        lambda m: camkit.LayerIntegratedGradients(m, "0", steps=2),
        lambda m: camkit.LayerConductance(m, "0", steps=4),
    ],
)
def test_layer_attributions_by_hand_on_every_rank(make, n):
    net = nn.Sequential(CONV[n](1, 1, 1, bias=False), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[0].weight.fill_(2.0)
        net[2].weight.copy_(torch.tensor([[3.0, -1.0]]))
    shape = (2,) if n == 1 else (1, 1, 2)
    e = make(net).explain(torch.tensor([1.0, 5.0]).view(1, 1, *shape), 0)
    torch.testing.assert_close(e.raw, torch.tensor([6.0, -10.0]).view(1, 1, *shape))  # A * dS/dA = [2 * 3, 10 * -1]
    torch.testing.assert_close(e.extras["map"], torch.tensor([6.0, -10.0]).view(1, *shape))
    torch.testing.assert_close(e.maps, torch.tensor([1.0, 0.0]).view(1, *shape))


# --- DFF: planted concepts on a signal and a volume ---------------------------------------------


class RankConceptNet(nn.Module):
    """The layer's output is a non-negative mix of the input's two 'concept' channels (see test_cam_extra)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.mix = CONV[n](2, 4, 1, bias=False)
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            w = torch.tensor([[1.0, 0.0], [0.5, 0.0], [0.0, 1.0], [0.0, 0.9]])
            self.mix.weight.copy_(w.view(4, 2, *(1,) * n))
            self.fc.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(self.mix(x).flatten(2).mean(dim=2))


@pytest.mark.parametrize("n", RANKS)
def test_dff_finds_the_planted_concepts_on_every_rank(n):
    size = (6,) if n == 1 else (2, 3, 6)
    x = torch.zeros(1, 2, *size)
    x[0, 0, ..., :3] = torch.linspace(0.5, 1.0, 3)  # concept 0 on the first half of the last axis
    x[0, 1, ..., 3:] = 1.0  # concept 1 on the second half
    e = camkit.DeepFeatureFactorization(RankConceptNet(n), "mix", concepts=2).explain(x, target=torch.tensor([[0, 1]]))
    maps = e.extras["concept_maps"][0]
    assert maps.shape == (2, *size) and e.maps.shape == (1, 2, *size) and e.raw.shape == (1, 2, *size)
    first, second = (x[0, 0] > 0).float(), (x[0, 1] > 0).float()
    order = [int((maps[i] * first).sum() < (maps[i] * second).sum()) for i in range(2)]
    assert sorted(order) == [0, 1]
    for i, half in enumerate(order):
        torch.testing.assert_close(maps[i], x[0, half] / x[0, half].max(), atol=1e-4, rtol=0)
    # class 0 reads channel 0 (the first concept), class 1 channels 2 and 3 (the second)
    assert (e.maps[0, 0] * first).sum() > 0.99 * e.maps[0, 0].sum()
    assert (e.maps[0, 1] * second).sum() > 0.99 * e.maps[0, 1].sum()


# --- every CAM-family method: batch equals one by one, raw at the layer's grid -----------------


class StridedNet(nn.Module):
    """conv (stride 2) - bn - relu - conv - relu - global pool - linear on ``n`` spatial axes: the CAM layer
    ``conv2`` has half the input's size on every axis."""

    def __init__(self, n: int, classes: int = 5) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = CONV[n](3, 4, 3, padding=1, stride=2)
        self.bn1 = NORM[n](4)
        self.relu = nn.ReLU()
        self.conv2 = CONV[n](4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = GLOBAL[n](1)
        self.fc = nn.Linear(6, classes)
        with torch.no_grad():
            self.bn1.running_mean.uniform_(-0.2, 0.2)
            self.bn1.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(self.pool(self.relu2(self.conv2(x))), 1))


SIZES = {1: (16,), 3: (4, 8, 8)}
GRIDS = {1: (8,), 3: (2, 4, 4)}
SESS_OPTIONS = {1: {"scales": [8, 10], "window": 8, "stride": 4}, 3: {"scales": [4, 5], "window": 4}}

MAKERS = {
    "gradcam": lambda m, n: camkit.GradCAM(m, "conv2"),
    "gradcam++": lambda m, n: camkit.GradCAMPlusPlus(m, "conv2"),
    "xgradcam": lambda m, n: camkit.XGradCAM(m, "conv2"),
    "hirescam": lambda m, n: camkit.HiResCAM(m, "conv2"),
    "layercam": lambda m, n: camkit.LayerCAM(m, ["conv1", "conv2"]),
    "gradcam eigen_smooth": lambda m, n: camkit.GradCAM(m, "conv2", eigen_smooth=True),
    "gradcamelementwise": lambda m, n: camkit.GradCAMElementWise(m, "conv2"),
    "eigencam": lambda m, n: camkit.EigenCAM(m, "conv2"),
    "eigengradcam": lambda m, n: camkit.EigenGradCAM(m, "conv2"),
    "cam": lambda m, n: camkit.CAM(m, "conv2"),
    "scorecam": lambda m, n: camkit.ScoreCAM(m, "conv2", batch_size=7),
    "scorecam top_k": lambda m, n: camkit.ScoreCAM(m, "conv2", batch_size=7, top_k=3, rank_by="variance"),
    "ablationcam": lambda m, n: camkit.AblationCAM(m, "conv2", batch_size=7, tail=False),
    "ablationcam tail": lambda m, n: camkit.AblationCAM(
        m, "conv2", batch_size=7, tail=lambda a: m.fc(torch.flatten(m.pool(m.relu2(a)), 1))
    ),
    "fem": lambda m, n: camkit.FEM(m, "conv2", k=1.0),
    "shapleycam": lambda m, n: camkit.ShapleyCAM(m, "conv2"),
    "kpcacam": lambda m, n: camkit.KPCACAM(m, "conv2", kernel="rbf"),
    "finercam": lambda m, n: camkit.FinerCAM(m, "conv2", comparisons=2),
    "randomcam": lambda m, n: camkit.RandomCAM(m, "conv2", seed=1),  # seed 0 gives flat 1-D maps here
    "fullgrad": lambda m, n: camkit.FullGrad(m),
    "dff": lambda m, n: camkit.DeepFeatureFactorization(m, "conv2", concepts=3, iterations=50),
    "sess": lambda m, n: camkit.SESS(camkit.GradCAM(m, "conv2"), max_batch=8, **SESS_OPTIONS[n]),
    "layeractivation": lambda m, n: camkit.LayerActivation(m, "conv2"),
    "layergradientxactivation": lambda m, n: camkit.LayerGradientXActivation(m, "conv2"),
    "layerintegratedgradients": lambda m, n: camkit.LayerIntegratedGradients(m, "conv2", steps=6, max_batch=5),
    "layerconductance": lambda m, n: camkit.LayerConductance(m, "conv2", steps=6, max_batch=5),
}
AT_INPUT = {"fullgrad", "sess"}  # raw maps at the input's size (FullGrad sums upsampled terms; SESS fuses patches)
LAYER_ATTRIBUTIONS = {"layeractivation", "layergradientxactivation", "layerintegratedgradients", "layerconductance"}


def _raw_shape(key: str, n: int, lead: tuple[int, ...]) -> tuple[int, ...]:
    if key in AT_INPUT:
        return (*lead, *SIZES[n])
    if key in LAYER_ATTRIBUTIONS:
        return (*lead, 6, *GRIDS[n])
    return (*lead, *GRIDS[n])


def _raws(e: camkit.Explanation) -> torch.Tensor:
    return e.raw[-1] if isinstance(e.raw, tuple) else e.raw  # LayerCAM fuses two layers: conv2's is last


@pytest.mark.heavy
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("key", sorted(MAKERS))
def test_batch_equals_one_by_one_with_raw_maps_at_the_layer_grid(key, n):
    model = StridedNet(n).eval()
    x = torch.randn(3, 3, *SIZES[n], generator=torch.Generator().manual_seed(2))
    target = torch.tensor([0, 3, 1])
    explainer = MAKERS[key](model, n)
    batched = explainer.explain(x, target)
    assert batched.maps.shape == (3, *SIZES[n]) and batched.spatial_dims == n
    assert _raws(batched).shape == _raw_shape(key, n, (3,))
    assert torch.isfinite(batched.maps).all() and not batched.flat.all()
    for i in range(3):
        single = MAKERS[key](model, n).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(_raws(batched)[i], _raws(single)[0], atol=1e-5, rtol=1e-5)
    if key == "dff":
        assert batched.extras["concept_maps"].shape == (3, 3, *SIZES[n])


@pytest.mark.heavy
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("key", sorted(set(MAKERS) - {"sess"}))  # SESS takes one class per image
def test_k_targets_give_k_maps_at_the_layer_grid(key, n):
    model = StridedNet(n).eval()
    x = torch.randn(2, 3, *SIZES[n], generator=torch.Generator().manual_seed(4))
    targets = torch.tensor([[0, 2], [4, 1]])
    multi = MAKERS[key](model, n).explain(x, targets)
    assert multi.maps.shape == (2, 2, *SIZES[n])
    assert _raws(multi).shape == _raw_shape(key, n, (2, 2))
    single = MAKERS[key](model, n).explain(x, targets[:, 1])
    torch.testing.assert_close(multi.maps[:, 1], single.maps, atol=1e-5, rtol=0)


def test_ablation_cam_needs_a_channel_first_layer_of_the_inputs_rank():
    class ChannelLast(nn.Module):  # a Linear over the channels of a signal: its output is [B, t, C]
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(3, 6)
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(self.proj(x.transpose(1, 2)).mean(dim=1))

    x = torch.randn(1, 3, 16)
    assert camkit.GradCAM(ChannelLast(), "proj").explain(x).raw.shape == (1, 16)  # read as channel-last
    with pytest.raises(camkit.InvalidInputError, match=r"needs a layer with channel-first \[B, C, t\] output"):
        camkit.AblationCAM(ChannelLast(), "proj").explain(x)


# --- SESS: windows, blur and resizing on every axis --------------------------------------------


def test_sess_blur_is_scipys_mirrored_gaussian_on_every_rank():
    ndimage = pytest.importorskip("scipy.ndimage")
    g = torch.Generator().manual_seed(0)
    for maps in (torch.rand(2, 17, generator=g), torch.rand(2, 7, 9, 12, generator=g), torch.rand(1, 4, 5, 6, generator=g)):
        blurred = gaussian_blur(maps)
        for m, b in zip(maps, blurred):
            # radius 5 = int(truncate * sigma + 0.5); 'mirror' reflects without repeating the edge
            mode = "mirror" if min(m.shape) > 5 else "nearest"
            expected = ndimage.gaussian_filter(m.double().numpy(), sigma=5.0, truncate=1.0, mode=mode)
            np.testing.assert_allclose(b.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_sess_antialiased_volume_resize_is_the_signal_resize_along_each_axis(axis):
    profile = torch.tensor([0.0, 4.0, 1.0, 3.0, 8.0, 2.0, 5.0, 7.0, 6.0, 1.0])
    shape = [1, 1, 1]
    shape[axis] = 10
    volume = profile.view(1, 1, *shape).expand(1, 2, 10, 10, 10).contiguous()
    small = _rescale(volume, (6, 6, 6), antialias=True)
    signal = _rescale(profile.view(1, 1, 10), (6,), antialias=True)[0, 0]
    view = [1, 1, 1]
    view[axis] = 6
    torch.testing.assert_close(small, signal.view(1, 1, *view).expand(1, 2, 6, 6, 6), atol=1e-6, rtol=0)
    # a signal goes through a one-row image: growing, that is plain linear interpolation; shrinking, the
    # antialiased (widened) linear filter, which differs from it
    grown = _rescale(profile.view(1, 1, 10), (14,), antialias=True)
    torch.testing.assert_close(grown, F.interpolate(profile.view(1, 1, 10), size=14, mode="linear", align_corners=False))
    plain = F.interpolate(profile.view(1, 1, 10), size=6, mode="linear", align_corners=False)[0, 0]
    assert not torch.allclose(signal, plain)
    # growing needs no antialiasing: trilinear itself
    big = _rescale(volume, (12, 12, 12), antialias=False)
    torch.testing.assert_close(big, F.interpolate(volume, size=(12, 12, 12), mode="trilinear", align_corners=False))


@pytest.mark.parametrize("n", RANKS)
def test_sess_with_one_full_window_is_the_blurred_inner_map(n):
    size = {1: (16,), 3: (6, 6, 6)}[n]
    model = StridedNet(n).eval()
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(5))
    inner = camkit.GradCAM(model, "conv2")
    e = camkit.SESS(inner, scales=[size[0]]).explain(x, [0, 2])
    # one patch (the whole input), weight 1, mean fusion of the values > 0, blur on every axis, min-max
    assert e.extras["patches"] == 1 and e.extras["window"] == size[0]
    plain = inner(x, [0, 2])
    expected = normalize_maps(gaussian_blur(torch.where(plain > 0, plain, 0.0)), spatial_dims=n)[0]
    torch.testing.assert_close(e.maps, expected, atol=1e-6, rtol=0)
    assert e.maps.shape == (2, *size) and e.method == "sess(gradcam)"


def test_sess_counts_windows_per_axis():
    model = StridedNet(3).eval()
    e = camkit.SESS(camkit.GradCAM(model, "conv2"), scales=[4, 5], window=4).explain(torch.randn(1, 3, 4, 8, 8), [1])
    # scale 4: 4 x 8 x 8, starts [0] x [0, 4] x [0, 4]; scale 5: 5 x 10 x 10, [0, 1] x [0, 4, 6] x [0, 4, 6]
    assert e.extras["patches"] == 1 * 2 * 2 + 2 * 3 * 3
    e = camkit.SESS(camkit.GradCAM(StridedNet(1).eval(), "conv2"), scales=[8, 10], window=8, stride=4).explain(
        torch.randn(1, 3, 16), [1]
    )
    assert e.extras["patches"] == 1 + 2  # scale 8: 8 steps, [0]; scale 10: 10 steps, [0, 2] (the last flush)


# --- parity with pytorch-grad-cam 1.5.7 (3-D) and MONAI (1-D and 3-D) ---------------------------


def test_gradcam_matches_pytorch_grad_cam_on_a_volume_layer_at_the_input_size():
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model = RankNet(3).eval()  # conv2: padding 1, stride 1, so its grid is the volume's 4 x 8 x 8 (no resize)
    x = rank_input(3)
    targets = [0, 3, 1]
    ours = camkit.GradCAM(model, "conv2").explain(x, targets)
    anchor_model = copy.deepcopy(model)
    with pgc.GradCAM(model=anchor_model, target_layers=[anchor_model.conv2]) as cam:
        anchor = cam(input_tensor=x, targets=[ClassifierOutputTarget(c) for c in targets])
    assert anchor.shape == (3, 4, 8, 8)
    # pytorch-grad-cam normalises with a 1e-7 epsilon and resizes with SciPy's zoom (factor 1 here)
    np.testing.assert_allclose(ours.maps.numpy(), anchor, atol=1e-5)


def test_pytorch_grad_cam_refuses_signals_which_camkit_explains():
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model = RankNet(1).eval()
    anchor_model = copy.deepcopy(model)
    with pgc.GradCAM(model=anchor_model, target_layers=[anchor_model.conv2]) as cam:
        with pytest.raises(ValueError, match="Only 2D or 3D"):
            cam(input_tensor=rank_input(1), targets=[ClassifierOutputTarget(0)] * 3)
    assert camkit.GradCAM(model, "conv2")(rank_input(1), 0).shape == (3, 16)


@pytest.mark.parametrize("n", RANKS)
def test_gradcam_matches_monai_raw_maps_and_its_flipped_normalisation(n):
    visualize = pytest.importorskip("monai.visualize")
    model = StridedNet(n).eval()  # conv2 at half the input's size: MONAI upsamples (linear/trilinear) as camkit does
    x = torch.randn(2, 3, *SIZES[n], generator=torch.Generator().manual_seed(6))
    ours = camkit.GradCAM(model, "conv2").explain(x, 3)
    anchor = visualize.GradCAM(nn_module=copy.deepcopy(model), target_layers="conv2")
    raw = anchor.compute_map(x, class_idx=3)  # [B, 1, *grid], before upsampling
    torch.testing.assert_close(ours.raw, raw[:, 0], atol=1e-6, rtol=1e-5)
    flipped = anchor(x, class_idx=3)[:, 0]  # upsampled, then MONAI's default_normalizer maps (min, max) to (1, 0)
    assert not ours.flat.any()
    torch.testing.assert_close(ours.maps, 1 - flipped, atol=1e-5, rtol=0)
    for ours_map, monai_map in zip(ours.maps, flipped):  # the flip: MONAI's strongest evidence reads 0
        assert monai_map.flatten()[ours_map.argmax()] == pytest.approx(0.0, abs=1e-6)
