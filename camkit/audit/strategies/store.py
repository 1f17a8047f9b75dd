"""What an audit keeps per image for its strategies, and how the merge reads it back.

Each batch's part ``parts/NAME.jsonl`` gets a sidecar ``parts/NAME.npz`` written before it (so
a part always has its sidecar, and ``--resume`` keeps both): the images' keys, their maps
average-pooled to at most :data:`GRID` cells per axis (float16), and their concept relevance
vectors (float16 [n, C]). That is 512 bytes per image for the maps and ``2 C`` for the vectors:
100,000 images at a 512-channel layer take about 150 MB. With ``torchrun`` every rank writes
its own sidecars and rank 0 reads them all once, at the merge.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from .analysis import Strategies, find_strategies

__all__ = ["GRID", "downsample_maps", "feature_bytes", "merge_strategies", "read_features", "sidecar", "strategies_of_run"]

GRID = 16
"""Cells per spatial axis of the maps kept for the map strategies (SpRAy works on downsampled maps)."""


def downsample_maps(maps: Tensor, grid: int = GRID) -> Tensor:
    """Maps [B, *S] average-pooled to at most ``grid`` cells per axis, float16 on their device.

    Example:
        >>> import torch
        >>> from camkit.audit.strategies.store import downsample_maps
        >>> downsample_maps(torch.arange(16.0).view(1, 4, 4), grid=2).tolist()
        [[[2.5, 4.5], [10.5, 12.5]]]
    """
    spatial = tuple(int(s) for s in maps.shape[1:])
    size = tuple(min(grid, s) for s in spatial)
    pool = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[len(spatial)]
    out: Tensor = pool(maps.float()[:, None], size)[:, 0]  # type: ignore[arg-type]
    return out.half()


def sidecar(part: Path) -> Path:
    """The sidecar of a part file: ``NAME.jsonl`` -> ``NAME.npz``."""
    return part.with_suffix(".npz")


def feature_bytes(keys: Sequence[str], maps: np.ndarray | None, vectors: np.ndarray | None) -> bytes:
    """An uncompressed ``.npz`` of ``keys`` and the images' features (float16)."""
    arrays: dict[str, Any] = {"keys": np.asarray(list(keys), dtype=str)}
    if maps is not None:
        arrays["maps"] = np.asarray(maps, dtype=np.float16)
    if vectors is not None:
        arrays["vectors"] = np.asarray(vectors, dtype=np.float16)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def read_features(parts: Iterable[Path], wanted: set[str]) -> tuple[dict[str, int], np.ndarray | None, np.ndarray | None]:
    """Gather the features of the keys in ``wanted`` from the sidecars of ``parts`` (later parts win).

    Returns ``(row of each key, maps [n, *s] float16, vectors [n, C] float16)``; a sidecar that
    cannot be read is skipped (its images get no strategy). Memory: the kept features only.
    """
    where: dict[str, tuple[int, int]] = {}
    loaded: list[tuple[np.ndarray | None, np.ndarray | None]] = []
    for part in parts:
        path = sidecar(part)
        try:
            with np.load(path, allow_pickle=False) as data:
                keys = data["keys"].tolist()
                maps = data["maps"] if "maps" in data.files else None
                vectors = data["vectors"] if "vectors" in data.files else None
        except (OSError, ValueError, KeyError):
            continue
        index = len(loaded)
        keep = [j for j, k in enumerate(keys) if k in wanted]
        loaded.append((maps[keep] if maps is not None else None, vectors[keep] if vectors is not None else None))
        for slot, j in enumerate(keep):
            where[keys[j]] = (index, slot)
    row = {key: i for i, key in enumerate(where)}
    maps_out = _stack([loaded[f][0] for f, _ in where.values()], [s for _, s in where.values()])
    vec_out = _stack([loaded[f][1] for f, _ in where.values()], [s for _, s in where.values()])
    return row, maps_out, vec_out


def _stack(arrays: list[np.ndarray | None], slots: list[int]) -> np.ndarray | None:
    if not arrays or any(a is None for a in arrays):
        return None
    shapes = {a.shape[1:] for a in arrays if a is not None}
    if len(shapes) != 1:
        return None  # parts of another layer or size: no strategies rather than wrong ones
    return np.stack([a[s] for a, s in zip(arrays, slots) if a is not None])


def strategies_of_run(
    parts: Sequence[Path], rows: dict[str, dict[str, Any]], keys: Sequence[str], *, labelled: bool, seed: int = 0,
    device: Any = None,
) -> tuple[Strategies | None, list[str], int]:
    """The strategies of a finished run: ``(strategies, the keys they cover in order, images left out)``.

    ``rows`` maps each key to its row (``label``, ``prediction_name``, ``correct``,
    ``confidence``, ``error``); classes are the labels when the run has labels, else the
    predictions (as in the summary's ``per_class``). Images that failed, or whose sidecar is
    missing, are left out. ``device``: where the clustering runs (see :func:`find_strategies`).
    """
    ok = [k for k in keys if k in rows and not rows[k].get("error")]
    row_of, maps, vectors = read_features(parts, set(ok))
    covered = [k for k in ok if k in row_of]
    if not covered or (maps is None and vectors is None):
        return None, [], len(ok)
    order = np.asarray([row_of[k] for k in covered], dtype=np.int64)

    def cls(row: dict[str, Any]) -> str:
        value = row.get("label") if labelled else row.get("prediction_name")
        return str(value) if value not in (None, "") else "(no label)"

    found = find_strategies(
        [cls(rows[k]) for k in covered],
        maps[order].astype(np.float32) if maps is not None else None,
        vectors[order].astype(np.float32) if vectors is not None else None,
        correct=[rows[k].get("correct") for k in covered], confidence=[rows[k].get("confidence") for k in covered],
        seed=seed, device=device,
    )  # fmt: skip
    return found, covered, len(ok) - len(covered)


def merge_strategies(
    out: Path, lines: dict[str, str], keys: Sequence[str], note: str = "", *, device: Any = None
) -> tuple[Strategies | None, list[str], dict[str, dict[str, Any]], dict[str, Any]]:
    """At the merge: the run's strategies from its parts' rows (``lines``: key -> JSON line) and sidecars.

    Returns ``(strategies, covered keys, slim rows by key, the summary's "strategies" section)``;
    the section says why when there are none. ``device``: where the clustering runs.
    """
    import json

    rows: dict[str, dict[str, Any]] = {}
    for key in keys:
        line = lines.get(key)
        if line is None:
            continue
        row = json.loads(line)
        rows[key] = {k: row.get(k) for k in ("key", "label", "prediction_name", "correct", "confidence", "overlay", "error")}
    labelled = any(r.get("label") for r in rows.values())
    parts = sorted((out / "parts").glob("*.jsonl"))
    found, covered, left_out = strategies_of_run(parts, rows, keys, labelled=labelled, device=device)
    section: dict[str, Any] = {"classes_from": "label" if labelled else "prediction", "images": len(covered),
                               "left_out": left_out}  # fmt: skip
    if note:
        section["concepts_note"] = note
    if found is None:
        section["note"] = "no strategies: no image has its features (a run without them, or every image failed)"
        return None, [], rows, section
    if not found.concepts:
        section.setdefault("concepts_note", "no concept vectors were recorded")
    section.update(found.describe(covered))
    return found, covered, rows, section
