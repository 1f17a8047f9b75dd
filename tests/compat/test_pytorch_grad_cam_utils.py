"""camkit.compat.pytorch_grad_cam's helpers, targets, metrics and legacy keywords against pytorch-grad-cam 1.5.7."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from pgc_helpers import TARGETS, SmallCNN, inputs

import camkit
import camkit.compat.pytorch_grad_cam as compat
from camkit.compat.pytorch_grad_cam.metrics import cam_mult_image as cmi
from camkit.compat.pytorch_grad_cam.metrics import road
from camkit.compat.pytorch_grad_cam.utils import image, reshape_transforms, svd_on_activations
from camkit.compat.pytorch_grad_cam.utils import model_targets as ct

pgc = pytest.importorskip("pytorch_grad_cam")
from pytorch_grad_cam.metrics import cam_mult_image as ocmi  # noqa: E402
from pytorch_grad_cam.metrics import road as oroad  # noqa: E402
from pytorch_grad_cam.utils import image as oimage  # noqa: E402
from pytorch_grad_cam.utils import model_targets as ot  # noqa: E402
from pytorch_grad_cam.utils import reshape_transforms as oreshape  # noqa: E402
from pytorch_grad_cam.utils import svd_on_activations as osvd  # noqa: E402

RNG = np.random.default_rng(0)
IMG = RNG.random((12, 10, 3)).astype(np.float32)
MASK = RNG.random((12, 10)).astype(np.float32)


@pytest.mark.parametrize("use_rgb", [False, True])
def test_show_cam_on_image_is_the_originals_uint8(use_rgb):
    ours = image.show_cam_on_image(IMG, MASK, use_rgb=use_rgb, image_weight=0.3)
    np.testing.assert_array_equal(ours, oimage.show_cam_on_image(IMG, MASK, use_rgb=use_rgb, image_weight=0.3))
    with pytest.raises(camkit.InvalidInputError, match="divide a uint8 image by 255"):
        image.show_cam_on_image(IMG * 255, MASK)


def test_preprocess_deprocess_and_scale_cam_image_match_the_original():
    uint8 = (IMG * 255).astype(np.uint8)
    for img in (IMG, uint8):
        np.testing.assert_allclose(image.preprocess_image(img, [0.4, 0.5, 0.6], [0.2, 0.3, 0.1]).numpy(),
                                   oimage.preprocess_image(img, [0.4, 0.5, 0.6], [0.2, 0.3, 0.1]).numpy(), atol=1e-6)
    np.testing.assert_array_equal(image.deprocess_image(IMG - 0.5), oimage.deprocess_image(IMG - 0.5))
    cams = RNG.random((2, 3, 4)).astype(np.float32)
    for size in (None, (7, 5), (2, 2)):
        np.testing.assert_allclose(image.scale_cam_image(cams, size), oimage.scale_cam_image(cams, size), atol=1e-6)
    batch = RNG.random((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(image.scale_accross_batch_and_channels(batch, (8, 6)),
                               oimage.scale_accross_batch_and_channels(batch, (8, 6)), atol=1e-6)


def test_scale_cam_image_has_no_epsilon():
    # (x - min) / (max - min + 1e-7): a map whose values span 1e-6 reaches only 0.91 in the original.
    tiny = np.array([[[0.0, 1e-6]]], dtype=np.float32)
    assert oimage.scale_cam_image(tiny)[0, 0, 1] < 0.92
    assert image.scale_cam_image(tiny)[0, 0, 1] == 1.0


def test_show_factorization_on_image_runs_without_plt_cm_get_cmap_and_leaves_the_maps_alone():
    maps = RNG.random((3, 12, 10)).astype(np.float32)
    given = maps.copy()
    out = image.show_factorization_on_image(IMG, given)  # the original calls plt.cm.get_cmap, gone in matplotlib 3.9
    assert out.shape == (12, 10, 3) and out.dtype == np.uint8 and np.array_equal(given, maps)
    labelled = image.show_factorization_on_image(IMG, given, concept_labels=["a", "b", "c"])
    assert labelled.shape == (12, 20, 3)


def test_projections_match_the_original_up_to_the_sign_and_leave_the_input_alone():
    acts = RNG.standard_normal((2, 5, 3, 4)).astype(np.float32)
    acts[0, 0, 0, 0] = np.nan
    given = acts.copy()
    for ours_fn, theirs_fn in ((svd_on_activations.get_2d_projection, osvd.get_2d_projection),
                               (svd_on_activations.get_2d_projection_kernel, osvd.get_2d_projection_kernel)):
        ours, theirs = ours_fn(acts), theirs_fn(acts)
        for i in range(2):
            assert min(np.abs(ours[i] - theirs[i]).max(), np.abs(ours[i] + theirs[i]).max()) < 1e-4
    np.testing.assert_allclose(svd_on_activations.get_2d_projection_with_sign_correction(acts),
                               osvd.get_2d_projection_with_sign_correction(acts), atol=1e-4)
    assert np.array_equal(acts, given, equal_nan=True)


def test_eigen_projection_sign_follows_the_activations():
    # Channel 2 = 2 x channel 1, increasing to the right: camkit's component points the way the activations grow.
    acts = np.array([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]]], dtype=np.float32)
    assert svd_on_activations.get_2d_projection(acts)[0, 0, 2] > 0


def test_model_targets_score_as_the_originals():
    out = torch.randn(2, 6, generator=torch.Generator().manual_seed(0))
    for name, args in (("ClassifierOutputTarget", (2,)), ("ClassifierOutputSoftmaxTarget", (2,)),
                       ("ClassifierOutputReST", (2,)), ("BinaryClassifierOutputTarget", (0,)),
                       ("SoftmaxOutputTarget", ()), ("RawScoresOutputTarget", ())):
        for row in (out, out[0]):
            torch.testing.assert_close(getattr(ct, name)(*args)(row), getattr(ot, name)(*args)(row))
    finer = (4, [1, 3], 0.7)
    torch.testing.assert_close(ct.FinerWeightedTarget(*finer)(out[0]), ot.FinerWeightedTarget(*finer)(out[0]))
    mask = (RNG.random((4, 5)) > 0.5).astype(np.float32)
    seg = torch.randn(3, 4, 5)
    torch.testing.assert_close(ct.SemanticSegmentationTarget(1, mask)(seg), ot.SemanticSegmentationTarget(1, mask)(seg))
    boxes = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]]), "labels": torch.tensor([1, 2]),
             "scores": torch.tensor([0.9, 0.4])}
    refs = ([1, 2, 2], [np.array([1.0, 0, 10, 10]), np.array([21.0, 20, 30, 30]), np.array([0.0, 0, 10, 10])])
    torch.testing.assert_close(ct.FasterRCNNBoxScoreTarget(*refs)(boxes), ot.FasterRCNNBoxScoreTarget(*refs)(boxes))


def test_finer_target_does_not_vanish_when_the_rival_probabilities_underflow():
    out = torch.tensor([0.0, -5000.0, -5001.0, 10.0])  # p(1), p(2) underflow to 0
    assert ot.FinerWeightedTarget(1, [2], 1.0)(out) == 0  # 0 / (0 + 1e-9)
    assert ct.FinerWeightedTarget(1, [2], 1.0)(out) == pytest.approx(1.0)  # y_1 - y_2


def test_reshape_transforms_match_the_original():
    tokens = torch.randn(2, 1 + 6, 5)
    torch.testing.assert_close(reshape_transforms.vit_reshape_transform(tokens, 2, 3),
                               oreshape.vit_reshape_transform(tokens, 2, 3))
    swin = torch.randn(2, 6, 5)
    torch.testing.assert_close(reshape_transforms.swinT_reshape_transform(swin, 2, 3),
                               oreshape.swinT_reshape_transform(swin, 2, 3))
    levels = {"0": torch.randn(1, 2, 8, 8), "1": torch.randn(1, 2, 4, 4), "pool": torch.randn(1, 2, 2, 2)}
    torch.testing.assert_close(reshape_transforms.fasterrcnn_reshape_transform(levels),
                               oreshape.fasterrcnn_reshape_transform(levels))


def test_confidence_metrics_match_the_original_and_restore_the_training_flag():
    model, x = SmallCNN(scale=3.0), inputs()
    cams = RNG.random((3, 20, 16)).astype(np.float32)
    targets = [ct.ClassifierOutputTarget(t) for t in TARGETS]
    model.train()
    ours = [cls()(x, cams, targets, model) for cls in (cmi.CamMultImageConfidenceChange, cmi.DropInConfidence,
                                                         cmi.IncreaseInConfidence)]
    assert model.training  # the model's mode is put back
    model.eval()
    theirs = [cls()(x, cams, [ot.ClassifierOutputTarget(t) for t in TARGETS], model)
              for cls in (ocmi.CamMultImageConfidenceChange, ocmi.DropInConfidence, ocmi.IncreaseInConfidence)]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert ours[0].shape == (3,) and (ours[1] > 0).any()


def test_road_imputation_and_metric_match_the_original_without_noise():
    img = torch.rand(3, 9, 8, generator=torch.Generator().manual_seed(0))
    keep = torch.rand(9, 8, generator=torch.Generator().manual_seed(1)) > 0.4
    torch.testing.assert_close(road.NoisyLinearImputer(noise=0.0)(img, keep.float()),
                               oroad.NoisyLinearImputer(noise=0.0)(img, keep.float()), atol=1e-5, rtol=0)
    model, x = SmallCNN(scale=3.0).eval(), inputs()
    cams = RNG.random((3, 20, 16)).astype(np.float32)
    metrics = []
    for module, targets in ((road, ct), (oroad, ot)):
        metric = module.ROADMostRelevantFirst(percentile=60)
        metric.perturbation.imputer.noise = 0.0
        metrics.append(metric(x, cams, [targets.ClassifierOutputTarget(t) for t in TARGETS], model))
    np.testing.assert_allclose(metrics[0], metrics[1], atol=1e-4)


def test_activations_and_gradients_record_as_the_original_and_release_their_hooks():
    model, x = SmallCNN().eval(), inputs()
    with compat.ActivationsAndGradients(model, [model.bn1, model.bn2], None) as ours:
        ours(x)[:, 1].sum().backward()
    theirs = pgc.ActivationsAndGradients(model, [model.bn1, model.bn2], None)
    theirs(x)[:, 1].sum().backward()
    for a, b in zip(ours.activations + ours.gradients, theirs.activations + theirs.gradients):
        torch.testing.assert_close(a, b)
    theirs.release()
    model.zero_grad(set_to_none=True)
    assert not model.bn1._forward_hooks and not model.bn2._forward_hooks


def test_sliding_window_matches_the_original():
    from pytorch_grad_cam.sess import sliding_window as theirs

    from camkit.compat.pytorch_grad_cam.sess import sliding_window as ours

    for args in ((224, 224, 224, 224), (288, 288, 224, 224), (224, 448, 112, 224), (300, 250, 70, 100)):
        assert ours(*args) == theirs(*args)


def test_dff_returns_the_originals_shapes_for_one_image():
    model = SmallCNN().eval()
    concepts, maps, outputs = compat.DeepFeatureFactorization(model, model.bn2, computation_on_concepts=model.fc)(
        inputs(1), n_components=3)
    assert concepts.shape == (12, 3) and len(maps) == 1 and maps[0].shape == (3, 20, 16) and outputs.shape == (3, 6)


def test_legacy_keywords_work_with_a_deprecation_warning():
    model, x = SmallCNN(scale=1e3).eval(), inputs()
    expected = compat.GradCAM(model, [model.bn2])(x, [ct.ClassifierOutputTarget(2)] * 3)
    with pytest.warns(DeprecationWarning, match="target_layers=\\[m\\]"):
        cam = compat.GradCAM(model=model, target_layer=model.bn2)
    with pytest.warns(DeprecationWarning, match="use_cuda"):
        compat.GradCAM(model=model, target_layers=[model.bn2], use_cuda=False)
    with pytest.warns(DeprecationWarning, match="target_category"):
        np.testing.assert_array_equal(cam(x, target_category=2), expected)
    with pytest.raises(TypeError, match="unexpected keyword"):
        compat.GradCAM(model, [model.bn2], not_a_keyword=1)


def test_cam_without_targets_and_with_a_wrong_target_count():
    model, x = SmallCNN(scale=1e3).eval(), inputs()
    assert compat.EigenCAM(model, [model.bn2])(x).shape == (3, 20, 16)  # cam(x): targets default to None
    with pytest.raises(camkit.InvalidTargetError, match="2 targets for a batch of 3"):
        compat.GradCAM(model, [model.bn2])(x, [ct.ClassifierOutputTarget(1)] * 2)
    with pytest.raises(camkit.InvalidInputError, match=r"pass \[layer\]"):
        compat.GradCAM(model, model.bn2)


def test_the_model_is_left_as_found_and_errors_are_not_swallowed():
    model, x = SmallCNN(scale=1e3).train(), inputs()
    with compat.GradCAM(model, [model.bn2]) as cam:
        cam(x)
    assert model.training and all(p.grad is None for p in model.parameters())
    with pytest.raises(IndexError), warnings.catch_warnings():  # the original's __exit__ prints and swallows it
        with compat.GradCAM(model, [model.bn2]):
            raise IndexError("kept")


def test_arcc_matches_the_original():
    from pytorch_grad_cam.metrics.arcc import ARCC as TheirARCC

    from camkit.compat.pytorch_grad_cam.metrics.arcc import ARCC

    model, x = SmallCNN(scale=1e3).eval(), inputs()
    ours_cam, theirs_cam = compat.GradCAM(model, [model.bn2]), pgc.GradCAM(model, [model.bn2])
    ours_t, theirs_t = [ct.ClassifierOutputTarget(t) for t in TARGETS], [ot.ClassifierOutputTarget(t) for t in TARGETS]
    torch.manual_seed(0)  # the ROAD imputation noise
    ours = ARCC(ours_cam)(x, ours_cam(x, ours_t), ours_t, model)
    torch.manual_seed(0)
    theirs = TheirARCC(theirs_cam)(x, theirs_cam(x, theirs_t), theirs_t, model)
    assert ours.shape == (3,) and ((ours > 0) & (ours < 1)).all()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
