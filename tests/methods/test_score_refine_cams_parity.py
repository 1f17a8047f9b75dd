"""SS-CAM and IS-CAM against torchcam 0.5.0, Seg-Eigen-CAM and RefineCAM against pytorch-grad-cam 1.5.7.

The target layers keep the input's resolution, so the libraries' resizing order does not enter
the comparison. torchcam returns maps at the layer's resolution, normalised as
``(m - min) / (max - min + 1e-8)``: camkit's ``raw`` normalised the same way is compared to them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from test_cam_extra_parity import TARGETS, SmallCNN, anchor_targets, inputs

import camkit

pgc = pytest.importorskip("pytorch_grad_cam")
torchcam_methods = pytest.importorskip("torchcam.methods")
from pytorch_grad_cam.refine_cam import RefineCAM as AnchorRefineCAM  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _torchcam_normalised(raw: torch.Tensor) -> torch.Tensor:
    low = raw.amin(dim=(-2, -1), keepdim=True)
    return (raw - low) / ((raw - low).amax(dim=(-2, -1), keepdim=True) + 1e-8)


def _torchcam(name: str, model, x, seed: int, layer: str = "bn2", **kwargs) -> list[torch.Tensor]:
    with getattr(torchcam_methods, name)(model, layer, batch_size=7, **kwargs) as extractor:
        torch.manual_seed(seed)
        scores = model(x)
        return extractor(TARGETS, scores)


def test_sscam_equals_torchcam_with_the_same_seed():
    model, x = SmallCNN().eval(), inputs()
    theirs = _torchcam("SSCAM", model, x, seed=5, num_samples=3, std=0.5)
    ours = camkit.SSCAM(model, "bn2", samples=3, std=0.5, seed=5, shared_noise=False, batch_size=7).explain(x, TARGETS)
    torch.testing.assert_close(_torchcam_normalised(ours.raw), theirs[0], atol=1e-5, rtol=0)
    assert theirs[0].amax(dim=(1, 2)).min() > 0.99  # real maps
    # torchcam's default std (2.0) too, and the global generator when no seed is given
    theirs = _torchcam("SSCAM", model, x, seed=7, num_samples=2)
    torch.manual_seed(7)
    ours = camkit.SSCAM(model, "bn2", samples=2, shared_noise=False).explain(x, TARGETS)
    torch.testing.assert_close(_torchcam_normalised(ours.raw), theirs[0], atol=1e-5, rtol=0)


def test_iscam_and_torchcams_scorecam_equal_torchcam():
    model, x = SmallCNN().eval(), inputs()
    theirs = _torchcam("ISCAM", model, x, seed=0, num_samples=4)
    ours = camkit.ISCAM(model, "bn2", samples=4).explain(x, TARGETS)
    torch.testing.assert_close(_torchcam_normalised(ours.raw), theirs[0], atol=1e-5, rtol=0)
    theirs = _torchcam("ScoreCAM", model, x, seed=0)
    ours = camkit.ISCAM(model, "bn2", samples=1).explain(x, TARGETS)
    torch.testing.assert_close(_torchcam_normalised(ours.raw), theirs[0], atol=1e-5, rtol=0)
    # ... which is not camkit's ScoreCAM (the class probability of the masked input, no softmax over channels)
    assert not torch.allclose(camkit.ScoreCAM(model, "bn2").explain(x, TARGETS).raw, ours.raw, atol=1e-3)


def test_segeigencam_equals_pytorch_grad_cam():
    model, x = SmallCNN().eval(), inputs()
    anchor = pgc.SegEigenCAM(model, [model.bn2])(x, anchor_targets())
    maps = camkit.SegEigenCAM(model, "bn2")(x, TARGETS)
    np.testing.assert_allclose(maps.numpy(), anchor, atol=1e-5)
    assert maps.amax(dim=(1, 2)).min() > 0.99


def test_refinecam_equals_pytorch_grad_cam_with_gradcam():
    model, x = SmallCNN().eval(), inputs()
    anchor = AnchorRefineCAM(model, [model.bn1, model.bn2], base_method=pgc.GradCAM)(x, anchor_targets())
    maps = camkit.RefineCAM(model, ["bn1", "bn2"], base="gradcam")(x, TARGETS)
    np.testing.assert_allclose(maps.numpy(), anchor, atol=1e-5)
    assert maps.amax(dim=(1, 2)).min() > 0.99


def test_refinecam_with_gradcampp_equals_the_anchor_where_its_epsilon_is_negligible():
    # pytorch-grad-cam's Grad-CAM++ adds 1e-7 to alpha's denominator 2 g^2 + sum(A) g^3; on this
    # model's scores g^2 is of that order, so the epsilon changes the anchor's maps. With the scores
    # scaled by 1e6 it is negligible and the two agree; camkit adds none (Grad-CAM++'s closed form is
    # checked by hand in test_gradcam_formulas.py).
    x = inputs()
    big = SmallCNN(1e6).eval()
    anchor_big = AnchorRefineCAM(big, [big.bn1, big.bn2])(x, anchor_targets())
    np.testing.assert_allclose(camkit.RefineCAM(big, ["bn1", "bn2"])(x, TARGETS).numpy(), anchor_big, atol=1e-5)
    small = SmallCNN(1.0).eval()
    anchor_small = AnchorRefineCAM(small, [small.bn1, small.bn2])(x, anchor_targets())
    ours_small = camkit.RefineCAM(small, ["bn1", "bn2"])(x, TARGETS).numpy()
    assert np.abs(ours_small - anchor_small).max() > 0.1
    # the departure is already in the anchor's single-layer Grad-CAM++ at unit scale (not in RefineCAM's fusion,
    # which test_refinecam_equals_pytorch_grad_cam_with_gradcam checks with Grad-CAM as the base)
    one_layer = pgc.GradCAMPlusPlus(small, [small.bn2])(x, anchor_targets())
    assert np.abs(camkit.GradCAMPlusPlus(small, "bn2")(x, TARGETS).numpy() - one_layer).max() > 0.1
