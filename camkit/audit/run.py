"""The audit loop: stream a dataset through an explainer, measure, and never lose work.

The run is described by one :class:`RunConfig`; each batch goes through the stages of
:mod:`camkit.audit.stages` (decode in DataLoader workers, explain on the model's device,
draw, encode and write in a thread pool that overlaps the model). Results are saved batch
by batch in ``DIR/parts/`` (each batch one JSON-lines file written under a temporary name and
renamed, after its overlays); an interruption loses at most the batches in flight, and
``resume=True`` skips every image already in a part. When all images are done, rank 0 merges
the parts into ``results.csv``, ``summary.json`` and ``report.html``. Nothing is written
outside ``out``; the rules that protect ``out`` are in :mod:`camkit.runs.outdir`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InvalidInputError
from ..methods import ConceptRelevance, GradientCAM
from ..modelload import LoadedModel, load_model, resolve_device, warn_random_weights
from ..runs.data import AuditDataset, Dataset, discover
from ..runs.distributed import DistContext
from ..runs.explaining import build_explainer
from ..runs.files import atomic_write, refresh_umask, safe_name
from ..runs.labels import LabelMapping, map_labels
from ..runs.loaders import make_loader
from ..runs.media import refuse_crop
from ..runs.outdir import PARTS, AuditError
from ..runs.targeting import parse_target
from .audit_media import MediaOptions, audit_media, is_media_data
from .config import RunConfig, base_columns
from .session import finish_run, start_run
from .stages import ExplainStage, ThreadPacer, Writer, default_threads

__all__ = ["AuditError", "RunConfig", "atomic_write", "audit", "base_columns", "safe_name"]


def audit(
    data: str | os.PathLike[str], model: str | nn.Module, *, out: str | os.PathLike[str], weights: str | None = None,
    trust_pickle: bool = False, method: str = "gradcam", layer: str | None = None, target: str | int | None = "pred",
    size: int | Sequence[int] | None = None, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
    device: str | torch.device | None = None, batch_size: int = 16, workers: int | None = None, limit: int | None = None,
    resume: bool = False, overwrite: bool = False, faithfulness: bool = False, steps: int = 20,
    classes: Sequence[str] | None = None, alphabetical_classes: bool = False, max_pixels: int = 64_000_000,
    save_maps: bool = False, overlay_format: str = "jpg", overlay_quality: int = 90, writers: int | None = None,
    progress: bool = True, crop: int | Sequence[int] | None = None, max_voxels: int = 64_000_000,
    intensity: str = "none", frames: int | None = None, strategies: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Audit where a model's attention falls over a dataset (the Python side of ``camkit audit``).

    Args:
        data: a folder of images, a folder of class sub-folders, or a CSV manifest
            (see :mod:`camkit.runs.data`). ``out`` is never read as data.
        model: a model description (see :func:`camkit.modelload.load_model`) or an ``nn.Module``.
        out: the output folder; everything is written inside it. A non-empty folder that is
            not a camkit run is refused unless ``overwrite`` (see :mod:`camkit.runs.outdir`).
        weights, trust_pickle, size, mean, std, device, crop: as in :func:`~camkit.modelload.load_model`.
        method, layer: the explainer (a registry key) and its layer (``None``: automatic).
        target: ``"pred"`` (the predicted class), a class index, or ``"label"`` (the true class).
        batch_size, workers: DataLoader batch size and worker processes (default: up to 4).
        limit: audit only the first ``limit`` images of the dataset's order.
        resume: continue the run already in ``out`` (same settings), skipping finished images.
        overwrite: replace camkit's files in a non-empty ``out`` (nothing else is removed).
        faithfulness: also compute deletion and insertion AUC (``steps`` steps; costly).
        classes: class names in the model's output order; labels are looked up there.
        alphabetical_classes: without ``classes`` or a class list from the model, accept
            numbering the sorted label names 0, 1, ... (see :mod:`camkit.runs.labels`).
        max_pixels: images with more pixels give an error row instead of being decoded.
        save_maps: also save each exact map as ``maps/NAME.npy`` (float32 [H, W] in [0, 1]).
        overlay_format, overlay_quality: ``"jpg"`` (default, quality 90) or ``"png"``; overlays
            are at the model input's size.
        writers: threads that draw, encode and write (default: the cores, 2 to 8).
        progress: show a progress bar with images per second (rank 0).
        strategies: find each class's strategies without masks (on by default; see
            :mod:`camkit.audit.strategies`): ``results.csv`` gains ``strategy`` and ``concept_strategy``,
            ``summary.json`` a ``strategies`` section, ``report.html`` a section per class. Image
            audits only: volumes and videos are audited without them.
        max_voxels, intensity, frames: for a folder or manifest of NIfTI volumes or videos (see
            :mod:`camkit.audit.audit_media`): larger inputs give error rows; the volumes'
            intensity normalisation; audit the first ``frames`` frames of each video.

    Returns:
        The summary written to ``summary.json`` (see :func:`camkit.audit.report.summarize`);
        its ``"errors"`` entry counts the images that failed.

    Example:
        >>> import os, tempfile, numpy as np, torch, camkit
        >>> from camkit.audit import audit
        >>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/data")
        >>> for i in range(3):
        ...     camkit.save_png(f"{root}/data/{i}.png", np.full((8, 8, 3), 60 * i, np.uint8))
        >>> torch.manual_seed(0) and None
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        ...                           torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> summary = audit(f"{root}/data", net, out=f"{root}/out", layer="1", size=8, device="cpu",
        ...                 workers=0, progress=False)
        >>> summary["images"], summary["errors"], sorted(os.listdir(f"{root}/out"))[:3]
        (3, 0, ['overlays', 'parts', 'report.html'])
    """
    cfg = RunConfig(
        Path(data), Path(out), method, layer, parse_target(target, allow=("pred", "class", "label")), batch_size,
        workers, writers, limit, resume, overwrite, faithfulness, steps, tuple(classes) if classes else None,
        alphabetical_classes, max_pixels, save_maps, overlay_format, overlay_quality, progress, strategies,
    )  # fmt: skip
    refresh_umask()
    media = MediaOptions(max_voxels, intensity, frames) if is_media_data(data, [out]) else None
    if media is not None:
        refuse_crop(crop)
    load = dict(weights=weights, trust_pickle=trust_pickle, size=size, mean=mean, std=std)
    ctx, dev = DistContext.start(resolve_device(device))
    try:
        if media is not None:  # volumes and videos; strategies are found for image audits only
            return audit_media(replace(cfg, strategies=False), model, load, ctx, dev, media)
        return _audit(cfg, model, {**load, "crop": crop}, ctx, dev)
    finally:
        ctx.finish()


