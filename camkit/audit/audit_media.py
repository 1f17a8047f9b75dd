"""``camkit audit`` over volumes and videos: the same outputs as for images, measured in 3-D.

``DATA`` is a folder of NIfTI volumes or video files (sub-folders are classes, as for images)
or a CSV manifest whose ``path`` column lists them (:func:`camkit.runs.data.discover`'s
format); a region is a mask volume: a ``NAME_mask`` column naming a NIfTI file (or a ``.npy``
array) of the scan's shape (a video's: ``[T, H, W]`` at its frame size), non-zero inside. Each
volume or video gives a row of ``results.csv`` with the image audit's columns: per region the
share of the map's energy inside it (``energy_NAME``), the pointing game on ``object``, the
share in the top 10% of voxels (``spread``) and in the outer 10% frame (``border``: every axis
of a volume; height and width of a video, whose first and last frames are no border). The
``overlay`` is one picture: the slice across axis 0 through the map's peak (a volume) or the
frame with the largest share of the map (a video), blended. Volumes keep their size unless
``--size``; videos follow the model's preset (:func:`camkit.modelload.video.video_preprocess`),
and with ``frames`` only the first clip of that many frames is audited.

The run keeps the image audit's guarantees: ``run.json`` and ``--resume``, parts written whole
and renamed, rows for inputs that fail (one line each), ``summary.json`` and ``report.html``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..media.nifti import INTENSITY_MODES, is_nifti, normalize_intensity, read_volume, write_volume
from ..media.video import VIDEO_SUFFIXES, is_video, read_video
from ..modelload import LoadedModel, load_model, warn_random_weights
from ..modelload.video import VideoPreprocess, video_preprocess
from ..runs.data import Dataset, Record, error_reason, read_manifest
from ..runs.distributed import DistContext
from ..runs.explaining import build_explainer
from ..runs.files import atomic_write, encode_image, npy_bytes, safe_name
from ..runs.labels import map_labels
from ..runs.media import explain_media_batch, volume_size
from ..runs.outdir import PARTS
from ..runs.targeting import chooser
from .config import RunConfig
from .session import finish_run, start_run

__all__ = ["MEDIA_SUFFIXES", "MediaOptions", "audit_media", "is_media_data"]

MEDIA_SUFFIXES = (".nii", ".nii.gz", *VIDEO_SUFFIXES)
"""File endings an audit reads as volumes or videos."""


@dataclass(frozen=True)
class MediaOptions:
    """The settings of volumes and videos in an audit (see :func:`camkit.audit.audit`)."""

    max_voxels: int = 64_000_000
    intensity: str = "none"
    frames: int | None = None
    max_frames: int = 4096

    def __post_init__(self) -> None:
        if self.intensity not in INTENSITY_MODES:
            raise InvalidInputError(f"--intensity must be one of {', '.join(INTENSITY_MODES)}, got {self.intensity!r}")
        if self.max_voxels < 1 or (self.frames is not None and self.frames < 1):
            raise InvalidInputError("--max-voxels and --frames must be at least 1")


def _is_media(path: str | os.PathLike[str]) -> bool:
    return is_nifti(path) or is_video(path)


def _media_under(root: Path, exclude: Sequence[Path]) -> list[Path]:
    skip = {p.resolve() for p in exclude}
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and (here / d).resolve() not in skip
                             and not (here / d / "run.json").is_file())  # fmt: skip
        found += [here / n for n in filenames if not n.startswith(".") and _is_media(n)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_media_data(data: str | os.PathLike[str], exclude: Sequence[str | os.PathLike[str]] = ()) -> bool:
    """Whether ``DATA`` holds volumes or videos: a CSV whose first path is one, or a folder with one and no image.

    Folders in ``exclude`` (the audit's ``--out``) and camkit run folders are not looked in.

    Example:
        >>> import os, tempfile
        >>> from camkit.audit.audit_media import is_media_data
        >>> root = tempfile.mkdtemp(); open(os.path.join(root, "a.nii.gz"), "wb").close()
        >>> is_media_data(root)
        True
    """
    root = Path(data)
    if root.is_file() and root.suffix.lower() == ".csv":
        import csv

        try:  # the first row decides (the whole manifest is read once, by the audit)
            with open(root, newline="", encoding="utf-8-sig") as handle:
                first = next(csv.DictReader(handle), None)
        except (OSError, UnicodeDecodeError, csv.Error):
            return False  # the image audit reports the CSV's problem
        return first is not None and _is_media((first.get("path") or "").strip())
    if not root.is_dir():
        return False
    from ..runs.data import IMAGE_SUFFIXES

    skip = {Path(p).resolve() for p in exclude}
    media = image = False
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and (here / d).resolve() not in skip
                       and not (here / d / "run.json").is_file()]  # fmt: skip
        media = media or any(_is_media(n) for n in filenames)
        image = image or any(n.lower().endswith(IMAGE_SUFFIXES) for n in filenames)
        if image:
            return False
    return media


def discover_media(data: Path, exclude: Sequence[Path]) -> Dataset:
    """The volumes or videos of an audit: a CSV manifest (mask regions only) or a folder (class sub-folders)."""
    if data.is_file():
        dataset = read_manifest(data)
        if dataset.box_regions:
            raise InvalidInputError(f"box regions {list(dataset.box_regions)} are for images; give volumes as NAME_mask")
        return dataset
    files = _media_under(data, exclude)
    if not files:
        raise InvalidInputError(f"nothing to audit: no volume or video under {data} (looked for {', '.join(MEDIA_SUFFIXES)})")
    nested = any(len(p.relative_to(data).parts) > 1 for p in files)
    records = [Record(p.relative_to(data).as_posix(), p, p.relative_to(data).parts[0] if nested and
                      len(p.relative_to(data).parts) > 1 else None) for p in files]  # fmt: skip
    return Dataset(records, "classes" if nested else "folder")


def _read_mask(path: Path, shape: tuple[int, ...], name: str) -> np.ndarray:
    mask = read_volume(path).data if is_nifti(path) else np.load(path, allow_pickle=False)
    if tuple(mask.shape) != shape:
        raise InvalidInputError(
            f"mask {path.name} for region {name!r} is {list(mask.shape)}, the input is {list(shape)}; masks must match it"
        )
    return np.asarray(mask) != 0


def _volume_item(record: Record, opts: MediaOptions, size: tuple[int, int, int] | None,
                 regions: Sequence[str]) -> tuple[Tensor, dict[str, Tensor], Tensor, dict[str, Any]]:  # fmt: skip
    volume = read_volume(record.path, opts.max_voxels)
    x = torch.from_numpy(normalize_intensity(volume.data, opts.intensity))[None, None]
    masks = {}
    for name in regions:
        if name in record.masks:
            m = torch.from_numpy(_read_mask(record.masks[name], volume.shape, name)).float()[None, None]
            masks[name] = (F.interpolate(m, size=size, mode="nearest-exact") if size else m)[0, 0] > 0.5
    if size is not None:
        x = F.interpolate(x, size=size, mode="trilinear", align_corners=False)
    gray = x[0, 0]
    low, high = gray.min(), gray.max()
    shown = (gray - low) / (high - low) if bool(high > low) else torch.zeros_like(gray)
    return x, masks, shown, {"affine": volume.affine}


def _video_item(record: Record, opts: MediaOptions, pre: VideoPreprocess,
                regions: Sequence[str]) -> tuple[Tensor, dict[str, Tensor], Tensor, dict[str, Any]]:  # fmt: skip
    import torchvision.transforms.v2.functional as TF

    video = read_video(record.path, opts.max_frames)
    frames = video.frames if opts.frames is None else video.frames[: opts.frames]
    if opts.frames is not None and len(frames) < opts.frames:
        raise InvalidInputError(f"{record.path.name} has {len(frames)} frame(s), fewer than --frames {opts.frames}")
    if frames.size // 3 > opts.max_voxels:
        raise InvalidInputError(f"{record.path.name} is {frames.size // 3} voxels, more than max_voxels={opts.max_voxels}")
    x, shown = pre(frames)
    masks = {}
    for name in regions:
        if name in record.masks:
            m = torch.from_numpy(_read_mask(record.masks[name], tuple(video.frames.shape[:3]), name)[: len(frames)])
            m = m[:, None].to(torch.uint8)
            if pre.resize is not None:
                m = TF.resize(m, list(pre.resize), interpolation=TF.InterpolationMode.NEAREST)
            if pre.crop is not None:
                m = TF.center_crop(m, list(pre.crop))
            masks[name] = m[:, 0] > 0
    return x[None], masks, torch.from_numpy(shown).permute(3, 0, 1, 2).float() / 255, {"fps": video.fps}


def _thumbnail(shown: Tensor, heat: Tensor, kind: str) -> np.ndarray:
    from ..viz.overlay import blend, peak_index

    if kind == "volume":
        d = peak_index(heat)[0]
        return blend(shown[d][None], heat[d][None], 0.5, "jet")[0]
    t = int(heat.sum(dim=(1, 2)).argmax())
    return blend(shown[:, t][None], heat[t][None], 0.5, "jet")[0]


def _row(record: Record, index: int, ctx: dict[str, Any]) -> dict[str, Any]:
    from ..metrics import energy_pointing_game, pointing_game, spread_and_border

    row: dict[str, Any] = {"key": record.key, "label": record.label or "", "note": "", "error": ""}
    kind = "volume" if is_nifti(record.path) else "video"
    if record.problem:
        raise InvalidInputError(record.problem)
    if kind == "volume":
        x, masks, shown, extra = _volume_item(record, ctx["opts"], ctx["size"], ctx["regions"])
    else:
        x, masks, shown, extra = _video_item(record, ctx["opts"], ctx["video_pre"], ctx["regions"])
    labels = ctx["labels"][index : index + 1]
    result = explain_media_batch(ctx, x.to(ctx["device"]), chooser(ctx["spec"], labels))
    logits = result.logits.float()
    heat = result.maps.detach().float()
    if not bool(logits.isfinite().all()):
        raise InvalidInputError("the model's scores are not finite (NaN or inf): check the intensity normalisation")
    probs = logits.softmax(dim=1)[0]
    pred = int(probs.argmax())
    names = ctx["names"]
    label = int(ctx["labels"][index])
    row.update(prediction=pred, prediction_name=names[pred] if names and pred < len(names) else str(pred),
               confidence=float(probs[pred]), target=int(result.classes.flatten()[0]),
               correct=(pred == label) if label >= 0 else None)  # fmt: skip
    for name in ctx["regions"]:
        mask = masks.get(name)
        row[f"energy_{name}"] = float(energy_pointing_game(heat, mask[None].to(heat.device))[0]) if mask is not None else None
        if name == "object":
            row["pointing_object"] = float(pointing_game(heat, mask[None].to(heat.device))[0]) if mask is not None else None
    heat = heat[0].cpu()
    spread, border = spread_and_border(heat[None].double(), border_axes=range(-3 if kind == "volume" else -2, 0))
    row["spread"], row["border"] = float(spread[0]), float(border[0])
    if ctx["faithfulness"]:
        from ..metrics import auc, deletion_curve, insertion_curve

        model, cls = ctx["explainer"].model, result.classes.flatten()[:1]
        xs, ms = x.to(ctx["device"]), heat[None].to(ctx["device"])
        row["deletion_auc"] = float(auc(*deletion_curve(model, xs, ms, cls, steps=ctx["steps"], softmax=True))[0])
        row["insertion_auc"] = float(auc(*insertion_curve(model, xs, ms, cls, steps=ctx["steps"], softmax=True))[0])
    name = safe_name(record.key, ".png")
    files: list[tuple[str, Any]] = [(f"overlays/{name}", encode_image(_thumbnail(shown, heat, kind), "png"))]
    row["overlay"] = f"overlays/{name}"
    if ctx["save_maps"]:
        stem = name[: -len(".png")]
        if kind == "volume":
            row["map"] = f"maps/{stem}.nii.gz"
            files.append((row["map"], lambda p: write_volume(p, heat.numpy(), extra["affine"])))
        else:
            row["map"] = f"maps/{stem}.npy"
            files.append((row["map"], npy_bytes(heat.numpy())))
    for rel, payload in files:  # written only once the whole row is computed
        atomic_write(ctx["out"] / rel, payload) if not callable(payload) else payload(ctx["out"] / rel)
    return row


def audit_media(cfg: RunConfig, model: str | nn.Module, load: dict[str, Any], ctx: DistContext, dev: torch.device,
                opts: MediaOptions) -> dict[str, Any]:  # fmt: skip
    """The audit of a folder or manifest of volumes or videos (called by :func:`camkit.audit.audit`)."""
    from tqdm import tqdm

    dataset = discover_media(cfg.data, [cfg.out])
    loaded: LoadedModel = load_model(model, load.get("weights"), trust_pickle=load.get("trust_pickle", False), device=dev)
    warn_random_weights(loaded)
    kinds = {"volume" if is_nifti(r.key) else "video" for r in dataset.records}
    if "volume" in kinds and (load.get("mean") is not None or load.get("std") is not None):
        raise InvalidInputError("--mean/--std normalise video frames; volumes take --intensity")
    size = load.get("size")
    cube = None
    if size is not None and "volume" in kinds:
        cube = volume_size(size)
    video_pre = video_preprocess(model, load.get("weights"), size=size if "video" in kinds and size else None,
                                 mean=load.get("mean"), std=load.get("std")) if "video" in kinds else None  # fmt: skip
    mapping = map_labels([r.label for r in dataset.records], classes=cfg.classes, model_classes=loaded.categories,
                         alphabetical=cfg.alphabetical_classes)  # fmt: skip
    fingerprint = cfg.fingerprint(loaded, dataset, mapping)
    fingerprint["preprocess"] = {"volume": {"size": cube, "intensity": opts.intensity},
                                 "video": video_pre.describe() if video_pre else None, "frames": opts.frames,
                                 "max_voxels": opts.max_voxels}  # fmt: skip
    session, count, todo, corrupt = start_run(cfg, dataset, fingerprint, ctx)
    shard = todo[ctx.rank :: ctx.world]
    state = {
        "explainer": build_explainer(cfg.method, loaded.model, cfg.layer), "spec": cfg.target, "device": loaded.device,
        "names": mapping.names, "labels": torch.tensor(mapping.indices, dtype=torch.long), "opts": opts, "size": cube,
        "video_pre": video_pre, "regions": dataset.mask_regions, "faithfulness": cfg.faithfulness, "steps": cfg.steps,
        "save_maps": cfg.save_maps, "out": cfg.out,
    }  # fmt: skip
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    seq = 0
    with tqdm(total=len(todo), unit="file", disable=not (cfg.progress and ctx.main), desc="audit") as bar:
        for n, index in enumerate(shard):
            record = dataset.records[index]
            try:
                rows.append(_row(record, index, state))
            except Exception as err:  # this input's error row; the others go on
                rows.append({"key": record.key, "label": record.label or "", "note": "",
                             "error": error_reason(err).replace(str(record.path), record.path.name)})  # fmt: skip
            bar.update(ctx.world)
            if len(rows) >= cfg.batch_size or n == len(shard) - 1:
                part = cfg.out / PARTS / f"{session}-r{ctx.rank:03d}-{seq:06d}.jsonl"
                atomic_write(part, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows), sync=True)
                rows, seq = [], seq + 1
    model_description = {**loaded.describe(), "preprocess": fingerprint["preprocess"]}
    return finish_run(
        cfg, dataset, model_description, mapping, ctx, f"{dataset.kind} of {' and '.join(sorted(kinds))}s",
        {"format": "png", "size": "one slice or frame at the model input's size"},
        {"preprocess": fingerprint["preprocess"]}, started=started, todo=len(todo), corrupt=corrupt, count=count,
    )  # fmt: skip
