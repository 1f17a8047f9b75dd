"""``camkit explain`` on detectors and segmenters: one overlay per detection, or per predicted class.

A detector (torchvision's Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD, SSDlite; an
ultralytics detector, segmenter or pose model; a Hugging Face DETR) is run once per image
without autograd; its detections with a score of at least ``score_threshold`` (at most ``top``
of them, best first) are explained in one call with
:meth:`camkit.DetectionTarget.from_detections`, and each gets an overlay with its box and
label drawn. A segmenter (torchvision's FCN, DeepLabV3, LRASPP; Hugging Face's SegFormer) gets
one overlay per class it predicts somewhere in the image, explained with
:class:`camkit.SegmentationTarget` over that class's pixels.

Inputs: torchvision's detectors resize and normalise inside, so they get the image as it is, in
[0, 1] (their maps are taken back through that resize: :func:`camkit.layers.families.torchvision.transform_window`);
ultralytics models get their own letterbox (``ultralytics:PATH.pt``,
:class:`camkit.modelload.ultralytics.Letterbox`); the others the loaded preprocessing. Every map
and box is taken back to the image's own pixels.

Ultralytics' raw candidates are turned into detections as its ``predict`` does by default: a
candidate's score is its best class probability, then class-wise NMS at IoU 0.7
(``torchvision.ops.batched_nms``; :func:`camkit.detection.detections_of`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._internal.state import eval_mode
from ..detection import DetectionTarget, detections_of, task_of, threshold_hint
from ..errors import InvalidInputError
from ..methods import Explainer
from ..modelload import LoadedModel
from ..runs.data import error_reason, read_checked
from ..runs.files import atomic_write, encode_image, npy_bytes, safe_name
from ..targets.tasks import SegmentationTarget
from ..viz.boxes import draw_boxes
from ..viz.overlay import overlay
from .manifest import write_manifest

__all__ = ["explain_dense", "explain_dense_files"]


def _input(loaded: LoadedModel, rgb: np.ndarray, task: str) -> tuple[Tensor, bool]:
    """The model input [1, 3, h, w], and whether it is the image at its own size (no map to invert)."""
    if task == "detect" and type(getattr(loaded.model, "transform", None)).__name__ == "GeneralizedRCNNTransform":
        return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float()[None] / 255.0, True
    x, _ = loaded.preprocess(rgb)
    return x[None], False


def _back(loaded: LoadedModel, heat: Tensor, height: int, width: int, same: bool) -> tuple[Tensor, Tensor]:
    if same:
        return heat, torch.ones(height, width, dtype=torch.bool)
    return loaded.preprocess.invert_map(heat, height, width)


def _boxes_back(loaded: LoadedModel, boxes: np.ndarray, height: int, width: int, same: bool) -> np.ndarray:
    if same:
        return boxes
    inverse = getattr(loaded.preprocess, "inverse_boxes", None)
    if inverse is not None:
        return np.asarray(inverse(boxes, height, width))
    forward = loaded.preprocess.transform_boxes(np.array([[0.0, 0.0, width, height]]), height, width)[0]
    scale = np.array([width / (forward[2] - forward[0]), height / (forward[3] - forward[1])] * 2)
    return (boxes - np.array([forward[0], forward[1]] * 2)) * scale


def explain_dense(
    loaded: LoadedModel,
    explainer: Explainer,
    entry: dict[str, Any],
    rgb: np.ndarray,
    out_dir: Path,
    *,
    score_threshold: float = 0.5,
    top: int | None = None,
) -> None:
    """Explain one image with a detector or a segmenter; fill its manifest ``entry`` and write its files.

    Detections (or predicted classes) go to ``entry["detections"]`` (or ``entry["classes"]``),
    each with its map (``maps/NAME-detJ.npy``, float32 in [0, 1] at the image's size) and
    overlay (``overlays/NAME-detJ.png``). An image where nothing is kept gets an ``error`` that
    says which threshold to lower.
    """
    task = task_of(loaded.model)
    height, width = rgb.shape[:2]
    x, same = _input(loaded, rgb, task or "")
    x = x.to(loaded.device)
    stem = safe_name(entry["path"])[: -len(".png")]
    names = loaded.categories
    with torch.no_grad(), eval_mode(loaded.model):
        output = loaded.model(x)
    if task == "segment":
        logits = output["out"] if isinstance(output, dict) and "out" in output else output.logits
        present = torch.unique(logits.argmax(dim=1)).tolist()[: top or None]
        targets = [(int(c), SegmentationTarget(int(c))) for c in present]
        key = "classes"
    else:
        found = detections_of(loaded.model, output, (int(x.shape[2]), int(x.shape[3])))[0]
        keep = (found["scores"] >= score_threshold).nonzero().flatten()
        keep = keep[torch.sort(found["scores"][keep], descending=True, stable=True).indices][: top or None]
        if keep.numel() == 0:
            best = float(found["scores"].max()) if found["scores"].numel() else None
            hint = threshold_hint(loaded.model, "--score-threshold")
            entry["error"] = f"no detection with score >= {score_threshold} (best: {best}); lower {hint}"
            entry["detections"] = []
            return
        kept = {k: v[keep] for k, v in found.items() if k in ("boxes", "scores", "labels")}
        target = DetectionTarget.from_detections([kept], iou_threshold=0.5)
        key = "detections"
    records: list[dict[str, Any]] = []
    if task == "segment":
        maps = torch.stack([explainer.explain(x, t).maps[0] for _, t in targets])
        labels = [c for c, _ in targets]
        scores: list[float | None] = [None] * len(labels)
        boxes = np.zeros((len(labels), 4))
    else:
        maps = explainer.explain(x, target).maps[0]  # [N, h, w]: every detection from one call
        labels = kept["labels"].cpu().tolist()
        scores = [float(s) for s in kept["scores"].cpu().tolist()]
        boxes = _boxes_back(loaded, kept["boxes"].cpu().double().numpy(), height, width, same)
    for j, label in enumerate(labels):
        full, inside = _back(loaded, maps[j].detach().float().cpu(), height, width, same)
        drawn = np.where(inside.numpy()[:, :, None], overlay(rgb, full), rgb)
        name = names[label] if names and 0 <= label < len(names) else str(label)
        record: dict[str, Any] = {"label": int(label), "label_name": name}
        if task != "segment":
            record["box"] = [round(float(v), 2) for v in boxes[j]]
            record["score"] = scores[j]
            drawn = draw_boxes(drawn, boxes[j : j + 1], [f"{name} {scores[j]:.2f}"])
        suffix = f"det{j + 1}" if task != "segment" else f"class{label}"
        atomic_write(out_dir / "overlays" / f"{stem}-{suffix}.png", encode_image(drawn, "png"))
        atomic_write(out_dir / "maps" / f"{stem}-{suffix}.npy", npy_bytes(full.numpy().astype(np.float32)))
        record["overlay"], record["map"] = f"overlays/{stem}-{suffix}.png", f"maps/{stem}-{suffix}.npy"
        records.append(record)
    entry[key] = records


def explain_dense_files(
    images: Sequence[str | os.PathLike[str]],
    loaded: LoadedModel,
    explainer: Explainer,
    *,
    out_dir: Path,
    method: str,
    layer: str | None,
    target: str | int | None,
    score_threshold: float,
    top: int | None,
    max_pixels: int,
) -> dict[str, Any]:
    """:func:`camkit.explain.files.explain_files` for a detector or a segmenter: one image at a time.

    Example:
        >>> import os, tempfile, numpy as np, torch, camkit
        >>> from camkit.explain.files import explain_files
        >>> from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
        >>> root = tempfile.mkdtemp(); camkit.save_png(f"{root}/a.png", np.full((48, 64, 3), 90, np.uint8))
        >>> torch.manual_seed(0) and None
        >>> model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3,
        ...                                               min_size=64, max_size=64, box_score_thresh=0.0)
        >>> manifest = explain_files([f"{root}/a.png"], model, out=f"{root}/out", score_threshold=0.0, top=2,
        ...                          device="cpu")
        >>> [sorted(d) for d in manifest["images"][0]["detections"]][0]
        ['box', 'label', 'label_name', 'map', 'overlay', 'score']
    """
    if target not in (None, "pred"):
        raise InvalidInputError(
            f"--target {target} has no meaning for a detector or a segmenter: every detection with a score of at "
            "least --score-threshold (at most --top) is explained, or every predicted class"
        )
    if not 0.0 <= score_threshold <= 1.0:
        raise InvalidInputError(f"--score-threshold must be in [0, 1], got {score_threshold}")
    if top is not None and top < 1:
        raise InvalidInputError(f"--top must be a positive number of detections, got {top}")
    entries: list[dict[str, Any]] = []
    from tqdm.auto import tqdm

    for image in tqdm(list(images), desc="explain", unit="img", disable=len(images) < 2):
        entry: dict[str, Any] = {"path": str(image), "note": "", "error": ""}
        entries.append(entry)
        try:
            rgb, entry["note"] = read_checked(Path(image), max_pixels)
        except Exception as err:  # an unreadable image is reported in its entry; the others go on
            entry["error"] = error_reason(err)
            continue
        explain_dense(loaded, explainer, entry, rgb, out_dir, score_threshold=score_threshold, top=top)
    layers = list(explainer._names()) if getattr(explainer, "_layers", None) else []  # type: ignore[attr-defined]
    fields = {"task": task_of(loaded.model), "score_threshold": score_threshold, "top": top}
    return write_manifest(out_dir, loaded.describe(), method, layers or layer, fields, entries)
