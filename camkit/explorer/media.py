"""Volumes, videos and signals in the explorer, through camkit's media readers and the session's model.

Plain Python, tested without a browser: :func:`explain_media` reads a NIfTI volume, a video or a
``.npy`` signal the way ``camkit explain`` does (volumes min-max scaled at their own size, frames
through the model's video preprocessing, signals as stored) and explains it with the session's
explainers (one model run at a time, under the session's lock). :func:`media_view` draws what the
page shows: one slice of a volume along an axis, one frame of a video, a signal's plot.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..explain.media import media_kind
from ..explanation import Explanation
from ..media.nifti import normalize_intensity, read_volume
from ..media.signal import read_signal
from ..media.video import read_video
from ..modelload.video import video_preprocess
from ..viz.overlay import overlay as blend
from .session import Session, settings_key

__all__ = ["MediaResult", "explain_media", "media_kind", "media_peak", "media_positions", "media_view"]

MAX_VOXELS = 64 * 1024 * 1024  # what one live explanation reads at most (voxels, frame pixels or values)
_MAP_RANK = {"volume": 3, "video": 3, "signal": 1}


@dataclass(frozen=True)
class MediaResult:
    """One live explanation of a volume, video or signal.

    Attributes:
        kind: ``"volume"``, ``"video"`` or ``"signal"``.
        map: float32, exactly ``explanation.maps[0]``: [D, H, W] (volume), [T, h, w] (video), [T] (signal).
        data: what the model saw, for drawing: float32 [D, H, W] in [0, 1] (volume), uint8
            [T, h, w, 3] (video frames after preprocessing), float32 [C, T] (signal).
        prediction: as :attr:`LiveResult.prediction`, with ``"kind"``.
        explanation: the camkit :class:`~camkit.Explanation` (batch of one).
    """

    kind: str
    map: np.ndarray
    data: np.ndarray
    prediction: dict[str, Any]
    explanation: Explanation


def _read(session: Session, path: str, kind: str) -> tuple[Tensor, np.ndarray]:
    """``(x, data)``: the model input [1, ...] and what is drawn (see :class:`MediaResult`)."""
    if kind == "volume":
        volume = normalize_intensity(read_volume(path, MAX_VOXELS).data, "minmax").astype(np.float32, copy=False)
        return torch.from_numpy(volume)[None, None], volume
    if kind == "video":
        frames = read_video(path).frames
        if frames.size // 3 > MAX_VOXELS:
            raise InvalidInputError(f"{os.path.basename(path)} has {frames.shape[0]} frames of "
                                    f"{frames.shape[2]}x{frames.shape[1]}, more than {MAX_VOXELS} pixels; cut it")  # fmt: skip
        x, shown = video_preprocess(session.model)(frames)
        return x[None], np.asarray(shown)
    signal = read_signal(path)
    if signal.size > MAX_VOXELS:
        raise InvalidInputError(f"{os.path.basename(path)} has {signal.size} values, more than {MAX_VOXELS}")
    return torch.from_numpy(signal)[None], signal


def explain_media(
    session: Session, path: str | os.PathLike[str], method: str, layer: str | None = None,
    target: int | None = None, **settings: Any,
) -> MediaResult:  # fmt: skip
    """Explain a volume (``.nii``/``.nii.gz``), video or signal (``.npy`` [T] or [C, T]) for ``target``.

    Args:
        session: the explorer's :class:`Session`; its model takes [B, 1, D, H, W] volumes,
            [B, 3, T, H, W] clips or [B, C, T] signals.
        path: the file.
        method: a registry key, as for :meth:`Session.explain`.
        layer: the dotted layer name; ``None`` for the method's automatic choice.
        target: the class index; ``None`` for the predicted class.
        **settings: the method's settings, as for :meth:`Session.explain`.

    Returns:
        A :class:`MediaResult` whose map equals the Python API's for the same input; the same
        object again for the same file content, method, layer, target and settings (the
        session's cache).

    Raises:
        InvalidInputError: a file of another kind, an unreadable file, a model that does not take it.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from torch import nn
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.media import explain_media
        >>> net = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4, 3))
        >>> path = os.path.join(tempfile.mkdtemp(), "ecg.npy")
        >>> np.save(path, np.random.default_rng(0).normal(size=(2, 50)).astype(np.float32))
        >>> result = explain_media(Session(net, device="cpu"), path, "gradcam", target=1)
        >>> result.kind, result.map.shape, result.prediction["target"]
        ('signal', (50,), 1)
    """
    path = os.fspath(path)
    kind = media_kind(path)
    if kind is None:
        raise InvalidInputError(f"{os.path.basename(path)} is not a volume (.nii, .nii.gz), video or signal (.npy)")
    if target is not None:
        target = int(target)
    x, data = _read(session, path, kind)
    digest = hashlib.sha256(f"{kind}{list(x.shape)}".encode())
    digest.update(x.numpy().tobytes())
    data_key = "media:" + digest.hexdigest()

    def compute() -> MediaResult:
        explainer = session._explainer(method, layer, dict(settings))
        explanation, logits = session._run(explainer, data_key, x.to(session.device), target, method)
        return _media_result(session, kind, data, explanation, logits, method, settings)

    return session.cached((data_key, method, layer, target, settings_key(settings)), compute)


def _media_result(
    session: Session, kind: str, data: np.ndarray, explanation: Explanation, logits: Tensor, method: str,
    settings: dict[str, Any],
) -> MediaResult:  # fmt: skip
    heat = explanation.maps[0].detach().float().cpu()
    if heat.dim() != _MAP_RANK[kind]:
        raise InvalidInputError(f"a {kind}'s map is {_MAP_RANK[kind]}-D; {method!r} gave {list(heat.shape)}")
    chosen = int(explanation.target.reshape(-1)[0]) if explanation.target is not None else int(logits.argmax())
    prediction = {
        "top": session._top(logits, 5), "target": chosen, "target_name": session.name(chosen),
        "layer": ", ".join(explanation.layers) or None, "method": explanation.method, "settings": dict(settings),
        "kind": kind,
    }  # fmt: skip
    return MediaResult(kind, heat.numpy().astype(np.float32, copy=False), data, prediction, explanation)


def media_positions(result: MediaResult, axis: int = 0) -> int:
    """How many slices along ``axis`` (volume), frames (video) or 1 (signal) the slider runs over.

    Example:
        >>> import numpy as np
        >>> from camkit.explorer.media import MediaResult, media_positions
        >>> media_positions(MediaResult("volume", np.zeros((4, 5, 6), np.float32), np.zeros((4, 5, 6)), {}, None), 2)
        6
    """
    if result.kind == "volume":
        return int(result.map.shape[_axis(axis)])
    return int(result.map.shape[0]) if result.kind == "video" else 1


def media_peak(result: MediaResult, axis: int = 0) -> int:
    """The position :func:`media_view` shows by default: a volume's slice along ``axis`` through the
    map's peak, a video's frame holding the most map (0 for a signal).

    Example:
        >>> import numpy as np
        >>> from camkit.explorer.media import MediaResult, media_peak
        >>> heat = np.zeros((4, 5, 6), np.float32); heat[2, 1, 3] = 1.0
        >>> [media_peak(MediaResult("volume", heat, heat, {}, None), a) for a in (0, 1, 2)]
        [2, 1, 3]
    """
    if result.kind == "signal":
        return 0
    heat = np.moveaxis(result.map, _axis(axis), 0) if result.kind == "volume" else result.map
    per = heat.reshape(heat.shape[0], -1)
    return int((per.max(axis=1) if result.kind == "volume" else per.sum(axis=1)).argmax())


def _axis(axis: Any) -> int:
    if isinstance(axis, bool) or axis not in (0, 1, 2):
        raise InvalidInputError(f"the axis of a volume is 0, 1 or 2; got {axis!r}")
    return int(axis)


def media_view(result: MediaResult, axis: int = 0, index: int | None = None, alpha: float = 0.5) -> np.ndarray:
    """The picture the page shows: uint8 [h, w, 3].

    Volume: slice ``index`` along ``axis`` (default: the slice through the map's peak), grey, the
    map over it. Video: frame ``index`` (default: the frame with the most map) with its map. Signal:
    the waveform with the map beneath (matplotlib).

    Example:
        >>> import numpy as np
        >>> from camkit.explorer.media import MediaResult, media_view
        >>> heat = np.zeros((4, 5, 6), np.float32); heat[2, 1, 3] = 1.0
        >>> media_view(MediaResult("volume", heat, heat.copy(), {}, None), axis=0).shape
        (5, 6, 3)
    """
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}")
    if result.kind == "signal":
        from ..viz.signal import signal_figure

        figure = signal_figure(torch.from_numpy(result.data), torch.from_numpy(result.map)[None])
        return np.asarray(figure.image)[:, :, :3].astype(np.uint8)
    along = _axis(axis) if result.kind == "volume" else 0
    heat = np.moveaxis(result.map, along, 0)
    count = heat.shape[0]
    if index is None:
        index = media_peak(result, along)
    if isinstance(index, bool) or not 0 <= int(index) < count:
        raise InvalidInputError(f"position {index!r} is outside 0 to {count - 1} along this axis")
    index = int(index)
    if result.kind == "volume":
        grey = (np.moveaxis(result.data, along, 0)[index] * 255.0).round().clip(0, 255).astype(np.uint8)
        picture = np.repeat(grey[:, :, None], 3, axis=2)
    else:
        picture = np.ascontiguousarray(result.data[index])
    return blend(picture, heat[index], alpha=alpha)
