"""Deletion / insertion curves, AUC, average drop and increase in confidence: hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

from camkit.errors import InvalidInputError, InvalidTargetError
from camkit.metrics import (
    auc,
    average_drop,
    blur_baseline,
    deletion_curve,
    increase_in_confidence,
    insertion_curve,
)


class SumNet(nn.Module):
    """One class whose score is the sum of every input value."""

    def forward(self, x):
        return x.sum(dim=(1, 2, 3))[:, None]


class PlusMinus(nn.Module):
    """Two classes scoring +sum and -sum: softmax of class 0 is sigmoid(2 * sum)."""

    def forward(self, x):
        s = x.sum(dim=(1, 2, 3))
        return torch.stack([s, -s], dim=1)


SQUARE = torch.tensor([[[[0.4, 0.3], [0.2, 0.1]]]])
ROW = torch.tensor([[[[0.3, 0.25, 0.2, 0.15, 0.1]]]])


def close(t, expected, tol=1e-6):
    return torch.allclose(t.double().cpu(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def test_issue_case_2x2(device):
    x = SQUARE.to(device)
    fr, dele = deletion_curve(SumNet(), x, x[:, 0], steps=2)
    fr_i, ins = insertion_curve(SumNet(), x, x[:, 0], steps=2)
    assert close(fr, [0.0, 0.5, 1.0]) and close(fr_i, [0.0, 0.5, 1.0])
    assert close(dele, [[1.0, 0.3, 0.0]]) and close(ins, [[0.0, 0.7, 1.0]])
    assert close(auc(fr, dele), [0.4]) and close(auc(fr_i, ins), [0.6])
    assert dele.shape == (1, 3) and dele.device.type == device.type


def test_issue_case_1x5_uses_ceil_counts():
    fr, dele = deletion_curve(SumNet(), ROW, ROW[:, 0], steps=3)
    _, ins = insertion_curve(SumNet(), ROW, ROW[:, 0], steps=3)
    assert close(fr, [0.0, 0.4, 0.8, 1.0])  # ceil(5k/3) = 0, 2, 4, 5
    assert close(dele, [[1.0, 0.45, 0.1, 0.0]])
    assert close(ins, [[0.0, 0.55, 0.9, 1.0]])
    # trapezoids: 0.4 * (1 + .45) / 2 + 0.4 * (.45 + .1) / 2 + 0.2 * (.1 + 0) / 2
    assert close(auc(fr, dele), [0.29 + 0.11 + 0.01])


def test_ties_are_taken_in_row_major_order():
    x = torch.tensor([[[[0.1, 0.2, 0.3, 0.4]]]])
    maps = torch.tensor([[[1.0, 1.0, 1.0, 0.0]]])
    _, dele = deletion_curve(SumNet(), x, maps, steps=4)
    assert close(dele, [[1.0, 0.9, 0.7, 0.4, 0.0]])  # pixels 0, 1, 2 (tied), then 3
    flat = torch.ones(1, 2, 2)
    _, dele = deletion_curve(SumNet(), SQUARE, flat, steps=4)
    assert close(dele, [[1.0, 0.6, 0.3, 0.1, 0.0]])  # (0,0), (0,1), (1,0), (1,1)


def test_all_channels_of_a_pixel_go_together():
    x = torch.cat([SQUARE, 10 * SQUARE], dim=1)  # [1, 2, 2, 2], total 11
    maps = torch.tensor([[[0.0, 1.0], [0.5, 0.2]]])  # order: (0,1), (1,0), (1,1), (0,0)
    fr, dele = deletion_curve(SumNet(), x, maps, steps=4)
    assert close(fr, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert close(dele, [[11.0, 11 - 3.3, 11 - 5.5, 11 - 6.6, 0.0]], tol=1e-5)


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        (1.0, [1.0, 2.3, 4.0]),
        (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), [1.0, 3.3, 10.0]),  # [H, W] broadcasts over B and C
        ("mean", [1.0, 0.8, 1.0]),  # mean 0.25 replaces 0.4 and 0.3
        (lambda x: torch.full_like(x, 0.5), [1.0, 1.3, 2.0]),
    ],
)
def test_baselines(baseline, expected):
    _, dele = deletion_curve(SumNet(), SQUARE, SQUARE[:, 0], steps=2, baseline=baseline)
    assert close(dele, [expected])


def test_blur_baseline_values_and_use():
    x = torch.zeros(1, 1, 1, 9)
    x[..., 4] = 1.0
    kernel = [math.exp(-(d**2) / 2) for d in range(-3, 4)]
    expected = [0.0] + [k / sum(kernel) for k in kernel] + [0.0]
    assert close(blur_baseline(x, sigma=1.0)[0, 0], [expected])
    const = torch.full((1, 3, 5, 6), 0.7)
    assert close(blur_baseline(const), torch.full((1, 3, 5, 6), 0.7).tolist())
    img = tiny_input(2, size=8)
    _, dele = deletion_curve(SumNet(), img, img[:, 0], steps=1, baseline="blur")
    assert torch.allclose(dele[:, 1], blur_baseline(img).sum(dim=(1, 2, 3)), atol=1e-5)
    _, ins = insertion_curve(SumNet(), img, img[:, 0], steps=1, baseline="blur")
    assert torch.allclose(ins[:, 0], dele[:, 1], atol=1e-5)


def test_softmax_option_and_explicit_targets():
    x = SQUARE
    _, probs = deletion_curve(PlusMinus(), x, x[:, 0], target=0, steps=2, softmax=True)
    sig = [1 / (1 + math.exp(-2 * s)) for s in (1.0, 0.3, 0.0)]
    assert close(probs, [sig], tol=1e-6)
    _, raw = deletion_curve(PlusMinus(), x, x[:, 0], target=[1], steps=2)
    assert close(raw, [[-1.0, -0.3, 0.0]])
    _, called = deletion_curve(PlusMinus(), x, x[:, 0], target=lambda out: out[:, 0] - out[:, 1], steps=2)
    assert close(called, [[2.0, 0.6, 0.0]])


def test_target_none_is_top1_of_the_clean_image():
    net, x = TinyNet(), tiny_input(4)
    maps = torch.rand(4, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = net.eval()(x)
    _, dele = deletion_curve(net, x, maps, steps=4)
    _, ins = insertion_curve(net, x, maps, steps=4)
    assert torch.allclose(dele[:, 0], out.max(dim=1).values, atol=1e-5)
    assert torch.allclose(ins[:, -1], out.max(dim=1).values, atol=1e-5)
    _, dele7 = deletion_curve(net, x, maps, target=2, steps=4)
    assert torch.allclose(dele7[:, 0], out[:, 2], atol=1e-5)


@pytest.mark.parametrize("curve", [deletion_curve, insertion_curve])
def test_batch_equals_one_by_one_and_chunk_size_does_not_matter(curve, device):
    net, x = TinyNet().to(device), tiny_input(5).to(device)
    maps = torch.rand(5, 8, 8, generator=torch.Generator().manual_seed(4)).to(device)
    fr, batched = curve(net, x, maps, steps=7, baseline="blur", chunk_size=6)
    singles = torch.cat([curve(net, x[i : i + 1], maps[i : i + 1], steps=7, baseline="blur")[1] for i in range(5)])
    assert torch.allclose(batched, singles, atol=1e-5)
    for size in (1, 13, 1000):
        assert torch.allclose(curve(net, x, maps, steps=7, baseline="blur", chunk_size=size)[1], batched, atol=1e-5)
    assert fr.shape == (8,) and batched.shape == (5, 8)


def test_nan_map_gives_a_nan_row_only():
    x = torch.cat([SQUARE, SQUARE])
    maps = x[:, 0].clone()
    maps[1, 0, 0] = float("nan")
    _, dele = deletion_curve(SumNet(), x, maps, steps=2)
    assert close(dele[:1], [[1.0, 0.3, 0.0]])
    assert torch.isnan(dele[1]).all()


def test_model_inputs_and_grads_untouched():
    net, x = TinyNet(), tiny_input(3)
    net.train()
    net.bn1.eval()
    net.fc.weight.requires_grad_(False)
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    maps = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(5))
    x0, maps0 = x.clone(), maps.clone()
    for run in (deletion_curve, insertion_curve):
        run(net, x, maps, steps=3, chunk_size=4)
    average_drop(net, x, maps)
    increase_in_confidence(net, x, maps)
    assert [m.training for m in net.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())  # BN stats not updated
    assert all(p.grad is None for p in net.parameters())
    assert net.fc.weight.requires_grad is False and net.conv1.weight.requires_grad is True
    assert torch.equal(x, x0) and torch.equal(maps, maps0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())


class ModeSum(nn.Module):
    """Scores the sum, doubled while in training mode."""

    def forward(self, x):
        return x.sum(dim=(1, 2, 3))[:, None] * (2.0 if self.training else 1.0)


def test_keep_mode_runs_the_callers_modes():
    net = ModeSum()
    _, evaluated = deletion_curve(net, SQUARE, SQUARE[:, 0], steps=2)
    _, kept = deletion_curve(net, SQUARE, SQUARE[:, 0], steps=2, keep_mode=True)
    assert close(evaluated, [[1.0, 0.3, 0.0]]) and close(kept, [[2.0, 0.6, 0.0]])
    assert net.training


def test_average_drop_and_increase_in_confidence_exact():
    x = torch.ones(3, 1, 2, 2)
    maps = torch.tensor([[[1.0, 0.5], [0.0, 0.5]], [[1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 0.25]]])
    assert close(average_drop(SumNet(), x, maps, softmax=False), [0.5, 0.0, 0.9375])
    assert close(increase_in_confidence(SumNet(), x, maps, softmax=False), [0.0, 0.0, 0.0])
    # PlusMinus, class 0, softmax: Y = sigmoid(8), O = sigmoid(2 * masked sum)
    y = 1 / (1 + math.exp(-8))
    o = [1 / (1 + math.exp(-2 * s)) for s in (2.0, 4.0, 0.25)]
    assert close(average_drop(PlusMinus(), x, maps, target=0), [(y - v) / y for v in o])
    # class 1 with a map that lowers the sum raises its probability
    assert close(increase_in_confidence(PlusMinus(), x, maps, target=1), [1.0, 0.0, 1.0])


def test_average_drop_nan_cases():
    x = torch.ones(2, 1, 2, 2)
    maps = torch.ones(2, 2, 2)
    maps[1, 0, 0] = float("nan")
    drop = average_drop(SumNet(), x, maps, softmax=False)
    rise = increase_in_confidence(SumNet(), x, maps, softmax=False)
    assert close(drop[:1], [0.0]) and torch.isnan(drop[1])
    assert close(rise[:1], [0.0]) and torch.isnan(rise[1])
    neg = average_drop(SumNet(), -x, torch.ones(2, 2, 2), softmax=False)  # Y <= 0: no ratio
    assert torch.isnan(neg).all()


def test_auc_shapes_and_errors():
    fr = torch.tensor([0.0, 0.25, 1.0])
    assert close(auc(fr, torch.tensor([[2.0, 2.0, 0.0], [0.0, 4.0, 4.0]])), [0.25 * 2 + 0.75, 0.5 + 0.75 * 4])
    with pytest.raises(InvalidInputError, match=r"fractions \[S\]"):
        auc(fr, torch.zeros(2, 4))


def test_input_errors_say_what_to_do():
    net, x = SumNet(), SQUARE
    with pytest.raises(InvalidInputError, match="upsample_maps"):
        deletion_curve(net, x, torch.zeros(1, 4, 4))
    with pytest.raises(InvalidInputError, match=r"maps\[:, 0\]"):
        deletion_curve(net, x, torch.zeros(1, 1, 2, 2))
    with pytest.raises(InvalidInputError, match="steps"):
        deletion_curve(net, x, x[:, 0], steps=0)
    with pytest.raises(InvalidInputError, match="unknown baseline 'gray'"):
        deletion_curve(net, x, x[:, 0], baseline="gray")
    with pytest.raises(InvalidInputError, match="does not broadcast"):
        deletion_curve(net, x, x[:, 0], baseline=torch.zeros(3, 3))
    with pytest.raises(InvalidInputError, match="chunk_size"):
        deletion_curve(net, x, x[:, 0], chunk_size=0)
    with pytest.raises(InvalidTargetError, match="one target per image"):
        deletion_curve(PlusMinus(), x, x[:, 0], target=torch.tensor([[0, 1]]))
    with pytest.raises(InvalidTargetError, match="out of range"):
        insertion_curve(net, x, x[:, 0], target=3)
