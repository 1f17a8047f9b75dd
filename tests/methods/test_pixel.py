"""Pixel-space attributions: hand-computed values, every ReLU spelling, integrated gradients."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from models import ResBlockNet, TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit import functional as CF

# ---------------------------------------------------------------------------------------------
# A fixed-weight net small enough to differentiate by hand.
#   input [B, 1, 1, 2] -> flatten -> h = relu(W1 x + b1) -> scores = W2 h
#   W1 = [[1, 2], [3, -1]], b1 = [0, -2], W2 = [[1, -2], [-1, 1]]
# For x1 = [1, 4]: W1 x1 + b1 = [9, -3] -> h = [9, 0], score of class 1 = -9.
# For x2 = [2, 1]: W1 x2 + b1 = [4, 3]  -> h = [4, 3], score of class 1 = -1.
# Gradient of class 1: W1^T (W2[1] * mask) with W2[1] = [-1, 1]:
#   x1: mask [1, 0] -> W1^T [-1, 0] = [-1, -2];  x2: mask [1, 1] -> W1^T [-1, 1] = [2, -3].
# Guided: W1^T (relu(W2[1]) * mask) = W1^T ([0, 1] * mask): x1 [0, 0]; x2 W1^T [0, 1] = [3, -1].
# DeconvNet: W1^T relu(W2[1]) = [3, -1] for both.
# ---------------------------------------------------------------------------------------------


class HandNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 2)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))
            self.fc1.bias.copy_(torch.tensor([0.0, -2.0]))
            self.fc2.weight.copy_(torch.tensor([[1.0, -2.0], [-1.0, 1.0]]))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.relu(self.fc1(x.flatten(1))))


HAND_X = torch.tensor([[[[1.0, 4.0]]], [[[2.0, 1.0]]]])


def _raw(explainer: camkit.Explainer, x: Tensor, target=1) -> Tensor:
    raw = explainer.explain(x, target).raw
    assert isinstance(raw, Tensor)
    return raw


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (camkit.Saliency, [[-1.0, -2.0], [2.0, -3.0]]),
        (camkit.InputXGradient, [[-1.0, -8.0], [4.0, -3.0]]),
        (camkit.GuidedBackprop, [[0.0, 0.0], [3.0, -1.0]]),
        (camkit.Deconvolution, [[3.0, -1.0], [3.0, -1.0]]),
    ],
)
def test_hand_computed_values(cls, expected):
    explanation = cls(HandNet()).explain(HAND_X, 1)
    torch.testing.assert_close(explanation.raw, torch.tensor(expected).view(2, 1, 1, 2))
    torch.testing.assert_close(explanation.scores, torch.tensor([-9.0, -1.0]))
    assert explanation.target.tolist() == [1, 1]
    assert explanation.layers == ()


def test_maps_are_max_abs_over_channels_normalised():
    x = torch.tensor([[[[1.0, 4.0, 0.0]], [[2.0, -1.0, 3.0]]]])  # [1, 2, 1, 3]
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 1, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, -4.0, 0.5, -2.0, 1.0, 3.0]]))
    explanation = camkit.Saliency(net).explain(x, 0)
    # gradient = the weights; max |.| over the 2 channels per pixel: [2, 4, 3] -> min-max [0, 1, 0.5]
    torch.testing.assert_close(explanation.maps, torch.tensor([[[0.0, 1.0, 0.5]]]))
    torch.testing.assert_close(CF.reduce_channels(explanation.raw), torch.tensor([[[2.0, 4.0, 3.0]]]))


def test_guided_all_zero_gradient_is_a_flat_map_not_nan():
    explanation = camkit.GuidedBackprop(HandNet()).explain(HAND_X, 1)
    assert explanation.flat.tolist() == [True, False]
    assert torch.equal(explanation.maps[0], torch.zeros(1, 2))


def test_integrated_gradients_hand_computed_midpoint():
    # Along t * x (baseline 0), x2's second unit switches on at t = 0.4; 3 of the 5 midpoint
    # nodes (0.1 .. 0.9) lie above it, so the rule integrates exactly:
    #   x2: x2 * ([-1, -2] + 0.6 * [3, -1]) = [2, 1] * [0.8, -2.6] = [1.6, -2.6]; x1: x1 * [-1, -2].
    explanation = camkit.IntegratedGradients(HandNet(), steps=5, rule="midpoint").explain(HAND_X, 1)
    torch.testing.assert_close(explanation.raw, torch.tensor([[-1.0, -8.0], [1.6, -2.6]]).view(2, 1, 1, 2))
    torch.testing.assert_close(explanation.extras["baseline_scores"], torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(explanation.extras["completeness_gap"], torch.zeros(2), atol=1e-5, rtol=0)
    # With 4 nodes (0.125 .. 0.875) 2 of 4 are above 0.4: x2 -> [2, 1] * [0.5, -2.5], gap 0.5 - 2.5 + 1.
    coarse = camkit.IntegratedGradients(HandNet(), steps=4, rule="midpoint").explain(HAND_X, 1)
    torch.testing.assert_close(coarse.raw[1], torch.tensor([1.0, -2.5]).view(1, 1, 2))
    torch.testing.assert_close(coarse.extras["completeness_gap"], torch.tensor([0.0, -0.5]))


def test_guided_gradcam_hand_computed():
    # conv 1x1 (weights [1, -1]) -> relu -> mean over 3 pixels -> W2 = [[1, -2], [-1, 1]].
    # x = [1, 3, 2]: A = [[1, 3, 2], [-1, -3, -2]]; class 0: dS/dA_0 = 1/3 (A_0 > 0), dS/dA_1 = 0.
    # Grad-CAM (layer "0", pre-ReLU A): relu(1/3 * [1, 3, 2]) -> min-max -> [0, 1, 0.5].
    # Guided: channel 0 passes 1/3, channel 1 relu(-2/3) = 0 -> input gradient [1/3, 1/3, 1/3].
    net = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
        net[4].weight.copy_(torch.tensor([[1.0, -2.0], [-1.0, 1.0]]))
    explanation = camkit.GuidedGradCAM(net, "0").explain(torch.tensor([[[[1.0, 3.0, 2.0]]]]), 0)
    torch.testing.assert_close(explanation.raw, torch.tensor([0.0, 1 / 3, 1 / 6]).view(1, 1, 1, 3))
    torch.testing.assert_close(explanation.maps, torch.tensor([[[0.0, 1.0, 0.5]]]))
    assert explanation.layers == ("0",)


def test_guided_gradcam_is_guided_times_gradcam_map():
    model, x = TinyNet().eval(), tiny_input()
    targets = torch.tensor([[0, 2], [4, 1], [3, 3]])
    combined = camkit.GuidedGradCAM(model, "conv2").explain(x, targets)
    guided = camkit.GuidedBackprop(model).explain(x, targets).raw
    cam = camkit.GradCAM(model, "conv2").explain(x, targets).maps
    torch.testing.assert_close(combined.raw, guided * cam.unsqueeze(2))
    assert combined.raw.shape == (3, 2, 3, 8, 8)


# ---------------------------------------------------------------------------------------------
# Every ReLU spelling gives the same guided / DeconvNet result.
# ---------------------------------------------------------------------------------------------

SPELLINGS = {
    "nn.ReLU": lambda m, t: m.act(t),
    "nn.ReLU(inplace)": lambda m, t: m.act_inplace(t),
    "F.relu": lambda m, t: F.relu(t),
    "F.relu(inplace)": lambda m, t: F.relu(t, inplace=True),
    "F.relu_": lambda m, t: F.relu_(t),
    "torch.relu": lambda m, t: torch.relu(t),
    "torch.relu_": lambda m, t: torch.relu_(t),
    "Tensor.relu": lambda m, t: t.relu(),
    "Tensor.relu_": lambda m, t: t.relu_(),
    "Tensor.relu_ unassigned": None,  # the in-place call's return value is ignored
}


class SpellingNet(nn.Module):
    """conv -> relu -> conv -> relu -> pool -> fc with one fixed set of weights; the ReLU spelling varies."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.spelling = spelling
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 5, 3, padding=1)
        self.fc = nn.Linear(5, 4)
        self.act = nn.ReLU()
        self.act_inplace = nn.ReLU(inplace=True)

    def _relu(self, t: Tensor) -> Tensor:
        if self.spelling == "Tensor.relu_ unassigned":
            t.relu_()
            return t
        return SPELLINGS[self.spelling](self, t)

    def forward(self, x: Tensor) -> Tensor:
        x = self._relu(self.conv1(x))
        x = self._relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


