import warnings

import pytest
import torch
import torch.nn.functional as F
from debug_helpers import hook_count
from models import ResBlockNet, TinyNet, tiny_input
from torch import nn

from camkit.debug import InspectWarning, inspect


def _kinds(findings):
    return [(f.kind, f.layer) for f in findings]


def test_tinynet_inplace_relu_and_training_mode():
    model = TinyNet()
    model.train()
    before = model.bn1.running_mean.clone()
    findings = inspect(model, tiny_input(), warn=False)
    assert _kinds(findings) == [("inplace", "bn1"), ("training", "")]
    assert "'relu' (ReLU(inplace=True))" in findings[0].message
    assert "'bn1'" in findings[1].message
    assert torch.equal(model.bn1.running_mean, before)
    assert all(m.training for m in model.modules()) and hook_count(model) == 0
    model.eval()
    assert _kinds(inspect(model, tiny_input(), warn=False)) == [("inplace", "bn1")]


def test_resblock_functional_relu_and_inplace_add():
    model = ResBlockNet().eval()
    findings = inspect(model, tiny_input(), warn=False)
    assert _kinds(findings) == [("inplace", "bn2"), ("functional", "")]
    assert "code in the forward of the model" in findings[0].message
    assert "relu() 3 time(s)" in findings[1].message  # F.relu twice, F.relu(inplace=True) once
    assert _kinds(inspect(ResBlockNet(inplace=False).eval(), tiny_input(), warn=False)) == [("functional", "")]


def test_reused_module_and_sigmoid_called_in_a_block():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return torch.sigmoid(self.lin(x))

    act = nn.Tanh()
    net = nn.Sequential(Block(), act, nn.Linear(3, 3), act).eval()
    findings = inspect(net, torch.randn(2, 3), warn=False)
    assert _kinds(findings) == [("reused", "1"), ("functional", "0")]
    assert "runs 2 times" in findings[0].message and "sigmoid()" in findings[1].message


def test_clean_model_has_no_findings_and_warnings_are_issued():
    net = nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(72, 2)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inspect(net, tiny_input()) == []
    model = TinyNet().eval()
    with pytest.warns(InspectWarning, match="changed in place"):
        inspect(model, tiny_input())


def test_dropout_in_training_mode_and_relu_module_calls_are_not_functional():
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Dropout(0.5))
    findings = inspect(net, torch.randn(2, 3), warn=False)
    assert _kinds(findings) == [("training", "")]
    assert "'2'" in findings[0].message


def test_functional_inplace_on_input_of_model_is_not_reported_as_layer():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            y = self.lin(x)
            return F.relu(y + 0)  # no in-place, one functional call

    assert _kinds(inspect(Net(), torch.randn(1, 2), warn=False)) == [("functional", "")]
