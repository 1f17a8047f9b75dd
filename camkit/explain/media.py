"""``camkit explain`` on volumes, videos and signals: maps in their own formats, pictures, a manifest.

Per input ``NAME`` (its safe name, see :func:`camkit.runs.files.safe_name`), in ``out``:

* a NIfTI volume (``.nii``, ``.nii.gz``): ``maps/NAME.nii.gz``, the map on the scan's own voxel
  grid with the scan's affine (it opens aligned with the scan in any viewer), and
  ``overlays/NAME-slices.png`` (three orthogonal slices through the map's peak) and
  ``overlays/NAME-montage.png`` (a montage of slices). The volume keeps its size unless ``size``
  (``(D, H, W)``) is given; then the map is resized back (trilinear) to the scan's grid.
* a video (``.mp4``, ``.avi``, ``.mov``, ``.mkv``, ``.webm``, ``.gif``...): ``maps/NAME.npy``
  (float32 ``[T, H, W]`` at the model input's frame size), ``overlays/NAME.mp4`` (the frames the
  model saw with the map over them, at the file's frame rate), ``overlays/NAME-frames.png`` (a
  strip of frames), ``curves/NAME.csv`` and ``overlays/NAME-curve.png`` (each frame's share of
  the map: which moments mattered). Frames are preprocessed with the model's preset (:func:`camkit.modelload.video.video_preprocess`).
  With ``frames=N`` the video is cut into clips of ``N`` frames ``stride`` apart, every clip is
  explained for the video's class (the best class by the clips' mean probability, or the one
  asked), and the clip maps are averaged where clips overlap.
* a signal (``.npy``, ``[T]`` or ``[C, T]``): ``maps/NAME.npy`` (float32 ``[T]``) and
  ``overlays/NAME.png`` (the waveform with the map beneath).

``manifest.json`` lists every input under ``"images"`` (as for images) with its ``kind``, its
prediction, target and files. Pictures need matplotlib; without it they are left out and the entry's note says so. An input
that cannot be explained gets an ``error`` in its entry and none of its files: everything of an
entry is computed before the first of its files is written, and removed again if a write fails.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..media.nifti import INTENSITY_MODES, is_nifti, normalize_intensity, read_volume, write_volume
from ..media.signal import read_signal
from ..media.video import is_video, read_video, write_video
from ..modelload import load_model, warn_random_weights
from ..modelload.video import video_preprocess
from ..runs.data import error_reason
from ..runs.explaining import build_explainer
from ..runs.files import atomic_write, encode_image, npy_bytes, refresh_umask, safe_name
from ..runs.media import explain_media_batch, volume_size
from ..runs.targeting import TargetSpec, chooser, parse_target
from .manifest import cam_layers, write_manifest

__all__ = ["explain_media_files", "media_kind"]


def media_kind(path: str | os.PathLike[str]) -> str | None:
    """``"volume"``, ``"video"`` or ``"signal"`` by a file's ending; ``None`` for anything else (images).

    Example:
        >>> from camkit.explain.media import media_kind
        >>> media_kind("scan.nii.gz"), media_kind("clip.MP4"), media_kind("ecg.npy"), media_kind("a.png")
        ('volume', 'video', 'signal', None)
    """
    if is_nifti(path):
        return "volume"
    if is_video(path):
        return "video"
    return "signal" if str(path).lower().endswith(".npy") else None


class _Files:
    """An entry's outputs, held until all are computed, then written; removed again if one write fails."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.pending: list[tuple[str, Any]] = []

    def add(self, rel: str, payload: Any) -> str:
        self.pending.append((rel, payload))
        return rel

    def write(self) -> None:
        done: list[Path] = []
        try:
            for rel, payload in self.pending:
                path = self.out / rel
                if callable(payload):
                    payload(path)
                else:
                    atomic_write(path, payload)
                done.append(path)
        except BaseException:
            for path in done:
                path.unlink(missing_ok=True)
            raise


def _png(fig: Any) -> bytes:
    return encode_image(fig.image, "png")


def _pictures(draw: Any) -> tuple[Any, str]:
    """``(draw(), "")``, or ``(None, note)`` when matplotlib is missing."""
    try:
        return draw(), ""
    except ImportError as err:
        if "matplotlib" not in str(err):
            raise
        return None, "pictures left out: they need matplotlib (pip install 'camkit[plot]')"


def _predict(entry: dict[str, Any], logits: Tensor, classes: Tensor, names: list[str] | None) -> None:
    probs = logits.float().softmax(dim=1).mean(dim=0)
    target = int(classes.flatten()[0])
    pred = int(probs.argmax())
    entry["prediction"] = pred
    entry["prediction_name"] = names[pred] if names and pred < len(names) else str(pred)
    entry["confidence"] = float(probs[pred])
    entry["targets"], entry["target_probabilities"] = [target], [float(probs[target])]


