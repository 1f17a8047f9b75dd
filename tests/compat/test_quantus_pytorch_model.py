"""camkit's translation of Quantus's ``PyTorchModel`` against Quantus 0.6.0's own wrapper."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat.quantus.functions.pytorch_model import PyTorchModel

quantus_model = pytest.importorskip("quantus.helpers.model.pytorch_model")


def net(softmax_last: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 5, 4)]
    return nn.Sequential(*layers, *([nn.Softmax(dim=-1)] if softmax_last else [])).eval()


X = np.random.RandomState(0).rand(2, 1, 6, 7).astype(np.float32)


@pytest.mark.parametrize("softmax_last", [False, True])
@pytest.mark.parametrize("softmax", [False, True])
def test_predict_equals_quantus_and_leaves_the_model_alone(softmax_last: bool, softmax: bool) -> None:
    model = net(softmax_last)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = quantus_model.PyTorchModel(net(softmax_last), softmax=softmax).predict(X)
        got = PyTorchModel(model, softmax=softmax).predict(X)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    if softmax:
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)
    assert isinstance(model[-1], nn.Softmax) == softmax_last  # the softmax is removed from a copy only
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_predict_refuses_a_model_in_training_mode() -> None:
    with pytest.raises(AttributeError, match="evaluation mode"):
        PyTorchModel(net().train()).predict(X)


@pytest.mark.parametrize("order", ["top_down", "bottom_up", "independent"])
def test_random_layer_generator_equals_quantus(order: str) -> None:
    ours = [(n, {k: v.clone() for k, v in m.state_dict().items()}) for n, m in PyTorchModel(net()).get_random_layer_generator(order)]
    theirs = [(n, {k: v.clone() for k, v in m.state_dict().items()})
              for n, m in quantus_model.PyTorchModel(net()).get_random_layer_generator(order)]  # fmt: skip
    assert [n for n, _ in ours] == [n for n, _ in theirs] == (["3", "0"] if order == "top_down" else ["0", "3"])
    for (_, a), (_, b) in zip(ours, theirs):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert PyTorchModel(net()).random_layer_generator_length == 2


def test_mean_shift_absorbs_the_shift_and_equals_quantus_without_padding() -> None:
    shifted = PyTorchModel(net()).add_mean_shift_to_first_layer(-1.0, (2, 1, 6, 7))
    theirs = quantus_model.PyTorchModel(net()).add_mean_shift_to_first_layer(-1.0, (2, 1, 6, 7))
    x = torch.as_tensor(X)
    with torch.no_grad():
        torch.testing.assert_close(shifted(x - 1.0), net()(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(shifted[0].bias, theirs[0].bias, rtol=1e-5, atol=1e-6)


def test_hidden_representations_equal_quantus_for_names_and_count_negative_indices_as_python() -> None:
    ours, theirs = PyTorchModel(net()), quantus_model.PyTorchModel(net())
    np.testing.assert_allclose(ours.get_hidden_representations(X), theirs.get_hidden_representations(X), rtol=1e-6)
    np.testing.assert_allclose(
        ours.get_hidden_representations(X, layer_names=["1"]), theirs.get_hidden_representations(X, layer_names=["1"])
    )
    assert ours.get_hidden_representations(X, layer_indices=[-1]).shape == (2, 4)  # the last layer, Linear(60, 4)
    with pytest.raises(ValueError, match="No hidden"):
        theirs.get_hidden_representations(X, layer_indices=[-1])  # Quantus counts from the end of every module


def test_shape_input_and_sample() -> None:
    wrapped = PyTorchModel(net())
    assert wrapped.shape_input(np.zeros((1, 42)), (1, 6, 7)).shape == (1, 1, 6, 7)
    with pytest.raises(ValueError, match="channel_first"):
        PyTorchModel(net(), channel_first=False).shape_input(np.zeros((1, 42)), (1, 6, 7))
    same = wrapped.sample(mean=1.0, std=0.0)
    assert same is not wrapped.model and all(torch.equal(a, b) for a, b in zip(same.parameters(), net().parameters()))
