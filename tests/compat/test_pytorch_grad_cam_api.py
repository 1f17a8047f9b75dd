"""Every public module path and name of grad-cam 1.5.7 in camkit.compat.pytorch_grad_cam, and the
smaller pieces (sobel_cam, the guided ReLU, dff, the constants and helpers) equal to the original's."""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import pytorch_grad_cam as ours
from camkit.compat.pytorch_grad_cam.ablation_cam_multilayer import AblationCAM as MultiAblation
from camkit.compat.pytorch_grad_cam.feature_factorization.deep_feature_factorization import dff
from camkit.compat.pytorch_grad_cam.guided_backprop import GuidedBackpropReLU, GuidedBackpropReLUasModule
from camkit.compat.pytorch_grad_cam.metrics.arcc import batch_pearson_coherency
from camkit.compat.pytorch_grad_cam.sobel_cam import sobel_cam
from camkit.compat.pytorch_grad_cam.utils import find_layers
from camkit.compat.pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from camkit.errors import InvalidInputError

pgc = pytest.importorskip("pytorch_grad_cam")
pytest.importorskip("cv2")

#: names the original's namespace holds only as a side effect of its own imports
_INCIDENTAL = {("pytorch_grad_cam", "pytorch_grad_cam")}


def _public(module) -> list[str]:
    """The module's own public names: what it defines, and (for a package) what it imports from its submodules."""
    names = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        home = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if home == module.__name__ or (hasattr(module, "__path__") and str(home).startswith("pytorch_grad_cam")):
            names.append(name)
    return names


def test_every_module_and_public_name_of_the_original_is_here():
    missing = []
    modules = ["pytorch_grad_cam", *(m.name for m in pkgutil.walk_packages(pgc.__path__, "pytorch_grad_cam."))]
    assert len(modules) >= 38
    for name in modules:
        theirs = importlib.import_module(name)
        try:
            mine = importlib.import_module("camkit.compat." + name)
        except ImportError:
            missing.append(name)
            continue
        missing += [f"{name}.{n}" for n in _public(theirs) if (name, n) not in _INCIDENTAL and not hasattr(mine, n)]
    assert missing == []


def test_sobel_cam_equals_the_originals():
    from pytorch_grad_cam.sobel_cam import sobel_cam as theirs
    from skimage import data

    rng = np.random.default_rng(0)
    for img in (data.astronaut()[::2, ::2], rng.integers(0, 256, (7, 9, 3), dtype=np.uint8),
                rng.integers(0, 256, (2, 2, 3), dtype=np.uint8)):
        kept = img.copy()
        mine = sobel_cam(img)
        assert mine.dtype == np.uint8 and mine.shape == img.shape[:2]
        np.testing.assert_array_equal(mine, theirs(img))
        np.testing.assert_array_equal(img, kept)
    step = np.zeros((3, 4, 3), np.uint8)
    step[:, 2:] = 255
    # |gx| saturates at 255 next to the step, |gy| is 0: (255 + 0) / 2 rounds half to even
    assert sobel_cam(step).tolist() == [[0, 128, 128, 0]] * 3
    with pytest.raises(InvalidInputError, match="uint8"):
        sobel_cam(step.astype(np.float32))
    with pytest.raises(InvalidInputError, match="2 x 2"):
        sobel_cam(step[:1])


def test_guided_relu_function_and_module_equal_the_originals():
    from pytorch_grad_cam.guided_backprop import GuidedBackpropReLU as Theirs
    from pytorch_grad_cam.guided_backprop import GuidedBackpropReLUasModule as TheirModule

    x = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    upstream = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (GuidedBackpropReLU.apply, Theirs.apply, GuidedBackpropReLUasModule(), TheirModule()):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        torch.testing.assert_close(out, x.clamp_min(0), rtol=0, atol=0)
        out.backward(upstream)
        grads.append(leaf.grad)
    expected = upstream.clamp_min(0) * (x > 0)  # the guided rule, written out
    for grad in grads:
        torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def test_batch_pearson_coherency_equals_the_originals():
    from pytorch_grad_cam.metrics.arcc import batch_pearson_coherency as theirs

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a, b = rng.random((3, 4, 5)).astype(dtype), rng.random((3, 4, 5)).astype(dtype)
        b[1] = 2 * a[1] + 1  # a perfect correlation
        mine = batch_pearson_coherency(a, b)
        assert mine.dtype == dtype and mine.shape == (3,)
        np.testing.assert_allclose(mine, theirs(a, b), rtol=0, atol=1e-6)
        assert abs(mine[1] - 1) < 1e-6


def test_constants_window_starts_and_package_level_helpers_equal_the_originals():
    from pytorch_grad_cam.finer_cam import DEFAULT_COMPARISON_CATEGORIES
    from pytorch_grad_cam.metrics.road import neighbors_weights
    from pytorch_grad_cam.sess import window_starts

    from camkit.compat.pytorch_grad_cam import finer_cam as our_finer
    from camkit.compat.pytorch_grad_cam.metrics import road as our_road
    from camkit.compat.pytorch_grad_cam.sess import window_starts as our_starts

    assert our_finer.DEFAULT_COMPARISON_CATEGORIES == DEFAULT_COMPARISON_CATEGORIES
    assert our_road.neighbors_weights == neighbors_weights
    assert sum(w for _, w in our_road.neighbors_weights) == pytest.approx(1.0)
    for length, step, window in [(10, 4, 4), (8, 4, 4), (3, 4, 4), (224, 112, 224), (300, 50, 64)]:
        assert our_starts(length, step_size=step, window_size=window) == window_starts(length, step, window)
    assert ours.deprocess_image is ours.utils.image.deprocess_image
    assert ours.get_2d_projection is ours.utils.svd_on_activations.get_2d_projection
    assert ours.grad_cam.GradCAM is ours.GradCAM and ours.score_cam.ScoreCAM is ours.ScoreCAM


