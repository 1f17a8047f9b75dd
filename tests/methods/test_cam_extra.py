"""Issue 18's pytorch-grad-cam methods against their formulas evaluated by hand (numpy, float64).

Models are tiny with fixed weights, so activations and gradients are known in closed form.
The anchor parity tests are in ``test_cam_extra_parity.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gradcam_formulas import CONV_B, CONV_W, HEAD_W, LinearHeadNet, X, hand_inputs
from torch import nn

import camkit
from camkit.functional.cam_extra import finer_scores, kpca_projection, nmf
from camkit.functional.perturbation import eigen_projection


def relu(v):
    return np.maximum(v, 0)


def minmax(v):
    span = v.max() - v.min()
    return (v - v.min()) / span if span > 0 else np.zeros_like(v)


def x_tensor():
    return torch.tensor(X, dtype=torch.float32).view(1, 1, 2, 3)


# --- GradCAMElementWise and FEM on the fixed 1x1-conv + linear net (acts and grads known) ---


@pytest.mark.parametrize("cls", [0, 1])
def test_gradcam_elementwise_hand_computed(cls):
    a, g = hand_inputs(cls)
    expected = relu(g[0] * a[0]) + relu(g[1] * a[1])  # sum_c relu(G_c A_c)
    e = camkit.GradCAMElementWise(LinearHeadNet(), "conv").explain(x_tensor(), target=cls)
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.maps[0].numpy(), minmax(expected), atol=1e-5)


@pytest.mark.parametrize("k", [0.0, 0.5, 1.0])
def test_fem_hand_computed(k):
    a, _ = hand_inputs(0)
    weights = [(a[c] > a[c].mean() + k * a[c].std()).mean() for c in range(2)]  # numpy std: population
    expected = relu(weights[0] * a[0] + weights[1] * a[1])
    e = camkit.FEM(LinearHeadNet(), "conv", k=k).explain(x_tensor(), target=0)
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-5, atol=1e-6)
    # the map ignores the target: class 1 gives the same one
    torch.testing.assert_close(camkit.FEM(LinearHeadNet(), "conv", k=k)(x_tensor(), 1), e.maps)


def test_fem_weights_spelled_out():
    # channel 0 of class 0: A_0 = 1.0 * X + 0.1 -> values 0.6, -0.9, 2.1, 1.6, 0.1, -0.4 (mean 0.5167)
    a, _ = hand_inputs(0)
    assert np.allclose(a[0].ravel(), [0.6, -0.9, 2.1, 1.6, 0.1, -0.4])
    # k = 0: positions above the mean: 0.6, 2.1, 1.6 -> 3 of 6
    w = camkit.functional.cam_extra.fem_weights(torch.tensor(a, dtype=torch.float32)[None], k=0.0)
    assert w[0, 0].item() == pytest.approx(0.5)


# --- ShapleyCAM on a head with a quadratic term, where the Hessian is known ---


class QuadraticHead(nn.Module):
    """``S_c = sum(Q_c * A^2) + sum(V_c * A)`` over the 1x1 conv's output A [2, 2, 3]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor(CONV_B))
        self.register_buffer("q", torch.tensor(HEAD_W[:, ::-1].copy(), dtype=torch.float32).view(2, 2, 2, 3))
        self.register_buffer("v", torch.tensor(HEAD_W, dtype=torch.float32).view(2, 2, 2, 3))

    def forward(self, x):
        a = self.conv(x)
        return (self.q[None] * a[:, None] ** 2).sum(dim=(2, 3, 4)) + (self.v[None] * a[:, None]).sum(dim=(2, 3, 4))


@pytest.mark.parametrize("cls", [0, 1])
def test_shapleycam_hand_computed(cls):
    a, _ = hand_inputs(cls)
    q = HEAD_W[cls, ::-1].reshape(2, 2, 3)
    v = HEAD_W[cls].reshape(2, 2, 3)
    grad = 2 * q * a + v  # dS/dA
    hvp = 2 * q * a  # Hessian (diagonal, 2q) times A
    weights = (grad - 0.5 * hvp).mean(axis=(1, 2))  # = mean(q A + v)
    expected = relu(weights[0] * a[0] + weights[1] * a[1])
    e = camkit.ShapleyCAM(QuadraticHead(), "conv").explain(x_tensor(), target=cls)
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(weights, grad.mean(axis=(1, 2)), rtol=0.1)  # not Grad-CAM's weights: H A matters here


