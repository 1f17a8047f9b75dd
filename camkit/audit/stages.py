"""The four stages of an audit batch: decode, explain, draw, write.

* **decode**: a ``DataLoader`` with worker processes reads, checks and preprocesses the
  images (:class:`~camkit.runs.data.AuditDataset`, :func:`~camkit.runs.loaders.make_loader`), ahead of the model.
* **explain** (:class:`ExplainStage`): on the model's device, predictions, maps and every
  measure of the batch, moved to the host in one transfer; rows whose scores or maps are
  not finite become error rows. On the CPU it runs with the intra-op threads the decode
  workers leave (:func:`explain_threads`).
* **draw** (:func:`draw_overlays`): colour map and blend, batched. On a GPU it runs there
  (one small kernel per step, no host work); on the CPU it runs in the writer threads with
  OpenCV's vectorised look-up and blend, so the model never waits for it.
* **write** (:class:`Writer`): a thread pool encodes the overlays (JPEG by default), writes
  them, the optional maps and, last, the batch's part file. A part exists only once its
  overlays do, so a resumed run never points at a missing file. At most ``2 x threads``
  batches are in flight, which bounds memory.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..functional import colormap_lut
from ..runs.data import Dataset
from ..runs.explaining import explain_batch
from ..runs.files import atomic_write, encode_image, npy_bytes, safe_name
from ..runs.targeting import TargetSpec, chooser

__all__ = ["BatchResult", "ExplainStage", "ThreadPacer", "Writer", "draw_overlays", "explain_threads"]


def draw_overlays(shown: Tensor, maps: Tensor, alpha: float = 0.5, colormap: str = "jet") -> Tensor:
    """Blend coloured maps over images, batched on their device: uint8 [B, H, W, 3].

    ``shown`` is uint8 RGB [B, H, W, 3]; ``maps`` [B, H, W] in [0, 1] (the model input's size).
    The pixel values are those of :func:`camkit.overlay` (index ``round(v * 255)`` into the
    colormap, ``round((1 - alpha) * image + alpha * colour)``).

    Example:
        >>> import torch
        >>> from camkit.audit.stages import draw_overlays
        >>> draw_overlays(torch.full((1, 1, 1, 3), 255, dtype=torch.uint8), torch.ones(1, 1, 1)).tolist()
        [[[[192, 128, 128]]]]
    """
    lut = colormap_lut(colormap, maps.device)
    index = maps.float().nan_to_num(0.0).clamp(0, 1).mul(255).round().to(torch.long)
    heat = lut[index].float()
    return shown.float().mul(1 - alpha).add(heat, alpha=alpha).round().clamp(0, 255).to(torch.uint8)


def _draw_host(shown: np.ndarray, maps: np.ndarray, alpha: float, colormap: str) -> np.ndarray:
    """:func:`draw_overlays` for host arrays, one image at a time with OpenCV (releases the GIL)."""
    import cv2

    lut = colormap_lut(colormap).numpy().reshape(256, 1, 3)
    out = np.empty_like(shown)
    for b in range(shown.shape[0]):
        index = cv2.convertScaleAbs(np.nan_to_num(maps[b], nan=0.0), alpha=255.0)  # round(v * 255), saturated
        heat = cv2.applyColorMap(index, lut)  # a user colormap: the table's RGB order is kept
        cv2.addWeighted(shown[b], 1 - alpha, heat, alpha, 0.0, dst=out[b])
    return out


@dataclass
class BatchResult:
    """What the explain stage hands to the writer for one batch.

    Attributes:
        rows: one dict per image (errors included), without the overlay path yet.
        ok: positions in ``rows`` of the images that have a map (in ``maps``/``drawn`` order).
        maps: float32 [n, H, W] host maps of the ``ok`` images (for ``--save-maps`` and drawing).
        shown: uint8 [n, H, W, 3] host images, when drawing is left to the writer.
        drawn: uint8 [n, H, W, 3] host overlays, when drawn on the device already.
    """

    rows: list[dict[str, Any]]
    ok: list[int]
    maps: np.ndarray | None = None
    shown: np.ndarray | None = None
    drawn: np.ndarray | None = None
    keys: list[str] = field(default_factory=list)
    features: tuple[np.ndarray, np.ndarray | None] | None = None  # (maps [n, *s], vectors [n, C]) of ``ok``


def _number(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    value = float(value)
    return None if value != value else value  # NaN -> None


class ExplainStage:
    """Explain one decoded batch on the model's device and measure it; one host transfer per batch."""

    def __init__(
        self, explainer: Any, spec: TargetSpec, dataset: Dataset, label_idx: list[int], class_names: list[str] | None,
        device: torch.device, *, faithfulness: bool = False, steps: int = 20, draw_on_device: bool | None = None,
        keep_maps: bool = False, strategies: bool = False, concepts: Any = None,
    ) -> None:  # fmt: skip
        self.explainer = explainer
        self.spec = spec
        self.dataset = dataset
        self.labels = torch.tensor(label_idx, dtype=torch.long)
        self.class_names = class_names
        self.device = device
        self.faithfulness = faithfulness
        self.steps = steps
        self.draw_on_device = device.type != "cpu" if draw_on_device is None else draw_on_device
        self.keep_maps = keep_maps  # host maps are needed for --save-maps, or to draw on the host
        # strategies: each image's downsampled map and concept vector (from the explainer's own pass when it
        # records one, else from ``concepts(x, classes)``, a ConceptRelevance's relevance)
        self.strategies = strategies
        self.concepts = concepts
        self.concepts_off = ""  # why concept vectors stopped (a layer ConceptRelevance cannot read)

    def __call__(self, batch: dict[str, Any]) -> BatchResult:
        index: list[int] = batch["index"].tolist()
        errors: list[str] = list(batch["error"])
        notes: list[str] = list(batch["note"])
        ok = [i for i, e in enumerate(errors) if not e]
        host: dict[str, list[Any]] = {}
        result = BatchResult([], [])
        if ok:
            every = len(ok) == len(index)  # the usual case: no copy of the batch
            sel = slice(None) if every else torch.tensor(ok)
            x = batch["x"][sel].to(self.device, non_blocking=True)
            labels = self.labels[torch.tensor([index[i] for i in ok])]
            out = explain_batch(self.explainer, x, chooser(self.spec, labels))
            maps = out.maps.float()
            metrics = self._measure(batch, sel, x, out.logits.float(), out.classes, maps)
            shown = batch["shown"][sel]
            drawn = draw_overlays(shown.to(self.device, non_blocking=True), maps) if self.draw_on_device else None
            host = {k: v.detach().cpu().tolist() for k, v in metrics.items()}  # one transfer per batch
            if self.strategies:
                result.features = self._features(x, out, maps)
            if self.keep_maps or drawn is None:
                result.maps = maps.detach().cpu().numpy()
            if drawn is not None:
                result.drawn = drawn.cpu().numpy()
            else:
                result.shown = shown.numpy()
        position = {i: j for j, i in enumerate(ok)}
        for i, item in enumerate(index):
            record = self.dataset.records[item]
            row: dict[str, Any] = {"key": record.key, "label": record.label or "", "note": notes[i], "error": errors[i]}
            if i in position:
                self._fill(row, {k: v[position[i]] for k, v in host.items()}, int(self.labels[item]))
            result.rows.append(row)
        result.ok = [i for i in ok if not result.rows[i]["error"]]
        if len(result.ok) != len(ok):  # non-finite rows lose their map and overlay
            keep = [position[i] for i in result.ok]
            result.maps = result.maps[keep] if result.maps is not None else None
            result.drawn = result.drawn[keep] if result.drawn is not None else None
            result.shown = result.shown[keep] if result.shown is not None else None
            if result.features is not None:
                small, vectors = result.features
                result.features = (small[keep], vectors[keep] if vectors is not None else None)
        return result

    def _features(self, x: Tensor, out: Any, maps: Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's downsampled maps and concept vectors, on the host."""
        from ..errors import CamkitError
        from .strategies.store import downsample_maps

        small = downsample_maps(torch.nan_to_num(maps.detach(), nan=0.0))
        relevance = out.relevance
        if relevance is None and self.concepts is not None and not self.concepts_off:
            try:
                relevance = self.concepts(x, out.classes)
            except CamkitError as err:
                self.concepts_off = str(err)
        if relevance is not None and relevance.dim() == 3:
            relevance = relevance[:, 0]  # several targets: the first one's
        vectors = None if relevance is None else torch.nan_to_num(relevance.detach().float()).half().cpu().numpy()
        return small.cpu().numpy(), vectors

    def _measure(self, batch: dict[str, Any], sel: Tensor | slice, x: Tensor, logits: Tensor, classes: Tensor,
                 maps: Tensor) -> dict[str, Tensor]:  # fmt: skip
        from ..metrics import energy_score, pointing_score, spread_and_border

        finite_scores = logits.isfinite().all(dim=1)
        finite_maps = maps.flatten(1).isfinite().all(dim=1)
        maps = torch.where(finite_maps[:, None, None], maps, torch.zeros_like(maps))
        probs = logits.softmax(dim=1)
        conf, pred = probs.max(dim=1)
        metrics = {"finite_scores": finite_scores, "finite_map": finite_maps, "prediction": pred, "confidence": conf}
        metrics["target"] = classes
        for r, name in enumerate(self.dataset.box_regions):
            boxes = batch["boxes"][sel, r].to(self.device)
            present = ~boxes.isnan().any(dim=1)
            metrics[f"energy_{name}"] = energy_score(maps, torch.nan_to_num(boxes, nan=0.0), present)
            if name == "object":
                metrics["pointing_object"] = pointing_score(maps, torch.nan_to_num(boxes, nan=0.0), present)
        for r, name in enumerate(self.dataset.mask_regions):
            masks = batch["masks"][sel, r].to(self.device)
            present = batch["mask_present"][sel, r].to(self.device)
            metrics[f"energy_{name}"] = energy_score(maps, masks, present)
            if name == "object":
                metrics["pointing_object"] = pointing_score(maps, masks, present)
        metrics["spread"], metrics["border"] = spread_and_border(maps)
        if self.faithfulness:
            from ..metrics import auc, deletion_curve, insertion_curve

            model = self.explainer.model
            fr, dels = deletion_curve(model, x, maps, classes, steps=self.steps, softmax=True)
            fi, ins = insertion_curve(model, x, maps, classes, steps=self.steps, softmax=True)
            metrics["deletion_auc"], metrics["insertion_auc"] = auc(fr, dels), auc(fi, ins)
        return metrics

    def _fill(self, row: dict[str, Any], values: dict[str, Any], label: int) -> None:
        if not values.pop("finite_scores"):
            row["error"] = "the model's scores are not finite (NaN or inf): check --mean/--std and the model"
            return
        if not values.pop("finite_map"):
            row["error"] = "the map is not finite (NaN or inf): the gradients or activations overflowed"
            return
        pred = int(values.pop("prediction"))
        names = self.class_names
        row["prediction"] = pred
        row["prediction_name"] = names[pred] if names and pred < len(names) else str(pred)
        row["confidence"] = _number(values.pop("confidence"))
        row["target"] = values.pop("target")
        row["correct"] = (pred == label) if label >= 0 else None
        for key, value in values.items():
            row[key] = _number(value)


class Writer:
    """The write stage: a thread pool that draws (on the CPU), encodes and writes each batch.

    ``submit`` blocks only when ``2 x threads`` batches are already waiting; ``close``
    waits for all and raises the first error a job met.
    """

    def __init__(self, out: Path, *, threads: int, overlay_format: str = "jpg", quality: int = 90,
                 save_maps: bool = False) -> None:  # fmt: skip
        self.out = out
        self.format = overlay_format
        self.quality = quality
        self.save_maps = save_maps
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="camkit-write")
        self.pending: deque[Future[int]] = deque()
        self.limit = 2 * max(1, threads)
        self.lock = threading.Lock()
        (out / "overlays").mkdir(parents=True, exist_ok=True)
        if save_maps:
            (out / "maps").mkdir(parents=True, exist_ok=True)

    def submit(self, result: BatchResult, part: Path) -> None:
        """Queue one batch: its overlays (and maps), then its part file ``part``."""
        while len(self.pending) >= self.limit:
            self.pending.popleft().result()
        self.pending.append(self.pool.submit(self._write, result, part))

    def _write(self, result: BatchResult, part: Path) -> int:
        drawn = result.drawn
        if drawn is None and result.shown is not None and result.maps is not None:
            drawn = _draw_host(result.shown, result.maps, 0.5, "jet")
        suffix = f".{self.format}"
        for j, i in enumerate(result.ok):
            row = result.rows[i]
            name = safe_name(row["key"], suffix)
            if drawn is not None:
                atomic_write(self.out / "overlays" / name, encode_image(drawn[j], self.format, self.quality))
                row["overlay"] = f"overlays/{name}"
            if self.save_maps and result.maps is not None:
                stem = name[: -len(suffix)]
                atomic_write(self.out / "maps" / f"{stem}.npy", npy_bytes(result.maps[j], np.float32))
                row["map"] = f"maps/{stem}.npy"
        if result.features is not None:
            from .strategies.store import feature_bytes, sidecar

            keys = [result.rows[i]["key"] for i in result.ok]
            atomic_write(sidecar(part), feature_bytes(keys, *result.features))
        payload = "".join(json.dumps(row, allow_nan=True) + "\n" for row in result.rows)
        atomic_write(part, payload, sync=True)
        return len(result.rows)

    def close(self) -> None:
        """Wait for every queued batch; re-raise the first failure."""
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def default_threads() -> int:
    """Writer threads: the machine's cores, at least 2 and at most 8."""
    return max(2, min(8, os.cpu_count() or 2))


def _cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def explain_threads(device: torch.device, workers: int, current: int | None = None) -> int:
    """Intra-op threads for the explain stage while it waits for decoding: the cores the workers leave.

    Each busy DataLoader worker keeps a core decoding; intra-op threads beyond the cores left
    over only spin against them (on 2 cores with 2 workers and a near-free model, two
    intra-op threads made the whole audit about 20% slower than one). Never more than
    ``current`` (default: torch's setting now); unchanged on an accelerator, where the host
    threads barely work, and without workers. :class:`ThreadPacer` applies it.

    Example:
        >>> import torch
        >>> from camkit.audit.stages import explain_threads
        >>> explain_threads(torch.device("cpu"), workers=1000, current=8)
        1
        >>> explain_threads(torch.device("cuda"), workers=1000, current=8)
        8
    """
    current = torch.get_num_threads() if current is None else current
    if device.type != "cpu" or workers <= 0:
        return current
    return max(1, min(current, _cores() - workers))


class ThreadPacer:
    """Intra-op threads of the explain stage on the CPU, set batch by batch by which stage waits.

    A run starts with the cores the decode workers leave (:func:`explain_threads`). After each
    batch but the first (whose wait includes the workers' start), :meth:`update` compares the
    time the model waited for the batch with the time it worked on it: a wait under ``low``
    of the work means decoding keeps up, so the model gets torch's own setting back; a wait
    over ``high`` means the model is waiting for decoding, so it drops back to the leftover
    cores. On an accelerator, or without workers, torch's setting is left alone. Used as a
    context manager, it restores torch's setting on exit.

    Example:
        >>> import torch
        >>> from camkit.audit.stages import ThreadPacer
        >>> before = torch.get_num_threads()
        >>> with ThreadPacer(torch.device("cpu"), workers=1000) as pacer:
        ...     start = torch.get_num_threads()
        ...     pacer.update(wait=0.0, work=1.0)  # the batch was ready: the model is the bottleneck
        ...     model_bound = torch.get_num_threads()
        >>> start, model_bound == before, torch.get_num_threads() == before
        (1, True, True)
    """

    def __init__(self, device: torch.device, workers: int, *, low: float = 0.05, high: float = 0.25) -> None:
        self.full = torch.get_num_threads()
        self.few = explain_threads(device, workers, self.full)
        self.low = low
        self.high = high

    def __enter__(self) -> ThreadPacer:
        if self.few != self.full:
            torch.set_num_threads(self.few)
        return self

    def update(self, wait: float, work: float) -> None:
        """After a batch: ``wait`` seconds blocked on the loader, ``work`` seconds explaining it."""
        if self.few == self.full:
            return
        now = torch.get_num_threads()
        if wait < self.low * work and now != self.full:
            torch.set_num_threads(self.full)
        elif wait > self.high * work and now != self.few:
            torch.set_num_threads(self.few)

    def __exit__(self, *exc: object) -> None:
        if torch.get_num_threads() != self.full:
            torch.set_num_threads(self.full)
