"""Hygiene invariants generated for every registered method (house style)."""

from __future__ import annotations

import warnings

import pytest
import torch
from factories import FACTORIES, method_params
from models import TinyNet, tiny_input
from torch import nn

import camkit

METHODS = camkit.list_methods()


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._backward_pre_hooks)
        for m in model.modules()
    )


def _state(model: nn.Module):
    return (
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        {k: v.clone() for k, v in model.state_dict().items()},
    )


def _assert_same_state(before, after) -> None:
    assert before[0] == after[0], "training flags changed"
    assert before[1] == after[1], "requires_grad changed"
    for g0, g1 in zip(before[2], after[2]):
        assert (g0 is None) == (g1 is None), "param.grad created or removed"
        if g0 is not None:
            assert torch.equal(g0, g1), "param.grad changed"
    for key in before[3]:
        assert torch.equal(before[3][key], after[3][key]), f"state_dict entry {key} changed"


def _messy_model(model: TinyNet | None = None) -> TinyNet:
    """Mixed training flags, a frozen parameter and existing gradients (on ``model``, default a TinyNet)."""
    model = TinyNet() if model is None else model
    model.train()
    model.bn1.eval()
    model.conv1.weight.requires_grad_(False)
    model.fc.weight.grad = torch.randn_like(model.fc.weight)
    return model


def test_every_method_has_a_factory():
    assert sorted(FACTORIES) == METHODS


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(METHODS))
def test_contract_and_hygiene(key):
    model = _messy_model()
    x = tiny_input()
    x_before = x.clone()
    before = _state(model)
    grad_mode = torch.is_grad_enabled()
    explanation = FACTORIES[key](model).explain(x)
    assert explanation.maps.shape == (3, 8, 8)
    assert explanation.maps.dtype == torch.float32
    assert torch.isfinite(explanation.maps).all()
    assert explanation.maps.min() >= 0 and explanation.maps.max() <= 1
    assert explanation.method == key
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled() == grad_mode
    assert torch.equal(x, x_before) and not x.requires_grad
    _assert_same_state(before, _state(model))


@pytest.mark.parametrize("key", method_params(METHODS))
def test_hygiene_after_exception_in_forward(key):
    model = _messy_model()
    before = _state(model)
    explainer = FACTORIES[key](model)
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        explainer.explain(tiny_input())
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled()
    _assert_same_state(before, _state(model))


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(METHODS))
def test_hygiene_after_bad_target(key):
    model = _messy_model()
    before = _state(model)
    explainer = FACTORIES[key](model)
    with pytest.raises(camkit.InvalidTargetError):
        explainer.explain(tiny_input(), target=99)
    with pytest.raises(camkit.InvalidTargetError):
        explainer.explain(tiny_input(batch=3), target=[0, 1])  # shorter than the batch
    assert _hook_count(model) == 0
    _assert_same_state(before, _state(model))


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(METHODS))
def test_batch_equals_one_by_one(key):
    model = TinyNet().eval()
    x = tiny_input(batch=4)
    target = torch.tensor([0, 3, 1, 4])
    batched = FACTORIES[key](model).explain(x, target)
    for i in range(4):
        single = FACTORIES[key](model).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.scores[i], single.scores[0], atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(METHODS))
def test_k_targets_equal_single_calls(key):
    model = TinyNet().eval()
    x = tiny_input(batch=2)
    targets = torch.tensor([[0, 2], [4, 1]])
    multi = FACTORIES[key](model).explain(x, targets)
    assert multi.maps.shape == (2, 2, 8, 8)
    for k in range(2):
        single = FACTORIES[key](model).explain(x, targets[:, k])
        torch.testing.assert_close(multi.maps[:, k], single.maps, atol=1e-5, rtol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(METHODS))
def test_works_under_outer_no_grad_and_refuses_inference_mode(key):
    model = TinyNet().eval()
    x = tiny_input()
    expected = FACTORIES[key](model).explain(x).maps
    with torch.no_grad():
        inside = FACTORIES[key](model).explain(x).maps
        assert not torch.is_grad_enabled(), "the outer no_grad was not restored"
    torch.testing.assert_close(inside, expected, atol=1e-6, rtol=0)
    explainer = FACTORIES[key](model)
    if explainer.needs_grad:
        with torch.inference_mode(), pytest.raises(camkit.InferenceModeError, match="inference_mode"):
            explainer.explain(x)


class _RootOfZero(nn.Module):
    """A classifier whose backward meets 0 * inf (the gradient of a square root at 0) when ``broken``."""

    def __init__(self, broken: bool) -> None:
        super().__init__()
        self.broken = broken
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = self.conv(x)
        out = self.fc(h.mean(dim=(2, 3)))
        if self.broken:  # adds 0 to the output, and NaN to every gradient that reaches h
            out = out + 0 * (h * 0).sqrt().sum(dim=(1, 2, 3))[:, None]
        return out


@pytest.mark.parametrize("key", ["gradcam", "saliency"])
def test_maps_that_are_not_finite_come_back_as_they_are_with_a_warning(key):
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    make = (lambda m: camkit.GradCAM(m, "conv")) if key == "gradcam" else camkit.Saliency
    with pytest.warns(camkit.CamkitWarning, match=rf"{key}: some maps are NaN or infinite .*find_nonfinite"):
        broken = make(_RootOfZero(True)).explain(x, 1)
    assert torch.isnan(broken.maps).all() and not broken.flat.any()  # not zeros that would pass for a map
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        healthy = make(_RootOfZero(False)).explain(x, 1)
    assert torch.isfinite(healthy.maps).all()
