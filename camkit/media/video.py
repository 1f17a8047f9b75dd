"""Video files as RGB frames: read with OpenCV (GIFs with Pillow), cut into clips, written back.

Frames are uint8 RGB ``[T, H, W, 3]``, the layout :func:`camkit.overlay` and the image readers
use; a model takes a clip as ``[B, 3, T, H, W]`` (see :mod:`camkit.modelload.video`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ._atomic import write_via_temp

__all__ = ["VIDEO_SUFFIXES", "Video", "read_video", "video_clips", "write_video"]

_GIF_FPS = "camkit fps="  # the comment a GIF written here carries: its frame rate (GIF stores 1/100 s delays)

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".gif")
"""File endings read as videos (case-insensitive)."""


def is_video(path: str | os.PathLike[str]) -> bool:
    """Whether a path names a video file by its ending (see :data:`VIDEO_SUFFIXES`)."""
    return str(path).lower().endswith(VIDEO_SUFFIXES)


@dataclass(frozen=True)
class Video:
    """A video read from a file.

    Attributes:
        frames: uint8 RGB [T, H, W, 3].
        fps: frames per second as the file states it (``0.0`` when it does not).

    Example:
        >>> import numpy as np
        >>> from camkit.media import Video
        >>> Video(np.zeros((8, 4, 6, 3), np.uint8), 25.0).duration
        0.32
    """

    frames: np.ndarray
    fps: float

    @property
    def duration(self) -> float:
        """Seconds: frames over frame rate (``0.0`` without a frame rate)."""
        return round(len(self.frames) / self.fps, 6) if self.fps > 0 else 0.0


def _read_gif(path: Path, max_frames: int | None) -> tuple[list[np.ndarray], float]:
    """GIF frames at one rate (the frame rate camkit wrote in its comment, else its shortest frame's).

    A frame shown k times as long counts k times, so identical frames Pillow joined come back apart.
    """
    from PIL import Image, ImageSequence

    shown: list[tuple[np.ndarray, float]] = []
    written = 0.0
    with Image.open(path) as gif:
        comment = gif.info.get("comment", b"")
        if isinstance(comment, bytes) and comment.startswith(_GIF_FPS.encode("ascii")):
            written = float(comment[len(_GIF_FPS) :] or 0)  # the frame rate camkit wrote it with
        for frame in ImageSequence.Iterator(gif):
            shown.append((np.asarray(frame.convert("RGB")), float(frame.info.get("duration") or 0)))
            if max_frames is not None and len(shown) > max_frames:
                break
    timed = [d for _, d in shown if d > 0]
    if not timed:
        return [f for f, _ in shown], 0.0
    tick = 1000.0 / written if written > 0 else min(timed)
    frames = [f for f, d in shown for _ in range(max(1, round(d / tick)))]
    return frames, written if written > 0 else 1000.0 / tick


def _read_cv2(path: Path, max_frames: int | None) -> tuple[list[np.ndarray], float]:
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise InvalidInputError(f"{path.name} could not be opened as a video (not a video, or truncated)")
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
        frames: list[np.ndarray] = []
        while max_frames is None or len(frames) <= max_frames:
            ok, bgr = capture.read()
            if not ok or bgr is None:
                break
            frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    finally:
        capture.release()
    return frames, fps if np.isfinite(fps) else 0.0


def read_video(path: str | os.PathLike[str], max_frames: int | None = None) -> Video:
    """Read a video file (MP4, AVI, MOV, MKV, WebM through OpenCV; GIF through Pillow).

    Args:
        path: the file.
        max_frames: refuse a video with more frames than this (read stops there, so a
            long film is not decoded whole before the refusal).

    Raises:
        InvalidInputError: the file is missing, empty, unreadable, has no frame, or too many.

    Example:
        >>> import os, tempfile, numpy as np
        >>> from camkit.media import read_video, write_video
        >>> path = os.path.join(tempfile.mkdtemp(), "clip.gif")
        >>> write_video(path, np.zeros((5, 8, 8, 3), np.uint8), fps=10)
        >>> video = read_video(path)
        >>> video.frames.shape, video.fps
        ((5, 8, 8, 3), 10.0)
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no video file at {path}")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path.name} is empty (0 bytes)")
    try:
        frames, fps = _read_gif(path, max_frames) if path.suffix.lower() == ".gif" else _read_cv2(path, max_frames)
    except InvalidInputError:
        raise
    except Exception as err:
        raise InvalidInputError(f"{path.name} could not be read as a video ({type(err).__name__}: {err})") from None
    if not frames:
        raise InvalidInputError(f"{path.name} has no readable frame (an empty or damaged video)")
    if max_frames is not None and len(frames) > max_frames:
        raise InvalidInputError(f"{path.name} has more than max_frames={max_frames} frames; cut it or raise the limit")
    if len({f.shape for f in frames}) != 1:
        raise InvalidInputError(f"{path.name}: its frames change size; camkit reads videos of one frame size")
    return Video(np.stack(frames), fps)


