"""``camkit explain``: explain a few image files and write overlays, maps and a manifest.

Writes into ``out``: ``overlays/NAME.png`` (for ``topK`` targets, ``NAME-topJ-classC.png``
per class) at each image's own size and shape (the map is taken back through the resize and
centre crop; pixels the crop left out are shown without colour), ``maps/NAME.npy`` (float32
maps in [0, 1] at the model input's size: [H, W], or [K, H, W] for ``topK``) and
``manifest.json`` (versions, model, method, layer, and per image its prediction, confidence,
targets and files, or its error). ``NAME`` is the file's stem made safe plus a short hash of
the path as given (see :func:`camkit.runs.files.safe_name`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..detection import task_of
from ..modelload import LoadedModel, load_model, warn_random_weights
from ..runs.data import error_reason, read_checked
from ..runs.explaining import build_explainer, explain_batch
from ..runs.files import atomic_write, encode_image, npy_bytes, refresh_umask, safe_name
from ..runs.media import refuse_crop
from ..runs.targeting import TargetSpec, chooser, parse_target
from ..viz.overlay import overlay
from .detect import explain_dense_files
from .manifest import cam_layers, write_manifest
from .media import explain_media_files, media_kind

__all__ = ["explain_files"]


def explain_files(
    images: Sequence[str | os.PathLike[str]], model: str | nn.Module, *, out: str | os.PathLike[str],
    weights: str | None = None, trust_pickle: bool = False, method: str = "gradcam", layer: str | None = None,
    target: str | int | None = "pred", size: int | Sequence[int] | None = None, mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None, device: str | torch.device | None = None, batch_size: int = 8,
    max_pixels: int = 64_000_000, crop: int | Sequence[int] | None = None, score_threshold: float = 0.5,
    top: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Explain image files (the Python side of ``camkit explain``); returns the manifest.

    ``target`` is ``"pred"`` (top-1), a class index, or ``"topK"`` (the K best classes,
    one map each). Overlays are at each image's own size; images above ``max_pixels``
    pixels get an error entry. Other arguments as in :func:`camkit.audit`. An image that cannot be read
    gets an ``error`` entry in the manifest; the others are still explained. NIfTI volumes, videos
    and ``.npy`` signals go to :func:`camkit.explain.media.explain_media_files` (with its defaults).
    Detectors and segmenters are explained per detection (``score_threshold``, ``top``) or per
    predicted class: :func:`camkit.explain.detect.explain_dense_files`.

    Example:
        >>> import os, tempfile, numpy as np, torch, camkit
        >>> from camkit.explain.files import explain_files
        >>> root = tempfile.mkdtemp(); camkit.save_png(f"{root}/a.png", np.zeros((8, 8, 3), np.uint8))
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        ...                           torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> manifest = explain_files([f"{root}/a.png"], net, out=f"{root}/out", layer="1", target="top2", size=8,
        ...                          device="cpu")
        >>> len(manifest["images"][0]["targets"]), sorted(os.listdir(f"{root}/out"))
        (2, ['manifest.json', 'maps', 'overlays'])
    """
    if any(media_kind(p) for p in images):  # volumes, videos and signals (camkit.explain.media)
        refuse_crop(crop)
        return explain_media_files(images, model, out=out, weights=weights, trust_pickle=trust_pickle, method=method,
                                   layer=layer, target=target, size=size, mean=mean, std=std, device=device)  # fmt: skip
    loaded = load_model(
        model, weights, trust_pickle=trust_pickle, size=size, mean=mean, std=std, device=device, crop=crop
    )
    warn_random_weights(loaded)
    refresh_umask()
    spec = parse_target(target, allow=("pred", "class", "topk"))
    explainer = build_explainer(method, loaded.model, layer)
    out_dir = Path(out)
    if task_of(loaded.model) is not None:  # detectors and segmenters: explain/detect.py
        return explain_dense_files(images, loaded, explainer, out_dir=out_dir, method=method, layer=layer, target=target,
                                   score_threshold=score_threshold, top=top, max_pixels=max_pixels)  # fmt: skip
    entries = _explain_images(images, loaded, explainer, spec, out_dir, batch_size, max_pixels)
    return write_manifest(out_dir, loaded.describe(), method, cam_layers(explainer) or layer, {"target": str(spec)},
                          entries)  # fmt: skip