def _volume(path: Path, ctx: dict[str, Any], files: _Files, entry: dict[str, Any]) -> None:
    from ..viz.volume import montage_figure, volume_figure

    volume = read_volume(path, ctx["max_voxels"])
    data = torch.from_numpy(normalize_intensity(volume.data, ctx["intensity"]))[None, None]
    size = ctx["size"]
    grid = tuple(volume.shape)
    if size is not None:
        data = F.interpolate(data, size=size, mode="trilinear", align_corners=False)
    result = explain_media_batch(ctx, data.to(ctx["device"]), chooser(ctx["spec"]))
    _predict(entry, result.logits, result.classes, ctx["names"])
    heat = result.maps.detach().float().cpu()[0]
    native = heat if size is None else F.interpolate(heat[None, None], size=grid, mode="trilinear",
                                                     align_corners=False)[0, 0].clamp(0, 1)  # fmt: skip
    stem = ctx["stem"]
    affine = volume.affine
    entry["map"] = files.add(f"maps/{stem}.nii.gz", lambda p: write_volume(p, native.numpy(), affine))
    entry["map_shape"], entry["model_input"] = list(grid), list(data.shape)
    scale = [g / s for g, s in zip(grid, data.shape[2:], strict=True)]
    spacing = [z * f for z, f in zip(volume.zooms, scale, strict=True)]
    figs, note = _pictures(lambda: (volume_figure(data[0], heat[None], spacing=spacing),
                                    montage_figure(data[0], heat, spacing=spacing)))  # fmt: skip
    if figs is not None:
        entry["pictures"] = [files.add(f"overlays/{stem}-slices.png", _png(figs[0])),
                             files.add(f"overlays/{stem}-montage.png", _png(figs[1]))]  # fmt: skip
    entry["note"] = note


def _video(path: Path, ctx: dict[str, Any], files: _Files, entry: dict[str, Any]) -> None:
    from ..viz.video import frame_curve_figure, overlay_frames, video_figure

    video = read_video(path, ctx["max_frames"])
    total, height, width = video.frames.shape[:3]
    if total * height * width > ctx["max_voxels"]:
        raise InvalidInputError(
            f"{path.name} is {total} frames of {width}x{height} = {total * height * width} voxels, more than "
            f"max_voxels={ctx['max_voxels']}; raise --max-voxels or cut the video"
        )
    pre = ctx["video_pre"]
    x, shown = pre(video.frames)  # [3, T, h, w], uint8 [T, h, w, 3]
    length, stride = ctx["frames"] or total, ctx["stride"]
    if length > total:
        raise InvalidInputError(f"{path.name} has {total} frame(s), fewer than --frames {length}")
    starts = list(range(0, total - length + 1, stride or length))
    clips = torch.stack([x[:, s : s + length] for s in starts])  # [N, 3, L, h, w]
    explainer, spec, batch = ctx["explainer"], ctx["spec"], ctx["batch_size"]
    if spec.kind == "pred" and len(starts) > 1:  # one class for the whole video: the best by mean probability
        scored: list[Tensor] = []

        def keep(logits: Tensor) -> Tensor:  # a target that records the logits and picks class 0
            scored.append(logits.detach().float().cpu())
            return torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)

        with torch.no_grad(), eval_mode(explainer.model, enabled=not explainer.keep_mode):
            for i in range(0, len(starts), batch):
                try:
                    keep(explainer._forward(clips[i : i + batch].to(ctx["device"])))
                except RuntimeError:  # the first clip's explanation below names the problem
                    explain_media_batch(ctx, clips[:1].to(ctx["device"]), keep)
                    raise
        spec = TargetSpec("class", int(torch.cat(scored).softmax(dim=1).mean(dim=0).argmax()))
    total_map = torch.zeros(total, *x.shape[2:])
    count = torch.zeros(total)
    all_logits, all_classes = [], []
    for i in range(0, len(starts), batch):
        result = explain_media_batch(ctx, clips[i : i + batch].to(ctx["device"]), chooser(spec))
        all_logits.append(result.logits.detach().float().cpu())
        all_classes.append(result.classes.detach().cpu())
        for j, start in enumerate(starts[i : i + batch]):
            total_map[start : start + length] += result.maps[j].detach().float().cpu()
            count[start : start + length] += 1
    _predict(entry, torch.cat(all_logits), torch.cat(all_classes), ctx["names"])
    covered = count > 0
    heat = total_map / count.clamp(min=1)[:, None, None]
    frames_out = int(covered.sum())
    if frames_out < total:
        entry["note"] = f"the last {total - frames_out} frame(s) fill no whole clip of {length}: not explained"
    heat, shown = heat[:frames_out], shown[:frames_out]
    entry["clips"] = len(starts)
    stem = ctx["stem"]
    entry["map"] = files.add(f"maps/{stem}.npy", npy_bytes(heat.numpy()))
    entry["map_shape"] = list(heat.shape)
    fps = video.fps if video.fps > 0 else 8.0
    drawn = overlay_frames(shown, heat)
    entry["overlay_video"] = files.add(f"overlays/{stem}.{ctx['video_format']}", lambda p: write_video(p, drawn, fps))
    share = heat.sum(dim=(1, 2))
    share = share / share.sum() if float(share.sum()) > 0 else torch.zeros_like(share)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["frame", "seconds", "share"])
    for t, value in enumerate(share.tolist()):
        writer.writerow([t, round(t / fps, 6), repr(float(value))])
    entry["curve"] = files.add(f"curves/{stem}.csv", text.getvalue())
    entry["fps"] = video.fps
    figs, note = _pictures(lambda: (video_figure(shown, heat), frame_curve_figure(share, fps)))
    if figs is not None:
        entry["pictures"] = [files.add(f"overlays/{stem}-frames.png", _png(figs[0])),
                             files.add(f"overlays/{stem}-curve.png", _png(figs[1]))]  # fmt: skip
    entry["note"] = "; ".join(n for n in (entry.get("note", ""), note) if n)


