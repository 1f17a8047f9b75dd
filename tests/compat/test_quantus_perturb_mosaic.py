"""Quantus's perturbation functions, index helpers and mosaic builders as camkit computes them.

Each perturbation is compared with Quantus 0.6.0's on the same arrays after the same
``np.random.seed``; where Quantus is wrong, a case shows camkit's value and Quantus's.
"""

from __future__ import annotations

import numpy as np
import pytest

from camkit.compat.quantus.functions import mosaic_func, perturb_func
from camkit.compat.quantus.functions.indices import baseline_values, expand_indices
from camkit.errors import InvalidInputError

quantus = pytest.importorskip("quantus")
qp = pytest.importorskip("quantus.functions.perturb_func")
qu = pytest.importorskip("quantus.helpers.utils")

RS = np.random.RandomState(0)
IMG = RS.rand(3, 6, 7)  # not square

INDEX_CASES = [
    ([0, 2, 9], [1, 2]), ([1], [0]), ([0, 5, 40], [0, 1, 2]), ((np.array([1, 3]), slice(2, 5)), [1, 2]),
    ((np.array([[0], [2]]), np.array([[1, 4]])), [1, 2]), ([2, 6], [2]),
]  # fmt: skip


@pytest.mark.parametrize(("indices", "axes"), INDEX_CASES)
def test_expand_indices_selects_what_quantus_selects(indices, axes) -> None:
    ours, theirs = np.zeros(IMG.shape, bool), np.zeros(IMG.shape, bool)
    ours[expand_indices(IMG, indices, axes)] = True
    theirs[qu.expand_indices(IMG, indices, axes)] = True
    assert ours.any() and np.array_equal(ours, theirs)


def test_expand_indices_refuses_axes_in_the_middle() -> None:
    with pytest.raises(ValueError, match="consecutive"):
        expand_indices(np.zeros((2, 3, 4, 5)), [0], [1, 2])


@pytest.mark.parametrize("baseline", ["black", "white", "mean", "uniform", 0.25, np.array([1.0, 2.0, 3.0])])
@pytest.mark.parametrize("func", ["baseline_replacement_by_indices", "baseline_replacement_by_shift"])
def test_index_perturbations_equal_quantus(func: str, baseline) -> None:
    key = "perturb_baseline" if func.endswith("indices") else "input_shift"
    out = []
    for lib in (qp, perturb_func):
        np.random.seed(3)
        out.append(getattr(lib, func)(arr=IMG.copy(), indices=[0, 8, 20], indexed_axes=[1, 2], **{key: baseline}))
    np.testing.assert_allclose(out[1], out[0])
    assert not np.array_equal(out[1], IMG)


def test_replacement_by_indices_by_hand() -> None:
    out = perturb_func.baseline_replacement_by_indices(np.zeros((2, 2, 3)), [1, 5], [1, 2], np.array([4.0, 7.0]))
    assert out[0].tolist() == [[0, 4, 0], [0, 0, 4]] and out[1].tolist() == [[0, 7, 0], [0, 0, 7]]


def test_replacement_by_mask_equals_quantus_and_checks_shapes() -> None:
    mask = IMG > 0.5
    np.testing.assert_allclose(perturb_func.baseline_replacement_by_mask(IMG, mask, "mean"),
                               qp.baseline_replacement_by_mask(IMG, mask, "mean"))  # fmt: skip
    with pytest.raises(ValueError, match="one shape"):
        perturb_func.baseline_replacement_by_mask(IMG, mask[0], 0.0)


@pytest.mark.parametrize(("func", "kwargs"), [
    ("gaussian_noise", {"perturb_std": 0.2}), ("uniform_noise", {"lower_bound": 0.1}),
    ("uniform_noise", {"lower_bound": 0.1, "upper_bound": 0.3}),
])  # fmt: skip
def test_noise_equals_quantus_after_the_same_seed(func: str, kwargs: dict) -> None:
    out = []
    for lib in (qp, perturb_func):
        np.random.seed(5)
        out.append(getattr(lib, func)(arr=IMG, indices=[0, 3], indexed_axes=[1, 2], **kwargs))
    np.testing.assert_allclose(out[1], out[0])
    changed = out[1] != IMG
    assert changed[:, 0, 0].all() and changed[:, 0, 3].all() and changed.sum() == 6


@pytest.mark.parametrize("func", ["batch_gaussian_noise", "batch_uniform_noise"])
def test_batched_noise_equals_quantus(func: str) -> None:
    arr, idx = IMG.reshape(3, -1), np.array([[0, 1], [4, 2], [9, 9]])
    out = []
    for lib in (qp, perturb_func):
        np.random.seed(6)
        out.append(getattr(lib, func)(arr=arr, indices=idx))
    np.testing.assert_allclose(out[1], out[0])


def test_uniform_noise_refuses_bounds_in_the_wrong_order() -> None:
    with pytest.raises(ValueError, match="larger"):
        perturb_func.uniform_noise(IMG, [0], [1, 2], lower_bound=0.3, upper_bound=0.1)


