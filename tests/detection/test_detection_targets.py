"""DetectionTarget on each kind of output, against scores picked by hand, and its errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.detection import candidates_of, cxcywh_to_xyxy


def _candidates() -> torch.Tensor:
    # B=1, 3 candidates (cx, cy, w, h), K=2 classes, then 1 extra channel (a mask coefficient, say)
    boxes = torch.tensor([[5.0, 5.0, 4.0, 4.0], [5.0, 5.0, 4.0, 4.0], [20.0, 20.0, 6.0, 6.0]]).T
    probs = torch.tensor([[0.2, 0.7, 0.1], [0.9, 0.3, 0.8]])
    return torch.cat([boxes, probs, torch.full((1, 3), 7.0)])[None]


def test_candidates_by_hand():
    cands = _candidates()
    ref = torch.tensor([3.0, 3.0, 7.0, 7.0])  # candidates 0 and 1 both overlap it exactly: a tie
    assert camkit.DetectionTarget(ref, labels=0, num_classes=2)(cands).tolist() == pytest.approx([0.7])  # tie -> 0.7
    assert camkit.DetectionTarget(ref, labels=1, num_classes=2)(cands).tolist() == pytest.approx([0.9])
    assert camkit.DetectionTarget(ref, num_classes=2)(cands).tolist() == pytest.approx([0.9])  # best class: 1
    far = torch.tensor([17.0, 17.0, 23.0, 23.0])
    assert camkit.DetectionTarget(far, labels=1, num_classes=2)(cands).tolist() == pytest.approx([0.8])
    # the ultralytics tuple (candidates, extras) says K itself
    extras = {"scores": torch.zeros(1, 2, 3)}
    assert camkit.DetectionTarget(far, labels=0)((cands, extras)).tolist() == pytest.approx([0.1])
    assert candidates_of(((cands, torch.zeros(1, 4, 2, 2)), extras)) is cands  # a segmenter's nesting
    with pytest.raises(camkit.InvalidTargetError, match="num_classes=K"):
        camkit.DetectionTarget(ref, labels=0)(cands)
    with pytest.raises(camkit.InvalidTargetError, match="label 2 is out of range for 2 classes"):
        camkit.DetectionTarget(ref, labels=2, num_classes=2)(cands)
    with pytest.raises(camkit.InvalidTargetError, match=r"no candidate matches .* image\(s\) \[0\]"):
        camkit.DetectionTarget(torch.tensor([40.0, 40.0, 50.0, 50.0]), labels=0, num_classes=2)(cands)


def test_candidate_gradient_reaches_only_the_chosen_probability():
    cands = _candidates().requires_grad_(True)
    camkit.DetectionTarget(torch.tensor([3.0, 3.0, 7.0, 7.0]), labels=1, num_classes=2)(cands).sum().backward()
    expected = torch.zeros_like(cands)
    expected[0, 5, 0] = 1.0  # class 1 of candidate 0
    assert torch.equal(cands.grad, expected)


def test_detr_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.5, 5.0], [1.0, 0.0, 0.0]]])  # K=2 + none
    boxes = torch.tensor([[[0.25, 0.25, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5], [0.3, 0.25, 0.5, 0.5]]])
    output = {"logits": logits, "pred_boxes": boxes}
    ref = torch.tensor([0.0, 0.0, 10.0, 20.0])  # the top-left quarter of a 40 x 20 (H x W) image
    probs = logits.softmax(-1)
    score = camkit.DetectionTarget(ref, labels=0, image_size=(40, 20))(output)
    assert score.tolist() == pytest.approx([float(probs[0, 0, 0])])  # query 0 (IoU 1) beats query 3
    assert camkit.DetectionTarget(ref, labels=1, image_size=(40, 20))(output).tolist() == pytest.approx([float(probs[0, 1, 1])])
    assert camkit.DetectionTarget(ref, image_size=(40, 20))(output).tolist() == pytest.approx([float(probs[0, 0, 0])])
    with pytest.raises(camkit.InvalidTargetError, match="image_size"):
        camkit.DetectionTarget(ref, labels=0)(output)
    # query 2 says "no object" above all, but its best real class is 1 (Hugging Face reports it as a
    # class-1 detection with probs[0, 2, 1] below a threshold of 0.5): it is matched, with that score
    corner = torch.tensor([10.0, 20.0, 20.0, 40.0])  # query 2's box
    assert camkit.DetectionTarget(corner, labels=1, image_size=(40, 20))(output).tolist() == pytest.approx(
        [float(probs[0, 2, 1])]
    )
    assert camkit.DetectionTarget(corner, image_size=(40, 20))(output).tolist() == pytest.approx([float(probs[0, 2, 1])])
    with pytest.raises(camkit.InvalidTargetError, match="no query whose best real class is that label"):
        camkit.DetectionTarget(corner, labels=0, image_size=(40, 20))(output)
    assert torch.equal(cxcywh_to_xyxy(boxes[0, :1] * torch.tensor([20.0, 40.0, 20.0, 40.0])), ref[None])


def test_from_detections_scores_every_detection_at_once():
    dets = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]),
             "scores": torch.tensor([0.9, 0.7]), "labels": torch.tensor([1, 2])}]
    target = camkit.DetectionTarget.from_detections(dets)
    assert target(dets).tolist() == [pytest.approx([0.9, 0.7])]
    with pytest.raises(camkit.InvalidTargetError, match="same number of detections"):
        camkit.DetectionTarget.from_detections([dets[0], {"boxes": torch.zeros(1, 4), "labels": torch.zeros(1)}])


def _faster_rcnn(**kwargs: float) -> nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96, **kwargs
    ).eval()


@pytest.mark.heavy
def test_bad_inputs_on_a_detector():
    x = torch.rand(1, 3, 48, 64, generator=torch.Generator().manual_seed(0))
    model = _faster_rcnn(box_score_thresh=0.0)
    with pytest.raises(camkit.InvalidTargetError, match="lies outside the 48x64 input image"):
        camkit.GradCAM(model).explain(x, camkit.DetectionTarget(torch.tensor([70.0, 10.0, 90.0, 40.0]), 1))
    with pytest.raises(camkit.InvalidTargetError, match="label 3 is out of range for 3 classes"):
        camkit.GradCAM(model).explain(x, camkit.DetectionTarget(torch.tensor([10.0, 10.0, 30.0, 40.0]), 3))
    strict = _faster_rcnn(box_score_thresh=0.99)  # random weights: nothing scores 0.99
    with pytest.raises(camkit.InvalidTargetError, match=r"kept no detection in image\(s\) \[0\].*roi_heads.score_thresh"):
        camkit.GradCAM(strict).explain(x, camkit.DetectionTarget(torch.tensor([10.0, 10.0, 30.0, 40.0]), 1))
    with pytest.raises(camkit.InvalidTargetError, match="x2 >= x1"):
        camkit.DetectionTarget(torch.tensor([30.0, 10.0, 10.0, 40.0]))
    with pytest.raises(camkit.InvalidTargetError, match="lies outside the 48x64 input image"):  # FullGrad runs here now
        camkit.FullGrad(model).explain(x, camkit.DetectionTarget(torch.tensor([70.0, 10.0, 90.0, 40.0]), 1))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # none left after errors
