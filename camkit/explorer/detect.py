"""Detectors in the explorer: every detection explained, each with its own overlay and box.

The work is ``camkit explain``'s (:func:`camkit.explain.detect.explain_dense`): the detector
runs once without autograd, its detections above ``score_threshold`` (best first, at most
``top``) are explained in one call through :meth:`camkit.DetectionTarget.from_detections`, and
each gets its map and overlay (box and label drawn) at the image's own size. Here they are
written under the app's temporary folder, in a folder named after the image and the settings.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..detection import task_of
from ..errors import InvalidInputError
from ..explain.detect import explain_dense
from .inputs import image_hash, read_image
from .session import Session, settings_key

__all__ = ["explain_detections", "is_detector"]


def is_detector(session: Session) -> bool:
    """Whether the session's model is a detector camkit knows (torchvision, ultralytics, DETR).

    Example:
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.detect import is_detector
        >>> is_detector(Session("demo", device="cpu"))
        False
    """
    return task_of(session.model) == "detect"


def explain_detections(
    session: Session, out: str | Path, image: Any, method: str = "gradcam", layer: str | None = None,
    *, score_threshold: float = 0.5, top: int | None = 10, **settings: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """Explain every detection of one image: ``[{"label", "label_name", "box", "score", "overlay", "map"}...]``.

    Args:
        session: a :class:`Session` on a detector.
        out: the folder the overlays (``.png``) and maps (``.npy``, float32 [H, W] in [0, 1] at the
            image's size) are written under.
        image: a file path, PIL image or uint8 array [H, W, 3].
        method: a registry key, as for :meth:`Session.explain`.
        layer: the dotted layer name; ``None`` for the method's automatic choice.
        score_threshold: detections scoring below are left out.
        top: at most this many detections, best first (``None``: all).
        **settings: the method's settings, as for :meth:`Session.explain`.

    Returns:
        One record per detection, best first; ``box`` is ``[x1, y1, x2, y2]`` in the image's pixels
        and ``overlay``/``map`` are absolute paths. The same image, method, layer, threshold, top
        and settings again are served from the session's cache while their files exist.

    Raises:
        InvalidInputError: the model is not a detector, or no detection reaches ``score_threshold``.

    Example (run in tests/explorer/test_explorer_detect.py, which checks the maps against GradCAM):
        >>> import tempfile
        >>> import numpy as np
        >>> from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.detect import explain_detections
        >>> net = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3,
        ...                                             min_size=64, max_size=96, box_score_thresh=0.0)
        >>> found = explain_detections(Session(net, device="cpu"), tempfile.mkdtemp(),
        ...                            np.full((48, 64, 3), 128, np.uint8), score_threshold=0.0, top=2)  # doctest: +SKIP
        >>> len(found), sorted(found[0])  # doctest: +SKIP
        (2, ['box', 'label', 'label_name', 'map', 'overlay', 'score'])
    """
    if not is_detector(session):
        raise InvalidInputError(
            f"{type(session.model).__name__} is not a detector camkit knows (torchvision, ultralytics, DETR); "
            "classifiers are explained with Session.explain"
        )
    rgb = read_image(image)
    key = json.dumps([image_hash(rgb), method, layer, float(score_threshold), top, settings_key(settings)])
    folder = Path(out) / "detections" / hashlib.sha256(key.encode()).hexdigest()[:16]

    def compute() -> list[dict[str, Any]]:
        entry: dict[str, Any] = {"path": "image.png"}
        explainer = session._explainer(method, layer, dict(settings))
        explain_dense(session.loaded, explainer, entry, rgb, folder, score_threshold=score_threshold, top=top)
        if "error" in entry:
            raise InvalidInputError(entry["error"])
        return [{**r, "overlay": str(folder / r["overlay"]), "map": str(folder / r["map"])} for r in entry["detections"]]

    found = session.cached(("detections", str(folder)), compute)
    if all(Path(r["overlay"]).is_file() and Path(r["map"]).is_file() for r in found):
        return [dict(r) for r in found]
    session.forget(("detections", str(folder)))  # its files were removed since: explain again
    return session.cached(("detections", str(folder)), compute)
