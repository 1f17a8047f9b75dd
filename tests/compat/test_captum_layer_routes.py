"""camkit.compat.captum's layer and neuron methods on a layer's input, on layers of several tensors and on lists of layers.

The model is float64 and non-linear after every layer read (tanh), so that a wrong tensor or a
path that moves the tensors apart would show.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours

ca = pytest.importorskip("captum.attr")


class _Pair(nn.Module):
    """Two tensors in, two out."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(a + b[:, :1]), torch.tanh(b) * a[:, :1]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.act = nn.Tanh()
        self.lin_a, self.lin_b = nn.Linear(48, 4), nn.Linear(48, 2)
        self.pair = _Pair()
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.conv(x)).flatten(1)
        a, b = self.pair(self.lin_a(h), self.lin_b(h))
        return self.out(torch.cat([a, b], dim=1))


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return _Net().double().eval()


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 2, 4, 4, dtype=torch.float64)


def _close(a, b, atol: float = 1e-6) -> None:
    if isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for p, q in zip(a, b):
            _close(p, q, atol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("to_input", [False, True])
def test_layer_methods_on_a_layer_of_two_tensors_equal_captum(net, x, to_input):
    for name in ("LayerActivation", "LayerGradientXActivation"):
        kwargs = {} if name == "LayerActivation" else {"target": 1}
        mine = getattr(ours, name)(net, net.pair).attribute(x, attribute_to_layer_input=to_input, **kwargs)
        _close(mine, getattr(ca, name)(net, net.pair).attribute(x, attribute_to_layer_input=to_input, **kwargs))
        assert isinstance(mine, tuple) and len(mine) == 2
    for name in ("LayerIntegratedGradients", "LayerConductance"):
        mine, my_delta = getattr(ours, name)(net, net.pair).attribute(
            x, target=2, n_steps=6, attribute_to_layer_input=to_input, return_convergence_delta=True)
        theirs, delta = getattr(ca, name)(net, net.pair).attribute(
            x, target=2, n_steps=6, attribute_to_layer_input=to_input, return_convergence_delta=True)
        _close(mine, theirs, atol=1e-5)
        _close(my_delta, delta, atol=1e-5)


def test_layer_input_of_a_one_tensor_layer_equals_captum(net, x):
    for name in ("LayerGradientXActivation", "LayerGradCam"):
        _close(getattr(ours, name)(net, net.act).attribute(x, target=0, attribute_to_layer_input=True),
               getattr(ca, name)(net, net.act).attribute(x, target=0, attribute_to_layer_input=True))
    _close(ours.LayerIntegratedGradients(net, net.lin_b).attribute(x, target=0, n_steps=5, attribute_to_layer_input=True),
           ca.LayerIntegratedGradients(net, net.lin_b).attribute(x, target=0, n_steps=5, attribute_to_layer_input=True),
           atol=1e-6)
    _close(ours.GuidedGradCam(net, net.act).attribute(x, target=1, attribute_to_layer_input=True),
           ca.GuidedGradCam(net, net.act).attribute(x, target=1, attribute_to_layer_input=True))


def test_lists_of_layers_give_lists(net, x):
    layers = [net.conv, net.lin_a]
    _close(ours.LayerActivation(net, layers).attribute(x), ca.LayerActivation(net, layers).attribute(x))
    _close(ours.LayerGradientXActivation(net, layers).attribute(x, target=2),
           ca.LayerGradientXActivation(net, layers).attribute(x, target=2))
    for to_input in (False, True):  # two layers on one path, their outputs or their inputs
        both = [net.lin_a, net.lin_b]
        mine = ours.LayerIntegratedGradients(net, both).attribute(x, target=2, n_steps=6, attribute_to_layer_input=to_input,
                                                                   return_convergence_delta=True)
        theirs = ca.LayerIntegratedGradients(net, both).attribute(x, target=2, n_steps=6, attribute_to_layer_input=to_input,
                                                                   return_convergence_delta=True)
        _close(mine, theirs)


def test_neuron_of_a_layer_input_equals_captum(net, x):
    _close(ours.NeuronGradient(net, net.act).attribute(x, (1, 2, 0), attribute_to_neuron_input=True),
           ca.NeuronGradient(net, net.act).attribute(x, (1, 2, 0), attribute_to_neuron_input=True))
    _close(ours.NeuronIntegratedGradients(net, net.lin_a).attribute(x, (5,), n_steps=5, attribute_to_neuron_input=True),
           ca.NeuronIntegratedGradients(net, net.lin_a).attribute(x, (5,), n_steps=5, attribute_to_neuron_input=True))


def test_no_hook_is_left_and_the_model_is_unchanged(net, x):
    before = {k: v.clone() for k, v in net.state_dict().items()}
    ours.LayerConductance(net, net.pair).attribute(x, target=2, n_steps=3, attribute_to_layer_input=True)
    ours.NeuronGradient(net, net.act).attribute(x, (0, 0, 0), attribute_to_neuron_input=True)
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert not any(name == "probe" for name, _ in net.named_modules())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_grad_cam_of_a_layer_the_score_does_not_read_is_zero_with_materialised_gradients():
    class Side(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 4)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            self.unused(t)  # runs, but the output ignores it
            return self.used(t)

    torch.manual_seed(0)
    side = Side().double()
    t = torch.rand(2, 3, dtype=torch.float64)
    options = {"materialize_grads": True}
    mine = ours.LayerGradCam(side, side.unused).attribute(t, target=1, grad_kwargs=options)
    _close(mine, ca.LayerGradCam(side, side.unused).attribute(t, target=1, grad_kwargs=options))
    assert mine.shape == (2, 1) and not mine.any()
    with pytest.raises(RuntimeError, match="does not depend"):
        ours.LayerGradCam(side, side.unused).attribute(t, target=1)


@pytest.mark.parametrize("relu", [False, True])
def test_grad_cam_per_channel_equals_captum(net, x, relu):
    mine = ours.LayerGradCam(net, net.conv).attribute(x, target=2, attr_dim_summation=False, relu_attributions=relu)
    _close(mine, ca.LayerGradCam(net, net.conv).attribute(x, target=2, attr_dim_summation=False, relu_attributions=relu))
    assert mine.shape == (2, 3, 4, 4)
    summed = ours.LayerGradCam(net, net.conv).attribute(x, target=2)
    if not relu:
        _close(mine.sum(dim=1, keepdim=True), summed)