def _signal(path: Path, ctx: dict[str, Any], files: _Files, entry: dict[str, Any]) -> None:
    from ..viz.signal import signal_figure

    signal = torch.from_numpy(read_signal(path))[None]
    if signal.numel() > ctx["max_voxels"]:
        raise InvalidInputError(f"{path.name} has {signal.numel()} values, more than max_voxels={ctx['max_voxels']}")
    result = explain_media_batch(ctx, signal.to(ctx["device"]), chooser(ctx["spec"]))
    _predict(entry, result.logits, result.classes, ctx["names"])
    heat = result.maps.detach().float().cpu()[0]
    entry["map"] = files.add(f"maps/{ctx['stem']}.npy", npy_bytes(heat.numpy()))
    entry["map_shape"] = list(heat.shape)
    fig, entry["note"] = _pictures(lambda: signal_figure(signal[0], heat))
    if fig is not None:
        entry["pictures"] = [files.add(f"overlays/{ctx['stem']}.png", _png(fig))]


_EXPLAIN = {"volume": _volume, "video": _video, "signal": _signal}


def explain_media_files(
    paths: Sequence[str | os.PathLike[str]], model: str | nn.Module, *, out: str | os.PathLike[str],
    weights: str | None = None, trust_pickle: bool = False, method: str = "gradcam", layer: str | None = None,
    target: str | int | None = "pred", size: int | Sequence[int] | None = None, mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None, device: str | torch.device | None = None, batch_size: int = 4,
    max_voxels: int = 64_000_000, intensity: str = "none", frames: int | None = None, stride: int | None = None,
    max_frames: int = 4096, video_format: str = "mp4",
) -> dict[str, Any]:  # fmt: skip
    """Explain volumes, videos and signals (the module docstring lists what is written); returns the manifest.

    Args:
        paths: NIfTI volumes, video files and ``.npy`` signals (:func:`media_kind`).
        model, weights, trust_pickle, method, layer, device: as in :func:`camkit.explain.files.explain_files`.
        target: ``"pred"`` (the best class) or a class index.
        size: volumes: ``(D, H, W)`` to resize to (an ``N`` or ``(N, N)`` means a cube); videos:
            ``(H, W)`` every frame is resized to (replacing the model's preset). Default: volumes
            keep their size, videos follow the model's preset.
        mean, std: videos: per-channel statistics replacing the preset's.
        batch_size: clips explained at once.
        max_voxels: larger volumes, videos (frames x pixels) and signals get an error entry, unread.
        intensity: volumes: ``"none"``, ``"minmax"``, ``"zscore"`` or ``"percentile"``
            (:func:`camkit.media.nifti.normalize_intensity`).
        frames, stride: videos: explain clips of ``frames`` frames starting ``stride`` apart
            (default: the whole video as one clip; ``stride`` defaults to ``frames``).
        max_frames: videos with more frames get an error entry (reading stops there).
        video_format: ``"mp4"`` or ``"gif"``, the overlay video's format.

    Example:
        >>> import os, tempfile, numpy as np, torch
        >>> from camkit.explain.media import explain_media_files
        >>> root = tempfile.mkdtemp(); np.save(f"{root}/ecg.npy", np.random.rand(2, 64))
        >>> net = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool1d(1),
        ...                           torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> manifest = explain_media_files([f"{root}/ecg.npy"], net, out=f"{root}/out", layer="1", device="cpu")
        >>> manifest["images"][0]["kind"], manifest["images"][0]["map_shape"], manifest["errors"]
        ('signal', [64], 0)
    """
    kinds = _check_arguments(paths, intensity, video_format, frames, stride, batch_size, max_voxels, mean, std)
    spec = parse_target(target, allow=("pred", "class"))
    cube = volume_size(size) if "volume" in kinds else None
    video_pre = (
        video_preprocess(model, weights, size=None if size is None else _frame_size(size), mean=mean, std=std)
        if "video" in kinds else None
    )  # fmt: skip
    loaded = load_model(model, weights, trust_pickle=trust_pickle, device=device)
    warn_random_weights(loaded)
    refresh_umask()
    explainer = build_explainer(method, loaded.model, layer)
    out_dir = Path(out)
    ctx: dict[str, Any] = {
        "explainer": explainer, "spec": spec, "device": loaded.device, "names": loaded.categories,
        "max_voxels": max_voxels, "intensity": intensity, "size": cube, "video_pre": video_pre,
        "frames": frames, "stride": stride, "max_frames": max_frames, "batch_size": batch_size,
        "video_format": video_format,
    }  # fmt: skip
    entries = _explain_each(paths, ctx, out_dir)
    described = loaded.describe()
    described["preprocess"] = {
        "volume": {"size": cube, "intensity": intensity} if "volume" in kinds else None,
        "video": video_pre.describe() if video_pre is not None else None,
        "video_clips": {"frames": frames, "stride": stride or frames} if "video" in kinds else None,
    }
    return write_manifest(out_dir, described, method, cam_layers(explainer) or layer, {"target": str(spec)}, entries)


