"""The hygiene invariants and the output contract of every registered method on signals and volumes.

The same checks as ``test_invariants.py`` (which runs on images), on :class:`models.RankNet` with
one spatial axis (a signal [B, 3, 16]) and three (a volume or clip [B, 3, 4, 8, 8]). A method that
does not serve a rank must refuse it with a camkit error naming the rank; none does today.
"""

from __future__ import annotations

import pytest
import torch
from factories import FACTORIES, method_params
from models import RANK_SIZES, RankNet, TinyNet, rank_input, tiny_input
from test_invariants import _assert_same_state, _hook_count, _messy_model, _state

import camkit

METHODS = camkit.list_methods()
RANKS = (1, 3)


def _baselines(count: int, spatial_dims: int) -> torch.Tensor:
    shape = (count, 3, *RANK_SIZES[spatial_dims])
    return torch.linspace(-1, 1, torch.Size(shape).numel()).view(shape)


def _factory(key: str, spatial_dims: int):
    # The image factories, with baselines of the rank for the methods that take them.
    if key == "deepliftshap":
        return lambda m: camkit.DeepLiftShap(m, _baselines(3, spatial_dims))
    if key == "layerdeepliftshap":
        return lambda m: camkit.LayerDeepLiftShap(m, "conv2", _baselines(2, spatial_dims))
    if key == "gradientshap":
        return lambda m: camkit.GradientShap(m, _baselines(2, spatial_dims), samples=6, stdev=0.1, seed=0, max_batch=5)
    if key == "featureablation":
        # 8 regions, not 64: the drops of 64 tiny volume regions span ~1e-3, and min-max
        # normalisation would stretch Conv3d's batch-dependent rounding (1e-8) past the tolerance.
        return lambda m: camkit.FeatureAblation(m, cells=2, batch_size=7)
    return FACTORIES[key]


def _messy(spatial_dims: int) -> RankNet:
    return _messy_model(RankNet(spatial_dims))


def test_ranknet_2d_is_tinynet():
    x = tiny_input()
    torch.testing.assert_close(RankNet(2).eval()(x), TinyNet().eval()(x), rtol=0, atol=0)
    assert torch.equal(rank_input(2), x)


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("key", method_params(METHODS))
def test_contract_and_hygiene_any_rank(key, spatial_dims):
    model = _messy(spatial_dims)
    x = rank_input(spatial_dims)
    x_before = x.clone()
    before = _state(model)
    grad_mode = torch.is_grad_enabled()
    explanation = _factory(key, spatial_dims)(model).explain(x)
    assert explanation.maps.shape == (3, *RANK_SIZES[spatial_dims])
    assert explanation.spatial_dims == spatial_dims
    assert explanation.maps.dtype == torch.float32
    assert torch.isfinite(explanation.maps).all()
    assert explanation.maps.min() >= 0 and explanation.maps.max() <= 1
    assert explanation.flat.shape == (3,)
    assert explanation.method == key
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled() == grad_mode
    assert torch.equal(x, x_before) and not x.requires_grad
    _assert_same_state(before, _state(model))


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("key", method_params(METHODS))
def test_hygiene_after_exception_any_rank(key, spatial_dims):
    model = _messy(spatial_dims)
    before = _state(model)
    explainer = _factory(key, spatial_dims)(model)
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        explainer.explain(rank_input(spatial_dims))
    assert _hook_count(model) == 0
    assert torch.is_grad_enabled()
    _assert_same_state(before, _state(model))


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("key", method_params(METHODS))
def test_batch_equals_one_by_one_any_rank(key, spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=3)
    target = torch.tensor([0, 3, 1])
    batched = _factory(key, spatial_dims)(model).explain(x, target)
    for i in range(3):
        single = _factory(key, spatial_dims)(model).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.scores[i], single.scores[0], atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("key", method_params(METHODS))
def test_k_targets_equal_single_calls_any_rank(key, spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    targets = torch.tensor([[0, 2], [4, 1]])
    multi = _factory(key, spatial_dims)(model).explain(x, targets)
    assert multi.maps.shape == (2, 2, *RANK_SIZES[spatial_dims])
    assert multi.spatial_dims == spatial_dims
    for k in range(2):
        single = _factory(key, spatial_dims)(model).explain(x, targets[:, k])
        torch.testing.assert_close(multi.maps[:, k], single.maps, atol=1e-5, rtol=0)


def test_rank_the_model_does_not_take_is_refused():
    explainer = camkit.GradCAM(RankNet(3), "conv2")
    with pytest.raises(camkit.InvalidInputError, match=r"takes volumes or videos \[B, C, D, H, W\].*Conv3d"):
        explainer.explain(rank_input(2))
    with pytest.raises(camkit.InvalidInputError, match=r"takes 3 channel\(s\), but x has 1"):
        explainer.explain(torch.rand(2, 1, 4, 8, 8))
    with pytest.raises(camkit.InvalidInputError, match=r"\[B, C, T\].*\[B, C, D, H, W\].*x\[:, None\]"):
        camkit.GradCAM(RankNet(1), "conv2").explain(torch.rand(2, 16))


def test_frame_share_of_a_video_map():
    model = RankNet(3).eval()
    e = camkit.GradCAM(model, "conv2").explain(rank_input(3, batch=2))
    share = e.frame_share
    assert share.shape == (2, 4)
    torch.testing.assert_close(share.sum(dim=1), torch.ones(2))
    torch.testing.assert_close(share, e.maps.sum(dim=(2, 3)) / e.maps.sum(dim=(1, 2, 3))[:, None])
    with pytest.raises(camkit.InvalidInputError, match="frame_share needs maps of a video"):
        _ = camkit.GradCAM(RankNet(1).eval(), "conv2").explain(rank_input(1)).frame_share


def test_figures_draw_volumes_and_signals_by_rank():
    """Issue 27: figures draw these ranks (their layouts are tested in tests/viz/test_rank_figures.py)."""
    pytest.importorskip("matplotlib")
    model = RankNet(3).eval()
    x = rank_input(3, batch=2)
    e = camkit.GradCAM(model, "conv2").explain(x)
    assert camkit.figure(x.sigmoid(), e, kind="volume", dpi=30).columns == ("axis 0", "axis 1", "axis 2")
    with pytest.raises(camkit.InvalidInputError, match=r"outside \[0, 1\].*pass mean= and std="):
        camkit.figure(x, e)  # three channels, drawn as a video: a normalised clip needs its mean and std
    signal = rank_input(1, batch=2)
    fig = camkit.figure(signal, camkit.GradCAM(RankNet(1).eval(), "conv2").explain(signal), dpi=30)
    assert fig.columns == ("signal", "map")
