"""captum.metrics' calling forms on camkit: perturbations drawn on the repeated batch, baselines, per-example
arguments and tuple targets for ``infidelity``; ``sensitivity_max`` where an attribution is all zero."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.compat.captum import metrics as ours

cm = pytest.importorskip("captum.metrics")


class _Scaled(nn.Module):
    """``(x * w) @ M``, with a per-example scale as an extra argument (one row per example)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2).double()

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x * scale))


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return _Scaled().eval()


def test_infidelity_perturbations_are_drawn_on_the_repeated_batch(model):
    # a perturbation that only fits the batch repeated sample by sample, as captum calls it
    x = torch.tensor([[1.0, 2.5, 3.3]], dtype=torch.float64)
    scale = torch.ones(1, 3, dtype=torch.float64)
    attributions = torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64)

    def sensitivity_one(inputs):
        pert = torch.eye(3, dtype=inputs.dtype)
        return pert, (1 - pert) * inputs

    mine = ours.infidelity(model, sensitivity_one, x, attributions, additional_forward_args=(scale,), target=0,
                           n_perturb_samples=3)
    theirs = cm.infidelity(model, sensitivity_one, x, attributions, additional_forward_args=(scale,), target=0,
                           n_perturb_samples=3)
    torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-6, atol=1e-10)
    # by hand: I_k . a - (f(x) - f(x with value k removed)), squared, averaged
    with torch.no_grad():
        full = model(x, scale)[0, 0]
        expected = torch.stack([(attributions[0, k] - (full - model(x * (1 - torch.eye(3)[k]), scale)[0, 0])) ** 2
                                for k in range(3)]).mean()
    torch.testing.assert_close(mine[0].double(), expected, rtol=1e-6, atol=1e-10)


def test_infidelity_with_baselines_tuple_targets_and_rows_of_arguments():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 6)).double().eval()

    def model(x, scale):
        return net(x * scale).reshape(-1, 2, 3)

    x = torch.arange(1.0, 13.0, dtype=torch.float64).view(4, 3)
    scale = torch.rand(4, 3, dtype=torch.float64) + 0.5
    baselines = torch.ones(4, 3, dtype=torch.float64)  # x - baseline is 0 at x[0, 0]: I . a reads a zero there
    attributions = torch.randn(4, 3, dtype=torch.float64)
    attributions[0, 0] = 0.0
    targets = [(0, 1), (1, 2), (1, 0), (0, 0)]

    def to_baseline(inputs, bases):
        return torch.ones_like(bases), bases

    kwargs = dict(baselines=baselines, additional_forward_args=(scale,), target=targets, n_perturb_samples=2)
    mine = ours.infidelity(model, to_baseline, x, attributions, **kwargs)
    theirs = cm.infidelity(model, to_baseline, x, attributions, **kwargs)
    torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-6, atol=1e-10)
    chunked = ours.infidelity(model, to_baseline, x, attributions, max_examples_per_batch=4, **kwargs)
    torch.testing.assert_close(chunked, mine)
    attributions[0, 0] = 1.0  # captum's I . a now reads a value where x' = x: still captum's value
    torch.testing.assert_close(
        ours.infidelity(model, to_baseline, x, attributions, **kwargs).double(),
        cm.infidelity(model, to_baseline, x, attributions, **kwargs).double(), rtol=1e-6, atol=1e-10,
    )


def test_sensitivity_max_of_an_all_zero_attribution_is_its_largest_change():
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)

    def zero(inputs):
        return torch.zeros_like(inputs)

    def relu_of_shift(inputs):  # zero at the first example, moved by the perturbation
        if isinstance(inputs, tuple):  # captum passes its unperturbed inputs as a tuple
            return tuple(torch.relu(t - 1.0) for t in inputs)
        return torch.relu(inputs - 1.0)

    def shift(inputs, radius):
        return inputs + radius

    stays = ours.sensitivity_max(zero, x, perturb_func=shift, perturb_radius=0.5, n_perturb_samples=2)
    assert torch.equal(stays, torch.zeros(2, dtype=stays.dtype))
    mine = ours.sensitivity_max(relu_of_shift, x, perturb_func=shift, perturb_radius=0.5, n_perturb_samples=2)
    theirs = cm.sensitivity_max(relu_of_shift, x, perturb_func=shift, perturb_radius=0.5, n_perturb_samples=2)
    torch.testing.assert_close(mine.double(), theirs.double())
    # by hand: example 0 has relu(x - 1) = 0 and relu(x + 0.5 - 1) = [0.5, 0]: the change's norm 0.5 over 1
    # example 1: relu = [0, 2], moved [0, 2.5]: 0.5 / 2
    torch.testing.assert_close(mine.double(), torch.tensor([0.5, 0.25], dtype=torch.float64))
