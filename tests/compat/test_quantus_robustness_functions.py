"""The robustness classes with Quantus's function arguments: similarity and norm functions, Continuity's translation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from camkit import metrics
from camkit.compat.quantus.functions.perturb_func import batched_translation
from tests.compat.test_quantus_robustness import cq, q_explain, quantus, run, setup

qs = pytest.importorskip("quantus.functions.similarity_func")
qn = pytest.importorskip("quantus.functions.norm_func")


def _absolute_gap(a, b, **kwargs):
    return np.abs(a - b)


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("AvgSensitivity", {"norm_numerator": qn.linf_norm}),
        ("MaxSensitivity", {"similarity_func": _absolute_gap, "norm_denominator": qn.linf_norm}),
        ("LocalLipschitzEstimate", {"norm_numerator": qs.distance_manhattan}),
        ("LocalLipschitzEstimate", {"norm_numerator": qs.distance_euclidean, "norm_denominator": qs.distance_manhattan}),
    ],
)
def test_similarity_and_norm_functions_equal_quantus(name: str, init: dict) -> None:
    call = setup()
    init = {"nr_samples": 3, "normalise": False, **init}
    ours, theirs = run(cq, name, init=init, **call), run(quantus, name, init=init, **call)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    # the functions matter: the defaults give other values
    default = run(cq, name, init={k: v for k, v in init.items() if k.startswith(("nr_", "normalise"))}, **call)
    assert not np.allclose(ours, default, rtol=1e-3)


def test_defaults_passed_by_name_keep_the_torch_path() -> None:
    metric = cq.AvgSensitivity(similarity_func=qs.difference, norm_numerator=qn.fro_norm, norm_denominator=None)
    assert metric.measure is None
    assert cq.LocalLipschitzEstimate(norm_numerator=qs.distance_euclidean).measure is None
    assert cq.LocalLipschitzEstimate(norm_numerator=qs.distance_manhattan).measure is not None


def test_native_measure_is_called_once_per_perturbation_with_the_maps_and_inputs() -> None:
    x = torch.ones(2, 1, 4)
    square = lambda inputs, target: inputs[:, 0] ** 2  # noqa: E731
    plan = torch.stack([x + 0.1, x - 0.1, x + 0.2])
    seen = []

    def chebyshev(maps, moved, inputs, perturbed):
        seen.append((maps.shape, moved.shape, inputs.shape, perturbed.shape))
        return (moved - maps).abs().amax(dim=1) / maps.abs().amax(dim=1)

    out = metrics.max_sensitivity(square, x, 0, perturbed=plan, measure=chebyshev)
    torch.testing.assert_close(out, torch.full((2,), 1.2**2 - 1))
    assert seen == [((2, 4), (2, 4), (2, 1, 4), (2, 1, 4))] * 3
    with pytest.raises(ValueError, match=r"one value per input \[B\] = \[2\]"):
        metrics.local_lipschitz_estimate(square, x, 0, perturbed=plan, measure=lambda *a: torch.zeros(3))


def _continuity_by_hand(call, steps, baseline, seed, func=batched_translation, **kwargs):
    """Continuity's formula written out: Quantus's schedule, the function at every step, ||da||_1 / ||dx||_2."""
    x, y, net = call["x_batch"], call["y_batch"], call["model"]
    np.random.seed(seed)
    a = q_explain(net, x, y).reshape(len(x), -1)
    width, out = x.shape[3], []
    for k in range(1, steps + 1):
        moved = func(arr=x, perturb_baseline=baseline, perturb_dx=-width + (2 * width + 1) // steps * k,
                     direction="x", **kwargs)  # fmt: skip
        gap = q_explain(net, moved.astype(np.float32), y).reshape(len(x), -1) - a
        dist = np.sqrt(((x - moved).reshape(len(x), -1) ** 2).sum(-1))
        out.append(np.where(dist == 0, np.nan, np.abs(gap).sum(-1) / np.where(dist == 0, 1, dist)))
    return np.nanmax(np.stack(out, 1), 1)


def _shift_rows(arr, perturb_baseline, perturb_dx, direction, **kwargs):
    return batched_translation(arr, perturb_baseline, perturb_dx // 2, direction="y")


@pytest.mark.parametrize(
    ("baseline", "func", "kwargs"),
    [("uniform", None, {}), ("uniform", None, {"uniform_low": -1.0, "uniform_high": 0.0}), ("white", _shift_rows, {}),
     ("mean", None, {})],
)  # fmt: skip
def test_continuity_takes_any_baseline_and_translation(baseline, func, kwargs) -> None:
    call = setup()
    init = {"nr_steps": 5, "abs": False, "normalise": False, "perturb_baseline": baseline}
    if func is not None:
        init["perturb_func"] = func
    ours = run(cq, "Continuity", init={**init, "perturb_func_kwargs": kwargs or None}, **call)
    np.testing.assert_allclose(ours, _continuity_by_hand(call, 5, baseline, 3, func or batched_translation, **kwargs),
                               rtol=1e-5)  # fmt: skip


def test_quantus_continuity_ignores_its_perturbation_arguments() -> None:
    call = setup()
    init = {"nr_steps": 5, "abs": False, "normalise": False}
    black = run(quantus, "Continuity", init=init, **call)
    for extra in ({"perturb_baseline": "uniform"}, {"perturb_baseline": 0.5}, {"perturb_func": _shift_rows}):
        np.testing.assert_array_equal(run(quantus, "Continuity", init={**init, **extra}, **call), black)
        assert not np.allclose(run(cq, "Continuity", init={**init, **extra}, **call), black, rtol=1e-3)


@pytest.mark.parametrize("baseline", ["black", "white", "mean", 0.3, "uniform"])
@pytest.mark.parametrize("direction", ["x", "y"])
def test_batched_translation_equals_quantus(baseline, direction) -> None:
    from quantus.functions.perturb_func import batched_translation as theirs

    x = np.random.RandomState(1).rand(3, 2, 5, 7).astype(np.float32)
    for shift in (-5, -3, 0, 2, 5):
        np.random.seed(0)
        ours = batched_translation(x, baseline, shift, direction=direction)
        np.random.seed(0)
        np.testing.assert_array_equal(ours, theirs(x, baseline, shift, direction=direction))


@pytest.mark.parametrize("discretiser", ["sign", "rank", "floating_points", "callable"])
def test_consistency_discretise_func_equals_quantus(discretiser) -> None:
    qd = pytest.importorskip("quantus.functions.discretise_func")
    call = setup()
    x = np.concatenate([call["x_batch"], call["x_batch"][::-1]])
    y = call["model"](torch.as_tensor(x)).argmax(1).numpy()
    base = q_explain(call["model"], call["x_batch"], call["y_batch"])
    scale = 1.0 if discretiser == "floating_points" else 2.0  # rounded values: only an equal map shares them
    a = np.concatenate([base, scale * base[::-1]])  # every map's label shared by one other sample
    func = {"sign": qd.sign, "rank": qd.rank, "floating_points": qd.floating_points,
            "callable": lambda row: int(np.argmax(np.abs(row)))}[discretiser]  # fmt: skip
    kwargs = {"model": call["model"], "x_batch": x, "y_batch": y, "a_batch": a, "device": "cpu"}
    init = {"discretise_func": func, "normalise": False}
    ours, theirs = run(cq, "Consistency", init=init, **kwargs), run(quantus, "Consistency", init=init, **kwargs)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_batched_translation_uniform_bounds_quantus_drops_them() -> None:
    from quantus.functions.perturb_func import batched_translation as theirs

    x = np.zeros((2, 1, 2, 4), dtype=np.float32)
    np.random.seed(0)
    ours = batched_translation(x, "uniform", 2, uniform_low=5.0, uniform_high=6.0)
    np.random.seed(0)
    quantus_fill = theirs(x, "uniform", 2, uniform_low=5.0, uniform_high=6.0)
    np.random.seed(0)
    draws = np.random.uniform(5.0, 6.0, 2)  # one draw per image, in the bounds given
    np.testing.assert_allclose(ours[:, :, :, :2], np.broadcast_to(draws[:, None, None, None], (2, 1, 2, 2)))
    assert ((quantus_fill[:, :, :, :2] >= 0) & (quantus_fill[:, :, :, :2] < 1)).all()  # Quantus: U(0, 1) always
