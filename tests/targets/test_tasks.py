"""Output selectors and target kinds, each against a value computed by hand."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
from models import TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit.targets.tasks import box_iou

LOGITS = torch.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]])


class HFLikeOutput(OrderedDict):
    """Mimics HuggingFace ModelOutput: a dict with attribute access and ``to_tuple()``."""

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_tuple(self) -> tuple[Tensor, ...]:
        return tuple(self.values())


@pytest.mark.parametrize(
    ("output", "selector"),
    [
        ({"out": LOGITS, "aux": -LOGITS}, "out"),
        ((-LOGITS, LOGITS), 1),
        (SimpleNamespace(logits=LOGITS, hidden=torch.zeros(2, 4)), "logits"),
        ([LOGITS * 2], lambda o: o[0] / 2),
        (HFLikeOutput(logits=LOGITS), 0),
        (HFLikeOutput(logits=LOGITS), "logits"),
    ],
)
def test_selectors_pick_the_right_tensor(output, selector):
    chosen = camkit.select_output(output, selector)
    assert torch.equal(chosen, LOGITS)
    classes, scores = camkit.resolve_target(None, chosen)
    assert classes.tolist() == [1, 0] and scores.tolist() == [5.0, 4.0]


class DictNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet()

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        logits = self.net(x)
        return {"logits": logits, "probs": logits.softmax(dim=1)}


class ScoresNet(DictNet):
    def forward(self, x: Tensor) -> dict[str, Tensor]:
        logits = self.net(x)
        return {"scores": logits, "probs": logits.softmax(dim=1)}


@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore:AblationCAM:UserWarning")
def test_every_explainer_takes_output_and_explains_the_missing_one():
    x = tiny_input()
    bare = camkit.GradCAM(TinyNet().eval(), "conv2").explain(x, 2)
    model = DictNet().eval()
    # a dict with a "logits" tensor is scored by its logits when no output= is given
    torch.testing.assert_close(camkit.GradCAM(model, "net.conv2").explain(x, 2).maps, bare.maps)
    with pytest.raises(camkit.OutputSelectionError) as info:  # without a "logits" key nothing is guessed
        camkit.GradCAM(ScoresNet().eval(), "net.conv2").explain(x, 2)
    message = str(info.value)
    assert "'scores': Tensor[3, 5]" in message and "'probs': Tensor[3, 5]" in message
    assert "output='scores'" in message
    for key in camkit.list_methods():
        cls = camkit.get_method(key)
        if not issubclass(cls, camkit.CAMExplainer) or key == "cam":
            continue
        got = cls(model, "net.conv2", output="logits").explain(x, 2)
        want = cls(TinyNet().eval(), "conv2").explain(x, 2)
        torch.testing.assert_close(got.maps, want.maps, atol=1e-5, rtol=0, msg=key)
    torch.testing.assert_close(camkit.GradCAM(model, "net.conv2", output="logits").explain(x, 2).maps, bare.maps)


def test_segmentation_target_by_hand():
    # B=1, K=2, H=2, W=2; class 1 wins at (0, 0) and (1, 1)
    logits = torch.tensor([[[[0.0, 3.0], [1.0, 0.5]], [[2.0, 1.0], [0.0, 4.0]]]], requires_grad=True)
    score = camkit.SegmentationTarget(1)(logits)
    assert score.tolist() == [6.0]  # 2 + 4
    score.sum().backward()
    assert logits.grad[0, 1].tolist() == [[1.0, 0.0], [0.0, 1.0]] and logits.grad[0, 0].abs().sum() == 0
    weights = torch.tensor([[0.5, 0.0], [1.0, 1.0]])
    assert camkit.SegmentationTarget(0, mask=weights)(logits).tolist() == [0.0 * 0.5 + 1.0 + 0.5]
    two = torch.cat([logits.detach(), logits.detach().flip(1)])  # the second sample swaps the classes
    assert camkit.SegmentationTarget([1, 0])(two).tolist() == [6.0, 6.0]
    with pytest.raises(camkit.InvalidTargetError, match=r"mask must be \[H, W\]"):
        camkit.SegmentationTarget(0, mask=torch.ones(3, 2))(logits)  # larger on one axis only
    with pytest.raises(camkit.InvalidTargetError, match="out of range"):
        camkit.SegmentationTarget(2)(logits)


def test_similarity_target_by_hand():
    embeddings = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    reference = torch.tensor([0.0, 1.0, 0.0])
    torch.testing.assert_close(
        camkit.SimilarityTarget(reference)(embeddings), torch.tensor([4.0 / 5.0, 1.0 / 3**0.5])
    )
    per_sample = torch.tensor([[3.0, 4.0, 0.0], [-1.0, -1.0, -1.0]])
    torch.testing.assert_close(camkit.SimilarityTarget(per_sample)(embeddings), torch.tensor([1.0, -1.0]))
    with pytest.raises(camkit.InvalidTargetError, match="same D"):
        camkit.SimilarityTarget(torch.ones(4))(embeddings)


def test_regression_and_binary_targets_by_hand():
    out = torch.tensor([[0.5, -2.0], [3.0, 1.0]])
    assert camkit.RegressionTarget(1)(out).tolist() == [-2.0, 1.0]
    assert camkit.RegressionTarget(0, negate=True)(out).tolist() == [-0.5, -3.0]
    assert camkit.RegressionTarget()(torch.tensor([[7.0], [8.0]])).tolist() == [7.0, 8.0]
    assert camkit.RegressionTarget((1, 0))(torch.arange(8.0).view(2, 2, 2)).tolist() == [2.0, 6.0]
    with pytest.raises(camkit.InvalidTargetError, match="pass index="):
        camkit.RegressionTarget()(out)
    logit = torch.tensor([[1.5], [-0.5]])
    assert camkit.BinaryTarget()(logit).tolist() == [1.5, -0.5]
    assert camkit.BinaryTarget(positive=False)(logit).tolist() == [-1.5, 0.5]
    with pytest.raises(camkit.InvalidTargetError, match="single logit"):
        camkit.BinaryTarget()(out)


class OneLogit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet(classes=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[:, 0]


def test_binary_negative_class_map_is_the_mirror():
    # relu(a) - relu(-a) = a: the positive and negative raw maps add up to the signed Grad-CAM sum
    model = OneLogit().eval()
    x = tiny_input()
    pos = camkit.GradCAM(model, "net.conv2").explain(x, camkit.BinaryTarget())
    neg = camkit.GradCAM(model, "net.conv2").explain(x, camkit.BinaryTarget(positive=False))
    torch.testing.assert_close(neg.scores, -pos.scores)
    acts = {}
    handle = model.net.conv2.register_forward_hook(lambda m, i, o: acts.update(a=o))
    try:
        score = model(x)
        (grad,) = torch.autograd.grad(score.sum(), acts["a"])
    finally:
        handle.remove()
    signed = (grad.mean(dim=(2, 3))[:, :, None, None] * acts["a"].detach()).sum(dim=1)
    torch.testing.assert_close(pos.raw - neg.raw, signed, atol=1e-6, rtol=1e-5)
    assert (pos.raw * neg.raw == 0).all()


def test_similarity_target_through_an_explainer():
    model = TinyNet(classes=4).eval()
    x = tiny_input()
    reference = torch.tensor([1.0, -1.0, 0.5, 0.0])
    got = camkit.GradCAM(model, "conv2").explain(x, camkit.SimilarityTarget(reference))
    with torch.no_grad():
        expected = torch.nn.functional.cosine_similarity(model(x), reference[None], dim=1)
    torch.testing.assert_close(got.scores, expected)
    assert got.target is None


def _detections() -> list[dict[str, Tensor]]:
    return [
        {
            "boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [0.0, 0.0, 9.0, 10.0]]),
            "scores": torch.tensor([0.9, 0.6, 0.8]),
            "labels": torch.tensor([1, 2, 2]),
        },
        {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)},
    ]


def test_detection_target_by_hand():
    dets = _detections()[:1]
    ref = torch.tensor([0.0, 0.0, 10.0, 10.0])
    assert box_iou(dets[0]["boxes"], ref).tolist() == pytest.approx([1.0, 0.0, 0.9])
    assert camkit.DetectionTarget(ref)(dets).tolist() == pytest.approx([0.9])  # IoU 1.0
    assert camkit.DetectionTarget(ref, labels=2)(dets).tolist() == pytest.approx([0.8])  # IoU 0.9 among label 2
    assert camkit.DetectionTarget(torch.tensor([21.0, 21.0, 30.0, 30.0]))(dets).tolist() == pytest.approx([0.6])
    with pytest.raises(camkit.InvalidTargetError, match=r"image\(s\) \[0\].*0.9"):
        camkit.DetectionTarget(ref, labels=2, iou_threshold=0.95)(dets)
    with pytest.raises(camkit.InvalidTargetError, match=r"image\(s\) \[1\]"):
        camkit.DetectionTarget(torch.stack([ref, ref]))(_detections())  # the second image has no detection
    with pytest.raises(camkit.OutputSelectionError, match="per-image dicts"):
        camkit.DetectionTarget(ref)(torch.zeros(1, 3))


def test_select_output_error_for_detections_points_to_the_target():
    with pytest.raises(camkit.OutputSelectionError, match="DetectionTarget"):
        camkit.select_output(_detections())
