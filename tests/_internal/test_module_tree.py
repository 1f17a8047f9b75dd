"""What explainers keep of a model's structure between calls, and when they walk it again."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit._internal.state import ModuleTree, eval_mode, module_tree_version


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 2)).eval()  # fmt: skip


def test_the_tree_is_walked_again_when_a_submodule_is_added_or_replaced():
    net = _net()
    tree = ModuleTree(net)
    first = tree.modules()
    assert tree.modules() is first  # nothing changed: no walk
    assert [id(m) for m in first] == [id(m) for m in net.modules()]
    net.append(nn.Dropout())
    assert len(tree.modules()) == len(first) + 1
    net[1] = nn.GELU()  # replaced under the same name
    assert any(isinstance(m, nn.GELU) for m in tree.modules())
    assert not any(isinstance(m, nn.ReLU) for m in tree.modules())


def test_the_version_moves_on_any_registration():
    before = module_tree_version()
    nn.Sequential(nn.Linear(1, 1))
    assert module_tree_version() > before


def test_eval_mode_with_a_kept_walk_switches_and_restores_every_flag():
    net = _net()
    net[4].train()
    tree = ModuleTree(net)
    with eval_mode(net, modules=tree.modules()):
        assert not any(m.training for m in net.modules())
    assert [m.training for m in net.modules()] == [False, False, False, False, False, True]


def test_explainer_sees_a_training_head_added_after_its_first_call():
    torch.manual_seed(0)
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    explainer = camkit.GradCAM(net, "0")
    explainer(x, 0)
    net[4] = nn.Sequential(nn.Dropout(0.9), nn.Linear(4, 2))  # a new head, in train mode as made
    seen = []
    net[4][0].register_forward_hook(lambda m, i, o: seen.append(m.training))
    first = explainer(x, 0)
    assert seen == [False]  # run in eval mode: the kept walk was renewed
    assert torch.equal(first, explainer(x, 0))  # no dropout noise
    assert net[4][0].training  # and the flag put back


def test_explainer_follows_the_model_dtype_and_its_first_convolution():
    net = _net()
    explainer = camkit.GradCAM(net, "0")
    x = torch.rand(1, 3, 8, 8)
    explainer(x, 0)
    net.double()  # parameters converted in place
    assert explainer._match_dtype(x).dtype == torch.float64
    net[0].weight = nn.Parameter(net[0].weight.detach().half())  # replaced, no submodule added
    assert explainer._match_dtype(x.double()).dtype == torch.float16
    net[0] = nn.Conv2d(1, 4, 3, padding=1)  # a new stem that takes one channel
    with pytest.raises(camkit.errors.InvalidInputError, match="takes 1 channel"):
        explainer(x.float(), 0)
