"""Generated data of the other ranks: a scan with a lesion, a clip with a moving object, a signal with a burst."""

from __future__ import annotations

from pathlib import Path

import numpy as np

AFFINE = np.array([[1.5, 0.0, 0.0, -20.0], [0.0, 1.2, 0.1, 10.0], [0.0, 0.0, 2.0, 5.0], [0.0, 0.0, 0.0, 1.0]])


def lesion_scan(shape=(16, 16, 16), center=(5, 10, 9), radius=3.0, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """A noisy ellipsoid 'organ' with a bright spherical lesion; returns ``(scan, lesion_mask)`` [D, H, W]."""
    rng = np.random.default_rng(seed)
    d, h, w = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    half = [s / 2 for s in shape]
    organ = sum(((a - m) / (0.45 * s)) ** 2 for a, m, s in zip((d, h, w), half, shape, strict=True)) < 1
    lesion = (d - center[0]) ** 2 + (h - center[1]) ** 2 + (w - center[2]) ** 2 <= radius**2
    scan = 100.0 * organ + 80.0 * lesion + rng.normal(0, 5, shape)
    return scan.astype(np.float32), lesion


def write_scan(path: Path, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lesion_scan` written as NIfTI with :data:`AFFINE`."""
    from camkit.media import write_volume

    scan, lesion = lesion_scan(**kwargs)
    write_volume(path, scan, AFFINE)
    return scan, lesion


def moving_clip(frames=10, height=32, width=32, size=8) -> np.ndarray:
    """uint8 RGB [T, H, W, 3]: a yellow square crossing a dark frame from left to right."""
    clip = np.full((frames, height, width, 3), 30, np.uint8)
    top = (height - size) // 2
    for t in range(frames):
        x = round(t * (width - size) / max(1, frames - 1))
        clip[t, top : top + size, x : x + size] = (240, 220, 40)
    return clip


def burst_signal(length=256, start=150, stop=180, seed=0) -> np.ndarray:
    """float32 [2, T]: two slow waves and noise, with a fast burst on lead 0 between ``start`` and ``stop``."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    signal = np.stack([0.3 * np.sin(t / 9.0), 0.2 * np.cos(t / 15.0)]) + rng.normal(0, 0.02, (2, length))
    signal[0, start:stop] += np.sin(t[start:stop] * 1.7)
    return signal.astype(np.float32)
