"""camkit.compat.pytorch_grad_cam against pytorch-grad-cam 1.5.7 on the same model and inputs.

Maps agree within 1e-5 wherever the original is right. Where it is not, a test shows the
difference and that the compat class returns camkit's value (the migration guide lists each).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from pgc_helpers import TARGETS, SmallCNN, inputs
from torch import nn

import camkit.compat.pytorch_grad_cam as compat
from camkit.compat.pytorch_grad_cam.utils import model_targets as ct

pgc = pytest.importorskip("pytorch_grad_cam")
from pytorch_grad_cam.utils import model_targets as ot  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def both(name, model, layers, targets=TARGETS, x=None, **call):
    """The original's and the compat class's maps for the same call."""
    x = inputs() if x is None else x
    theirs = getattr(pgc, name)(model, [getattr(model, n) for n in layers])(
        x, None if targets is None else [ot.ClassifierOutputTarget(t) for t in targets], **call
    )
    ours = getattr(compat, name)(model, [getattr(model, n) for n in layers])(
        x, None if targets is None else [ct.ClassifierOutputTarget(t) for t in targets], **call
    )
    return theirs, ours


@pytest.mark.parametrize("layers", [["bn2"], ["bn1", "bn2"]])
@pytest.mark.parametrize("name", ["GradCAM", "HiResCAM", "GradCAMElementWise", "XGradCAM", "LayerCAM", "FEM"])
def test_gradient_and_activation_cams_match_the_original(name, layers):
    theirs, ours = both(name, SmallCNN(scale=1e3).eval(), layers)
    assert ours.dtype == np.float32 and ours.shape == (3, 20, 16)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert ours.max() > 0.99  # real maps, not flat ones


def test_segeigencam_matches_the_original():
    theirs, ours = both("SegEigenCAM", SmallCNN(scale=1e3).eval(), ["bn2"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("base", ["GradCAM", "XGradCAM", "LayerCAM"])
def test_refinecam_matches_the_original(base):
    model, x = SmallCNN(scale=1e3).eval(), inputs()
    theirs = pgc.RefineCAM(model, [model.bn1, model.bn2], base_method=getattr(pgc, base))(
        x, [ot.ClassifierOutputTarget(t) for t in TARGETS])
    ours = compat.RefineCAM(model, [model.bn1, model.bn2], base_method=getattr(compat, base))(
        x, [ct.ClassifierOutputTarget(t) for t in TARGETS])
    assert ours.shape == (3, 20, 16) and ours.max() > 0.99
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("base", ["GradCAMPlusPlus", "EigenGradCAM", "EigenCAM", "ScoreCAM", "KPCA_CAM", "FEM", "SegEigenCAM"])
def test_refinecam_takes_every_base_class_and_multiplies_its_maps(base):
    """Every CAM class is a base (the original's test_refine_cam.py passes ScoreCAM and EigenCAM). Where the
    base differs from the original's (the migration guide's table), RefineCAM is the product of the compat
    base's own per-layer maps, rescaled to [0, 1] per image as the original does."""
    model, x = SmallCNN(scale=1e3).eval(), inputs()
    targets = [ct.ClassifierOutputTarget(t) for t in TARGETS]
    ours = compat.RefineCAM(model, [model.bn1, model.bn2], base_method=getattr(compat, base))(x, targets)
    per_layer = [getattr(compat, base)(model, [layer])(x, targets) for layer in (model.bn1, model.bn2)]
    product = per_layer[0] * per_layer[1]
    low = product.min(axis=(1, 2), keepdims=True)
    expected = (product - low) / np.maximum(product.max(axis=(1, 2), keepdims=True) - low, 1e-12)
    assert ours.shape == (3, 20, 16)
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_shapleycam_matches_the_original_on_one_layer_and_runs_on_two():
    theirs, ours = both("ShapleyCAM", SmallCNN(scale=1e3).eval(), ["bn2"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    model = SmallCNN(scale=1e3).eval()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        pgc.ShapleyCAM(model, [model.bn1, model.bn2])(inputs(), None)  # the original's second layer
    assert compat.ShapleyCAM(model, [model.bn1, model.bn2])(inputs(), None).shape == (3, 20, 16)


def test_targets_none_is_each_images_top_class():
    model = SmallCNN(scale=1e3).eval()
    theirs, ours = both("GradCAM", model, ["bn2"], targets=None)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    top = model(inputs()).argmax(1).tolist()
    np.testing.assert_array_equal(ours, compat.GradCAM(model, [model.bn2])(inputs(), [ct.ClassifierOutputTarget(t) for t in top]))


@pytest.mark.parametrize("make", [lambda m: m.ClassifierOutputSoftmaxTarget(3), lambda m: m.ClassifierOutputReST(3)])
def test_other_targets_match_the_original(make):
    model, x = SmallCNN(scale=30.0).eval(), inputs()
    theirs = pgc.GradCAM(model, [model.bn2])(x, [make(ot)] * 3)
    ours = compat.GradCAM(model, [model.bn2])(x, [make(ct)] * 3)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_target_with_several_scores_differentiates_their_sum_where_the_original_fails():
    model, x = SmallCNN(scale=30.0).eval(), inputs()
    with pytest.raises(RuntimeError, match="scalar outputs"):
        pgc.GradCAM(model, [model.bn2])(x, [ot.RawScoresOutputTarget()] * 3)
    ours = compat.GradCAM(model, [model.bn2])(x, [ct.RawScoresOutputTarget()] * 3)
    summed = compat.GradCAM(model, [model.bn2])(x, [lambda row: row.sum()] * 3)
    np.testing.assert_array_equal(ours, summed)
    assert ours.max() > 0.99


def test_gradcam_plusplus_matches_where_its_epsilon_is_negligible():
    theirs, ours = both("GradCAMPlusPlus", SmallCNN(scale=1e5).eval(), ["bn2"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _eq19(acts, grads, eps):
    """Grad-CAM++'s channel weights (eq. 19 with the ReLU of eq. 7), written out; ``eps`` in the alpha denominator."""
    g2, g3 = grads**2, grads**3
    total = acts.sum(axis=(2, 3), keepdims=True)
    denominator = 2 * g2 + total * g3 + eps
    alpha = np.where(grads != 0, g2 / np.where(denominator == 0, 1, denominator), 0)
    return (np.maximum(grads, 0) * alpha).sum(axis=(2, 3))


def test_gradcam_plusplus_weights_have_no_epsilon():
    # Gradients of order 1e-3: the original's 1e-6 is as large as 2 g^2 and shrinks the weights.
    g = np.random.default_rng(0)
    acts = g.random((2, 3, 4, 5)).astype(np.float32) + 0.5
    grads = (g.standard_normal((2, 3, 4, 5)) * 1e-3).astype(np.float32)
    theirs = pgc.GradCAMPlusPlus.get_cam_weights(None, None, None, None, acts, grads)
    ours = compat.GradCAMPlusPlus.get_cam_weights(None, None, None, None, acts, grads)
    np.testing.assert_allclose(theirs, _eq19(acts, grads, 1e-6), rtol=1e-4)
    np.testing.assert_allclose(ours, _eq19(acts, grads, 0.0), rtol=1e-4)
    assert np.abs(ours - theirs).max() > 0.1 * np.abs(ours).max()


def test_fullgrad_matches_where_its_epsilon_is_negligible_and_not_elsewhere():
    theirs, ours = both("FullGrad", SmallCNN(scale=1e5).eval(), [])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    theirs_small, ours_small = both("FullGrad", SmallCNN(scale=1e-2).eval(), [])
    assert np.abs(theirs_small - theirs).max() > 0.005
    np.testing.assert_allclose(ours_small, ours, atol=1e-5)


def test_eigencam_matches_the_original_where_the_svd_signs_agree():
    theirs, ours = both("EigenCAM", SmallCNN().eval(), ["bn2"], targets=None)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _scorecam_by_hand(model, x, softmax_over):
    """Score-CAM at a layer with the input's resolution (no mask resize): each channel min-max normalised
    into a mask, the target scored on x * mask, weights from a softmax over the classes (the paper,
    camkit) or over the channels of the raw logits (the original)."""
    acts = {}
    handle = model.bn2.register_forward_hook(lambda m, i, o: acts.setdefault("a", o.detach()))
    with torch.no_grad():
        model(x)
        handle.remove()
        a = acts["a"]
        low, high = a.amin(dim=(2, 3), keepdim=True), a.amax(dim=(2, 3), keepdim=True)
        masks = (a - low) / (high - low + 1e-8)
        maps = []
        for i, target in enumerate(TARGETS):
            logits = model(x[i : i + 1] * masks[i][:, None])
            if softmax_over == "classes":
                weights = logits.softmax(dim=1)[:, target]
            else:
                weights = logits[:, target].softmax(dim=0)
            raw = (weights[:, None, None] * a[i]).sum(0).clamp_min(0)
            maps.append((raw - raw.min()) / (raw.max() - raw.min()))
    return torch.stack(maps).numpy()


def test_scorecam_weights_by_class_probability_where_the_original_softmaxes_over_channels():
    model, x = SmallCNN(scale=10.0, stride=1).eval(), inputs()
    theirs, ours = both("ScoreCAM", model, ["bn2"])
    np.testing.assert_allclose(theirs, _scorecam_by_hand(model, x, "channels"), atol=1e-5)
    np.testing.assert_allclose(ours, _scorecam_by_hand(model, x, "classes"), atol=1e-5)
    assert np.abs(ours - theirs).max() > 1e-3


def test_ablationcam_matches_on_a_relu_layer_with_positive_scores():
    model = SmallCNN(scale=10.0, shift=50.0, relu_head=True).eval()
    theirs, ours = both("AblationCAM", model, ["act2"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_finercam_matches_the_original():
    model = SmallCNN(scale=30.0).eval()
    x = inputs()
    np.testing.assert_allclose(
        compat.FinerCAM(model, [model.bn2])(x), pgc.FinerCAM(model, [model.bn2])(x), atol=1e-5
    )
    np.testing.assert_allclose(
        compat.FinerCAM(model, [model.bn2])(x, target_idx=2), pgc.FinerCAM(model, [model.bn2])(x, target_idx=2), atol=1e-5
    )


def test_finercam_original_zeroes_maps_when_rival_probabilities_underflow():
    model, x = SmallCNN(scale=5000.0).eval(), inputs()[:1]
    lowest = int(model(x)[0].argmin())
    theirs = pgc.FinerCAM(model, [model.bn2])(x, target_idx=lowest)
    ours = compat.FinerCAM(model, [model.bn2])(x, target_idx=lowest)
    assert np.abs(theirs).max() == 0 and ours.max() > 0.99


def test_aug_smooth_matches_the_originals_flips_and_multiplies():
    theirs, ours = both("GradCAM", SmallCNN(scale=1e3).eval(), ["bn2"], aug_smooth=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_subclass_with_its_own_weights_runs_as_in_the_original():
    class TwiceGradCAM:  # the original's guide: subclass BaseCAM and define get_cam_weights
        def get_cam_weights(self, input_tensor, target_layer, targets, activations, grads):
            return 2 * grads.mean(axis=(2, 3)) - 0.1 * activations.mean(axis=(2, 3))

    theirs_cls = type("T", (TwiceGradCAM, pgc.base_cam.BaseCAM), {})
    ours_cls = type("T", (TwiceGradCAM, compat.BaseCAM), {})
    model, x = SmallCNN(scale=1e3).eval(), inputs()
    targets = [ot.ClassifierOutputTarget(t) for t in TARGETS]
    np.testing.assert_allclose(
        ours_cls(model, [model.bn2])(x, targets), theirs_cls(model, [model.bn2])(x, targets), atol=1e-5
    )


@pytest.mark.parametrize("name", ["GradCAMPlusPlus", "XGradCAM"])
def test_get_cam_weights_takes_numpy_as_in_the_original(name):
    g = np.random.default_rng(0)
    acts, grads = g.random((2, 3, 4, 5), dtype=np.float32) + 0.5, g.standard_normal((2, 3, 4, 5), dtype=np.float32) * 1e3
    theirs = getattr(pgc, name).get_cam_weights(None, None, None, None, acts, grads)
    ours = getattr(compat, name).get_cam_weights(None, None, None, None, acts, grads)
    assert ours.shape == (2, 3)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)


def test_sess_matches_the_original():
    model = SmallCNN(scale=30.0, stride=1).eval()
    x = torch.randn(2, 3, 10, 12, generator=torch.Generator().manual_seed(2))
    kwargs = dict(window_size=8, num_scales=2, step_size=3, pre_filter_ratio=0.3)
    theirs = pgc.SESS(model, [model.bn1], **kwargs)(x, [ot.ClassifierOutputTarget(1), ot.ClassifierOutputTarget(4)])
    ours = compat.SESS(model, [model.bn1], **kwargs)(x, [ct.ClassifierOutputTarget(1), ct.ClassifierOutputTarget(4)])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_guided_backprop_matches_the_original():
    torch.manual_seed(0)  # ReLU modules only: the original patches nothing else
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 3, padding=1, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 6)).eval()
    x = inputs(1)
    theirs = pgc.GuidedBackpropReLUModel(model, "cpu")(x.clone(), target_category=3)
    ours = compat.GuidedBackpropReLUModel(model)(x, target_category=3)
    assert ours.shape == (20, 16, 3)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