def _explain_images(images: Sequence[str | os.PathLike[str]], loaded: LoadedModel, explainer: Any, spec: TargetSpec,
                    out_dir: Path, batch_size: int, max_pixels: int) -> list[dict[str, Any]]:  # fmt: skip
    """Read the images, explain them ``batch_size`` at a time and write their files; their manifest entries."""
    entries: list[dict[str, Any]] = []
    pending: list[tuple[dict[str, Any], torch.Tensor, Any]] = []  # (entry, x, original RGB)
    for image in images:
        entry: dict[str, Any] = {"path": str(image), "note": "", "error": ""}
        entries.append(entry)
        try:
            rgb, entry["note"] = read_checked(Path(image), max_pixels)
            x, _shown = loaded.preprocess(rgb)
        except Exception as err:  # an unreadable image is reported in its entry; the others go on
            entry["error"] = error_reason(err)
            continue
        pending.append((entry, x, rgb))
        if len(pending) >= batch_size:
            _explain_batch(pending, loaded, explainer, spec, out_dir)
            pending.clear()
    if pending:
        _explain_batch(pending, loaded, explainer, spec, out_dir)
    return entries


def _explain_batch(pending: list[tuple[dict[str, Any], torch.Tensor, Any]], loaded: LoadedModel, explainer: Any,
                   spec: TargetSpec, out_dir: Path) -> None:  # fmt: skip
    """Explain one batch of read images and fill their entries (prediction, targets, files)."""
    x = torch.stack([p[1] for p in pending]).to(loaded.device)
    result = explain_batch(explainer, x, chooser(spec))
    probs = result.logits.float().softmax(dim=1)
    conf, pred = probs.max(dim=1)
    classes = result.classes if result.classes.dim() == 2 else result.classes[:, None]
    maps = result.maps if result.maps.dim() == 4 else result.maps[:, None]
    chosen = probs.gather(1, classes)
    host = (pred.cpu().tolist(), conf.cpu().tolist(), classes.cpu().tolist(), chosen.cpu().tolist())
    maps_host = maps.detach().float().cpu()
    names = loaded.categories
    for j, (entry, _, rgb) in enumerate(pending):
        entry["prediction"] = host[0][j]
        entry["prediction_name"] = names[host[0][j]] if names and host[0][j] < len(names) else str(host[0][j])
        entry["confidence"] = host[1][j]
        entry["targets"], entry["target_probabilities"] = host[2][j], host[3][j]
        _write_files(entry, rgb, maps_host[j], loaded, spec, out_dir)


def _write_files(entry: dict[str, Any], rgb: Any, maps: torch.Tensor, loaded: LoadedModel, spec: TargetSpec,
                 out_dir: Path) -> None:  # fmt: skip
    """One image's overlays (one per target, at the image's size) and its maps [K, H, W]; their paths in ``entry``."""
    stem = safe_name(entry["path"])[: -len(".png")]
    entry["overlays"] = []
    height, width = rgb.shape[:2]
    for k, cls in enumerate(entry["targets"]):
        name = f"{stem}.png" if spec.kind != "topk" else f"{stem}-top{k + 1}-class{cls}.png"
        full, inside = loaded.preprocess.invert_map(maps[k], height, width)
        drawn = np.where(inside.numpy()[:, :, None], overlay(rgb, full), rgb)
        atomic_write(out_dir / "overlays" / name, encode_image(drawn, "png"))
        entry["overlays"].append(f"overlays/{name}")
    array = maps if spec.kind == "topk" else maps[0]
    atomic_write(out_dir / "maps" / f"{stem}.npy", npy_bytes(array.numpy()))
    entry["map"] = f"maps/{stem}.npy"
