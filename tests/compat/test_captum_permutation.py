"""camkit.compat.captum's FeaturePermutation and LayerFeaturePermutation: by hand, and equal to captum's on the same seeds."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours
from camkit.compat.captum.attr._permutation import _permute_feature

ca = pytest.importorskip("captum.attr")


def _seeded(make: Any, *args: Any, seed: int = 3, **kwargs: Any) -> tuple[Any, torch.Tensor]:
    """``make(*args, **kwargs)`` after seeding torch, and torch's generator state after it (the draws must match in number too)."""
    torch.manual_seed(seed)
    out = make(*args, **kwargs)
    return out, torch.get_rng_state()


def _same(mine: Any, theirs: Any) -> None:
    mine, theirs = (mine, theirs) if isinstance(mine, tuple) else ((mine,), (theirs,))
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_two_examples_by_hand():
    # with two examples the only other order swaps them: the drop of feature j is f(x) - f(x with x_j swapped)
    x = torch.tensor([[1.0, 2.0, 7.0], [4.0, 0.0, 7.0]])
    weights = torch.tensor([1.0, -3.0, 5.0])
    attribution = ours.FeaturePermutation(lambda t: t @ weights).attribute(x)
    expected = torch.tensor([[1.0 - 4.0, -3.0 * (2.0 - 0.0), 0.0], [4.0 - 1.0, -3.0 * (0.0 - 2.0), 0.0]])
    torch.testing.assert_close(attribution, expected)


@pytest.mark.parametrize("per_eval", [1, 3])
def test_single_input_equals_captum_on_the_same_seed(per_eval):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 2, 2, 1]])
    (mine, my_state) = _seeded(lambda: ours.FeaturePermutation(net).attribute(
        x, target=2, feature_mask=mask, perturbations_per_eval=per_eval))
    (theirs, their_state) = _seeded(lambda: ca.FeaturePermutation(net).attribute(
        x, target=2, feature_mask=mask, perturbations_per_eval=per_eval))
    _same(mine, theirs)
    assert torch.equal(my_state, their_state)
    assert not x.requires_grad and all(p.grad is None for p in net.parameters())


def test_a_group_across_two_inputs_and_one_output_for_the_batch_equal_captum():
    # feature 1 spans both inputs (each input gets its own order, as in captum); the model returns one value
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 2)

    def loss(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (p.sum(dim=1) * q[:, 0] - q[:, 1]).square().mean()

    masks = (torch.tensor([[0, 1, 2]]), torch.tensor([[1, 3]]))
    for per_eval in (1, 2):
        kwargs: dict[str, Any] = {"feature_mask": masks} if per_eval == 1 else {}
        mine, my_state = _seeded(ours.FeaturePermutation(loss).attribute, (a, b), seed=per_eval, **kwargs)
        theirs, their_state = _seeded(ca.FeaturePermutation(loss).attribute, (a, b), seed=per_eval, **kwargs)
        _same(mine, theirs)
        assert mine[0].shape == (1, 3) and torch.equal(my_state, their_state)
        if per_eval == 1:  # one drop for the group, on its positions in both inputs
            assert torch.equal(mine[0][0, 1], mine[1][0, 0]) and mine[0][0, 1] != 0


def test_a_custom_perm_func_and_a_batch_of_one():
    calls: list[tuple[int, ...]] = []

    def reverse(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(mask.shape))
        return torch.where(mask, x.flip(0), x)

    x = torch.tensor([[1.0, 2.0], [3.0, 5.0], [6.0, 9.0]])
    mine = ours.FeaturePermutation(lambda t: t.sum(dim=1), perm_func=reverse).attribute(x)
    theirs = ca.FeaturePermutation(lambda t: t.sum(dim=1), perm_func=reverse).attribute(x)
    _same(mine, theirs)
    torch.testing.assert_close(mine[:, 0], torch.tensor([1.0 - 6.0, 0.0, 6.0 - 1.0]))
    assert calls[0] == calls[-1] == (1, 2) and len(calls) == 4  # two features, once each per library
    one = x[:1]  # nothing to permute: captum leaves 0 (and warns); its perm function refuses the batch
    torch.testing.assert_close(ours.FeaturePermutation(lambda t: t.sum(dim=1)).attribute(one), torch.zeros(1, 2))
    with pytest.raises(AssertionError, match="batch_size"):
        _permute_feature(one, torch.tensor([True, False]))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.lin1, self.relu, self.lin2 = nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin2(self.relu(self.lin1(x))) * scale


def test_layer_feature_permutation_equals_captum_and_leaves_no_hook():
    net = _Net()
    x = torch.randn(4, 3)
    for per_eval, mask in ((1, None), (2, torch.tensor([[0, 0, 1, 1]]))):
        options = {"additional_forward_args": (2.0,), "layer_mask": mask, "perturbations_per_eval": per_eval}
        mine, my_state = _seeded(ours.LayerFeaturePermutation(net, net.lin1).attribute, x, **options)
        theirs, their_state = _seeded(ca.LayerFeaturePermutation(net, net.lin1).attribute, x, **options)
        _same(mine, theirs)
        assert mine.shape == (8, 4) and torch.equal(my_state, their_state)  # no target: one row per output value
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())
    assert all(p.grad is None for p in net.parameters())


def test_layer_feature_permutation_with_a_target_where_captum_refuses():
    # captum selects the target twice (inside its layer forward and again outside) and raises; the
    # translation selects it once: the same as captum's own call on the model's target column
    net = _Net()
    x = torch.randn(4, 3)
    with pytest.raises(AssertionError, match="target"):
        ca.LayerFeaturePermutation(net, net.lin1).attribute(x, target=1)
    mine, _ = _seeded(lambda: ours.LayerFeaturePermutation(net, net.lin1).attribute(x, target=1))

    class Column(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.net(t)[:, 1]

    column = Column()
    theirs, _ = _seeded(lambda: ca.LayerFeaturePermutation(column, net.lin1).attribute(x))
    _same(mine, theirs)
    assert mine.shape == (4, 4)