@pytest.mark.parametrize("cls", [camkit.GuidedBackprop, camkit.Deconvolution])
def test_every_relu_spelling_gives_the_same_result(cls):
    x = tiny_input(batch=2)
    target = torch.tensor([1, 3])
    reference = _raw(cls(SpellingNet("nn.ReLU")), x, target)
    plain = _raw(camkit.Saliency(SpellingNet("nn.ReLU")), x, target)
    assert (reference - plain).abs().max() > 0.5 * plain.abs().max(), "the rule changed nothing: ReLUs were missed"
    for spelling in SPELLINGS:
        raw = _raw(cls(SpellingNet(spelling)), x, target)
        torch.testing.assert_close(raw, reference, atol=1e-6, rtol=0, msg=f"spelling {spelling} differs")
        # the plain gradient of the same net is the same under every spelling too
        torch.testing.assert_close(_raw(camkit.Saliency(SpellingNet(spelling)), x, target), plain, atol=1e-6, rtol=0)


def test_guided_differs_from_plain_gradient_on_functional_resnet_block():
    model, x = ResBlockNet().eval(), tiny_input()
    guided = _raw(camkit.GuidedBackprop(model), x, 0)
    plain = _raw(camkit.Saliency(model), x, 0)
    assert (guided - plain).abs().max() > 0.25 * plain.abs().max()
    # Guided backprop keeps only paths of positive gradient: where plain and guided differ,
    # the difference comes from suppressed negative paths, so the result is not a rescaling.
    assert not torch.allclose(guided / guided.norm(), plain / plain.norm(), atol=1e-3)


