"""``model_predict_kwargs`` in the robustness, randomisation, localisation, complexity and axiomatic classes.

Quantus passes them to the model's forward wherever its ``PyTorchModel.predict`` runs (the
robustness classes' prediction checks, ``Consistency``'s classes, ``RelativeOutputStability``'s
logits, ``EfficientMPRT``'s model entropies) and never when explaining; the other classes never
predict, so Quantus accepts the keywords and does not use them. camkit does the same.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq

quantus = pytest.importorskip("quantus")

H, W = 6, 8


class Keyed(nn.Module):
    """A classifier whose forward takes keywords that change its output.

    ``temperature`` divides the logits; ``quantum`` adds 100 to one class (the input's sum in
    quanta, modulo 3) where every input value is a multiple of it (the clean inputs below are; noise
    moves them off the grid, so the class of a perturbed input changes where the network alone
    picks another); ``positive`` returns ``softplus`` of the logits (non-negative outputs, for the entropy of ``EfficientMPRT``'s extras).
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * (H - 2) * (W - 2), 3)

    def forward(
        self, x: torch.Tensor, temperature: float = 1.0, quantum: float | None = None, positive: bool = False
    ) -> torch.Tensor:
        out = self.fc(self.relu(self.conv(x)).flatten(1)) / temperature
        if quantum is not None:
            on_grid = (torch.remainder(x, quantum) == 0).flatten(1).all(dim=1)
            label = torch.remainder(torch.round(x.flatten(1).sum(dim=1) / quantum), 3).long()
            out = out + 100.0 * torch.nn.functional.one_hot(label, 3) * on_grid[:, None]
        return torch.nn.functional.softplus(out) if positive else out


def explain(model, inputs, targets, **kwargs):
    """The gradient of the caller's model (Quantus and camkit explain without the keywords)."""
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(model(x).gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return grad.detach().numpy()


def batch() -> dict:
    rs = np.random.RandomState(0)
    x = (rs.randint(0, 8, size=(4, 1, H, W)) / 8).astype(np.float32)  # on the grid of 1/8
    y = np.array([0, 2, 1, 0])
    s = np.zeros((4, 1, H, W), dtype=np.float32)
    s[:, :, 1:4, 2:7] = 1.0
    return {"x_batch": x, "y_batch": y, "a_batch": explain(Keyed().eval(), x, y), "s_batch": s}


def run(lib, name: str, kwargs: dict, call: dict) -> np.ndarray:
    np.random.seed(7)
    torch.manual_seed(7)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = getattr(lib, name)(**kwargs, **extra)
        out = metric(model=Keyed().eval(), **batch(), explain_func=explain, device="cpu", **call)
    if isinstance(out, dict):
        out = [out[key] for key in sorted(out)]
    return np.asarray(out, dtype=np.float64)


#: classes that predict in Quantus: constructor arguments (the prediction checks switched on)
PREDICTING = {
    "AvgSensitivity": {"nr_samples": 3, "return_nan_when_prediction_changes": True},
    "MaxSensitivity": {"nr_samples": 3, "return_nan_when_prediction_changes": True},
    "LocalLipschitzEstimate": {"nr_samples": 3, "normalise": False, "return_nan_when_prediction_changes": True},
    "RelativeInputStability": {"nr_samples": 3},
    "RelativeOutputStability": {"nr_samples": 3},
    "RelativeRepresentationStability": {"nr_samples": 3, "layer_names": ["conv"]},
    "Consistency": {},
}
KEYWORDS = {"model_predict_kwargs": {"quantum": 0.125, "temperature": 0.5}, "softmax": False}


@pytest.mark.parametrize("name", sorted(PREDICTING))
def test_robustness_predictions_take_the_keywords_as_in_quantus(name: str) -> None:
    theirs = run(quantus, name, PREDICTING[name], KEYWORDS)
    ours = run(cq, name, PREDICTING[name], KEYWORDS)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=1e-6, equal_nan=True)
    plain = run(cq, name, PREDICTING[name], {"softmax": False})
    assert not np.allclose(plain, ours, equal_nan=True)  # the keywords changed what the model predicts