@pytest.mark.parametrize(("size", "axes"), [(3, [1, 2]), ([2, 4], [1, 2]), (5, [0, 1, 2]), (3, [2])])
def test_blur_equals_quantus(size, axes) -> None:
    ours = perturb_func.baseline_replacement_by_blur(IMG, [0, 3, 6], axes, blur_kernel_size=size)
    theirs = qp.baseline_replacement_by_blur(IMG, [0, 3, 6], axes, blur_kernel_size=size)
    np.testing.assert_allclose(ours, theirs, atol=1e-12)


def test_blur_by_hand_zeros_outside() -> None:
    arr = np.array([[1.0, 2.0, 3.0, 4.0]])
    assert perturb_func.baseline_replacement_by_blur(arr, [0, 3], [1], blur_kernel_size=3).tolist() == [[1.0, 2, 3, 7 / 3]]


@pytest.mark.parametrize("angle", [30.0, 90.0, -45.0])
def test_rotation_equals_quantus_on_square_images(angle: float) -> None:
    img = RS.rand(3, 8, 8).astype(np.float32)
    np.testing.assert_allclose(perturb_func.rotation(img, angle), qp.rotation(img, angle), atol=1e-5)


def test_rotation_keeps_non_square_and_one_channel_images_where_quantus_does_not() -> None:
    img = IMG.astype(np.float32)
    assert perturb_func.rotation(img, 10.0).shape == img.shape
    assert qp.rotation(img, 10.0).shape == (3, 7, 6)  # Quantus: height and width swapped
    with pytest.raises(Exception):  # noqa: B017  Quantus: OpenCV drops the one channel axis
        qp.rotation(img[:1], 10.0)
    assert perturb_func.rotation(img[:1], 0.0).shape == (1, 6, 7)
    np.testing.assert_allclose(perturb_func.rotation(img[:1], 0.0), img[:1], atol=1e-6)


def test_translation_by_hand_and_against_quantus() -> None:
    img = RS.rand(3, 8, 8).astype(np.float32)
    ours = perturb_func.translation_x_direction(img, "black", perturb_dx=3)
    theirs = qp.translation_x_direction(img, "black", perturb_dx=3)
    np.testing.assert_allclose(ours[:, :, 3:], img[:, :, :5]) and np.testing.assert_allclose(ours[:, :, :3], img.min())
    # Quantus fills only the first channel with the baseline (OpenCV reads one number as (v, 0, 0, 0))
    np.testing.assert_allclose(ours[0], theirs[0], atol=1e-6)
    np.testing.assert_allclose(theirs[1:, :, :3], 0.0)
    down = perturb_func.translation_y_direction(img, 0.5, perturb_dy=2)
    np.testing.assert_allclose(down[:, 2:], img[:, :6]) and np.testing.assert_allclose(down[:, :2], 0.5)
    np.testing.assert_allclose(down, qp.translation_y_direction(img, 0.5, perturb_dy=2), atol=1e-6)
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        perturb_func.translation_x_direction(img[0], 0.0)


def test_baseline_values_refuses_random_and_fits_arrays() -> None:
    with pytest.raises(ValueError, match="uniform"):
        baseline_values("random", IMG, (3,))
    with pytest.raises(ValueError, match="does not fit"):
        baseline_values(np.zeros(2), IMG, (3,))
    assert baseline_values("neighbourhood_mean", IMG, (2,), patch=IMG[:, :2, :2]).tolist() == [IMG[:, :2, :2].mean()] * 2


def test_mosaic_creation_keeps_quantus_contract() -> None:
    images, labels = np.arange(24.0).reshape(6, 1, 2, 2), np.array([0, 1, 2, 0, 1, 2])
    mosaics, indices, mosaic_labels, flags, targets = mosaic_func.mosaic_creation(images, labels, 3, seed=4)
    assert mosaics.shape == (9, 1, 4, 4) and [int(t) for t in targets] == [0] * 3 + [1] * 3 + [2] * 3
    for mosaic, idx, labs, flag, target in zip(mosaics, indices, mosaic_labels, flags, targets):
        quadrants = [mosaic[:, :2, :2], mosaic[:, :2, 2:], mosaic[:, 2:, :2], mosaic[:, 2:, 2:]]
        assert all(np.array_equal(q, images[i]) for q, i in zip(quadrants, idx))
        assert [int(labels[i]) for i in idx] == [int(v) for v in labs]
        assert list(flag) == [int(v == target) for v in labs] and sum(flag) == 2
    again = mosaic_func.mosaic_creation(images, labels, 3, seed=4)
    assert np.array_equal(again[0], mosaics) and again[1] == indices  # the seed fixes the draws


def test_mosaic_creation_refuses_one_class() -> None:
    with pytest.raises(InvalidInputError, match="two classes"):
        mosaic_func.mosaic_creation(np.zeros((2, 1, 2, 2)), np.array([1, 1]), 1)
    with pytest.raises(InvalidInputError, match="four images"):
        mosaic_func.build_single_mosaic([np.zeros((1, 2, 2))] * 3)