def test_shapleycam_equals_gradcam_on_a_relu_head():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(camkit.ShapleyCAM(net, "0")(x, 1), camkit.GradCAM(net, "0")(x, 1))


# --- Finer-CAM: gradient of the rival-weighted difference, by hand ---


class FourClassNet(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.fc = nn.Linear(12, 4)
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor(CONV_B))
            self.fc.weight.copy_(torch.randn(4, 12, generator=g) * 0.5)
            self.fc.bias.copy_(torch.tensor([0.1, 0.3, 0.2, 0.25]))
        self.scale = scale

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1)) * self.scale


def finer_by_hand(model: FourClassNet, main: int, comparisons: int, alpha: float):
    a = np.stack([CONV_W[k] * X + CONV_B[k] for k in range(2)])
    w = model.fc.weight.detach().double().numpy() * model.scale
    y = w @ a.ravel() + model.fc.bias.detach().double().numpy() * model.scale
    others = [j for j in np.argsort(np.abs(y - y[main]), kind="stable") if j != main][:comparisons]
    s = np.exp(y[others] - y[others].max())
    s /= s.sum()  # p_j / sum p over the rivals
    score = sum(sj * (y[main] - alpha * y[j]) for sj, j in zip(s, others))
    # dScore/dy: main gets 1; rival j gets s_j (y_m - alpha y_j - score) - alpha s_j (the softmax's derivative)
    dy = np.zeros(4)
    dy[main] = 1.0
    for sj, j in zip(s, others):
        dy[j] += sj * (y[main] - alpha * y[j] - score) - alpha * sj
    grad = (dy @ w).reshape(2, 2, 3)
    return score, relu(grad[0].mean() * a[0] + grad[1].mean() * a[1])


@pytest.mark.parametrize(("main", "comparisons", "alpha"), [(0, 1, 1.0), (2, 2, 1.0), (3, 3, 0.6)])
def test_finercam_hand_computed(main, comparisons, alpha):
    model = FourClassNet()
    score, expected = finer_by_hand(model, main, comparisons, alpha)
    e = camkit.FinerCAM(model, "conv", comparisons=comparisons, alpha=alpha).explain(x_tensor(), target=main)
    assert e.scores.item() == pytest.approx(score, rel=1e-5)
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-4, atol=1e-6)


def test_finercam_alpha_zero_is_its_base_method():
    model = FourClassNet()
    for base in ("gradcam", "hirescam"):
        ours = camkit.FinerCAM(model, "conv", base=base, alpha=0.0)(x_tensor(), 2)
        torch.testing.assert_close(ours, camkit.get_method(base)(model, "conv")(x_tensor(), 2))


def test_finer_scores_stay_exact_where_probabilities_underflow():
    y = torch.tensor([[0.0, -200.0, -205.0, 50.0]])  # softmax of classes 1, 2 is exactly 0 in float32
    assert torch.softmax(y, 1)[0, 1] == 0 and torch.softmax(y, 1)[0, 2] == 0
    got = finer_scores(y, torch.tensor([2]), comparisons=2)
    # rivals of class 2 (y = -205) by |y_j + 205|: class 1 (5), then class 0 (205); weights softmax([-200, 0])
    w = np.exp([-200.0, 0.0]) / np.exp([-200.0, 0.0]).sum()
    expected = w[0] * (-205 + 200) + w[1] * (-205 - 0)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_finercam_refuses_callable_targets_and_bad_arguments():
    with pytest.raises(camkit.InvalidTargetError, match="class targets"):
        camkit.FinerCAM(FourClassNet(), "conv")(x_tensor(), lambda out: out[:, 0])
    with pytest.raises(camkit.InvalidInputError, match="comparisons must be between 1 and 3"):
        camkit.FinerCAM(FourClassNet(), "conv", comparisons=4)(x_tensor(), 0)
    with pytest.raises(camkit.InvalidInputError, match="gradient CAM"):
        camkit.FinerCAM(FourClassNet(), "conv", base="scorecam")


# --- KPCA-CAM: kernel PCA in numpy ---


def kpca_by_hand(acts: np.ndarray, kernel: str, gamma: float) -> np.ndarray:
    c = acts.shape[0]
    p = acts.reshape(c, -1).T
    p = p - p.mean(axis=0)
    dots = p @ p.T
    if kernel == "rbf":
        sq = (p**2).sum(1)
        k = np.exp(-gamma * (sq[:, None] + sq[None, :] - 2 * dots))
    else:  # sigmoid
        k = np.tanh(gamma * dots + 1.0)
    n = len(k)
    one = np.full((n, n), 1.0 / n)
    kc = k - one @ k - k @ one + one @ k @ one
    values, vectors = np.linalg.eigh(kc)
    proj = vectors[:, -1] * np.sqrt(max(values[-1], 0))
    total = acts.reshape(c, -1).sum(0)
    if (proj * (total - total.mean())).sum() < 0:  # sign: agree with the channel-summed activations
        proj = -proj
    return proj.reshape(acts.shape[1:])