def test_continuity_prediction_check_takes_the_keywords() -> None:
    """Quantus 0.6.0's check (``return_nan_when_prediction_changes=True``) writes ``np.NaN``, gone in
    numpy 2: without it Quantus still predicts with the keywords (and does not use the predictions)."""
    kwargs = {"nr_steps": 4, "normalise": False}
    theirs, ours = run(quantus, "Continuity", kwargs, KEYWORDS), run(cq, "Continuity", kwargs, KEYWORDS)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=1e-6)
    checked = {**kwargs, "return_nan_when_prediction_changes": True}
    with_keywords, plain = run(cq, "Continuity", checked, KEYWORDS), run(cq, "Continuity", checked, {"softmax": False})
    assert np.isnan(with_keywords).any() and not np.array_equal(with_keywords, plain, equal_nan=True)


def test_efficient_mprt_model_entropies_take_the_keywords_as_in_quantus() -> None:
    call = {"model_predict_kwargs": {"temperature": 0.5, "positive": True}, "softmax": False}
    scores, extras = [], []
    for lib in (quantus, cq):
        np.random.seed(7)
        extra = {"disable_warnings": True} if lib is quantus else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = lib.EfficientMPRT(compute_extra_scores=True, **extra)
            scores.append(metric(model=Keyed().eval(), **batch(), explain_func=explain, device="cpu", **call))
        extras.append(metric.scores_extra)
    np.testing.assert_allclose(scores[1], scores[0], rtol=2e-4, atol=1e-6)
    for key in ("scores_delta_model", "scores_fraction_model"):
        np.testing.assert_allclose(np.asarray(extras[1][key], float), np.asarray(extras[0][key], float), rtol=2e-4)
    cooler = {"model_predict_kwargs": {"temperature": 2.0, "positive": True}, "softmax": False}
    metric = cq.EfficientMPRT(compute_extra_scores=True)
    metric(model=Keyed().eval(), **batch(), explain_func=explain, device="cpu", **cooler)
    assert not np.allclose(metric.scores_extra["scores_delta_model"], extras[1]["scores_delta_model"])


#: classes that never predict in Quantus (nor in camkit): the keywords are accepted and not used
UNUSED = {
    "Sparseness": {}, "Complexity": {}, "EffectiveComplexity": {"eps": 1e-3},
    "AttributionLocalisation": {}, "AUC": {}, "PointingGame": {}, "RelevanceMassAccuracy": {},
    "RelevanceRankAccuracy": {}, "TopKIntersection": {"k": 10},
    "MPRT": {"layer_order": "independent"},
    "RandomLogit": {"normalise": False, "num_classes": 3, "similarity_func": quantus.similarity_func.ssim},
    "InputInvariance": {},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(UNUSED))
def test_classes_that_never_predict_accept_the_keywords_and_do_not_use_them_as_quantus(name: str) -> None:
    unknown = {"model_predict_kwargs": {"not_a_forward_argument": 1}}  # the forward would raise if they reached it
    theirs = run(quantus, name, UNUSED[name], unknown)
    assert np.array_equal(theirs, run(quantus, name, UNUSED[name], {}), equal_nan=True)
    ours = run(cq, name, UNUSED[name], unknown)
    assert np.array_equal(ours, run(cq, name, UNUSED[name], {}), equal_nan=True)
    if name != "InputInvariance":  # Quantus's shifted model differs (docs/guide/metrics.md)
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=1e-6, equal_nan=True)


def test_efficient_mprt_with_its_default_softmax_quantus_fails_and_camkit_takes_the_softmax_of_the_forward() -> None:
    """``EfficientMPRT`` predicts whatever ``compute_extra_scores`` says and defaults to ``softmax=True``: Quantus
    hands the keywords to its ``nn.Sequential(model, Softmax)``, a TypeError."""
    call = {**batch(), "explain_func": explain, "device": "cpu", "model_predict_kwargs": {"temperature": 0.5}}
    with warnings.catch_warnings(), pytest.raises(TypeError, match="temperature"):
        warnings.simplefilter("ignore")
        quantus.EfficientMPRT(disable_warnings=True)(model=Keyed().eval(), **call)
    metric = cq.EfficientMPRT(compute_extra_scores=True)
    metric(model=Keyed().eval(), **call)
    hot = metric.scores_extra["scores_delta_model"]
    metric(model=Keyed().eval(), **{**call, "model_predict_kwargs": {"temperature": 2.0}})
    assert not np.allclose(hot, metric.scores_extra["scores_delta_model"])
