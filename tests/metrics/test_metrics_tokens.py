"""Deletion and insertion by a token's log-probability, over image units, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.metrics import auc, token_deletion_curve, token_insertion_curve, unit_scores


class _Planted:
    """Two answer tokens over three units: token t's logit is w[t] . (shown units' values); vocabulary {it, other}."""

    def __init__(self) -> None:
        self.values = torch.tensor([1.0, 2.0, 3.0])
        self.w = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
        self.calls: list[tuple[list[list[bool]], list[int]]] = []

    def __call__(self, keep: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.calls.append((keep.tolist(), tokens.tolist()))
        logit = (self.w[tokens] * self.values * keep).sum(dim=1)
        return torch.log_softmax(torch.stack([logit, torch.zeros_like(logit)], dim=1), dim=1)[:, 0]


def _logsig(z: float) -> float:
    return -math.log1p(math.exp(-z))


def test_deletion_by_hand():
    scorer = _Planted()
    ranking = torch.tensor([[0.1, 0.2, 0.9], [0.5, 0.5, 0.0]])  # token 0: unit 2 first; token 1: units 0, 1 tied
    fractions, curves = token_deletion_curve(scorer, ranking, steps=3, chunk_size=5)
    assert fractions.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    # token 0 (logit 3 * shown[2]): hiding unit 2 first drops it to log sigmoid(0) at once
    expect0 = [_logsig(3.0), _logsig(0.0), _logsig(0.0), _logsig(0.0)]
    # token 1 (logit 2 * shown[0]): the tie goes to unit 0 (unit order), hidden at step 1
    expect1 = [_logsig(2.0), _logsig(0.0), _logsig(0.0), _logsig(0.0)]
    torch.testing.assert_close(curves, torch.tensor([expect0, expect1]))
    assert sum(len(t) for _, t in scorer.calls) == 8 and max(len(t) for _, t in scorer.calls) <= 5  # chunked
    area = auc(fractions, curves)
    torch.testing.assert_close(area[0], torch.tensor((expect0[0] + expect0[1]) / 6 + 2 * expect0[1] / 3))


def test_insertion_by_hand_and_a_bad_ranking_scores_worse():
    scorer = _Planted()
    good = torch.tensor([[0.0, 0.1, 1.0]])  # token 0 depends on unit 2
    bad = torch.tensor([[1.0, 0.5, 0.0]])  # unit 2 last
    fractions, curve = token_insertion_curve(scorer, good, steps=3)
    torch.testing.assert_close(curve[0], torch.tensor([_logsig(0.0), _logsig(3.0), _logsig(3.0), _logsig(3.0)]))
    _, worse = token_insertion_curve(scorer, bad, steps=3)
    torch.testing.assert_close(worse[0], torch.tensor([_logsig(0.0), _logsig(0.0), _logsig(0.0), _logsig(3.0)]))
    assert float(auc(fractions, curve)[0]) > float(auc(fractions, worse)[0])
    _, deleted = token_deletion_curve(scorer, bad, steps=3)
    _, deleted_good = token_deletion_curve(scorer, good, steps=3)
    assert float(auc(fractions, deleted_good)[0]) < float(auc(fractions, deleted)[0])


def test_units_without_a_score_go_last_and_block_spacing():
    scorer = _Planted()
    ranking = torch.tensor([[float("nan"), 0.0, 1.0]])
    fractions, _ = token_deletion_curve(scorer, ranking, steps=2, spacing="block")
    assert fractions.tolist() == pytest.approx([0.0, 2 / 3, 1.0])
    (keep, tokens), = scorer.calls
    assert tokens == [0, 0, 0] and keep[1] == [True, False, False]  # units 2, 1 hidden first: the NaN unit 0 last


def test_unit_scores_average_each_box():
    maps = torch.arange(16.0).view(1, 4, 4)
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [2.0, 2.0, 4.0, 4.0], [float("nan")] * 4, [0.2, 0.2, 0.4, 0.4]])
    got = unit_scores(maps, boxes)
    assert got[0, :2].tolist() == [(0 + 1 + 4 + 5) / 4, (10 + 11 + 14 + 15) / 4]
    assert got[0, 2:].isnan().all()  # no pixels: NaN


def test_bad_input():
    with pytest.raises(InvalidInputError, match=r"\[T, N\]"):
        token_deletion_curve(_Planted(), torch.zeros(3))
    with pytest.raises(InvalidInputError, match="one log-probability per row"):
        token_deletion_curve(lambda keep, tokens: torch.zeros(1, 1), torch.zeros(1, 3))
    with pytest.raises(InvalidInputError, match="steps"):
        token_insertion_curve(_Planted(), torch.zeros(1, 3), steps=0)
