"""Robustness measures: formulas by hand, parity with Quantus 0.6.0 and captum on the same draws, every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.errors import InvalidInputError
from camkit.metrics import (
    avg_sensitivity,
    consistency,
    continuity,
    local_lipschitz_estimate,
    max_sensitivity,
    relative_input_stability,
    relative_output_stability,
    relative_representation_stability,
)
from tests.models import RankNet, rank_input


def grad_x_input(model: nn.Module):
    """Gradient x input summed over channels: maps [B, *S]."""

    def explain(x, target):
        x = x.detach().clone().requires_grad_(True)
        y = torch.as_tensor(target).long().expand(x.shape[0])
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(model(x).gather(1, y[:, None].to(x.device)).sum(), x)
        return (grad * x).sum(dim=1).detach()

    return explain


def _nets(dims: int):
    net = RankNet(dims, classes=3).eval()
    return net, rank_input(dims, batch=3)


# ---- by hand --------------------------------------------------------------------------------


def test_sensitivities_by_hand() -> None:
    x = torch.tensor([[[1.0, 2.0]]])
    square = lambda inputs, target: inputs[:, 0] ** 2  # noqa: E731
    plan = torch.stack([x + 0.5, x - 0.5])
    base = (1.0 + 16.0) ** 0.5
    d1 = (1.25**2 + 2.25**2) ** 0.5  # (1.5^2 - 1, 2.5^2 - 4)
    d2 = (0.75**2 + 1.75**2) ** 0.5  # (0.5^2 - 1, 1.5^2 - 4)
    torch.testing.assert_close(avg_sensitivity(square, x, 0, perturbed=plan), torch.tensor([(d1 + d2) / 2 / base]))
    torch.testing.assert_close(max_sensitivity(square, x, 0, perturbed=plan), torch.tensor([d1 / base]))
    # Lipschitz: ||e - e_n|| / ||x - x_n||, ||x - x_n|| = sqrt(2) * 0.5
    torch.testing.assert_close(
        local_lipschitz_estimate(square, x, 0, perturbed=plan), torch.tensor([d1 / (0.5 * 2**0.5)])
    )
    flat = lambda inputs, target: torch.zeros_like(inputs[:, 0])  # noqa: E731
    assert torch.isnan(avg_sensitivity(flat, x, 0, perturbed=plan)).all()  # a zero map has no relative change


def test_relative_stabilities_by_hand() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))  # class 0 always wins for positive inputs
    x = torch.tensor([[[1.0, 2.0]]])
    square = lambda inputs, target: inputs[:, 0] ** 2  # noqa: E731
    plan = torch.stack([x * 1.1, x * 1.5])
    # RIS: relative map change (1.21 - 1, 1.21 - 1) / relative input change (0.1, 0.1): 2.1; for 1.5: 1.25 / 0.5 = 2.5
    torch.testing.assert_close(relative_input_stability(square, net, x, 0, perturbed=plan), torch.tensor([2.5]))
    # ROS: relative map change / ||h(x) - h(x_n)||: logits (1, 0) -> (1.1, 0) and (1.5, 0)
    ros = max(0.21 * 2**0.5 / 0.1, 1.25 * 2**0.5 / 0.5)
    torch.testing.assert_close(relative_output_stability(square, net, x, 0, perturbed=plan), torch.tensor([ros]))
    # RRS with the identity as representation equals RIS
    rrs = relative_representation_stability(square, net, x, 0, perturbed=plan, representation=lambda t: t)
    torch.testing.assert_close(rrs, torch.tensor([2.5]))


def test_perturbations_that_change_the_class_are_left_out() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # class = larger of the two values
    x = torch.tensor([[[2.0, 1.0]]])
    identity_sq = lambda inputs, target: inputs[:, 0] ** 2  # noqa: E731
    plan = torch.stack([x * 1.1, torch.tensor([[[0.5, 3.0]]])])  # the second flips the class
    kept = relative_input_stability(identity_sq, net, x, 0, perturbed=plan)
    alone = relative_input_stability(identity_sq, net, x, 0, perturbed=plan[:1])
    torch.testing.assert_close(kept, alone)
    assert torch.isnan(relative_input_stability(identity_sq, net, x, 0, perturbed=plan[1:])).all()


def test_continuity_by_hand() -> None:
    x = torch.tensor([[[0.0, 3.0, 1.0]]])
    identity = lambda inputs, target: inputs[:, 0]  # noqa: E731
    # W = 3, steps 7: dx = 1, shifts -2..4; the map is the input, so each ratio is ||d||_1 / ||d||_2
    shifts = range(-2, 5)
    best = 0.0
    for s in shifts:
        moved = torch.zeros(3)
        for i in range(3):
            if 0 <= i - s < 3:
                moved[i] = x[0, 0, i - s]
        d = moved - x[0, 0]
        if d.abs().sum() > 0:
            best = max(best, float(d.abs().sum() / d.norm()))
    torch.testing.assert_close(continuity(identity, x, 0, steps=7), torch.tensor([best]))


def test_continuity_takes_a_plan_of_perturbed_inputs() -> None:
    x = torch.tensor([[[0.0, 3.0, 1.0]], [[2.0, 2.0, 2.0]]])
    identity = lambda inputs, target: inputs[:, 0]  # noqa: E731
    plan = torch.stack([x + torch.tensor([1.0, 0.0, 0.0]), x + torch.tensor([1.0, -1.0, 1.0]), x])
    # the map is the input: ||d||_1 / ||d||_2 is 1 and sqrt(3); the unchanged copy is left out
    torch.testing.assert_close(continuity(identity, x, 0, perturbed=plan), torch.full((2,), 3**0.5))
    with pytest.raises(InvalidInputError, match="perturbed inputs"):
        continuity(identity, x, 0, perturbed=plan[:, :1])


def test_consistency_by_hand() -> None:
    maps = torch.tensor([[1.0, -1.0], [2.0, -3.0], [5.0, -1.0], [1.0, 1.0]])
    predictions = torch.tensor([0, 0, 1, 0])
    # maps 0, 1, 2 share the signs (+, -): for 0 one of {1, 2} agrees, for 2 none of {0, 1}
    torch.testing.assert_close(consistency(maps, predictions, n=2), torch.tensor([0.5, 0.5, 0.0, float("nan")]),
                               equal_nan=True)  # fmt: skip
    labels = torch.tensor([7, 7, 8, 8])
    torch.testing.assert_close(consistency(maps, predictions, labels=labels), torch.tensor([1.0, 1.0, 0.0, 0.0]))


# ---- maps with a channel axis [B, K, *S]: compared whole --------------------------------------


def test_maps_with_channels_are_compared_whole_by_hand() -> None:
    x = torch.ones(1, 2, 2)
    square = lambda inputs, target: inputs**2  # noqa: E731  (maps [B, 2, 2], one per input channel)
    plan = (x + torch.tensor([[0.1], [0.2]]))[None]  # channel 0 moved by 0.1, channel 1 by 0.2
    change = (2 * 0.21**2 + 2 * 0.44**2) ** 0.5  # ||e(x_n) - e(x)|| over all four values
    step = (2 * 0.1**2 + 2 * 0.2**2) ** 0.5  # ||x_n - x||
    torch.testing.assert_close(avg_sensitivity(square, x, 0, perturbed=plan), torch.tensor([change / 2]))
    torch.testing.assert_close(local_lipschitz_estimate(square, x, 0, perturbed=plan), torch.tensor([change / step]))
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    ris = relative_input_stability(square, net, x, 0, perturbed=plan, skip_changed=False)
    torch.testing.assert_close(ris, torch.tensor([change / step]))  # e = 1 and x = 1: the relative changes are these
    # the channels summed into one map [B, 2] would give another value: (2.65 - 2) * sqrt(2) / (2 * sqrt(2))
    summed = avg_sensitivity(lambda inputs, target: square(inputs, target).sum(1), x, 0, perturbed=plan)
    torch.testing.assert_close(summed, torch.tensor([0.325]))
    # maps given in the same layout stand for e(x): here 2 everywhere, so the change is (1.21 - 2, 1.44 - 2) per channel
    given = avg_sensitivity(square, x, 0, maps=2 * x, perturbed=plan)
    torch.testing.assert_close(given, torch.tensor([(2 * 0.79**2 + 2 * 0.56**2) ** 0.5 / 4]))


def test_continuity_of_maps_with_channels_by_hand() -> None:
    x = torch.tensor([[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]]])
    identity = lambda inputs, target: inputs  # noqa: E731
    # W = 4, steps 3: shifts -1, 2, 5, filled with the minimum 0; ||d||_1 / ||d||_2 over both channels:
    # -1: d = (-1, 1, 0, 0 | 0, -2, 2, 0): 6 / sqrt(10); 2: (0, 1, 0, -1 | 0, 0, 2, 0): 4 / sqrt(6); 5: x: 3 / sqrt(5)
    torch.testing.assert_close(continuity(identity, x, 0, steps=3), torch.tensor([6 / 10**0.5]))
    summed = continuity(lambda inputs, target: inputs.sum(1), x, 0, steps=3)  # the sum: (-1, -1, 2, 0) at -1
    torch.testing.assert_close(summed, torch.tensor([4 / 6**0.5]))


def test_the_maps_and_the_perturbed_maps_need_one_layout() -> None:
    x = torch.ones(2, 3, 4)
    per_channel = lambda inputs, target: inputs**2  # noqa: E731
    plan = (x + 0.1)[None]
    with pytest.raises(InvalidInputError, match="same layout"):
        avg_sensitivity(per_channel, x, 0, maps=torch.ones(2, 4), perturbed=plan)
    with pytest.raises(InvalidInputError, match="same layout"):
        continuity(lambda inputs, target: inputs[:, 0], x, 0, maps=x.clone())
    with pytest.raises(InvalidInputError, match=r"\[B, K, \*S\] = \[2, K, 4\]"):
        local_lipschitz_estimate(per_channel, x, 0, maps=torch.ones(2, 3, 5), perturbed=plan)


# ---- every rank, batch equals one by one, hygiene ------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("dims", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_batch_equals_one_by_one_every_rank(dims: int) -> None:
    net, x = _nets(dims)
    explain = grad_x_input(net)
    plan = x[None] + 0.05 * torch.randn((4, *x.shape), generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, 2])
    x_before = x.clone()
    measures = {
        "avg": lambda x, t, p: avg_sensitivity(explain, x, t, perturbed=p, chunk_size=5),
        "lle": lambda x, t, p: local_lipschitz_estimate(explain, x, t, perturbed=p, chunk_size=5),
        "ris": lambda x, t, p: relative_input_stability(explain, net, x, t, perturbed=p, skip_changed=False),
        "ros": lambda x, t, p: relative_output_stability(explain, net, x, t, perturbed=p),
        "cont": lambda x, t, p: continuity(explain, x, t, steps=4),
    }
    for name, measure in measures.items():
        batched = measure(x, target, plan)
        single = torch.cat([measure(x[i : i + 1], target[i : i + 1], plan[:, i : i + 1]) for i in range(3)])
        # RIS divides by the map's values, some near 1e-7 here: float noise of a batched conv shows more
        rtol = 1e-3 if name in ("ris", "ros") else 1e-4
        torch.testing.assert_close(batched, single, rtol=rtol, atol=1e-6, equal_nan=True, msg=name)
        assert batched.shape == (3,) and torch.isfinite(batched).all(), name
    assert torch.equal(x, x_before)
    assert all(p.grad is None for p in net.parameters()) and not net.training


def test_generator_draws_are_reproducible_and_errors() -> None:
    net, x = _nets(2)
    explain = grad_x_input(net)
    a = max_sensitivity(explain, x, model=net, samples=3, generator=torch.Generator().manual_seed(1))
    b = max_sensitivity(explain, x, model=net, samples=3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    with pytest.raises(InvalidInputError, match="perturbed must be"):
        avg_sensitivity(explain, x, 0, perturbed=torch.zeros(2, 3, 3, 4, 4))
    with pytest.raises(InvalidInputError, match="needs the model"):
        avg_sensitivity(explain, x)


# ---- parity with captum and Quantus 0.6.0 ---------------------------------------------------


def test_max_sensitivity_equals_captum_on_the_same_perturbations() -> None:
    captum_metrics = pytest.importorskip("captum.metrics")
    net, x = _nets(2)
    explain = grad_x_input(net)
    plan = x[None] + (torch.rand((5, *x.shape), generator=torch.Generator().manual_seed(2)) * 0.04 - 0.02)
    interleaved = plan.transpose(0, 1).reshape(-1, *x.shape[1:])  # captum repeats each input N times in a row

    def explanation_func(inputs, target):
        if isinstance(inputs, tuple):  # captum passes tuples and expects tuples back
            return (explain(inputs[0], target)[:, None],)
        return explain(inputs, target)[:, None]

    theirs = captum_metrics.sensitivity_max(
        explanation_func, x, perturb_func=lambda inputs, radius: interleaved, n_perturb_samples=5,
        target=torch.tensor([0, 1, 2]),
    )  # fmt: skip
    ours = max_sensitivity(explain, x, torch.tensor([0, 1, 2]), perturbed=plan)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-6)


quantus = pytest.importorskip("quantus")


def _q_explain(model, inputs, targets, **kwargs):
    return grad_x_input(model)(torch.as_tensor(inputs), torch.as_tensor(targets))[:, None].numpy()


def _quantus_plan(x: torch.Tensor, samples: int, seed: int, draw) -> torch.Tensor:
    """The perturbed inputs Quantus draws after np.random.seed(seed): one [B, features] draw per step."""
    np.random.seed(seed)
    flat = x.flatten(1).double().numpy()
    return torch.stack([torch.as_tensor(flat + draw(flat.shape)).view_as(x).float() for _ in range(samples)])


def _run_quantus(metric, net, x, y, seed=5):
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(metric(model=net, x_batch=x.numpy(), y_batch=y.numpy(), explain_func=_q_explain,
                                 device="cpu"), dtype=np.float64)  # fmt: skip


def test_sensitivity_and_lipschitz_parity_with_quantus() -> None:
    net, x = _nets(2)
    y = torch.tensor([0, 1, 2])
    explain = grad_x_input(net)
    common = {"nr_samples": 4, "normalise": False, "abs": False, "disable_warnings": True}
    uniform = _quantus_plan(x, 4, 5, lambda shape: np.random.uniform(-0.2, 0.2, shape))
    for metric, ours in (
        (quantus.AvgSensitivity(**common), avg_sensitivity(explain, x, y, perturbed=uniform)),
        (quantus.MaxSensitivity(**common), max_sensitivity(explain, x, y, perturbed=uniform)),
    ):
        np.testing.assert_allclose(ours.numpy(), _run_quantus(metric, net, x, y), rtol=1e-4)
    gauss = _quantus_plan(x, 4, 5, lambda shape: np.random.normal(0.0, 0.1, shape))
    lle = quantus.LocalLipschitzEstimate(**common)
    np.testing.assert_allclose(
        local_lipschitz_estimate(explain, x, y, perturbed=gauss).numpy(), _run_quantus(lle, net, x, y), rtol=1e-4
    )


@pytest.mark.heavy
def test_relative_stability_parity_with_quantus() -> None:
    net, x = _nets(2)
    y = torch.tensor([0, 1, 2])
    explain = grad_x_input(net)
    # Quantus's noise for the relative stabilities is U(0.02, 0.2): every value is raised
    plan = _quantus_plan(x, 3, 5, lambda shape: np.random.uniform(0.02, 0.2, shape))
    common = {"nr_samples": 3, "normalise": False, "abs": False, "disable_warnings": True,
              "return_nan_when_prediction_changes": False}  # fmt: skip
    ris = relative_input_stability(explain, net, x, y, perturbed=plan, skip_changed=False)
    np.testing.assert_allclose(
        ris.numpy(), _run_quantus(quantus.RelativeInputStability(**common), net, x, y), rtol=1e-4
    )
    ros = relative_output_stability(explain, net, x, y, perturbed=plan, skip_changed=False)
    np.testing.assert_allclose(
        ros.numpy(), _run_quantus(quantus.RelativeOutputStability(**common), net, x, y), rtol=1e-4
    )
    rrs = relative_representation_stability(explain, net, x, y, perturbed=plan, skip_changed=False,
                                            representation=lambda t: net.relu2(net.conv2(net.relu(net.bn1(net.conv1(t))))))  # fmt: skip
    theirs = _run_quantus(quantus.RelativeRepresentationStability(**common, layer_names=["conv2"]), net, x, y)
    rrs_conv2 = relative_representation_stability(explain, net, x, y, perturbed=plan, skip_changed=False,
                                                  representation=lambda t: net.conv2(net.relu(net.bn1(net.conv1(t)))))  # fmt: skip
    np.testing.assert_allclose(rrs_conv2.numpy(), theirs, rtol=1e-4)
    assert rrs.shape == (3,)


def test_quantus_relative_stability_is_nan_when_any_perturbation_changes_the_class() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).eval()
    x = rank_input(2, batch=3)
    y = torch.tensor([0, 1, 2])
    explain = grad_x_input(net)
    plan = _quantus_plan(x, 6, 5, lambda shape: np.random.uniform(-3.0, 3.0, shape))  # large: some flip the class
    before = net(x).argmax(1)
    changed = torch.stack([net(p).argmax(1) != before for p in plan]).detach()
    assert changed.any(0).any() and not changed.all(0).all()
    metric = quantus.RelativeInputStability(nr_samples=6, normalise=False, abs=False, disable_warnings=True,
                                            perturb_func_kwargs={"lower_bound": -3.0, "upper_bound": 3.0})  # fmt: skip
    theirs = _run_quantus(metric, net, x, y)
    ours = relative_input_stability(explain, net, x, y, perturbed=plan)
    some = changed.any(0).numpy()
    assert np.isnan(theirs[some]).all()  # Quantus: one changed class spoils the whole maximum
    assert torch.isfinite(ours[~changed.all(0)]).all()  # camkit: the maximum over the perturbations that keep it
    np.testing.assert_allclose(ours.numpy()[~some], theirs[~some], rtol=1e-4)


def test_continuity_parity_with_quantus() -> None:
    net, x = _nets(2)
    y = torch.tensor([0, 1, 2])
    metric = quantus.Continuity(nr_steps=5, normalise=False, abs=False, disable_warnings=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = metric(model=net, x_batch=x.numpy(), y_batch=y.numpy(), explain_func=_q_explain, device="cpu")
    ours = continuity(grad_x_input(net), x, y, steps=5)
    np.testing.assert_allclose(ours.numpy(), np.asarray(theirs, dtype=np.float64), rtol=1e-4)


def test_consistency_quantus_scores_a_lonely_label_zero() -> None:
    net, x = _nets(2)
    x = torch.cat([x, x[:1]])
    y = net(x).argmax(1).detach()
    a = grad_x_input(net)(x, y)
    metric = quantus.Consistency(normalise=False, abs=False, disable_warnings=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = np.asarray(metric(model=net, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=a[:, None].numpy(),
                                   device="cpu"), dtype=np.float64)  # fmt: skip
    ours = consistency(a, y, n=5).double().numpy()
    shared = ~np.isnan(ours)
    assert shared[0] and shared[3]  # input 3 repeats input 0
    np.testing.assert_allclose(ours[shared], theirs[shared], atol=1e-6)
    assert (theirs[~shared] == 0).all()  # no other input shares the label: Quantus says 0, camkit NaN
