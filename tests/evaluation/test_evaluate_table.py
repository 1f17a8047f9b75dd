"""Every row of the metric table: one score per image, the table's needs honoured, batch equals one by one."""

from __future__ import annotations

import pytest
import torch
from evaluate_helpers import BOX, TruthModel

import camkit
from camkit.errors import InvalidInputError
from camkit.evaluation import METRICS, MetricInput
from camkit.evaluation.rows import layer_features
from camkit.evaluation.table import select_metrics

RANDOM = {"road_morf", "road_lerf", "faithfulness_correlation", "monotonicity_correlation", "infidelity", "sensitivity_n",
          "avg_sensitivity", "max_sensitivity", "infidelity_unnormalised", "local_lipschitz_estimate",
          "relative_input_stability", "relative_output_stability", "relative_representation_stability", "mprt",
          "mprt_bottom_up", "mprt_independent", "smooth_mprt", "efficient_mprt", "random_logit"}
BATCH = {"consistency", "sufficiency", "focus"}  # compare the images of a batch: a batch is not its images one by one
UNDEFINED = {"increase_in_confidence": "0/1 with NaN allowed", "consistency": "NaN without a look-alike map",
             "focus": "NaN where every part shows the class", "mprt_independent": "a layer alone may leave a flat map",
             "efficient_mprt": "NaN for a flat map"}


def batch(n=3):
    x = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    model = TruthModel()
    target = model(x).argmax(dim=1)
    maps = camkit.Saliency(model)(x, target)
    masks = torch.zeros(n, 16, 16, dtype=torch.bool)
    masks[:, BOX[1] : BOX[3], BOX[0] : BOX[2]] = True
    return model, x, maps, target, masks


def view(model, x, maps, target, masks, seed=0):
    explain = camkit.Saliency(model)
    return MetricInput(model, x, maps, target, masks, torch.Generator().manual_seed(seed), steps=4, chunk_size=16,
                       explain=explain, factory=camkit.Saliency,
                       representation=layer_features(model, "relu"))  # fmt: skip


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(METRICS))
def test_each_metric_gives_one_score_per_image(name):
    spec = METRICS[name]
    model, x, maps, target, masks = batch()
    scores = spec.compute(view(model, x, maps, target, masks))
    assert scores.shape == (3,) and scores.dtype.is_floating_point
    if name not in UNDEFINED:
        assert torch.isfinite(scores).all(), scores
    if name not in RANDOM | BATCH:  # no draw: a batch equals its images one by one
        ones = torch.cat([spec.compute(view(model, x[i : i + 1], maps[i : i + 1], target[i : i + 1], masks[i : i + 1]))
                          for i in range(3)])  # fmt: skip
        torch.testing.assert_close(scores, ones, rtol=1e-5, atol=1e-6)
    if spec.needs_masks:
        empty = spec.compute(view(model, x, maps, target, torch.zeros_like(masks)))
        assert torch.isnan(empty).all()  # no region: no score, never a miss


def test_known_values_on_the_truth_model():
    model, x, maps, target, masks = batch()
    i = view(model, x, maps, target, masks)
    # saliency is zero outside the box: every localisation share is 1 and the pointing game hits
    for name in ("pointing_game", "energy_pointing_game", "relevance_mass_accuracy", "attribution_localisation"):
        assert METRICS[name].compute(i).tolist() == pytest.approx([1.0] * 3), name
    # the centred Gaussian puts exp(-d^2 / (2 (4 px)^2)) of its mass inside the box: its share is that sum / total
    centre = camkit.evaluation.controls.centre_map(x)
    share = centre[:, BOX[1] : BOX[3], BOX[0] : BOX[2]].sum(dim=(1, 2)) / centre.sum(dim=(1, 2))
    got = METRICS["energy_pointing_game"].compute(view(model, x, centre, target, masks))
    torch.testing.assert_close(got, share)


def test_selecting_metrics():
    assert [m.name for m in select_metrics(None, have_masks=True)] == [
        "deletion", "insertion", "average_drop", "increase_in_confidence", "pointing_game", "energy_pointing_game"
    ]  # fmt: skip
    assert all(not m.needs_masks for m in select_metrics("all", have_masks=False))
    assert len(select_metrics("all", have_masks=True)) == len(METRICS)
    with pytest.raises(InvalidInputError, match="unknown metric"):
        select_metrics("deletion,nope", have_masks=True)
    with pytest.raises(InvalidInputError, match="need a localisation region"):
        select_metrics(["region_auc"], have_masks=False)
