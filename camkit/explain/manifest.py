"""The ``manifest.json`` of ``camkit explain``: versions, model, method, layer, and one entry per input.

Written the same way for images (:mod:`camkit.explain.files`), detectors and segmenters
(:mod:`camkit.explain.detect`) and volumes, videos and signals (:mod:`camkit.explain.media`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..methods import CAMExplainer
from ..runs.files import atomic_write

__all__ = ["cam_layers", "write_manifest"]


def cam_layers(explainer: Any) -> list[str]:
    """The layers a CAM explainer read (their names), or ``[]`` for other explainers."""
    return list(explainer._names()) if isinstance(explainer, CAMExplainer) and explainer._layers else []


def write_manifest(out_dir: Path, model: dict[str, Any], method: str, layer: Any, fields: dict[str, Any],
                   entries: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Write ``out_dir/manifest.json`` and return it: versions, ``model`` (its description), ``method``,
    ``layer``, the run's own ``fields`` (such as ``target``), the error count and the ``entries``.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from camkit.explain.manifest import write_manifest
        >>> out = Path(tempfile.mkdtemp())
        >>> manifest = write_manifest(out, {"name": "net"}, "gradcam", "layer4", {"target": "pred"},
        ...                           [{"path": "a.png", "error": ""}, {"path": "b.png", "error": "unreadable"}])
        >>> manifest["errors"], list(json.loads((out / "manifest.json").read_text()))[3:]
        (1, ['model', 'method', 'layer', 'target', 'errors', 'images'])
    """
    import torchvision

    manifest = {
        "camkit_version": __version__, "torch_version": torch.__version__, "torchvision_version": torchvision.__version__,
        "model": model, "method": method, "layer": layer, **fields,
        "errors": sum(1 for e in entries if e["error"]), "images": entries,
    }  # fmt: skip
    atomic_write(out_dir / "manifest.json", json.dumps(manifest, indent=2, allow_nan=False))
    return manifest
