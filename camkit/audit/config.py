"""The settings of one audit run (:class:`RunConfig`) and the columns of its ``results.csv``.

Shared by the image audit (:mod:`camkit.audit.run`) and the media audit (:mod:`camkit.audit.audit_media`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..modelload import LoadedModel
from ..runs.data import Dataset
from ..runs.files import OVERLAY_FORMATS
from ..runs.labels import LabelMapping
from ..runs.targeting import TargetSpec

__all__ = ["RunConfig", "base_columns"]


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one audit run (what :func:`audit` takes, checked once).

    The settings that change the results go into ``run.json`` (:meth:`fingerprint`) and
    must match on ``--resume``; ``batch_size``, ``workers``, ``writers``, ``limit`` and
    ``progress`` change only how fast or how much.
    """

    data: Path
    out: Path
    method: str = "gradcam"
    layer: str | None = None
    target: TargetSpec = TargetSpec("pred")  # noqa: RUF009  (frozen: one shared instance is safe)
    batch_size: int = 16
    workers: int | None = None
    writers: int | None = None
    limit: int | None = None
    resume: bool = False
    overwrite: bool = False
    faithfulness: bool = False
    steps: int = 20
    classes: tuple[str, ...] | None = None
    alphabetical_classes: bool = False
    max_pixels: int = 64_000_000
    save_maps: bool = False
    overlay_format: str = "jpg"
    overlay_quality: int = 90
    progress: bool = True
    strategies: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InvalidInputError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.overlay_format not in OVERLAY_FORMATS:
            raise InvalidInputError(f"overlay_format must be one of {OVERLAY_FORMATS}, got {self.overlay_format!r}")
        if not 1 <= self.overlay_quality <= 100:
            raise InvalidInputError(f"overlay_quality must be 1 to 100, got {self.overlay_quality}")
        if self.resume and self.overwrite:
            raise InvalidInputError("--resume continues the run in --out and --overwrite replaces it: pass one")
        if self.limit is not None and self.limit < 1:
            raise InvalidInputError(f"limit must be at least 1 (nothing to audit otherwise), got {self.limit}")

    def loader_workers(self) -> int:
        """DataLoader worker processes: as given, else up to 4 (one core left for the model)."""
        return self.workers if self.workers is not None else min(4, max(0, (os.cpu_count() or 1) - 1))

    def fingerprint(self, loaded: LoadedModel, dataset: Dataset, mapping: LabelMapping) -> dict[str, Any]:
        """The ``run.json`` content: everything that, changed, would change the results."""
        return {
            "data": str(self.data.resolve()), "model": loaded.spec, "weights": loaded.weights,
            "weights_sha256": loaded.weights_sha256(), "method": self.method, "layer": self.layer,
            "target": str(self.target), "preprocess": loaded.preprocess.describe(),
            "faithfulness": self.faithfulness, "steps": self.steps, "label_mapping": mapping.describe(),
            "regions": list(dataset.regions), "max_pixels": self.max_pixels, "save_maps": self.save_maps,
            "overlay_format": self.overlay_format, "overlay_quality": self.overlay_quality,
            "strategies": self.strategies,
        }  # fmt: skip


def base_columns(regions: Sequence[str], faithfulness: bool, strategies: bool = False) -> list[str]:
    """The columns of ``results.csv``, in order."""
    cols = ["key", "label", "prediction", "prediction_name", "confidence", "target", "correct"]
    cols += [f"energy_{r}" for r in regions]
    if "object" in regions:
        cols.append("pointing_object")
    cols += ["spread", "border"]
    if faithfulness:
        cols += ["deletion_auc", "insertion_auc"]
    if strategies:
        cols += ["strategy", "concept_strategy"]
    return [*cols, "overlay", "note", "error"]