def test_nothing_left_patched_after_the_call_even_after_an_exception():
    relu_before = (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)
    model, x = TinyNet().eval(), tiny_input()
    plain_before = _raw(camkit.Saliency(model), x, 0)
    camkit.GuidedBackprop(model).explain(x, 0)
    assert torch._C._len_torch_function_stack() == 0
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        camkit.Deconvolution(model).explain(x, 0)
    model.fail = False
    assert torch._C._len_torch_function_stack() == 0
    assert (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_) == relu_before
    assert all(type(m) is not nn.Module for m in model.modules())
    torch.testing.assert_close(_raw(camkit.Saliency(model), x, 0), plain_before, atol=0, rtol=0)


class GeluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.silu(nn.functional.gelu(self.conv(x))).mean(dim=(2, 3)))


@pytest.mark.parametrize("cls", [camkit.GuidedBackprop, camkit.Deconvolution])
def test_model_without_relu_warns_and_gives_the_plain_gradient(cls):
    model, x = GeluNet().eval(), tiny_input()
    with pytest.warns(camkit.NoReLUWarning, match="called no ReLU.*plain input gradient"):
        raw = _raw(cls(model), x, 0)
    torch.testing.assert_close(raw, _raw(camkit.Saliency(model), x, 0), atol=0, rtol=0)
    assert issubclass(camkit.NoReLUWarning, camkit.CamkitWarning)


def test_model_with_relu_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        camkit.GuidedBackprop(TinyNet().eval()).explain(tiny_input())