@pytest.mark.parametrize(("kernel", "gamma"), [("rbf", None), ("sigmoid", None), ("rbf", 0.3)])
def test_kpcacam_hand_computed(kernel, gamma):
    a, _ = hand_inputs(0)
    e = camkit.KPCACAM(LinearHeadNet(), "conv", kernel=kernel, gamma=gamma).explain(x_tensor(), target=0)
    expected = kpca_by_hand(a, kernel, 1 / 2 if gamma is None else gamma)  # gamma None: 1 / channels
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-4, atol=1e-6)


def test_kpca_linear_kernel_is_eigencam():
    acts = torch.randn(2, 5, 4, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(kpca_projection(acts, "linear"), eigen_projection(acts), atol=1e-5, rtol=1e-4)


# --- RandomCAM: seeded properties ---


def test_randomcam_is_relu_of_seeded_uniform_weights():
    model = LinearHeadNet()
    e = camkit.RandomCAM(model, "conv", seed=7).explain(x_tensor(), target=0)
    w = torch.rand(2, generator=torch.Generator().manual_seed(7), dtype=torch.float64).numpy() * 2 - 1
    a, _ = hand_inputs(0)
    np.testing.assert_allclose(e.raw[0].numpy(), relu(w[0] * a[0] + w[1] * a[1]), rtol=1e-5, atol=1e-6)
    assert e.extras["seed"] == 7


def test_randomcam_seeds():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    x = torch.randn(2, 3, 8, 8)
    same = [camkit.RandomCAM(net, "0", seed=1)(x, t) for t in (0, 2)]
    torch.testing.assert_close(same[0], same[1])  # the target plays no part
    other = camkit.RandomCAM(net, "0", seed=2)(x)
    assert (other - same[0]).abs().max() > 0.05
    torch.manual_seed(5)
    a = camkit.RandomCAM(net, "0")(x)
    torch.manual_seed(5)
    torch.testing.assert_close(camkit.RandomCAM(net, "0")(x), a)  # unseeded: torch's global generator


def test_randomcam_weights_are_uniform_on_minus_one_one():
    # 400 channels of a constant-1 identity layer: raw = relu(sum_c w_c), and the weights' moments
    net = nn.Sequential(nn.Identity(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(400, 2))
    x = torch.ones(1, 400, 2, 2)
    weights = []
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        w = torch.rand(400, generator=g, dtype=torch.float64) * 2 - 1
        raw = camkit.RandomCAM(net, "0", seed=seed).explain(x).raw[0, 0, 0].item()
        assert raw == pytest.approx(max(w.sum().item(), 0.0), rel=1e-4, abs=1e-4)
        weights.append(w)
    allw = torch.cat(weights)
    assert allw.min() >= -1 and allw.max() <= 1
    assert abs(allw.mean().item()) < 0.05 and abs(allw.var().item() - 1 / 3) < 0.03


# --- FullGrad: a 1x1 conv with bias and a linear head ---


class BiasNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.bn = nn.BatchNorm2d(2, affine=False)  # a bias without affine parameters: -mean / sqrt(var + eps)
        self.fc = nn.Linear(12, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(CONV_W).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor(CONV_B))
            self.bn.running_mean.copy_(torch.tensor([0.3, -0.2]))
            self.bn.running_var.copy_(torch.tensor([0.5, 2.0]))
            self.fc.weight.copy_(torch.tensor(HEAD_W))
            self.fc.bias.fill_(0.7)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).flatten(1))


@pytest.mark.parametrize("cls", [0, 1])
def test_fullgrad_hand_computed(cls):
    model = BiasNet().eval()
    eps = model.bn.eps
    inv = 1 / np.sqrt(np.array([0.5, 2.0]) + eps)
    bn_bias = -np.array([0.3, -0.2]) * inv
    d_bn = HEAD_W[cls].reshape(2, 2, 3)  # dS/d(bn output)
    d_conv = d_bn * inv[:, None, None]  # dS/d(conv output)
    d_x = (d_conv * CONV_W[:, None, None]).sum(0)  # dS/dx
    expected = minmax(np.abs(X * d_x))  # the input term, one channel
    for bias, grad in ((CONV_B, d_conv), (bn_bias, d_bn)):
        for c in range(2):
            expected = expected + minmax(np.abs(bias[c] * grad[c]))  # psi per channel, summed
    e = camkit.FullGrad(model).explain(x_tensor(), target=cls)
    assert e.layers == ("conv", "bn")
    np.testing.assert_allclose(e.raw[0].numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.maps[0].numpy(), minmax(expected), atol=1e-5)


