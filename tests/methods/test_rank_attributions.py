"""The gradient attributions on signals [B, C, T] and volumes or videos [B, C, D, H, W].

Formulas written out with autograd in 1-D and 3-D (saliency, input x gradient, guided
backprop, DeconvNet, Guided Grad-CAM with linear / trilinear upsampling, integrated gradients
and its completeness, GradientShap, SmoothGrad, AugSmooth), the functional pieces they use
(channel reduction, blur, completeness gap, view scaling) and the refusals. The 2-D results
are held by the image tests (tests/methods/test_pixel.py, test_smooth.py, tests/viz/test_views.py).
DeepLift and LRP are in test_rank_propagation.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from models import RANK_SIZES, RankNet, rank_input
from torch import Tensor, nn

import camkit
from camkit import functional as CF

RANKS = (1, 3)
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
POOL = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}
MODES = {1: "linear", 3: "trilinear"}


def _spatial(t: Tensor, lead: int = 1) -> tuple[int, ...]:
    return tuple(range(lead, t.dim()))


def _minmax(m: Tensor) -> Tensor:
    """Min-max of each map [B, *S] over all its spatial axes, by hand."""
    axes = _spatial(m)
    low, high = m.amin(dim=axes, keepdim=True), m.amax(dim=axes, keepdim=True)
    return (m - low) / (high - low)


def _grad(model: nn.Module, x: Tensor, classes: Tensor) -> Tensor:
    leaf = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(leaf).gather(1, classes[:, None]).sum(), leaf)
    return g


class StridedNet(nn.Module):
    """conv (stride 2) -> ReLU -> conv -> ReLU -> global mean -> linear, any rank: the CAM layer's grid is half the input's."""

    def __init__(self, spatial_dims: int, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        conv = CONV[spatial_dims]
        self.conv1 = conv(3, 4, 3, stride=2, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = conv(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = POOL[spatial_dims](1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x))))).flatten(1))


class OneReLUNet(nn.Module):
    """conv -> ReLU -> global mean -> linear: guided backprop and DeconvNet by hand."""

    def __init__(self, spatial_dims: int) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.conv = CONV[spatial_dims](3, 6, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = POOL[spatial_dims](1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


class SmoothNet(nn.Module):
    """conv -> tanh -> conv -> softplus -> mean -> linear: smooth, so 32 Gauss-Legendre points integrate exactly."""

    def __init__(self, spatial_dims: int) -> None:
        super().__init__()
        torch.manual_seed(4)
        conv = CONV[spatial_dims]
        self.conv1, self.conv2 = conv(3, 4, 3, padding=1), conv(4, 5, 3, padding=1)
        self.pool = POOL[spatial_dims](1)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(F.softplus(self.conv2(torch.tanh(self.conv1(x))))).flatten(1))


def _linear_net(spatial_dims: int) -> nn.Module:
    torch.manual_seed(5)
    size = math.prod(RANK_SIZES[spatial_dims])
    return nn.Sequential(CONV[spatial_dims](3, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * size, 3)).eval()


# --- every method: the contract on each rank --------------------------------------------------------------------


def _factories(spatial_dims: int) -> dict[str, object]:
    bases = torch.linspace(-1, 1, 2 * 3 * math.prod(RANK_SIZES[spatial_dims])).view(2, 3, *RANK_SIZES[spatial_dims])
    return {
        "saliency": camkit.Saliency,
        "inputxgradient": camkit.InputXGradient,
        "guidedbackprop": camkit.GuidedBackprop,
        "deconvolution": camkit.Deconvolution,
        "guidedgradcam": lambda m: camkit.GuidedGradCAM(m, "conv2"),
        "integratedgradients": lambda m: camkit.IntegratedGradients(m, steps=4, max_batch=3),
        "gradientshap": lambda m: camkit.GradientShap(m, bases, samples=3, seed=0),
        "deeplift": camkit.DeepLift,
        "deepliftshap": lambda m: camkit.DeepLiftShap(m, bases),
        "lrp": camkit.LRP,
        "smoothgrad": lambda m: camkit.SmoothGrad(camkit.Saliency(m), samples=2, seed=0),
        "augsmooth": lambda m: camkit.AugSmooth(camkit.InputXGradient(m), flip=(-1,)),
    }


@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("key", list(_factories(1)))
def test_every_gradient_attribution_gives_maps_at_the_inputs_size(key, spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    size = RANK_SIZES[spatial_dims]
    targets = torch.tensor([[0, 3], [3, 0]])
    e = _factories(spatial_dims)[key](model).explain(x, targets)
    assert e.maps.shape == (2, 2, *size) and e.spatial_dims == spatial_dims
    assert e.raw.shape == (2, 2, 3, *size)  # [B, K, C, *S]
    assert e.flat.shape == (2, 2) and not e.flat.all()
    low, high = e.maps.amin(dim=_spatial(e.maps, 2)), e.maps.amax(dim=_spatial(e.maps, 2))
    assert low.eq(0).all() and high.eq((~e.flat).float()).all()  # min-max over every spatial axis; flat maps zero
    for name in ("completeness_gap", "delta"):
        if name in e.extras:
            assert e.extras[name].shape == (2, 2)  # one per input and target, not summed over the batch


# --- formulas ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_saliency_and_input_x_gradient_by_hand(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    classes = torch.tensor([2, 0, 4])
    g = _grad(model, x, classes)
    saliency = camkit.Saliency(model).explain(x, classes)
    torch.testing.assert_close(saliency.raw, g)
    # maps: the maximum over channels of |dS/dx| at each position, min-max over every spatial axis
    torch.testing.assert_close(saliency.maps, _minmax(g.abs().amax(dim=1)))
    ixg = camkit.InputXGradient(model).explain(x, classes)
    torch.testing.assert_close(ixg.raw, x * g)
    torch.testing.assert_close(ixg.maps, _minmax((x * g).abs().amax(dim=1)))


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_guided_backprop_and_deconvnet_by_hand(spatial_dims):
    model = OneReLUNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    classes = torch.tensor([1, 3, 0])
    leaf = x.clone().requires_grad_(True)
    z = model.conv(leaf)
    a = z.detach().relu().requires_grad_(True)
    (g_a,) = torch.autograd.grad(model.fc(model.pool(a).flatten(1)).gather(1, classes[:, None]).sum(), a)
    guided = g_a.clamp_min(0) * (a > 0)  # positive gradients, where the ReLU was active
    deconv = g_a.clamp_min(0)  # positive gradients, wherever
    (expected_guided,) = torch.autograd.grad(z, leaf, guided, retain_graph=True)
    (expected_deconv,) = torch.autograd.grad(z, leaf, deconv)
    torch.testing.assert_close(camkit.GuidedBackprop(model).explain(x, classes).raw, expected_guided)
    torch.testing.assert_close(camkit.Deconvolution(model).explain(x, classes).raw, expected_deconv)
    assert (expected_guided - expected_deconv).abs().max() > 1e-3  # the two rules differ here
    assert (expected_guided - _grad(model, x, classes)).abs().max() > 1e-3  # ... and from the plain gradient


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_guided_gradcam_upsamples_the_cam_with_the_ranks_mode(spatial_dims):
    model = StridedNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    size = RANK_SIZES[spatial_dims]
    classes = torch.tensor([0, 3, 0])  # no flat Grad-CAM map among them
    # Grad-CAM at conv2 (a grid of half the input's sides), written out
    acts = model.conv2(model.relu1(model.conv1(x))).detach().requires_grad_(True)
    scores = model.fc(model.pool(model.relu2(acts)).flatten(1)).gather(1, classes[:, None]).sum()
    (grads,) = torch.autograd.grad(scores, acts)
    assert acts.shape[2:] == tuple(s // 2 for s in size)
    weights = grads.mean(dim=_spatial(grads, 2), keepdim=True)
    cam = (weights * acts).sum(dim=1).clamp_min(0).detach()
    up = F.interpolate(cam[:, None], size=size, mode=MODES[spatial_dims], align_corners=False)[:, 0]
    cam_map = _minmax(up)
    guided = camkit.GuidedBackprop(model).explain(x, classes).raw
    e = camkit.GuidedGradCAM(model, "conv2").explain(x, classes)
    torch.testing.assert_close(e.raw, guided * cam_map[:, None], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(e.maps, _minmax(e.raw.abs().amax(dim=1)))
    # nearest-neighbour upsampling would give another map: the mode matters here
    nearest = _minmax(F.interpolate(cam[:, None], size=size, mode="nearest")[:, 0])
    assert (nearest - cam_map).abs().max() > 1e-2


def _integrated_by_hand(model: nn.Module, x: Tensor, x0: Tensor, classes: Tensor, steps: int, rule: str) -> Tensor:
    alphas, weights = CF.integration_points(steps, rule)
    total = torch.zeros_like(x)
    for alpha, weight in zip(alphas.tolist(), weights.tolist()):
        total += weight * _grad(model, x0 + alpha * (x - x0), classes)
    return (x - x0) * total


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
def test_integrated_gradients_by_hand_and_complete(spatial_dims):
    model = SmoothNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    x0 = torch.full_like(x[0], -2.0)  # one baseline [C, *S] for every input
    classes = torch.tensor([0, 2, 1])
    e = camkit.IntegratedGradients(model, steps=32, baseline=x0, max_batch=7).explain(x, classes)
    torch.testing.assert_close(e.raw, _integrated_by_hand(model, x, x0.expand_as(x), classes, 32, "gausslegendre"))
    with torch.no_grad():
        difference = model(x).gather(1, classes[:, None])[:, 0] - model(x0.expand_as(x)).gather(1, classes[:, None])[:, 0]
    assert difference.abs().min() > 1e-2, "a degenerate case: the score barely moves"
    # completeness: the attributions of each input add up to score(x) - score(x0)
    torch.testing.assert_close(e.raw.sum(dim=_spatial(e.raw)), difference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e.extras["completeness_gap"], e.raw.sum(dim=_spatial(e.raw)) - difference)
    assert e.extras["completeness_gap"].abs().max() < 1e-5


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_integrated_gradients_is_complete_on_a_relu_net_with_many_steps(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    e = camkit.IntegratedGradients(model, steps=128, rule="midpoint", max_batch=256).explain(x, 3)
    difference = e.scores - e.extras["baseline_scores"]
    assert difference.abs().min() > 1e-2
    torch.testing.assert_close(e.raw.sum(dim=_spatial(e.raw)), difference, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_integrated_gradients_blur_baseline_blurs_every_spatial_axis(spatial_dims):
    model = SmoothNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    e = camkit.IntegratedGradients(model, steps=8, baseline="blur", blur_sigma=1.0).explain(x, 1)
    x0 = CF.blur(x, 1.0)
    torch.testing.assert_close(e.raw, _integrated_by_hand(model, x, x0, torch.tensor([1, 1]), 8, "gausslegendre"))
    # the default sigma is a tenth of the largest spatial side
    default = camkit.IntegratedGradients(model, steps=8, baseline="blur").explain(x, 1)
    sigma = max(RANK_SIZES[spatial_dims]) / 10
    expected = _integrated_by_hand(model, x, CF.blur(x, sigma), torch.tensor([1, 1]), 8, "gausslegendre")
    torch.testing.assert_close(default.raw, expected)


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_gradientshap_on_a_linear_model_by_hand(spatial_dims):
    model = _linear_net(spatial_dims)
    x = rank_input(spatial_dims, batch=2)
    bases = torch.randn(3, 3, *RANK_SIZES[spatial_dims], generator=torch.Generator().manual_seed(9))
    explainer = camkit.GradientShap(model, bases, samples=5, stdev=0.2, seed=4, max_batch=3)
    e = explainer.explain(x, 2)
    index, _, noise = explainer.draws(x, 4)
    w = _grad(model, x, torch.tensor([2, 2]))  # the constant gradient of a linear model
    expected = torch.stack([(x + noise[s] - bases[index[s]]) * w for s in range(5)]).mean(dim=0)
    torch.testing.assert_close(e.raw, expected, atol=1e-6, rtol=1e-5)
    assert index.unique().numel() > 1 and noise.abs().max() > 0


# --- SmoothGrad and AugSmooth -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_smoothgrad_noise_spreads_over_every_axis_by_hand(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    classes = model(x).argmax(dim=1)
    generator = torch.Generator().manual_seed(5)
    every = _spatial(x)
    spread = 0.3 * (x.amax(dim=every, keepdim=True) - x.amin(dim=every, keepdim=True))
    grads = [_grad(model, x + spread * torch.randn(x.shape, generator=generator), classes) for _ in range(3)]
    e = camkit.SmoothGrad(camkit.Saliency(model), samples=3, sigma=0.3, seed=5, max_batch=4).explain(x)
    torch.testing.assert_close(e.raw, torch.stack(grads).mean(dim=0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(e.maps, _minmax(e.raw.abs().amax(dim=1)))
    assert e.maps.shape == (2, *RANK_SIZES[spatial_dims])


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_augsmooth_batch_equals_one_by_one(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    target = torch.tensor([0, 3, 1])
    flip = (-1,) if spatial_dims == 1 else (-1, -3)
    batched = camkit.AugSmooth(camkit.GradCAM(model, "conv2"), flip=flip).explain(x, target)
    for i in range(3):
        single = camkit.AugSmooth(camkit.GradCAM(model, "conv2"), flip=flip).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_smoothgrad_without_noise_is_the_wrapped_method(spatial_dims):
    # SmoothGrad's noise is drawn for the whole batch at once, so only sigma = 0 compares image by image
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    plain = camkit.GradCAM(model, "conv2").explain(x, 1)
    smooth = camkit.SmoothGrad(camkit.GradCAM(model, "conv2"), samples=2, sigma=0.0, seed=0).explain(x, 1)
    torch.testing.assert_close(smooth.raw, plain.raw)
    torch.testing.assert_close(smooth.maps, plain.maps)


def _maps(model: nn.Module, x: Tensor, classes: Tensor) -> Tensor:
    return camkit.Saliency(model).explain(x, classes).maps


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_augsmooth_mirrors_back_along_the_axes_it_flipped(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    classes = model(x).argmax(dim=1)
    axes = (-1,) if spatial_dims == 1 else (-1, -3)  # a video's time axis only on request
    e = camkit.AugSmooth(camkit.Saliency(model), flip=axes, scales=(1.0,)).explain(x)
    mean = (_maps(model, x, classes) + sum(_maps(model, x.flip(a), classes).flip(a) for a in axes)) / (1 + len(axes))
    torch.testing.assert_close(e.maps, _minmax(mean))
    assert e.extras["flip_axes"] == axes


def test_augsmooth_default_mirrors_left_and_right_of_a_volume_only():
    model = RankNet(3).eval()
    x = rank_input(3, batch=2)
    classes = model(x).argmax(dim=1)
    e = camkit.AugSmooth(camkit.Saliency(model), scales=(1.0,)).explain(x)
    assert e.extras["flip_axes"] == (-1,)
    torch.testing.assert_close(e.maps, _minmax(_maps(model, x, classes) + _maps(model, x.flip(-1), classes).flip(-1)))


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_augsmooth_rescales_every_spatial_axis_with_the_ranks_mode(spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    size = RANK_SIZES[spatial_dims]
    classes = model(x).argmax(dim=1)
    e = camkit.AugSmooth(camkit.Saliency(model), flip=False, scales=(1.0, 0.5)).explain(x)
    half = F.interpolate(x, size=tuple(s // 2 for s in size), mode=MODES[spatial_dims], align_corners=False)
    back = F.interpolate(_maps(model, half, classes)[:, None], size=size, mode=MODES[spatial_dims], align_corners=False)
    torch.testing.assert_close(e.maps, _minmax(_maps(model, x, classes) + back[:, 0]))


def test_augsmooth_refuses_to_reverse_a_signal_unless_asked():
    model = RankNet(1).eval()
    with pytest.raises(camkit.InvalidInputError, match=r"signal \[B, C, T\].*time.*flip=False.*flip=\(-1,\)"):
        camkit.AugSmooth(camkit.Saliency(model)).explain(rank_input(1))
    with pytest.raises(camkit.InvalidInputError, match=r"flip axis -3 needs 3 spatial axes.*\[B, C, T\]"):
        camkit.AugSmooth(camkit.Saliency(model), flip=(-1, -3)).explain(rank_input(1))
    for bad in ((-4,), (0,), (-1, -1), (True,)):
        with pytest.raises(camkit.InvalidInputError, match="flip must be True"):
            camkit.AugSmooth(camkit.Saliency(model), flip=bad)
    e = camkit.AugSmooth(camkit.Saliency(model), flip=False).explain(rank_input(1))
    assert e.maps.shape == (3, 16) and e.extras["flip_axes"] == ()


# --- bad baselines name the rank's shapes -----------------------------------------------------------------------


def test_baselines_of_another_rank_are_refused_with_the_shapes_that_fit():
    model, x = RankNet(1).eval(), rank_input(1)
    volumes = torch.zeros(2, 3, 4, 8, 8)
    for explainer in (camkit.GradientShap(model, volumes), camkit.DeepLiftShap(model, volumes)):
        with pytest.raises(camkit.InvalidInputError, match=r"pass baselines \[N, C, T\] or one baseline \[C, T\]"):
            explainer.explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"pass baselines \[N, C, T\] with x's C, T"):
        camkit.GradientShap(model, torch.zeros(2, 3, 15)).explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"pass \[C, D, H, W\], \[1, C, D, H, W\] or \[B, C, D, H, W\]"):
        camkit.IntegratedGradients(RankNet(3), baseline=torch.zeros(3, 4, 8, 7)).explain(rank_input(3))
    with pytest.raises(camkit.InvalidInputError, match=r"pass \[C, T\], \[1, C, T\] or \[B, C, T\]"):
        camkit.DeepLift(model, baseline=torch.zeros(2, 3, 16)).explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"baselines must be a tensor \[N, C, \*S\]"):
        camkit.GradientShap(model, torch.zeros(16))


def test_one_baseline_without_its_batch_axis_serves_every_signal():
    model, x = RankNet(1).eval(), rank_input(1)
    one = torch.linspace(-1, 1, 48).view(3, 16)  # [C, T]
    for make in (camkit.GradientShap, camkit.DeepLiftShap):
        a = make(model, one, **({"samples": 4, "seed": 1} if make is camkit.GradientShap else {})).explain(x, 2)
        b = make(model, one[None], **({"samples": 4, "seed": 1} if make is camkit.GradientShap else {})).explain(x, 2)
        torch.testing.assert_close(a.raw, b.raw, rtol=0, atol=0)


# --- the functional pieces --------------------------------------------------------------------------------------


def test_reduce_channels_and_completeness_gap_by_rank():
    raw = torch.randn(2, 4, 3, 4, 5, 6)  # [B, K, C, D, H, W]
    torch.testing.assert_close(CF.reduce_channels(raw, spatial_dims=3), raw.abs().amax(dim=2))
    signal = torch.randn(2, 4, 3, 16)  # [B, K, C, T]
    torch.testing.assert_close(CF.reduce_channels(signal, spatial_dims=1), signal.abs().amax(dim=2))
    score, base = torch.randn(2, 4), torch.randn(2, 4)
    gap = CF.completeness_gap(signal, score, base, spatial_dims=1)
    torch.testing.assert_close(gap, signal.sum(dim=(2, 3)) - (score - base))
    torch.testing.assert_close(CF.completeness_gap(raw, score, base, spatial_dims=3), raw.sum(dim=(2, 3, 4, 5)) - (score - base))
    with pytest.raises(camkit.InvalidInputError, match="spatial_dims must be 1"):
        CF.reduce_channels(raw, spatial_dims=4)
    with pytest.raises(camkit.InvalidInputError, match=r"at least \[C, D, H, W\]"):
        CF.reduce_channels(torch.zeros(3, 4, 5), spatial_dims=3)


def _kernel(sigma: float) -> Tensor:
    radius = math.ceil(3 * sigma)
    k = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    return (k / k.sum()).float()


def test_blur_is_one_gaussian_per_spatial_axis():
    k = _kernel(1.0)  # 7 taps
    volume = torch.zeros(1, 2, 9, 9, 9)
    volume[0, 0, 4, 4, 4] = 1.0  # far enough from every edge
    out = CF.blur(volume, 1.0)
    outer = k[:, None, None] * k[None, :, None] * k[None, None, :]
    torch.testing.assert_close(out[0, 0, 1:8, 1:8, 1:8], outer)
    assert out[0, 1].abs().max() == 0 and volume.sum() == 1  # channels apart, input unchanged
    signal = torch.arange(6.0).view(1, 1, 6)
    padded = torch.cat([signal[..., :1].expand(1, 1, 3), signal, signal[..., -1:].expand(1, 1, 3)], dim=-1)
    expected = torch.stack([(padded[0, 0, i : i + 7] * k).sum() for i in range(6)])  # edges replicated
    torch.testing.assert_close(CF.blur(signal, 1.0)[0, 0], expected)
    with pytest.raises(camkit.InvalidInputError, match=r"\[B, C, T\] \(a signal\)"):
        CF.blur(torch.zeros(2, 16), 1.0)


def test_scale_attribution_on_signals_and_volumes_by_hand():
    attr = torch.randn(2, 3, 4, 5, 6, generator=torch.Generator().manual_seed(0))  # [B, C, D, H, W]
    summed = attr.sum(dim=1)
    expected = summed / summed.abs().amax(dim=(1, 2, 3), keepdim=True)  # outlier_perc=0: t = max |a|
    torch.testing.assert_close(CF.scale_attribution(attr, "all", 0, spatial_dims=3), expected)
    torch.testing.assert_close(CF.scale_attribution(summed, "all", 0, spatial_dims=3), expected)  # maps [B, D, H, W]
    signal = torch.tensor([[[1.0, -3.0, 2.0, 4.0]], [[0.0, 0.0, 0.0, 0.0]]])  # [B, C, T]
    # |a| mass 10; half of it (5) is reached at 1 + 2 + 3 = 6: t = 3
    assert CF.scale_attribution(signal, "absolute_value", 50, spatial_dims=1).mul(3).tolist() == [
        [1.0, 3.0, 2.0, 3.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
    with pytest.raises(camkit.InvalidInputError, match=r"\[B, T\] or \[B, C, T\]"):
        CF.scale_attribution(attr, spatial_dims=1)
    with pytest.raises(camkit.InvalidInputError, match=r"pass spatial_dims=3"):
        CF.scale_attribution(attr)


def test_pictures_refuse_volumes_and_signal_maps_with_what_to_draw():
    volume = torch.randn(2, 3, 4, 8, 8)
    images = torch.rand(2, 3, 8, 8)
    for draw in (
        lambda: CF.heat_map(volume),
        lambda: CF.attribution_view(volume, images),
        lambda: CF.masked_image(images, volume),
        lambda: CF.alpha_scaling(images, volume),
    ):
        with pytest.raises(camkit.InvalidInputError, match=r"drawn for images.*one slice or frame, e\.g\. attr\[:, :, d\]"):
            draw()
    with pytest.raises(camkit.InvalidInputError, match=r"signal maps \[B, T\].*spatial_dims=1"):
        CF.heat_map(torch.randn(2, 16))
    assert CF.heat_map(volume[:, :, 1]).shape == (2, 3, 8, 8)  # one slice is an image
