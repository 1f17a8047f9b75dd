"""NeuronTarget: one channel or unit of a layer as the target of any explainer."""

from __future__ import annotations

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

import camkit


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _conv2(net: TinyNet, x: torch.Tensor) -> torch.Tensor:
    return net.conv2(net.relu(net.bn1(net.conv1(x))))


def test_scores_are_the_unit_by_hand():
    net = TinyNet().eval()
    x = tiny_input()
    with torch.no_grad():
        act = _conv2(net, x)
    cases = [
        (camkit.NeuronTarget("conv2", 4), act[:, 4].mean(dim=(1, 2))),
        (camkit.NeuronTarget("conv2", 4, reduce="sum"), act[:, 4].sum(dim=(1, 2))),
        (camkit.NeuronTarget("conv2", 4, reduce="max"), act[:, 4].amax(dim=(1, 2))),
        (camkit.NeuronTarget(net.conv2, 1, position=(2, 5)), act[:, 1, 2, 5]),
    ]
    for target, expected in cases:
        e = camkit.Saliency(net).explain(x, target=target)
        torch.testing.assert_close(e.scores, expected, atol=1e-6, rtol=0)
        assert e.target is None and _hooks(net) == 0


def test_saliency_of_a_unit_by_hand():
    # unit = conv(x)[0, 0, 0, 1] of a 3x3 convolution with padding 1: its input gradient is the
    # kernel, placed around pixel (0, 1) and cut at the border.
    conv = nn.Conv2d(1, 1, 3, padding=1, bias=False)
    net = nn.Sequential(conv, nn.Flatten(), nn.Linear(9, 2))
    with torch.no_grad():
        conv.weight.copy_(torch.arange(9.0).view(1, 1, 3, 3))
    raw = camkit.Saliency(net).explain(torch.rand(1, 1, 3, 3), target=camkit.NeuronTarget("0", 0, (0, 1))).raw
    assert raw[0, 0].tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [0.0, 0.0, 0.0]]


def test_gradcam_at_an_earlier_layer_and_occlusion():
    net = TinyNet().eval()
    x = tiny_input()
    target = camkit.NeuronTarget("conv2", 2)
    maps = camkit.GradCAM(net, "conv1").explain(x, target=target).maps
    assert maps.shape == (3, 8, 8) and _hooks(net) == 0
    occ = camkit.Occlusion(net, window=4, stride=4).explain(x[:1], target=target)
    with torch.no_grad():
        covered = x[:1].clone()
        covered[..., :4, :4] = 0
        drop = _conv2(net, x[:1])[0, 2].mean() - _conv2(net, covered)[0, 2].mean()
    assert occ.raw[0, 0, 0].item() == pytest.approx(drop.item(), abs=1e-5)


def test_errors():
    net = TinyNet().eval()
    x = tiny_input()
    with pytest.raises(camkit.InvalidTargetError, match="target= to a camkit explainer"):
        camkit.NeuronTarget("conv2", 0)(net(x))
    with pytest.raises(camkit.InvalidTargetError, match="out of range"):
        camkit.Saliency(net).explain(x, target=camkit.NeuronTarget("conv2", 6))
    with pytest.raises(camkit.InvalidTargetError, match="position"):
        camkit.Saliency(net).explain(x, target=camkit.NeuronTarget("conv2", 0, (8, 0)))
    with pytest.raises(camkit.LayerNotFoundError):
        camkit.Saliency(net).explain(x, target=camkit.NeuronTarget("conv9", 0))
    assert _hooks(net) == 0


captum_attr = pytest.importorskip("captum.attr", reason="captum is not installed")


def test_matches_captum_neuron_methods():
    net = TinyNet().eval()
    x = tiny_input()
    target = camkit.NeuronTarget("conv2", 3, (4, 2))
    ours = camkit.Saliency(net).explain(x, target=target).raw
    theirs = captum_attr.NeuronGradient(net, net.conv2).attribute(x, neuron_selector=(3, 4, 2))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    ours = camkit.IntegratedGradients(net, steps=16).explain(x, target=target).raw
    theirs = captum_attr.NeuronIntegratedGradients(net, net.conv2).attribute(x, (3, 4, 2), n_steps=16)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    ours = camkit.GuidedBackprop(net).explain(x, target=target).raw
    theirs = captum_attr.NeuronGuidedBackprop(net, net.conv2).attribute(x, (3, 4, 2))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_gradcam_on_the_neurons_own_layer_is_that_channel_by_hand(reduce):
    # The score is the mean (or sum) of channel 5 of conv2's output A, so dS/dA is a constant on
    # channel 5 and zero elsewhere: Grad-CAM's weights pick that channel, and its map is relu(A_5)
    # (up to a positive factor that normalisation removes). The target reads the layer through
    # the capture's copy, so the gradient reaches the captured activation.
    net = TinyNet().eval()
    x = tiny_input()
    explanation = camkit.GradCAM(net, "conv2").explain(x, target=camkit.NeuronTarget("conv2", 5, reduce=reduce))
    with torch.no_grad():
        act = _conv2(net, x)[:, 5].clamp_min(0)
    low = act.amin(dim=(1, 2), keepdim=True)
    high = act.amax(dim=(1, 2), keepdim=True)
    expected = (act - low) / (high - low)
    assert not explanation.flat.any()
    torch.testing.assert_close(explanation.maps, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(explanation.scores, _conv2(net, x)[:, 5].mean(dim=(1, 2)) * (1 if reduce == "mean" else 64))
    assert _hooks(net) == 0
