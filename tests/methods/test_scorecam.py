"""Score-CAM and Ablation-CAM: hand-computed values, chunking, dedupe, tail path."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

import camkit


def _sig(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def fixed_net() -> nn.Sequential:
    """x [B, 1, 1, 2] -> 1x1 conv with 5 channels -> flatten -> linear(10, 2).

    Channels for x = [1, 2]: A0 = x = [1, 2], A1 = 2.5 - x = [1.5, 0.5], A2 = A3 = 0,
    A4 = 2x = [2, 4]. logit0 = sum(A0) + 0.5 sum(A1) - 0.25 A4[0]; logit1 = 0.
    """
    net = nn.Sequential(nn.Conv2d(1, 5, 1), nn.Flatten(), nn.Linear(10, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([1.0, -1.0, 0.0, 0.0, 2.0]).view(5, 1, 1, 1))
        net[0].bias.copy_(torch.tensor([0.0, 2.5, 0.0, 0.0, 0.0]))
        net[2].weight.zero_()
        net[2].weight[0] = torch.tensor([1.0, 1.0, 0.5, 0.5, 0, 0, 0, 0, -0.25, 0])
        net[2].bias.zero_()
    return net


X = torch.tensor([[[[1.0, 2.0]]]])
A0, A1, A4 = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 0.5]), torch.tensor([2.0, 4.0])


def test_scorecam_hand_computed():
    # Masks: M0 = minmax(A0) = [0, 1] (also M4), M1 = [1, 0], M2 = M3 = 0.
    # x*M0 = [0, 2]: logit0 = 2 + 0.5 * (2.5 + 0.5) - 0.25 * 0 = 3.5
    # x*M1 = [1, 0]: logit0 = 1 + 0.5 * (1.5 + 2.5) - 0.25 * 2 = 2.5
    # x*0  = [0, 0]: logit0 = 0 + 0.5 * 5 = 2.5 (weight of the all-zero channels, times A = 0)
    w0, w1 = _sig(3.5), _sig(2.5)
    expected = w0 * A0 + w1 * A1 + w0 * A4
    explanation = camkit.ScoreCAM(fixed_net(), "0", batch_size=2).explain(X)
    torch.testing.assert_close(explanation.raw[0, 0], expected, atol=1e-5, rtol=0)
    assert explanation.target.tolist() == [0]
    assert explanation.extras["scored"] == 3  # M0 (= M4), M1 and the zero mask: 3 distinct masks of 5
    torch.testing.assert_close(explanation.maps[0, 0], torch.tensor([0.0, 1.0]))


def test_scorecam_top_k_by_mass_and_variance():
    w0 = _sig(3.5)
    # mass: A4 (6) and A0 (3) beat A1 (2); both share one mask -> one masked forward.
    top2 = camkit.ScoreCAM(fixed_net(), "0", top_k=2).explain(X)
    torch.testing.assert_close(top2.raw[0, 0], w0 * A0 + w0 * A4, atol=1e-5, rtol=0)
    assert top2.extras["scored"] == 1
    # variance: A4 (1.0) beats A0 and A1 (0.25 each).
    top1 = camkit.ScoreCAM(fixed_net(), "0", top_k=1, rank_by="variance").explain(X)
    torch.testing.assert_close(top1.raw[0, 0], w0 * A4, atol=1e-5, rtol=0)


def test_scorecam_callable_target_uses_its_value():
    # weight = logit0 itself: 3.5 for M0/M4, 2.5 for M1.
    explanation = camkit.ScoreCAM(fixed_net(), "0").explain(X, target=lambda out: out[:, 0])
    torch.testing.assert_close(explanation.raw[0, 0], 3.5 * A0 + 2.5 * A1 + 3.5 * A4, atol=1e-5, rtol=0)


def test_channel_masks_upsample_then_normalise():
    from camkit.functional.perturbation import channel_masks

    # [1, 3] -> bilinear to width 4: [1, 1.5, 2.5, 3] -> min-max: [0, .25, .75, 1]
    masks = channel_masks(torch.tensor([[[1.0, 3.0]], [[5.0, 5.0]]]), (1, 4))
    torch.testing.assert_close(masks, torch.tensor([[[0.0, 0.25, 0.75, 1.0]], [[0.0, 0.0, 0.0, 0.0]]]))


class Recorder(nn.Module):
    """Wraps a model and records each forward's batch size and grad mode."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.seen: list[tuple[int, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.shape[0], torch.is_grad_enabled()))
        return self.model(x)


