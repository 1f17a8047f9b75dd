"""Accumulators: mean/std over batches equal the whole-set formulas; NaN samples counted and skipped."""

from __future__ import annotations

import math

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.metrics import CurveAccumulator, MetricAccumulator, auc


def test_mean_std_match_the_whole_set_however_it_is_split():
    g = torch.Generator().manual_seed(0)
    values = 3 + 2 * torch.randn(50, generator=g)
    for splits in ([50], [1, 49], [7, 13, 30], [10] * 5):
        acc = MetricAccumulator()
        for part in values.split(splits):
            acc.update(part)
        assert acc.count == 50 and acc.skipped == 0
        assert acc.mean.item() == pytest.approx(values.double().mean().item(), abs=1e-9)
        assert acc.std.item() == pytest.approx(values.double().std().item(), abs=1e-9)


def test_nan_samples_are_counted_and_skipped():
    acc = MetricAccumulator()
    acc.update(torch.tensor([1.0, float("nan"), 3.0]))
    acc.update(torch.tensor([float("nan"), float("nan")]))  # a batch of only NaN
    acc.update(torch.tensor([5.0]))
    assert (acc.count, acc.skipped) == (3, 3)
    assert acc.mean.item() == 3.0 and acc.std.item() == 2.0  # values 1, 3, 5
    assert acc.summary() == {"mean": 3.0, "std": 2.0, "count": 3, "skipped": 3}


def test_empty_and_single_sample():
    acc = MetricAccumulator()
    assert math.isnan(acc.mean.item()) and acc.count == 0
    acc.update(torch.tensor([float("nan")]))
    assert math.isnan(acc.mean.item()) and acc.skipped == 1
    acc.update(torch.tensor([2.0]))
    assert acc.mean.item() == 2.0 and math.isnan(acc.std.item())


def test_curves_skip_whole_rows_and_average_auc():
    fr = torch.tensor([0.0, 0.5, 1.0])
    first = torch.tensor([[1.0, 0.5, 0.0], [1.0, float("nan"), 0.0]])
    second = torch.tensor([[1.0, 0.0, 0.0]])
    acc = CurveAccumulator()
    acc.update(fr, first)
    acc.update(fr, second)
    assert acc.curve.mean.tolist() == [1.0, 0.25, 0.0]
    assert (acc.curve.count, acc.curve.skipped, acc.auc.skipped) == (2, 1, 1)
    # AUCs 0.5 and 0.25
    assert acc.auc.mean.item() == pytest.approx(0.375)
    assert acc.auc.mean.item() == pytest.approx(auc(fr, acc.curve.mean.float()).item())  # linear in the curve
    with pytest.raises(InvalidInputError, match="other fractions"):
        acc.update(torch.tensor([0.0, 0.25, 1.0]), second)
    with pytest.raises(InvalidInputError, match="per-sample shape"):
        acc.curve.update(torch.zeros(2, 4))
