"""Detection: the detection target, reading detectors' outputs, and narrowing their backward graph.

* :mod:`camkit.detection.target`: :class:`DetectionTarget`, the score of the detection that best
  matches a reference box (torchvision, ultralytics, DETR-style outputs);
* :mod:`camkit.detection.outputs`: boxes (:func:`box_iou`, :func:`cxcywh_to_xyxy`), ultralytics'
  raw candidates (:func:`candidates_of`, :func:`default_output`), what a model detects
  (:func:`task_of`, :func:`detections_of`) and which threshold to lower (:func:`threshold_hint`);
* :mod:`camkit.detection.narrow`: a detection's score with the backward graph of only what it
  depends on, per detector family (R-CNN here, ultralytics' dense heads in
  :mod:`~camkit.detection.narrow_dense`, torchvision's single-stage detectors in
  :mod:`~camkit.detection.narrow_single`); the explainers call :func:`narrowed_scores` alone.

``DetectionTarget`` and ``box_iou`` are also importable from :mod:`camkit.targets` and
``DetectionTarget`` from :mod:`camkit`.
"""

from .narrow import narrowed_scores
from .outputs import box_iou, candidates_of, cxcywh_to_xyxy, default_output, detections_of, task_of, threshold_hint
from .target import DetectionTarget

__all__ = [
    "DetectionTarget",
    "box_iou",
    "candidates_of",
    "cxcywh_to_xyxy",
    "default_output",
    "detections_of",
    "narrowed_scores",
    "task_of",
    "threshold_hint",
]
