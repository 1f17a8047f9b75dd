import pytest
import torch
from debug_helpers import hook_count
from models import TinyNet, tiny_input
from torch import nn

from camkit.debug import GradientEditor


def _linear():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        net[0].bias.copy_(torch.tensor([0.5, -0.5]))
        net[1].weight.copy_(torch.tensor([[2.0, -3.0]]))
        net[1].bias.zero_()
    return net


X = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
# loss = out.sum(): grad wrt h = net[0](X) is W1 per sample: [[2, -3], [2, -3]]
# dW0 = g^T X = [[2*1 + 2*3, 2*2 + 2*-1], [-3*1 - 3*3, -3*2 - 3*-1]] = [[8, 2], [-12, -3]]; db0 = [4, -6]
# dW1 = sum over samples of h: h = [[5.5, 10.5], [1.5, 4.5]] -> [[7, 15]]; db1 = [2]
DW0 = torch.tensor([[8.0, 2.0], [-12.0, -3.0]])
DB0 = torch.tensor([4.0, -6.0])
DW1 = torch.tensor([[7.0, 15.0]])


def _backward(net):
    net.zero_grad(set_to_none=True)
    net(X).sum().backward()


def test_hand_computed_gradients_without_edits():
    net = _linear()
    _backward(net)
    assert torch.equal(net[0].weight.grad, DW0) and torch.equal(net[0].bias.grad, DB0)
    assert torch.equal(net[1].weight.grad, DW1)


def test_clip_value_on_parameters_then_gone():
    net = _linear()
    with GradientEditor(net) as edit:
        edit.clip_value("0", 5.0)  # module name: all its parameters
        _backward(net)
        assert torch.equal(net[0].weight.grad, torch.tensor([[5.0, 2.0], [-5.0, -3.0]]))
        assert torch.equal(net[0].bias.grad, torch.tensor([4.0, -5.0]))
        assert torch.equal(net[1].weight.grad, DW1)  # not targeted
    assert hook_count(net) == 0
    _backward(net)
    assert torch.equal(net[0].weight.grad, DW0)


def test_clip_norm_per_tensor_scale_and_zero_by_parameter_name():
    net = _linear()
    with GradientEditor(net) as edit:
        edit.clip_norm(["0.weight", "0.bias"], 10.0)
        edit.scale(net[1].weight, 0.5)
        edit.zero("1.bias")
        _backward(net)
    # |DW0| = sqrt(64 + 4 + 144 + 9) = sqrt(221) > 10 -> rescaled to norm 10; |DB0| = sqrt(52) < 10 -> unchanged
    assert torch.allclose(net[0].weight.grad, DW0 * 10 / 221**0.5)
    assert net[0].weight.grad.norm().item() == pytest.approx(10.0, rel=1e-6)
    assert torch.equal(net[0].bias.grad, DB0)
    assert torch.equal(net[1].weight.grad, DW1 * 0.5)
    assert torch.equal(net[1].bias.grad, torch.zeros(1))
    assert hook_count(net) == 0


def test_activation_edits_change_what_earlier_layers_receive():
    net = _linear()
    with GradientEditor(net) as edit:
        edit.scale("0", 3.0, on="activations")
        _backward(net)
        assert torch.equal(net[0].weight.grad, 3 * DW0) and torch.equal(net[0].bias.grad, 3 * DB0)
        assert torch.equal(net[1].weight.grad, DW1)  # the later layer is not affected
    net2 = _linear()
    with GradientEditor(net2) as edit:
        handle = edit.clip_norm("0", 1.0, on="activations")
        # g = [[2, -3], [2, -3]] has norm sqrt(26): scaled by 1/sqrt(26)
        _backward(net2)
        assert torch.allclose(net2[0].weight.grad, DW0 / 26**0.5)
        handle.remove()  # this edit alone
        _backward(net2)
        assert torch.equal(net2[0].weight.grad, DW0)
    assert hook_count(net2) == 0


def test_activation_clip_value_and_zero_with_inplace_relu_after_the_layer():
    model = TinyNet()
    x = tiny_input()
    with GradientEditor(model) as edit:
        edit.zero("bn1", on="activations")  # bn1 is followed by ReLU(inplace=True)
        model(x).sum().backward()
    assert model.conv1.weight.grad.abs().sum() == 0 and model.bn1.weight.grad.abs().sum() == 0
    assert model.conv2.weight.grad.abs().sum() > 0
    assert hook_count(model) == 0
    # clip by value on conv2's output: compare with a manual clamp of the same gradient
    model.zero_grad(set_to_none=True)
    out2 = model.relu(model.bn1(model.conv1(x)))
    c2 = model.conv2(out2)
    score = model.fc(model.pool(model.relu2(c2)).flatten(1)).sum()
    (g,) = torch.autograd.grad(score, [c2], retain_graph=True)
    limit = g.abs().max().item() / 4
    (expected,) = torch.autograd.grad(c2, [model.conv1.weight], grad_outputs=g.clamp(-limit, limit))
    with GradientEditor(model) as edit:
        edit.clip_value("conv2", limit, on="activations")
        model(x).sum().backward()
    assert torch.allclose(model.conv1.weight.grad, expected, atol=1e-6)


def test_errors_and_cleanup_on_bad_targets():
    net = _linear()
    with GradientEditor(net) as edit:
        with pytest.raises(ValueError, match="on='parameters'"):
            edit.scale("0.weight", 2.0, on="activations")
        with pytest.raises(KeyError, match="no layer 'lin'"):
            edit.zero("lin")
        with pytest.raises(ValueError, match="max_norm"):
            edit.clip_norm("0", 0.0)
        with pytest.raises(ValueError, match="'parameters' or 'activations'"):
            edit.zero("0", on="outputs")
        net[1].weight.requires_grad_(False)
        with pytest.raises(ValueError, match="does not require grad"):
            edit.zero("1.weight")
        net[1].weight.requires_grad_(True)
        assert hook_count(net) == 0


def test_long_lived_activation_edit_keeps_a_bounded_number_of_handles():
    net = _linear()
    with GradientEditor(net) as edit:
        scope = edit.scale("0", 1.0, on="activations")
        for _ in range(300):
            net(X).sum().backward()  # each forward hooks a fresh output tensor, freed after backward
        assert len(scope) <= 129  # one module hook + tensor hooks of freed tensors pruned as new ones arrive
    assert len(scope) == 0 and hook_count(net) == 0