def _audit(cfg: RunConfig, model: str | nn.Module, load: dict[str, Any], ctx: DistContext,
           dev: torch.device) -> dict[str, Any]:  # fmt: skip
    dataset = discover(cfg.data, exclude=[cfg.out])
    loaded = load_model(model, device=dev, **load)
    warn_random_weights(loaded)
    pre = loaded.preprocess
    if pre.size is None and pre.crop is None:
        raise InvalidInputError("audits need a fixed input size: pass --size")
    mapping = map_labels(
        [r.label for r in dataset.records], classes=cfg.classes, model_classes=loaded.categories,
        alphabetical=cfg.alphabetical_classes,
    )  # fmt: skip
    run = start_run(cfg, dataset, cfg.fingerprint(loaded, dataset, mapping), ctx)
    started = time.perf_counter()
    note = _run_shard(cfg, dataset, run.todo[ctx.rank :: ctx.world], loaded, mapping, run.session, ctx,
                      total=len(run.todo))  # fmt: skip
    overlays = {"format": cfg.overlay_format, "quality": cfg.overlay_quality, "size": "model input"}
    extra = {"concepts_note": note} if note else {}
    return finish_run(cfg, dataset, loaded.describe(), mapping, ctx, dataset.kind, overlays, extra,
                      started=started, todo=len(run.todo), corrupt=run.corrupt, count=run.covered,
                      device=loaded.device)  # fmt: skip


def _run_shard(cfg: RunConfig, dataset: Dataset, shard: list[int], loaded: LoadedModel, mapping: LabelMapping,
               session: str, ctx: DistContext, *, total: int) -> str:  # fmt: skip
    """Audit this rank's shard; returns why concept vectors were left out ("" when they were not)."""
    from tqdm import tqdm

    pre = loaded.preprocess
    shape = pre.crop or pre.size or (0, 0)  # the crop, when there is one, is the input size
    items = AuditDataset(dataset.records, shard, pre, shape, dataset.box_regions, dataset.mask_regions, cfg.max_pixels)
    workers = cfg.loader_workers()
    loader = make_loader(items, cfg.batch_size, workers, loaded.device)
    explainer = build_explainer(cfg.method, loaded.model, cfg.layer)
    concepts = None
    if cfg.strategies and isinstance(explainer, GradientCAM):
        explainer.record_relevance = True  # concept vectors from the map's own forward and backward
    elif cfg.strategies:
        concepts = ConceptRelevance(loaded.model, cfg.layer).relevance  # one more forward and backward per batch
    explain = ExplainStage(
        explainer, cfg.target, dataset, mapping.indices, mapping.names, loaded.device,
        faithfulness=cfg.faithfulness, steps=cfg.steps, keep_maps=cfg.save_maps, strategies=cfg.strategies,
        concepts=concepts,
    )  # fmt: skip
    writer = Writer(
        cfg.out, threads=cfg.writers or default_threads(), overlay_format=cfg.overlay_format,
        quality=cfg.overlay_quality, save_maps=cfg.save_maps,
    )  # fmt: skip
    bar = tqdm(
        total=total, unit="img", disable=not (cfg.progress and ctx.main), dynamic_ncols=True,
        desc=f"audit (rank 0 of {ctx.world})" if ctx.world > 1 else "audit",
    )  # fmt: skip
    try:
        with ThreadPacer(loaded.device, workers) as pacer:
            batches = iter(loader)
            seq = 0
            while True:
                asked = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                got = time.perf_counter()
                result = explain(batch)
                if seq:  # the first wait is the workers' start
                    pacer.update(got - asked, time.perf_counter() - got)
                writer.submit(result, cfg.out / PARTS / f"{session}-r{ctx.rank:03d}-{seq:06d}.jsonl")
                bar.update(len(result.rows) * ctx.world)
                seq += 1
    finally:
        try:
            writer.close()
        finally:
            bar.close()
    return explain.concepts_off
