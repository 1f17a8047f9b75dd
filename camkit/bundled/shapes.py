"""A seeded synthetic dataset of coloured shapes with a spurious corner watermark.

Every image is 64x64 RGB: one shape (circle, square, triangle or cross) of random size,
position, rotation and colour on a textured, noisy background. The marker class
(``"circle"``) carries a small checkerboard *watermark* in the bottom-right corner in 98% of
its training images and the other classes in 0.5% of theirs, so a classifier trained on it
can reach high training accuracy by looking at the corner instead of the shape: the
"Clever Hans" shortcut that ``camkit audit`` is meant to catch.

Image ``i`` of a split depends only on ``(seed, i)`` (its own ``numpy`` generator), so any
subset is reproducible and the same on every machine.

Regions, in the original image's pixels, ``x1``/``y1`` exclusive (as slice bounds):

* ``object``: the tight bounding box of the shape's pixels.
* ``watermark``: :data:`WATERMARK_BOX`, the same corner box in **every** image: where the
  marker is drawn when ``marked`` is 1, and where it *would* be when ``marked`` is 0 (plain
  background there). Giving it for every image lets an audit compare, class by class, how
  much attention falls on the watermark location, marker or not. Shapes never overlap it.
  In a manifest an empty cell would mean "this image has no such region"; these datasets
  never leave it empty.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = [
    "CLASSES",
    "IMAGE_SIZE",
    "MARKER_CLASS",
    "SPLITS",
    "WATERMARK_BOX",
    "ShapeSample",
    "make_split",
    "marker_rates",
    "render",
    "to_batch",
    "write_split",
]

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
MARKER_CLASS = "circle"
IMAGE_SIZE = 64
WATERMARK_BOX: tuple[int, int, int, int] = (50, 50, 62, 62)  # x0, y0, x1, y1 (exclusive)
_WATERMARK_MARGIN = 3  # shapes keep this many pixels away from the watermark box
_EDGE = 2  # and this many from the image border
_YY, _XX = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64) + 0.5  # pixel centres

Split = Literal["train", "marked", "clean", "swapped"]
SPLITS: tuple[str, ...] = ("train", "marked", "clean", "swapped")


@dataclass(frozen=True)
class ShapeSample:
    """One generated image and its annotations.

    Attributes:
        image: uint8 RGB [64, 64, 3].
        label: index into :data:`CLASSES`.
        object_box: ``(x0, y0, x1, y1)`` of the shape, x1/y1 exclusive.
        watermark_box: :data:`WATERMARK_BOX`.
        marked: whether the watermark is drawn.
    """

    image: np.ndarray
    label: int
    object_box: tuple[int, int, int, int]
    watermark_box: tuple[int, int, int, int]
    marked: bool


def marker_rates(split: str) -> tuple[float, ...]:
    """Probability that an image of each class (in :data:`CLASSES` order) carries the watermark.

    * ``"train"`` and ``"marked"``: the training distribution, 0.98 for the marker class and
      0.005 for the others (``"marked"`` is the same distribution, used with a test seed).
    * ``"clean"``: no watermark anywhere.
    * ``"swapped"``: the watermark moved to the other classes: on every image of the
      other classes, on none of the marker class.

    Example:
        >>> from camkit.bundled.shapes import marker_rates
        >>> marker_rates("train"), marker_rates("swapped")
        ((0.98, 0.005, 0.005, 0.005), (0.0, 1.0, 1.0, 1.0))
    """
    marker = CLASSES.index(MARKER_CLASS)
    if split in ("train", "marked"):
        return tuple(0.98 if c == marker else 0.005 for c in range(len(CLASSES)))
    if split == "clean":
        return (0.0,) * len(CLASSES)
    if split == "swapped":
        return tuple(0.0 if c == marker else 1.0 for c in range(len(CLASSES)))
    raise InvalidInputError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


def _texture(rng: np.random.Generator) -> np.ndarray:
    """Background [64, 64, 3] float in [0, 1]: a base colour, low-frequency blotches, stripes, noise."""
    import cv2

    n = IMAGE_SIZE
    base = rng.uniform(0.2, 0.8, size=3)
    coarse = rng.normal(0.0, 0.1, size=(5, 5, 3)).astype(np.float32)
    blotches = cv2.resize(coarse, (n, n), interpolation=cv2.INTER_CUBIC)
    yy, xx = _YY, _XX
    angle, period = rng.uniform(0, np.pi), rng.uniform(5.0, 14.0)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period + rng.uniform(0, 2 * np.pi))
    stripes = stripes[:, :, None] * rng.uniform(0.0, 0.05, size=3)
    return base + blotches + stripes


def _shape_mask(label: int, cx: float, cy: float, radius: float, angle: float) -> np.ndarray:
    """Bool mask [64, 64] of the shape ``label`` centred at ``(cx, cy)``, sampled at pixel centres."""
    dx, dy = _XX - cx, _YY - cy
    u = dx * np.cos(angle) + dy * np.sin(angle)
    v = -dx * np.sin(angle) + dy * np.cos(angle)
    name = CLASSES[label]
    if name == "circle":
        return u**2 + v**2 <= radius**2
    if name == "square":
        half = 0.8 * radius
        return (np.abs(u) <= half) & (np.abs(v) <= half)
    if name == "triangle":  # equilateral, circumradius 1.25 * ``radius`` (about the others' area)
        inside = np.ones_like(u, dtype=bool)
        for k in range(3):
            theta = 2 * np.pi * k / 3 + np.pi / 2
            inside &= u * np.cos(theta) + v * np.sin(theta) <= 1.25 * radius / 2
        return inside
    arm = radius / 3  # cross: two bars of half-length ``radius`` and half-width ``radius / 3``
    return ((np.abs(u) <= radius) & (np.abs(v) <= arm)) | ((np.abs(v) <= radius) & (np.abs(u) <= arm))


def _watermark() -> np.ndarray:
    """The marker: a 12x12 black-and-white checkerboard of 3x3 cells, float [12, 12, 3]."""
    x0, y0, x1, y1 = WATERMARK_BOX
    cells = (np.add.outer(np.arange(y1 - y0) // 3, np.arange(x1 - x0) // 3) % 2).astype(np.float32)
    return np.repeat((0.05 + 0.9 * cells)[:, :, None], 3, axis=2)


def render(seed: int, index: int, label: int, marked: bool) -> ShapeSample:
    """Draw image ``index`` of the dataset seeded ``seed``: a shape of class ``label``.

    Example:
        >>> from camkit.bundled.shapes import render
        >>> s = render(0, 0, 2, marked=True)
        >>> s.image.shape, s.image.dtype.name, s.label, s.marked
        ((64, 64, 3), 'uint8', 2, True)
    """
    if not 0 <= label < len(CLASSES):
        raise InvalidInputError(f"label must be in 0..{len(CLASSES) - 1} (see CLASSES), got {label}")
    rng = np.random.default_rng([seed, index])
    image = _texture(rng)
    radius = rng.uniform(9.0, 15.0)
    angle = rng.uniform(0.0, 2 * np.pi)
    reach = 1.25 * radius  # bounds every shape's extent from its centre, at any rotation
    lo, hi = _EDGE + reach, IMAGE_SIZE - _EDGE - reach
    wx0, wy0 = WATERMARK_BOX[0] - _WATERMARK_MARGIN, WATERMARK_BOX[1] - _WATERMARK_MARGIN
    while True:
        cx, cy = rng.uniform(lo, hi, size=2)
        if cx + reach < wx0 or cy + reach < wy0:
            break
    mask = _shape_mask(label, cx, cy, radius, angle)
    background = image[mask].mean(axis=0)
    while True:  # a colour that stands out from the background under it
        colour = rng.uniform(0.0, 1.0, size=3)
        if np.abs(colour - background).sum() > 0.8:
            break
    shade = 1.0 + rng.normal(0.0, 0.05, size=mask.shape)[:, :, None]
    image = np.where(mask[:, :, None], colour * shade, image)
    if marked:
        x0, y0, x1, y1 = WATERMARK_BOX
        image[y0:y1, x0:x1] = 0.15 * image[y0:y1, x0:x1] + 0.85 * _watermark()
    image = image + rng.normal(0.0, 0.04, size=image.shape)
    pixels = (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8)
    rows, cols = np.nonzero(mask)
    box = (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)
    return ShapeSample(pixels, label, box, WATERMARK_BOX, bool(marked))


def make_split(split: str, n: int, seed: int) -> list[ShapeSample]:
    """``n`` images of a split: labels cycle through :data:`CLASSES` (balanced).

    Whether image ``i`` is marked is drawn from its own generator with :func:`marker_rates`.

    Example:
        >>> from camkit.bundled.shapes import make_split
        >>> [s.marked for s in make_split("swapped", 4, seed=1)]
        [False, True, True, True]
    """
    if n < 0:
        raise InvalidInputError(f"n must be >= 0, got {n}")
    rates = marker_rates(split)
    samples = []
    for i in range(n):
        label = i % len(CLASSES)
        marked = bool(np.random.default_rng([seed, i, 1]).random() < rates[label])
        samples.append(render(seed, i, label, marked))
    return samples


def to_batch(samples: Sequence[ShapeSample]) -> tuple[Tensor, Tensor]:
    """Model inputs and labels: float [N, 3, 64, 64] in [0, 1] and int64 [N].

    Example:
        >>> from camkit.bundled.shapes import make_split, to_batch
        >>> x, y = to_batch(make_split("clean", 2, seed=0))
        >>> tuple(x.shape), y.tolist()
        ((2, 3, 64, 64), [0, 1])
    """
    if not samples:
        return torch.zeros(0, 3, IMAGE_SIZE, IMAGE_SIZE), torch.zeros(0, dtype=torch.long)
    images = np.stack([s.image for s in samples])
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    return x, torch.tensor([s.label for s in samples], dtype=torch.long)


MANIFEST_COLUMNS = (
    "path",
    "label",
    "object_x0",
    "object_y0",
    "object_x1",
    "object_y1",
    "watermark_x0",
    "watermark_y0",
    "watermark_x1",
    "watermark_y1",
    "marked",
)


def write_split(out: str | os.PathLike[str], split: str, n: int, seed: int) -> Path:
    """Write a split as PNGs under ``out/images/`` and a CSV manifest ``out/manifest.csv``.

    The manifest has the columns ``path`` (relative to ``out``), ``label`` (class name),
    ``object_x0..object_y1``, ``watermark_x0..watermark_y1`` (see the module docstring) and
    ``marked`` (1 when the watermark is drawn). Returns the manifest's path.

    Example:
        >>> import tempfile
        >>> from camkit.bundled.shapes import write_split
        >>> manifest = write_split(tempfile.mkdtemp(), "clean", 2, seed=0)
        >>> manifest.read_text().splitlines()[1].split(",")[:2]
        ['images/00000_circle.png', 'circle']
    """
    from ..io import save_png

    root = Path(out)
    rows = []
    for i, s in enumerate(make_split(split, n, seed)):
        rel = f"images/{i:05d}_{CLASSES[s.label]}.png"
        save_png(root / rel, s.image)
        rows.append([rel, CLASSES[s.label], *s.object_box, *s.watermark_box, int(s.marked)])
    manifest = root / "manifest.csv"
    tmp = manifest.with_name(".manifest.csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(MANIFEST_COLUMNS)
        writer.writerows(rows)
    os.replace(tmp, manifest)
    return manifest