@pytest.mark.parametrize(("method", "kwargs"), [
    ("Control Var. Sobel Filter", {}), ("Control Var. Random Uniform", {}),
    ("Control Var. Constant", {"constant_value": 0.3}),
])  # fmt: skip
def test_explain_control_variates_equal_quantus(method: str, kwargs: dict) -> None:
    import torch

    from camkit.compat.quantus.functions.explanation_func import explain

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 7, 2))
    x, y = IMG[None].repeat(2, 0).astype(np.float32), np.array([0, 1])
    torch.manual_seed(0)
    ours = explain(net, x, y, method=method, **kwargs)
    torch.manual_seed(0)
    np.testing.assert_allclose(ours, quantus.explain(net, x, y, method=method, **kwargs), atol=1e-6)
    assert ours.shape == (2, 1, 6, 7)


def test_explain_constant_control_variate_takes_baseline_names_where_quantus_raises() -> None:
    import torch

    from camkit.compat.quantus.functions.explanation_func import explain

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 7, 2))
    x = np.stack([IMG, IMG + 1]).astype(np.float32)
    ours = explain(net, x, np.array([0, 1]), method="Control Var. Constant", constant_value="black")
    np.testing.assert_allclose(ours[:, 0, 0, 0], x.reshape(2, -1).min(1))
    with pytest.raises(TypeError):  # Quantus calls a tensor's min with numpy's axis=
        quantus.explain(net, x, np.array([0, 1]), method="Control Var. Constant", constant_value="black")
    with pytest.raises(InvalidInputError, match="constant_value"):
        explain(net, x, np.array([0, 1]), method="Control Var. Constant")


@pytest.mark.parametrize("layer", ["model._modules.get('1')", "model._modules['1']", "1"])
def test_explain_gradcam_reads_quantus_gc_layer_strings_and_interpolates(layer: str) -> None:
    import torch

    from camkit.compat.quantus.functions.explanation_func import explain

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 5, 2)).eval()  # fmt: skip
    x, y = np.stack([IMG, IMG[:, ::-1]]).astype(np.float32), np.array([0, 1])
    kwargs = {"method": "LayerGradCam", "gc_layer": layer, "interpolate": (6, 7), "reduce_axes": ()}
    ours = explain(model, x, y, **kwargs)
    theirs = quantus.explain(model, x, y, **{**kwargs, "gc_layer": "model._modules.get('1')"})
    assert ours.shape == (2, 1, 6, 7) and (theirs < 0).any()
    # camkit's Grad-CAM keeps its ReLU; captum's LayerGradCam (relu_attributions=False) returns the signed map
    np.testing.assert_allclose(ours, np.maximum(theirs, 0), atol=1e-6)
    with pytest.raises(InvalidInputError, match="does not evaluate"):
        explain(model, x, y, method="LayerGradCam", gc_layer="__import__('os')")


def test_continuity_and_faithfulness_correlation_raise_where_quantus_raises() -> None:
    import torch

    from camkit.compat import quantus as cq

    torch.manual_seed(0)
    signal_net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 9, 3)).eval()
    x, y = RS.rand(2, 2, 9).astype(np.float32), np.array([0, 1])
    for lib in (quantus, cq):  # a signal: Quantus's translation needs images
        kwargs = {"disable_warnings": True} if lib is quantus else {}
        with pytest.raises(ValueError):
            lib.Continuity(nr_steps=3, **kwargs)(model=signal_net, x_batch=x, y_batch=y, a_batch=None,
                                                 explain_func=lib.explain, explain_func_kwargs={"method": "Saliency"})
        with pytest.raises(ValueError, match="subset_size"):  # 9 values per channel: a subset of 9 is refused
            lib.FaithfulnessCorrelation(subset_size=9, nr_runs=2, **kwargs)(
                model=signal_net, x_batch=x, y_batch=y, a_batch=x.copy())
    ok = cq.FaithfulnessCorrelation(subset_size=8, nr_runs=2, return_aggregate=False)(
        model=signal_net, x_batch=x, y_batch=y, a_batch=x.copy())
    assert len(ok) == 2


def test_auc_is_float64_and_exactly_rounded() -> None:
    import torch
    from sklearn.metrics import roc_auc_score

    from camkit.compat import quantus as cq
    from camkit.metrics import region_auc

    maps = torch.tensor([[0.2, 0.1, 0.3, 0.4, 0.05, 0.6]], dtype=torch.float64)
    region = torch.tensor([[True, False, False, False, True, False]])
    ours = region_auc(maps, region)
    assert ours.dtype == torch.float64 and ours.item() == (1 + 0) / 8  # u = 1: one pair of eight ordered right
    assert region_auc(maps.float(), region).dtype == torch.float32
    assert ours.item() == pytest.approx(roc_auc_score(region[0].numpy(), maps[0].numpy()), abs=1e-15)
    assert cq.AUC(normalise=False, abs=False).score(maps.float(), region).dtype == torch.float64