def _check_arguments(paths: Sequence[str | os.PathLike[str]], intensity: str, video_format: str, frames: int | None,
                     stride: int | None, batch_size: int, max_voxels: int, mean: Sequence[float] | None,
                     std: Sequence[float] | None) -> set[str | None]:  # fmt: skip
    """Refuse arguments that do not fit (before any model is loaded); the kinds of the inputs."""
    if intensity not in INTENSITY_MODES:
        raise InvalidInputError(f"--intensity must be one of {', '.join(INTENSITY_MODES)}, got {intensity!r}")
    if video_format not in ("mp4", "gif"):
        raise InvalidInputError(f"the overlay video is mp4 or gif, got {video_format!r}")
    for name, value in (("frames", frames), ("stride", stride), ("batch_size", batch_size), ("max_voxels", max_voxels)):
        if value is not None and value < 1:
            raise InvalidInputError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    kinds = {media_kind(p) for p in paths}
    if None in kinds:
        raise InvalidInputError(
            "explain images and volumes, videos or signals in separate runs: "
            f"{next(str(p) for p in paths if media_kind(p) is None)} is an image"
        )
    if (mean is not None or std is not None) and kinds & {"volume", "signal"}:
        raise InvalidInputError("--mean/--std normalise video frames; volumes take --intensity, signals are used as stored")
    return kinds


_ENTRY_RESULTS = ("prediction", "prediction_name", "confidence", "targets", "target_probabilities", "map", "map_shape",
                  "pictures", "overlay_video", "curve", "clips", "fps", "model_input")  # fmt: skip
"""An entry's keys that an error removes again (it keeps ``path``, ``kind``, ``note`` and ``error``)."""


def _explain_each(paths: Sequence[str | os.PathLike[str]], ctx: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Explain every input and write its files (all or none); their manifest entries, errors included."""
    from tqdm import tqdm

    entries: list[dict[str, Any]] = []
    for path in tqdm(paths, unit="file", desc="explain", disable=len(paths) < 2):
        kind = media_kind(path)
        entry: dict[str, Any] = {"path": str(path), "kind": kind, "note": "", "error": ""}
        entries.append(entry)
        files = _Files(out_dir)
        ctx["stem"] = safe_name(str(path), "")
        try:
            _EXPLAIN[str(kind)](Path(path), ctx, files, entry)
            files.write()
        except Exception as err:  # this input's error row; the others go on
            for key in _ENTRY_RESULTS:
                entry.pop(key, None)
            entry["error"] = error_reason(err).replace(str(path), Path(path).name)
    return entries


def _frame_size(size: Sequence[int] | int) -> tuple[int, int]:
    values = [int(size)] * 2 if isinstance(size, int) else [int(s) for s in size]
    if len(values) != 2:
        raise InvalidInputError(f"--size for videos is N or HxW (every frame), got {'x'.join(map(str, values))}")
    return values[0], values[1]