def wide_net(channels: int = 20) -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(channels, 5),
    ).eval()


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_scorecam_chunks_bound_the_batch_and_run_without_autograd(batch_size):
    wrapped = Recorder(wide_net())
    x = tiny_input(batch=4)
    explanation = camkit.ScoreCAM(wrapped, "model.2", batch_size=batch_size).explain(x)
    masked = wrapped.seen[1:]  # the first call is the capturing forward
    assert sum(n for n, _ in masked) == explanation.extras["scored"]
    assert max(n for n, _ in masked) <= batch_size
    assert not any(grad for _, grad in wrapped.seen)


@pytest.mark.parametrize("key", ["scorecam", "ablationcam", "ablationcam-full", "occlusion", "rise"])
def test_batch_size_does_not_change_results(key):
    model, x = wide_net(), tiny_input(batch=4)
    targets = torch.tensor([[0, 3], [1, 1], [4, 2], [2, 0]])

    def build(bs: int) -> camkit.Explainer:
        if key == "scorecam":
            return camkit.ScoreCAM(model, "2", batch_size=bs)
        if key == "ablationcam":
            return camkit.AblationCAM(model, "2", batch_size=bs)
        if key == "ablationcam-full":
            return camkit.AblationCAM(model, "2", batch_size=bs, tail=False)
        if key == "occlusion":
            return camkit.Occlusion(model, window=3, stride=2, batch_size=bs)
        return camkit.RISE(model, masks=40, seed=1, grid=3, batch_size=bs)

    results = [build(bs).explain(x, targets) for bs in (1, 7, 64)]
    for other in results[1:]:
        torch.testing.assert_close(other.maps, results[0].maps, atol=1e-5, rtol=0)
        torch.testing.assert_close(other.raw, results[0].raw, atol=1e-5, rtol=1e-5)


def test_scorecam_under_inference_mode():
    model, x = wide_net(), tiny_input(batch=2)
    expected = camkit.ScoreCAM(model, "2").explain(x).maps
    with torch.inference_mode():
        inside = camkit.ScoreCAM(model, "2").explain(x).maps
    torch.testing.assert_close(inside, expected)


def test_ablation_hand_computed():
    # Zeroing a channel removes its share of logit0: w0 = 1 + 2 = 3, w1 = 0.5 * (1.5 + 0.5) = 1,
    # w4 = -0.25 * 2 = -0.5, w2 = w3 = 0. Map = relu(3 A0 + A1 - 0.5 A4) = [3.5, 4.5].
    explanation = camkit.AblationCAM(fixed_net(), "0", batch_size=2).explain(X)
    assert explanation.extras["tail"] is True
    torch.testing.assert_close(explanation.raw[0, 0], torch.tensor([3.5, 4.5]), atol=1e-5, rtol=0)


def test_ablation_tail_equals_full_forward():
    model, x = wide_net(), tiny_input(batch=3)
    targets = torch.tensor([[0, 1], [2, 3], [4, 0]])
    tail = camkit.AblationCAM(model, "1", batch_size=5).explain(x, targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # full forwards asked for explicitly: no warning
        full = camkit.AblationCAM(model, "1", batch_size=5, tail=False).explain(x, targets)
    assert tail.extras["tail"] and not full.extras["tail"]
    torch.testing.assert_close(tail.raw, full.raw, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail.maps, full.maps, atol=1e-5, rtol=0)


def test_ablation_user_tail_on_a_non_sequential_model():
    model, x = TinyNet().eval(), tiny_input(batch=2)

    def tail(a: torch.Tensor) -> torch.Tensor:
        return model.fc(torch.flatten(model.pool(model.relu2(a)), 1))

    explainer = camkit.AblationCAM(model, "conv2")
    with pytest.warns(UserWarning, match="cannot be rerun on its own"):
        full = explainer.explain(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per explainer
        explainer.explain(x)
        fast = camkit.AblationCAM(model, "conv2", tail=tail).explain(x)
    assert fast.extras["tail"] and not full.extras["tail"]
    torch.testing.assert_close(fast.maps, full.maps, atol=1e-5, rtol=0)


def test_ablation_rejects_a_wrong_tail():
    model = TinyNet().eval()
    with pytest.raises(camkit.InvalidInputError, match="does not reproduce"):
        camkit.AblationCAM(model, "conv2", tail=lambda a: model.fc(a.mean(dim=(2, 3)))).explain(tiny_input())


def test_bad_arguments():
    with pytest.raises(camkit.InvalidInputError, match="batch_size"):
        camkit.ScoreCAM(TinyNet(), "conv2", batch_size=0)
    with pytest.raises(camkit.InvalidInputError, match="rank_by"):
        camkit.ScoreCAM(TinyNet(), "conv2", rank_by="max")  # type: ignore[arg-type]
    with pytest.raises(camkit.InvalidInputError, match="tail"):
        camkit.AblationCAM(TinyNet(), "conv2", tail="yes")  # type: ignore[arg-type]