def video_clips(frames: Any, length: int, stride: int | None = None, step: int = 1) -> np.ndarray:
    """Cut frames [T, ...] into clips [N, length, ...]: ``length`` frames each, ``step`` apart.

    Clip ``n`` starts at frame ``n * stride`` (default ``stride``: one clip's span,
    ``(length - 1) * step + 1``, so clips do not overlap) and takes frames ``start, start + step,
    ...``. Frames left at the end that fill no whole clip are dropped. A video shorter than one
    clip is refused.

    Example:
        >>> import numpy as np
        >>> from camkit.media import video_clips
        >>> frames = np.arange(10)
        >>> video_clips(frames, 4).tolist()
        [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> video_clips(frames, 3, stride=2, step=2).tolist()
        [[0, 2, 4], [2, 4, 6], [4, 6, 8]]
    """
    array = np.asarray(frames)
    if length < 1 or step < 1 or (stride is not None and stride < 1):
        raise InvalidInputError(f"clips need length, stride and step of at least 1, got {length}, {stride}, {step}")
    span = (length - 1) * step + 1
    stride = span if stride is None else stride
    total = array.shape[0] if array.ndim else 0
    if total < span:
        raise InvalidInputError(
            f"the video has {total} frame(s); one clip of {length} frames {step} apart needs {span}"
        )
    starts = range(0, total - span + 1, stride)
    return np.stack([array[s : s + span : step] for s in starts])


def write_video(path: str | os.PathLike[str], frames: Any, fps: float = 8.0) -> None:
    """Write uint8 RGB frames [T, H, W, 3] as an animated GIF (Pillow) or an MP4/AVI (OpenCV).

    GIFs (written by Pillow) loop forever, with an adaptive palette of up to 256 colours per
    frame; identical consecutive frames are stored as one frame shown as long (which
    :func:`read_video` splits again). MP4 is encoded with OpenCV's ``mp4v`` codec, AVI with MJPG. The file appears whole or not at all.

    Example:
        >>> import os, tempfile, numpy as np
        >>> from camkit.media import read_video, write_video
        >>> path = os.path.join(tempfile.mkdtemp(), "clip.mp4")
        >>> write_video(path, np.zeros((6, 16, 16, 3), np.uint8), fps=12)
        >>> len(read_video(path).frames)
        6
    """
    array = np.asarray(frames)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[3] != 3 or array.shape[0] == 0:
        raise InvalidInputError(f"write_video takes uint8 RGB frames [T, H, W, 3], got {array.dtype} {list(array.shape)}")
    if not fps > 0:
        raise InvalidInputError(f"fps must be positive, got {fps}")
    suffix = Path(path).suffix.lower()
    if suffix == ".gif":
        write_via_temp(path, lambda tmp: _write_gif(tmp, array, fps))
    elif suffix in (".mp4", ".avi"):
        write_via_temp(path, lambda tmp: _write_cv2(tmp, array, fps, "mp4v" if suffix == ".mp4" else "MJPG"))
    else:
        raise InvalidInputError(f"{path}: videos are written as .gif, .mp4 or .avi")


def _write_gif(tmp: str, frames: np.ndarray, fps: float) -> None:
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    duration = max(1, round(1000.0 / fps))
    # Pillow joins identical consecutive frames into one longer frame; read_video splits them again
    images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0,
                   comment=f"{_GIF_FPS}{float(fps)!r}".encode("ascii"))  # fmt: skip


def _write_cv2(tmp: str, frames: np.ndarray, fps: float, codec: str) -> None:
    import cv2

    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(tmp, cv2.VideoWriter.fourcc(*codec), float(fps), (int(width), int(height)))
    try:
        if not writer.isOpened():
            raise InvalidInputError(f"OpenCV cannot write {codec} video here (its build lacks the codec); use .gif")
        for frame in frames:
            writer.write(cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