def test_layer_replacers_change_the_model_as_the_originals_do():
    from pytorch_grad_cam.utils import find_layers as theirs

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Sequential(nn.Conv2d(2, 2, 1), nn.ReLU()))
    results = []
    for lib in (find_layers, theirs):
        model = copy.deepcopy(net)
        assert lib.replace_layer_recursive(model, model[2][0], nn.Tanh()) is True
        assert lib.replace_layer_recursive(model, nn.Linear(1, 1), nn.Tanh()) is False
        lib.replace_all_layer_type_recursive(model, nn.ReLU, nn.ELU())
        results.append([type(m).__name__ for m in model.modules()])
    # one ELU instance in both places: modules() lists it once
    assert results[0] == results[1] == ["Sequential", "Conv2d", "ELU", "Sequential", "Tanh"]
    assert [type(m).__name__ for m in net.modules()].count("ReLU") == 2  # the copies changed, not net


def test_dff_factorises_the_batch_jointly_like_the_original_without_touching_nans():
    from pytorch_grad_cam.feature_factorization.deep_feature_factorization import dff as theirs

    rng = np.random.default_rng(0)
    w0, h0 = rng.random((6, 3)), rng.random((3, 2 * 4 * 4))
    activations = (w0 @ h0).reshape(6, 2, 4, 4).transpose(1, 0, 2, 3).astype(np.float32) - 0.25
    activations[0, 0, 0, 0] = np.nan
    kept = activations.copy()
    concepts, maps = dff(activations, n_components=3)
    np.testing.assert_array_equal(activations, kept)  # the original zeroes the NaN in place
    their_concepts, their_maps = theirs(activations.copy(), n_components=3)
    assert concepts.shape == their_concepts.shape == (6, 3) and maps.shape == their_maps.shape == (2, 3, 4, 4)
    assert concepts.dtype == np.float32 and (maps >= 0).all()
    # the same factorisation problem, solved about as well (NMF's factors are not unique): the
    # relative error of W H against the shifted [C, B*H*W] matrix
    rows = np.nan_to_num(activations).transpose(1, 0, 2, 3).reshape(6, -1)
    offset = rows.min(axis=1, keepdims=True)
    errors = []
    for c, m in ((concepts, maps), (their_concepts, their_maps)):
        rebuilt = (c - offset) @ m.transpose(1, 0, 2, 3).reshape(3, -1)
        errors.append(np.linalg.norm(rebuilt - (rows - offset)) / np.linalg.norm(rows - offset))
    assert errors[0] < 0.1 and errors[0] <= 1.05 * errors[1] + 1e-3


def test_the_originals_multilayer_ablation_cam_cannot_run_and_this_one_is_the_maintained_class():
    from pytorch_grad_cam.ablation_cam_multilayer import AblationCAM as Theirs
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget as TheirTarget

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).eval()
    x = torch.rand(2, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    with pytest.raises(TypeError, match="get_cam_weights"):
        Theirs(net, [net[3]])(x, [TheirTarget(0), TheirTarget(1)])
    assert MultiAblation is ours.AblationCAM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = MultiAblation(net, [net[1], net[3]])(x, [ClassifierOutputTarget(0), ClassifierOutputTarget(1)])
        one = [MultiAblation(net, [layer])(x, [ClassifierOutputTarget(0), ClassifierOutputTarget(1)]) for layer in (net[1], net[3])]
    assert maps.shape == (2, 10, 10) and maps.dtype == np.float32
    # several layers: each ablated on its own; the per-layer maps (each scaled to [0, 1]) averaged and scaled again
    mean = (one[0] + one[1]) / 2
    low = mean.min(axis=(1, 2), keepdims=True)
    expected = (mean - low) / (1e-7 + (mean - low).max(axis=(1, 2), keepdims=True))
    np.testing.assert_allclose(maps, expected, rtol=0, atol=1e-5)


def test_a_layer_of_one_position_gives_the_originals_zero_map_with_a_warning():
    # a ResNet's last block on a 32 x 32 image is 1 x 1: pytorch-grad-cam scales the constant map to zeros
    from pytorch_grad_cam import GradCAM as TheirGradCAM

    from camkit.errors import CamkitWarning

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 8, stride=8), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))  # net[3] is 1 x 1 here
    targets = [ClassifierOutputTarget(0), ClassifierOutputTarget(2)]
    theirs = TheirGradCAM(net, [net[3]])(x, targets)
    their_both = TheirGradCAM(net, [net[1], net[3]])(x, targets)
    net.zero_grad(set_to_none=True)  # the original fills param.grad; camkit must leave it empty
    with pytest.warns(CamkitWarning, match="1 of 1 target layer"):
        mine = ours.GradCAM(net, [net[3]])(x, targets)
    assert mine.shape == (2, 8, 8) and mine.dtype == np.float32
    np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(mine, 0)
    # with a layer that has a grid, the one-position layer's zero map leaves the others' normalised mean as is
    with pytest.warns(CamkitWarning, match="1 of 2 target layer"):
        both = ours.GradCAM(net, [net[1], net[3]])(x, targets)
    np.testing.assert_allclose(both, their_both, rtol=0, atol=1e-5)
    np.testing.assert_allclose(both, ours.GradCAM(net, [net[1]])(x, targets), rtol=0, atol=1e-6)
    assert all(p.grad is None for p in net.parameters())
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