def test_model_that_mutates_its_input_in_place_leaves_the_callers_tensor_alone():
    class Normalising(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyNet()

        def forward(self, x: Tensor) -> Tensor:
            x.sub_(0.5)  # legal in plain PyTorch on a tensor that does not require grad
            return self.inner(x)

    x = tiny_input()
    before = x.clone()
    raw = _raw(camkit.GuidedBackprop(Normalising().eval()), x, 0)
    assert torch.equal(x, before)
    torch.testing.assert_close(raw, _raw(camkit.GuidedBackprop(TinyNet().eval()), x - 0.5, 0))


def test_pixel_methods_on_device(device):
    model, x = TinyNet().eval().to(device), tiny_input().to(device)
    for cls in (camkit.Saliency, camkit.GuidedBackprop, camkit.Deconvolution):
        explanation = cls(model).explain(x, 2)
        assert explanation.maps.device.type == device.type and explanation.raw.device.type == device.type


# ---------------------------------------------------------------------------------------------
# Integrated gradients
# ---------------------------------------------------------------------------------------------


def test_integration_points_hand_values():
    alphas, weights = CF.integration_points(2, "gausslegendre", dtype=torch.float64)
    half = 0.5 / 3**0.5
    torch.testing.assert_close(alphas, torch.tensor([0.5 - half, 0.5 + half], dtype=torch.float64))
    torch.testing.assert_close(weights, torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert float((weights * alphas**3).sum()) == pytest.approx(0.25, abs=1e-12)  # exact for degree 3
    alphas, weights = CF.integration_points(3, "trapezoid")
    assert alphas.tolist() == [0.0, 0.5, 1.0] and weights.tolist() == [0.25, 0.5, 0.25]
    with pytest.raises(camkit.InvalidInputError, match="steps"):
        CF.integration_points(0)


@pytest.mark.parametrize("baseline", [0.0, "blur"])
def test_integrated_gradients_completeness_within_one_percent_at_64_steps(baseline):
    model, x = ResBlockNet().eval(), tiny_input(size=10)
    explanation = camkit.IntegratedGradients(model, steps=64, baseline=baseline).explain(x, 2)
    delta = explanation.scores - explanation.extras["baseline_scores"]
    gap = explanation.extras["completeness_gap"]
    torch.testing.assert_close(gap, explanation.raw.sum(dim=(1, 2, 3)) - delta)
    assert delta.abs().min() > 1e-2, "a degenerate case: the score barely changes along the path"
    assert (gap.abs() <= 0.01 * delta.abs()).all(), f"gap {gap.tolist()} vs delta {delta.tolist()}"


def test_integrated_gradients_independent_of_internal_batch_size():
    model, x = TinyNet().eval(), tiny_input(batch=2)
    target = torch.tensor([[0, 1], [2, 3]])
    results = [
        camkit.IntegratedGradients(model, steps=6, max_batch=size).explain(x, target).raw for size in (1, 5, 1000)
    ]
    scale = results[0].abs().max()
    for other in results[1:]:
        torch.testing.assert_close(other / scale, results[0] / scale, atol=1e-5, rtol=0)


def test_integrated_gradients_tensor_baselines():
    model, x = TinyNet().eval(), tiny_input()
    same = camkit.IntegratedGradients(model, steps=4, baseline=x).explain(x, 0)
    assert torch.equal(same.raw, torch.zeros_like(x)) and same.flat.all()
    per_image = camkit.IntegratedGradients(model, steps=6, baseline=torch.full((3, 8, 8), 0.25)).explain(x, 1)
    constant = camkit.IntegratedGradients(model, steps=6, baseline=0.25).explain(x, 1)
    torch.testing.assert_close(per_image.raw, constant.raw)
    with pytest.raises(camkit.InvalidInputError, match=r"baseline has shape \[3, 4, 4\]"):
        camkit.IntegratedGradients(model, baseline=torch.zeros(3, 4, 4)).explain(x)
    with pytest.raises(camkit.InvalidInputError, match="'blur'"):
        camkit.IntegratedGradients(model, baseline="noise")


def _forward_rows(model: nn.Module) -> list[int]:
    """The batch size of every forward of ``model`` from now on."""
    rows: list[int] = []
    model.register_forward_pre_hook(lambda _module, args: rows.append(args[0].shape[0]))
    return rows


@pytest.mark.parametrize(
    ("baseline", "target", "keep_mode", "first"),
    [
        (0.25, 1, False, [4]),  # the 3 images and the shared baseline's one row in one forward
        (torch.full((3, 3, 8, 8), 0.25), torch.tensor([1, 1, 1]), False, [6]),  # each image's baseline row
        (0.25, lambda out: out[:, 1], False, [3, 3]),  # a callable scores the batch it gets: apart
        (0.25, 1, True, [3, 3]),  # batch norm in training mode would mix the rows: apart
    ],
    ids=["shared", "per-image", "callable", "training"],
)
def test_integrated_gradients_scores_both_ends_in_one_forward_where_rows_cannot_mix(baseline, target, keep_mode, first):
    model, x = TinyNet(), tiny_input()
    model.train(keep_mode)
    rows = _forward_rows(model)
    explanation = camkit.IntegratedGradients(model, steps=6, baseline=baseline, keep_mode=keep_mode, max_batch=18)
    result = explanation.explain(x, target)
    assert rows[: len(first)] == first and rows[len(first) :] == [18]  # then the 18 path images, one chunk
    if keep_mode:
        return  # batch statistics: a batch of 3 images is not the reference's batch
    # against the plain two-forward path (baseline 0.25 given as a number there too: the same values)
    plain = camkit.IntegratedGradients(copy.deepcopy(model), steps=6, baseline=0.25).explain(x, lambda out: out[:, 1])
    torch.testing.assert_close(result.scores, plain.scores, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(result.extras["baseline_scores"], plain.extras["baseline_scores"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(result.raw, plain.raw, atol=1e-6, rtol=1e-5)


def test_integrated_gradients_on_a_bfloat16_model_weights_in_float32():
    model, x = ResBlockNet().eval(), tiny_input(size=10)
    full = camkit.IntegratedGradients(model, steps=16).explain(x, 2)
    half = camkit.IntegratedGradients(copy.deepcopy(model).to(torch.bfloat16), steps=16).explain(x, 2)
    assert half.raw.dtype == torch.float32
    scale = full.raw.abs().max()
    assert (half.raw - full.raw).abs().max() < 0.05 * scale  # bf16 activations: a few per cent
    delta = half.scores.float() - half.extras["baseline_scores"].float()
    assert (half.extras["completeness_gap"].abs() <= 0.05 * delta.abs() + 1e-3).all()


def test_integrated_gradients_scores_a_neuron_at_both_ends_in_one_forward():
    model, x = TinyNet().eval(), tiny_input()
    rows = _forward_rows(model)
    result = camkit.IntegratedGradients(model, steps=6, baseline=0.25, max_batch=18).explain(
        x, camkit.NeuronTarget("conv2", 4, position=(2, 5))
    )
    assert rows == [4, 18]  # the 3 images and the baseline's row, then the path images
    seen: list[Tensor] = []
    handle = model.conv2.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    with torch.no_grad():
        model(x), model(torch.full_like(x, 0.25))
    handle.remove()
    torch.testing.assert_close(result.scores, seen[0][:, 4, 2, 5], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(result.extras["baseline_scores"], seen[1][:, 4, 2, 5], atol=1e-6, rtol=1e-6)


def test_blur_baseline_matches_the_functional_blur():
    model, x = TinyNet().eval(), tiny_input()
    by_name = camkit.IntegratedGradients(model, steps=5, baseline="blur", blur_sigma=1.5).explain(x, 0)
    by_tensor = camkit.IntegratedGradients(model, steps=5, baseline=CF.blur(x, 1.5)).explain(x, 0)
    torch.testing.assert_close(by_name.raw, by_tensor.raw)
    # blur keeps a constant image constant and does not touch its input
    flat = torch.full((1, 1, 5, 5), 2.0)
    assert torch.allclose(CF.blur(flat, 2.0), flat) and torch.equal(flat, torch.full((1, 1, 5, 5), 2.0))


def test_integrated_gradients_callable_target():
    model, x = TinyNet().eval(), tiny_input()
    by_callable = camkit.IntegratedGradients(model, steps=6).explain(x, lambda out: out[:, 2] - out[:, 0])
    by_class = [camkit.IntegratedGradients(model, steps=6).explain(x, c).raw for c in (2, 0)]
    torch.testing.assert_close(by_callable.raw, by_class[0] - by_class[1], atol=1e-5, rtol=1e-5)
    assert by_callable.target is None
