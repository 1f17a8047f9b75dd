"""Shared pieces of the explorer tests: a real audit and evaluation of the demo model, a stand-in Session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DEMO_IMAGES = 12


def make_demo_runs(root: Path, *, evaluation: bool = True) -> dict[str, Path]:
    """The demo's data (12 images), its Grad-CAM audit (with strategies) and, optionally, an evaluation.

    The same calls as ``camkit demo`` (:func:`camkit.demo.run.run_demo`), on fewer images; about 5 s.
    """
    from camkit.audit import audit
    from camkit.demo.model import CAM_LAYER, load_shapes_cnn
    from camkit.demo.run import DEMO_SEED
    from camkit.demo.shapes import CLASSES, IMAGE_SIZE, write_split

    model = load_shapes_cnn()
    manifest = write_split(root / "data", "marked", DEMO_IMAGES, DEMO_SEED)
    common = dict(layer=CAM_LAYER, size=IMAGE_SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu",
                  classes=list(CLASSES), progress=False)  # fmt: skip
    audit(manifest, model, out=root / "gradcam", method="gradcam", batch_size=50, workers=0, overlay_format="png",
          **common)  # fmt: skip
    runs = {"data": root / "data", "audit": root / "gradcam"}
    if evaluation:
        from camkit.evaluation.run import evaluate

        evaluate(manifest, model, out=root / "evaluation", methods=["gradcam", "gradcam++"], steps=5, gate_images=2,
                 **common)  # fmt: skip
        runs["evaluation"] = root / "evaluation"
    return runs


_MADE: dict[str, dict[str, Path]] = {}


def demo_runs(tmp_path_factory: Any) -> dict[str, Path]:
    """:func:`make_demo_runs` once per test session (the folders are only read by the tests)."""
    base = str(tmp_path_factory.getbasetemp())
    if base not in _MADE:
        _MADE[base] = make_demo_runs(tmp_path_factory.mktemp("demo"))
    return _MADE[base]


@dataclass
class LiveResult:
    """What the stand-in Session returns: the fields the tabs read."""

    overlay: np.ndarray
    map: np.ndarray
    prediction: dict[str, Any]
    explanation: Any = None


@dataclass
class StubSession:
    """A Session with ``explain`` over the real camkit API (no cache), recording its calls."""

    model: Any = None
    preprocess: Any = None
    class_names: list[str] = field(default_factory=list)
    calls: list[tuple[Any, str, str | None, int | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model is None:
            from camkit.demo.model import load_shapes_cnn
            from camkit.demo.shapes import CLASSES

            self.model = load_shapes_cnn()
            self.class_names = list(CLASSES)

    def explain(self, image: Any, method: str, layer: str | None = None, target: int | None = None,
                **settings: Any) -> LiveResult:  # fmt: skip
        import camkit

        self.calls.append((image, method, layer, target))
        rgb = camkit.read_rgb(image) if not isinstance(image, np.ndarray) else image
        cls = camkit.get_method(method)
        explainer = cls(self.model, layer=layer or None) if issubclass(cls, camkit.CAMExplainer) else cls(self.model)
        explanation = explainer.explain(camkit.to_tensor(rgb)[None], target)
        heat = explanation.maps[0].detach().float().reshape(rgb.shape[:2]).numpy()
        overlay = rgb.copy()
        overlay[..., 0] = np.clip(rgb[..., 0] * 0.5 + 127.0 * heat / max(float(heat.max()), 1e-8), 0, 255)
        return LiveResult(overlay.astype(np.uint8), heat, {"target": target, "method": method}, explanation)

    def topk(self, image: Any, k: int = 5) -> list[tuple[int, str, float]]:
        return [(i, name, 1.0 / len(self.class_names)) for i, name in enumerate(self.class_names[:k])]
