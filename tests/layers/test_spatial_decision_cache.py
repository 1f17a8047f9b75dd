"""The check that an architecture's default layer is spatial: one forward for all its layers, kept per input shape."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.layers import resolve
from camkit.layers.auto import all_spatial_here, is_spatial_here


def _forwards(model: nn.Module) -> list[tuple[int, ...]]:
    seen: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    return seen


def test_a_second_explainer_of_the_same_model_and_shape_runs_no_extra_forward(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()  # fmt: skip
    monkeypatch.setattr(resolve, "default_layer", lambda m: "3" if m is model else None)  # a known family's default
    seen = _forwards(model)
    x = torch.rand(2, 3, 16, 16)
    camkit.GradCAM(model)(x)
    assert seen == [(1, 3, 16, 16), (2, 3, 16, 16)]  # the check on one image, then the call
    seen.clear()
    explainer = camkit.GradCAMPlusPlus(model)
    maps = explainer(x)
    assert seen == [(2, 3, 16, 16)]  # the decision is reused
    assert explainer.layers()[0][0] == "3" and maps.shape == (2, 16, 16)
    seen.clear()
    camkit.GradCAM(model)(torch.rand(1, 3, 24, 24))
    assert seen == [(1, 3, 24, 24), (1, 3, 24, 24)]  # another shape: checked again
    seen.clear()
    with pytest.warns(camkit.errors.CamkitWarning, match="gives no spatial map"):
        camkit.GradCAM(model)(torch.rand(2, 3, 4, 4))  # 1x1 at the default layer here: the rule picks another
    with pytest.warns(camkit.errors.CamkitWarning, match="gives no spatial map"):
        camkit.GradCAM(model)(torch.rand(2, 3, 4, 4))  # the decision kept says so again, without the check's forward
    assert seen[0] == (1, 3, 4, 4) and (1, 3, 4, 4) not in seen[1:]


def test_a_changed_model_is_checked_again():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1))
    seen = _forwards(model)
    x = torch.rand(1, 3, 8, 8)
    assert is_spatial_here(model, "0", model[0], x, None)
    assert is_spatial_here(model, "0", model[0], x, None)
    assert len(seen) == 1
    model[0] = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1))  # now a 1x1 output
    assert not is_spatial_here(model, "0", model[0], x, None)
    assert len(seen) == 2


def test_several_layers_are_judged_in_one_forward():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3), nn.AdaptiveAvgPool2d(1))
    seen = _forwards(model)
    x = torch.rand(1, 3, 8, 8)
    assert all_spatial_here(model, [("0", model[0]), ("1", model[1])], x, None)
    assert not all_spatial_here(model, [("0", model[0]), ("2", model[2])], x, None)
    assert len(seen) == 2
    calls = []
    assert all_spatial_here(model, [("0", model[0])], x, lambda batch: calls.append(1) or model(batch))
    assert all_spatial_here(model, [("0", model[0])], x, lambda batch: calls.append(1) or model(batch))
    assert calls == [1, 1]  # with a forward of the caller's (other inputs matter), never kept