def test_fullgrad_is_invariant_to_the_score_scale():
    model = FourClassNet(1.0).eval()
    tiny = FourClassNet(1e-6).eval()
    torch.testing.assert_close(camkit.FullGrad(tiny)(x_tensor(), 1), camkit.FullGrad(model)(x_tensor(), 1))


def test_fullgrad_refuses_layers_without_bias():
    with pytest.raises(camkit.InvalidInputError, match="add none"):
        camkit.FullGrad(BiasNet(), layers=["fc"])


# --- Deep Feature Factorization ---


def test_nmf_recovers_a_planted_factorisation():
    g = torch.Generator().manual_seed(0)
    w0 = torch.rand(2, 6, 3, generator=g) + 0.5
    w0 = w0 * torch.eye(3).repeat_interleave(2, dim=0)  # channels 2k, 2k+1 belong to component k only
    h0 = torch.zeros(2, 3, 12)
    h0[:, 0, :4], h0[:, 1, 4:8], h0[:, 2, 8:] = 1.0, 2.0, 0.5  # disjoint supports: unique up to scale and order
    w, h = nmf(w0 @ h0, 3)
    torch.testing.assert_close(w @ h, w0 @ h0, atol=1e-5, rtol=1e-5)
    for b in range(2):  # both factors are separable, so the factorisation is unique up to scale and order
        owner = h[b].argmax(dim=0)  # the component of each position
        assert owner[:4].unique().numel() == owner[4:8].unique().numel() == owner[8:].unique().numel() == 1
        assert len({int(owner[0]), int(owner[4]), int(owner[8])}) == 3
        for k in range(3):
            others = [j for j in range(3) if j != k]
            assert h[b, others][:, owner == k].abs().max() < 1e-5


