"""camkit.compat.captum's GradientShap, LayerGradientShap and LayerInputBaselineXGradient draw as captum draws.

captum draws the baselines and the points on the path from numpy's global generator and the
noise from torch's, in a fixed order; after the same seeds the translation returns captum's
attribution and convergence deltas (computed by camkit) and leaves both generators where
captum leaves them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours
from camkit.compat.captum.attr._influence import LayerInputBaselineXGradient as OursInputX

ca = pytest.importorskip("captum.attr")
layer_shap = pytest.importorskip("captum.attr._core.layer.layer_gradient_shap")


class _Two(nn.Module):
    """Two inputs of different shapes, non-linear after the layer read, an extra forward argument."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(5, 4)
        self.relu = nn.ReLU()
        self.out = nn.Linear(4, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        joint = torch.cat([a, b.flatten(1)], dim=1)
        return torch.tanh(self.out(self.relu(self.lin1(joint)))) * scale


@pytest.fixture
def two() -> nn.Module:
    torch.manual_seed(0)
    return _Two().double().eval()


@pytest.fixture
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)).double().eval()


def _seeded(call, seed: int = 7):
    """The call after both generators are seeded, and the next draw of each after it."""
    np.random.seed(seed)
    torch.manual_seed(seed)
    out = call()
    return out, np.random.rand(), torch.rand(()).item()


def _same(mine, theirs) -> None:
    # equal up to camkit's float32 accumulation of the gradients (the draws themselves are the same numbers)
    pairs = zip(mine, theirs) if isinstance(mine, tuple) else [(mine, theirs)]
    for m, t in pairs:
        assert m.shape == t.shape and m.dtype == t.dtype
        torch.testing.assert_close(m, t, atol=1e-7, rtol=1e-5)


def _untouched(net: nn.Module) -> None:
    assert all(p.grad is None for p in net.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in net.modules())


def test_gradient_shap_on_images_equals_captum_after_the_same_seeds(cnn):
    torch.manual_seed(1)
    x, dist = torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(5, 2, 4, 4, dtype=torch.float64)
    before = x.clone()
    (mine, delta), *mine_next = _seeded(lambda: ours.GradientShap(cnn).attribute(
        x, dist, n_samples=4, stdevs=0.3, target=1, return_convergence_delta=True))
    (theirs, their_delta), *their_next = _seeded(lambda: ca.GradientShap(cnn).attribute(
        x, dist, n_samples=4, stdevs=0.3, target=1, return_convergence_delta=True))
    _same(mine, theirs)
    _same(delta, their_delta)
    assert mine_next == their_next  # both generators left where captum leaves them
    assert torch.equal(x, before)
    _untouched(cnn)


def test_gradient_shap_on_two_inputs_draws_each_inputs_baselines_apart(two):
    # captum draws each input's baseline rows on their own (they need not be the same rows,
    # nor the distributions the same size)
    torch.manual_seed(2)
    xs = (torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 1, 2, dtype=torch.float64))
    dist = (torch.randn(4, 3, dtype=torch.float64), torch.randn(6, 1, 2, dtype=torch.float64))
    mine, *mine_next = _seeded(lambda: ours.GradientShap(two).attribute(
        xs, dist, n_samples=5, stdevs=(0.1, 0.2), target=[0, 2], additional_forward_args=2.0))
    theirs, *their_next = _seeded(lambda: ca.GradientShap(two).attribute(
        xs, dist, n_samples=5, stdevs=(0.1, 0.2), target=[0, 2], additional_forward_args=2.0))
    _same(mine, theirs)
    assert mine_next == their_next
    local, _, _ = _seeded(lambda: ours.GradientShap(two, multiply_by_inputs=False).attribute(xs, dist, target=1))
    their_local, _, _ = _seeded(lambda: ca.GradientShap(two, multiply_by_inputs=False).attribute(xs, dist, target=1))
    _same(local, their_local)


def test_gradient_shap_on_a_linear_model_by_hand():
    # one baseline, no noise: every draw's attribution is (x - b) * w, whatever the draws
    torch.manual_seed(0)
    lin = nn.Linear(4, 2).double()
    x, base = torch.randn(3, 4, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64)
    found, delta = ours.GradientShap(lin).attribute(x, base, n_samples=3, target=1, return_convergence_delta=True)
    torch.testing.assert_close(found, (x - base) * lin.weight[1].detach())
    assert delta.shape == (9,) and delta.abs().max() < 1e-5


def test_layer_gradient_shap_equals_captum_after_the_same_seeds(two):
    torch.manual_seed(3)
    xs = (torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 1, 2, dtype=torch.float64))
    dist = (torch.randn(5, 3, dtype=torch.float64), torch.randn(2, 1, 2, dtype=torch.float64))
    before = tuple(t.clone() for t in xs)
    for to_input in (False, True):
        def run(lib, to_input=to_input):
            return lib.LayerGradientShap(two, two.relu).attribute(
                xs, dist, n_samples=4, stdevs=0.25, target=2, additional_forward_args=1.5,
                return_convergence_delta=True, attribute_to_layer_input=to_input)

        (mine, delta), *mine_next = _seeded(lambda: run(ours))
        (theirs, their_delta), *their_next = _seeded(lambda: run(ca))
        _same(mine, theirs)
        _same(delta, their_delta)
        assert mine_next == their_next
    assert all(torch.equal(t, b) for t, b in zip(xs, before))
    _untouched(two)


def test_layer_gradient_shap_with_a_callable_baseline_and_without_the_multiplication(cnn):
    torch.manual_seed(4)
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64)

    def baselines(inputs: torch.Tensor) -> torch.Tensor:
        return torch.stack([inputs[0] * 0.5, inputs[1] * -1.0, torch.zeros_like(inputs[0])])

    for multiply in (True, False):
        def run(lib, multiply=multiply):
            return lib.LayerGradientShap(cnn, cnn[1], multiply_by_inputs=multiply).attribute(
                x, baselines, n_samples=3, stdevs=0.1, target=0)

        mine, *mine_next = _seeded(lambda: run(ours))
        theirs, *their_next = _seeded(lambda: run(ca))
        _same(mine, theirs)
        assert mine_next == their_next


def test_layer_input_baseline_x_gradient_draws_its_point_from_numpy(two):
    torch.manual_seed(5)
    xs = (torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 1, 2, dtype=torch.float64))
    bases = (torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 1, 2, dtype=torch.float64))
    (mine, delta), *mine_next = _seeded(lambda: OursInputX(two, two.lin1).attribute(
        xs, bases, target=1, return_convergence_delta=True))
    (theirs, their_delta), *their_next = _seeded(lambda: layer_shap.LayerInputBaselineXGradient(two, two.lin1).attribute(
        xs, bases, target=1, return_convergence_delta=True))
    _same(mine, theirs)
    _same(delta, their_delta)
    assert mine_next == their_next


def test_a_baseline_of_another_example_shape_is_refused(two):
    xs = (torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 1, 2, dtype=torch.float64))
    with pytest.raises(AssertionError, match="example shape"):
        ours.GradientShap(two).attribute(xs, (torch.zeros(3, 4), torch.zeros(3, 1, 2)), target=0)
    with pytest.raises(AssertionError, match=r"torch\.Tensor"):
        ours.LayerGradientShap(two, two.lin1).attribute(xs, (0.0, torch.zeros(3, 1, 2)), target=0)
    with pytest.raises(AssertionError, match="stdevs"):
        ours.LayerGradientShap(two, two.lin1).attribute(xs, (torch.zeros(3, 3), torch.zeros(3, 1, 2)),
                                                        stdevs=(0.1, 0.1, 0.1), target=0)
