"""Localisation measures: formulas by hand, parity with Quantus 0.6.0, every rank, bad inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.metrics import (
    attribution_localisation,
    focus,
    pointing_game,
    region_auc,
    relevance_mass_accuracy,
    relevance_rank_accuracy,
    top_k_intersection,
)

NAN = float("nan")


def _close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), equal_nan=True)


def _batch(spatial: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    maps = torch.rand(3, *spatial, generator=g)
    masks = torch.rand(3, *spatial, generator=g) > 0.6
    masks[0].view(-1)[0] = True
    masks[2] = False  # an empty region
    return maps, masks


# ---- formulas by hand ----------------------------------------------------------------------


def test_mass_and_localisation_by_hand() -> None:
    maps = torch.tensor([[1.0, 3.0, 0.0, 4.0], [1.0, -1.0, 2.0, 0.0]])
    masks = torch.tensor([[False, True, False, True], [True, True, False, False]])
    _close(relevance_mass_accuracy(maps, masks), [7 / 8, 0.0])
    # positive_only: the second map becomes [1, 0, 2, 0]: 1 of 3 inside
    _close(attribution_localisation(maps, masks, positive_only=True), [7 / 8, 1 / 3])
    _close(attribution_localisation(maps, masks, positive_only=True, weighted=True), [7 / 16, 1 / 6])
    # a share above 1 (negative relevance outside) is undefined
    _close(attribution_localisation(torch.tensor([[2.0, -1.0]]), torch.tensor([[True, False]])), [NAN])


def test_rank_measures_by_hand() -> None:
    maps = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.3]])
    masks = torch.tensor([[True, True, False, False, True]])  # K = 3: top-3 = {1, 3, 2}: one inside
    _close(relevance_rank_accuracy(maps, masks), [1 / 3])
    _close(top_k_intersection(maps, masks, k=2), [0.5])  # top-2 = {1, 3}
    _close(top_k_intersection(maps, masks, k=2, concept_influence=True), [0.5 * 5 / 3])
    # ties: the earlier position ranks first (position 0 before position 2)
    tied = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    _close(top_k_intersection(tied, torch.tensor([[True, False, False, False]]), k=1), [1.0])
    _close(top_k_intersection(tied, torch.tensor([[False, False, True, False]]), k=1), [0.0])


def test_region_auc_by_hand_with_ties() -> None:
    # positives 0.5, 0.5; negatives 0.5, 0.2: pairs (p > n) 1 + 1, ties 0.5 + 0.5 -> 3 of 4
    maps = torch.tensor([[0.5, 0.5, 0.5, 0.2]])
    _close(region_auc(maps, torch.tensor([[True, True, False, False]])), [0.75])
    _close(region_auc(maps, torch.ones(1, 4, dtype=torch.bool)), [NAN])  # no negatives


def test_focus_by_hand_every_rank() -> None:
    signal = torch.tensor([[1.0, 2.0, 3.0, -1.0, 4.0]])  # halves [0:2] and [2:5]
    _close(focus(signal, torch.tensor([[1, 0]])), [3 / 10])
    image = torch.zeros(1, 2, 3)
    image[0, 0, 0], image[0, 0, 2], image[0, 1, 1] = 1.0, 2.0, 5.0  # parts: TL {(0,0)}, TR {(0,1),(0,2)}, BL, BR
    _close(focus(image, torch.tensor([[0, 1, 0, 1]])), [7 / 8])
    volume = torch.zeros(1, 2, 2, 2)
    volume[0, 1, 0, 1] = 3.0  # part index 0b101 = 5
    volume[0, 0, 0, 0] = 1.0  # part 0
    parts = torch.zeros(1, 8)
    parts[0, 5] = 1
    _close(focus(volume, parts), [0.75])


def test_pointing_game_ties_any() -> None:
    maps = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    region = torch.tensor([[False, False, True, False]])
    assert pointing_game(maps, region).tolist() == [False]  # first maximum: position 0
    assert pointing_game(maps, region, ties="any").tolist() == [True]
    with pytest.raises(InvalidInputError, match="ties"):
        pointing_game(maps, region, tolerance=1, ties="any")


# ---- every rank, batch equals one by one, undefined cases -----------------------------------

MEASURES = {
    "mass": relevance_mass_accuracy,
    "rank": relevance_rank_accuracy,
    "topk": lambda m, r: top_k_intersection(m, r, k=3, concept_influence=True),
    "local": lambda m, r: attribution_localisation(m, r, weighted=True),
    "auc": region_auc,
}


@pytest.mark.parametrize("spatial", [(10,), (4, 5), (2, 3, 4)], ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("name", list(MEASURES))
def test_batch_equals_one_by_one_every_rank(name: str, spatial: tuple[int, ...]) -> None:
    measure = MEASURES[name]
    maps, masks = _batch(spatial)
    batched = measure(maps, masks)
    single = torch.cat([measure(maps[i : i + 1], masks[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(batched, single, equal_nan=True)
    assert torch.isnan(batched[2]) and not torch.isnan(batched[:2]).any()  # empty region: NaN
    nan_map = maps.clone()
    nan_map[0].view(-1)[1] = NAN
    assert torch.isnan(measure(nan_map, masks)[0])
    assert not torch.isnan(maps).any()  # inputs untouched


def test_wrong_mask_is_a_clear_error() -> None:
    maps = torch.rand(2, 4, 4)
    with pytest.raises(InvalidInputError, match=r"expected the maps' \[2, 4, 4\]"):
        relevance_mass_accuracy(maps, torch.ones(2, 4, 5, dtype=torch.bool))
    with pytest.raises(InvalidInputError, match="bool"):
        region_auc(maps, torch.ones(2, 4, 4))
    with pytest.raises(InvalidInputError, match="k must be"):
        top_k_intersection(maps, torch.ones(2, 4, 4, dtype=torch.bool), k=17)
    with pytest.raises(InvalidInputError, match=r"parts must be \[B, 4\]"):
        focus(maps, torch.ones(2, 2))


def test_boxes_on_images() -> None:
    maps = torch.zeros(1, 4, 4)
    maps[0, 1, 2] = 1.0
    _close(relevance_mass_accuracy(maps, torch.tensor([[2, 0, 4, 2]])), [1.0])


# ---- parity with Quantus 0.6.0 -------------------------------------------------------------

quantus = pytest.importorskip("quantus")


def _quantus(metric_cls, maps: torch.Tensor, masks: torch.Tensor, **kwargs) -> np.ndarray:
    a = maps[:, None].numpy()
    s = masks[:, None].numpy().astype(np.float32)
    x = np.zeros_like(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = metric_cls(normalise=False, abs=False, disable_warnings=True, **kwargs)
        scores = metric(model=None, x_batch=x, y_batch=np.zeros(len(a), int), a_batch=a, s_batch=s)
    return np.asarray(scores, dtype=np.float64)


def test_parity_with_quantus_where_quantus_is_right() -> None:
    maps, masks = _batch((6, 6))
    cases = [
        (quantus.RelevanceMassAccuracy, {}, relevance_mass_accuracy(maps, masks)),
        (quantus.RelevanceRankAccuracy, {}, relevance_rank_accuracy(maps, masks)),
        (quantus.TopKIntersection, {"k": 7}, top_k_intersection(maps, masks, k=7)),
        (
            quantus.TopKIntersection,
            {"k": 7, "concept_influence": True},
            top_k_intersection(maps, masks, k=7, concept_influence=True),
        ),
        (quantus.AttributionLocalisation, {}, attribution_localisation(maps, masks)),
        (quantus.AUC, {}, region_auc(maps, masks)),
    ]
    for metric_cls, kwargs, ours in cases:
        expected = _quantus(metric_cls, maps, masks, **kwargs)
        np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, equal_nan=True)
    # region AUC with tied values (scikit-learn's ROC handles ties as half a pair, as we do)
    coarse = (maps * 3).floor()
    np.testing.assert_allclose(
        region_auc(coarse, masks).double().numpy(), _quantus(quantus.AUC, coarse, masks), rtol=1e-6, equal_nan=True
    )


def test_quantus_pointing_game_counts_an_empty_region_as_a_hit() -> None:
    maps, masks = _batch((6, 6))
    expected_hits = pointing_game(maps, masks, ties="any")
    quantus_hits = _quantus(quantus.PointingGame, maps, masks)
    assert quantus_hits[:2].tolist() == expected_hits[:2].double().tolist()  # equal where the region is not empty
    assert quantus_hits[2] == 1.0  # the empty region: Quantus writes NaN into a bool array, which reads True
    assert expected_hits[2].item() is False  # camkit: no region, no hit


def test_quantus_weighted_localisation_divides_by_the_wrong_size() -> None:
    # Quantus sizes the data as x_batch[2:].size: the values of the samples after the second, not
    # the positions of one map. With four 6x6 samples that is 72, twice the 36 positions.
    maps, masks = _batch((6, 6))
    maps, masks = torch.cat([maps, maps[:1]]), torch.cat([masks, masks[:1]])
    ours = attribution_localisation(maps, masks, weighted=True).double().numpy()
    share = attribution_localisation(maps, masks).double().numpy()
    np.testing.assert_allclose(ours, share * masks.flatten(1).sum(1).numpy() / 36, rtol=1e-6, equal_nan=True)
    theirs = _quantus(quantus.AttributionLocalisation, maps, masks, weighted=True)
    np.testing.assert_allclose(theirs, ours / 2, rtol=1e-5, equal_nan=True)
    # and with two samples x_batch[2:] is empty: every weighted score is infinite
    assert np.isinf(_quantus(quantus.AttributionLocalisation, maps[:2], masks[:2], weighted=True)).all()