class ConceptNet(nn.Module):
    """The layer's output is a non-negative mix of the input's two 'concept' channels.

    Each output channel reads one concept and is 0 somewhere (no shift is subtracted), so the
    factorisation of the layer's activations is unique up to scale and order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Conv2d(2, 4, 1, bias=False)
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.mix.weight.copy_(torch.tensor([[1.0, 0.0], [0.5, 0.0], [0.0, 1.0], [0.0, 0.9]]).view(4, 2, 1, 1))
            self.fc.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(self.mix(x).mean(dim=(2, 3)))


def concept_input() -> torch.Tensor:
    x = torch.zeros(1, 2, 6, 6)
    x[0, 0, :, :3] = torch.linspace(0.5, 1.0, 3)  # concept 0 on the left half
    x[0, 1, :, 3:] = 1.0  # concept 1 on the right half
    return x


def test_dff_finds_the_planted_concepts_and_picks_by_the_head():
    x = concept_input()
    e = camkit.DeepFeatureFactorization(ConceptNet(), "mix", concepts=2).explain(x, target=torch.tensor([[0, 1]]))
    left, right = (x[0, 0] > 0).float(), (x[0, 1] > 0).float()
    maps = e.extras["concept_maps"][0]
    order = [int((maps[i] * left).sum() < (maps[i] * right).sum()) for i in range(2)]  # which half each concept is
    assert sorted(order) == [0, 1]
    for i, half in enumerate(order):
        expected = x[0, half] / x[0, half].max()
        torch.testing.assert_close(maps[i], expected, atol=1e-4, rtol=0)
    # class 0 reads channel 0 (concept 'left'), class 1 channels 2-3 (concept 'right')
    assert e.maps.shape == (1, 2, 6, 6)
    assert (e.maps[0, 0] * left).sum() > 0.99 * e.maps[0, 0].sum()
    assert (e.maps[0, 1] * right).sum() > 0.99 * e.maps[0, 1].sum()
    vectors = e.extras["concepts"][0]  # [C, 2]: columns proportional to the mixing weights' columns
    for i, half in enumerate(order):
        v = vectors[:, i] / vectors[:, i].norm()
        m = ConceptNet().mix.weight[:, half, 0, 0]
        assert torch.allclose(v, m / m.norm(), atol=1e-4)


def test_dff_needs_a_head_and_class_targets():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(4 * 16, 2))
    with pytest.raises(camkit.LayerNotFoundError, match="pass head="):
        camkit.DeepFeatureFactorization(net, "0", concepts=2)(torch.rand(1, 3, 4, 4))
    with pytest.raises(camkit.InvalidTargetError, match="class"):
        camkit.DeepFeatureFactorization(ConceptNet(), "mix", concepts=2)(concept_input(), lambda out: out[:, 0])


def test_factorization_image_hand_computed_and_inputs_untouched():
    maps = torch.tensor([[[1.0, 0.2], [0.0, 0.5]], [[0.5, 0.4], [0.0, 0.6]]])
    before = maps.clone()
    image = np.full((2, 2, 3), 100, np.uint8)
    out = camkit.factorization_image(image, maps, colors=[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], image_weight=0.25)
    # pixel (0, 0): concept 0 (red) at 1.0 -> 0.25 * 100 + 0.75 * 255 * (1, 0, 0)
    assert out[0, 0].tolist() == [round(25 + 0.75 * 255), 25, 25]
    # pixel (0, 1): concept 1 (blue) at 0.4; pixel (1, 0): ties at 0 -> concept 0 at 0
    assert out[0, 1].tolist() == [25, 25, round(25 + 0.75 * 255 * 0.4)]
    assert out[1, 0].tolist() == [25, 25, 25]
    assert torch.equal(maps, before) and (image == 100).all()


# --- SESS: windows and blur ---


def test_sess_windows_and_blur_by_hand():
    from camkit.methods.wrappers.sess import gaussian_blur, window_starts

    assert window_starts(224, 224, 224) == [0]
    assert window_starts(288, 224, 224) == [0, 64]  # the second window flush with the border
    assert window_starts(10, 3, 4) == [0, 3, 6]
    cv2 = pytest.importorskip("cv2")
    maps = torch.rand(2, 9, 13, generator=torch.Generator().manual_seed(0))
    for m, b in zip(maps, gaussian_blur(maps)):
        np.testing.assert_allclose(b.numpy(), cv2.GaussianBlur(m.numpy(), (11, 11), 5.0, 0), atol=1e-5)


def test_sess_with_one_full_window_is_the_blurred_inner_map():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    x = torch.randn(2, 3, 12, 12)
    inner = camkit.GradCAM(net, "1")
    e = camkit.SESS(inner, scales=[12]).explain(x, [0, 2])
    # one patch (the image), weight 1, mean fusion of the values > 0, blur, min-max
    plain = inner(x, [0, 2])
    fused = torch.where(plain > 0, plain, torch.zeros_like(plain))
    from camkit.methods.wrappers.sess import gaussian_blur

    expected = camkit.functional.normalize_maps(gaussian_blur(fused))[0]
    torch.testing.assert_close(e.maps, expected, atol=1e-6, rtol=0)
    assert e.method == "sess(gradcam)" and e.extras["patches"] == 1


def test_sess_batch_equals_one_by_one():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    x = torch.randn(3, 3, 10, 12)
    sess = camkit.SESS(camkit.GradCAM(net, "1"), num_scales=3, window=8, stride=4, max_batch=5)
    batched = sess(x, [0, 1, 2])
    for i in range(3):
        torch.testing.assert_close(batched[i], sess(x[i : i + 1], [i])[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda m: camkit.GradCAMElementWise(m, "conv2"),
        lambda m: camkit.ShapleyCAM(m, "conv2"),
        lambda m: camkit.FinerCAM(m, "conv2"),
        lambda m: camkit.FEM(m, "conv2"),
        lambda m: camkit.KPCACAM(m, "conv2"),
        lambda m: camkit.RandomCAM(m, "conv2", seed=3),
        lambda m: camkit.FullGrad(m),
        lambda m: camkit.DeepFeatureFactorization(m, "conv2", concepts=3, iterations=30),
        lambda m: camkit.SESS(camkit.GradCAM(m, "conv2"), num_scales=2, window=6),
    ],
)
def test_new_methods_run_on_the_device_and_match_the_cpu(make, device):
    from models import TinyNet, tiny_input

    model, x = TinyNet().eval(), tiny_input()
    expected = make(model)(x, [0, 3, 1])
    got = make(model.to(device))(x.to(device), torch.tensor([0, 3, 1], device=device))
    assert got.device.type == device.type
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=0)
