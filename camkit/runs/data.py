"""What an audit or an evaluation runs over: finding the images, labels and regions, and reading them safely.

``DATA`` is one of

* a folder of images (no labels);
* a folder with one sub-folder per class: the sub-folder names are the labels (images
  directly inside ``DATA`` then have no label);
* a CSV manifest with a ``path`` column (relative to the CSV's folder), an optional
  ``label`` column, and any number of named regions: a box as the four columns
  ``NAME_x0, NAME_y0, NAME_x1, NAME_y1`` (original-image pixels, x1/y1 exclusive) or a
  mask image as ``NAME_mask`` (a path; non-zero pixels are inside). Empty cells mean the
  region is absent for that image. The region ``object`` is the one the pointing game uses.

Images are files whose suffix is one of :data:`IMAGE_SUFFIXES` (case-insensitive), found
recursively and sorted by their path relative to ``DATA``; hidden files are skipped. Every
image has a ``key``: that relative path (or the CSV's ``path`` cell), unique per run.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from ..io import read_rgb
from ..modelload import Preprocess

__all__ = ["IMAGE_SUFFIXES", "AuditDataset", "Dataset", "Record", "discover", "error_reason", "read_checked", "read_manifest"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
_BOX = ("x0", "y0", "x1", "y1")
_MODES = {
    "L": "grayscale", "LA": "grayscale with alpha", "RGBA": "RGBA (alpha composited on black)",
    "P": "palette", "PA": "palette with alpha", "1": "1-bit", "I;16": "16-bit grayscale",
    "I;16B": "16-bit grayscale", "I;16L": "16-bit grayscale", "I": "32-bit integer", "F": "32-bit float",
    "CMYK": "CMYK", "RGBX": "RGBX", "YCbCr": "YCbCr",
}  # fmt: skip


@dataclass(frozen=True)
class Record:
    """One image of an audit.

    Attributes:
        key: unique name (path relative to DATA, or the CSV's ``path`` cell).
        path: the file.
        label: the label as written (class folder name or CSV cell), or ``None``.
        boxes: region name -> ``(x0, y0, x1, y1)`` in original pixels, for present box regions.
        masks: region name -> mask file, for present mask regions.
        problem: a reason this row cannot be used (bad CSV cell), reported as its error.
    """

    key: str
    path: Path
    label: str | None = None
    boxes: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)
    masks: Mapping[str, Path] = field(default_factory=dict)
    problem: str = ""


@dataclass(frozen=True)
class Dataset:
    """The result of :func:`discover`: records in a fixed order, and the region names by kind."""

    records: list[Record]
    kind: str  # "folder", "classes" or "csv"
    box_regions: tuple[str, ...] = ()
    mask_regions: tuple[str, ...] = ()

    @property
    def regions(self) -> tuple[str, ...]:
        """Every region name: boxes first, then masks, each in column order."""
        return self.box_regions + self.mask_regions


def _is_run_folder(path: Path) -> bool:
    """A folder written by ``camkit audit`` (it holds ``run.json``): its overlays are never data."""
    return (path / "run.json").is_file()


def _images_under(root: Path, exclude: Sequence[Path] = ()) -> list[Path]:
    """Image files under ``root``, following symbolic-link folders once each (no loops).

    Folders in ``exclude`` (resolved) and folders holding a camkit run are skipped.
    """
    skip = {p.resolve() for p in exclude}
    seen: set[tuple[int, int]] = set()
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        st = here.stat()
        if (st.st_dev, st.st_ino) in seen:  # a link back to a folder already walked: a loop or a repeat
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        keep = []
        for d in sorted(dirnames):
            sub = here / d
            if d.startswith(".") or sub.resolve() in skip or _is_run_folder(sub):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                found.append(here / name)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def read_manifest(path: Path) -> Dataset:
    """The records of a CSV manifest: a ``path`` column, optional ``label``, ``NAME_x0..y1`` boxes and ``NAME_mask`` masks."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except UnicodeDecodeError as err:
        raise InvalidInputError(
            f"the CSV manifest {path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8 "
            "(for example: iconv -f latin1 -t utf-8 OLD.csv > NEW.csv)"
        ) from None
    except (OSError, csv.Error) as err:
        raise InvalidInputError(f"cannot read the CSV manifest {path}: {err}") from None
    if "path" not in columns:
        raise InvalidInputError(f"the CSV manifest {path} has no 'path' column; its columns are {columns}")
    boxes: list[str] = []
    masks: list[str] = []
    for column in columns:
        stem, _, part = column.rpartition("_")
        if part == "mask" and stem:
            masks.append(stem)
        elif part in _BOX and stem and stem not in boxes:
            missing = [f"{stem}_{c}" for c in _BOX if f"{stem}_{c}" not in columns]
            if missing:
                raise InvalidInputError(f"the CSV manifest {path} has box columns for {stem!r} but lacks {missing}")
            boxes.append(stem)
    both = sorted(set(boxes) & set(masks))
    if both:
        raise InvalidInputError(f"region(s) {both} in {path} have both box and mask columns; keep one kind per region")
    base = path.parent
    records: list[Record] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        key = (row.get("path") or "").strip()
        if not key:
            raise InvalidInputError(f"{path}, line {line}: empty 'path' cell")
        if key in seen:
            raise InvalidInputError(f"{path}, line {line}: the path {key!r} is listed twice; list each image once")
        seen.add(key)
        label = (row.get("label") or "").strip() or None
        row_boxes: dict[str, tuple[float, float, float, float]] = {}
        problem = ""
        for name in boxes:
            cells = [(row.get(f"{name}_{c}") or "").strip() for c in _BOX]
            if not any(cells):
                continue
            try:
                values = tuple(float(c) for c in cells)
                if not all(math.isfinite(v) for v in values):
                    raise ValueError
            except ValueError:
                problem = f"region {name!r}: box cells {cells} are not four numbers (line {line})"
                continue
            row_boxes[name] = (values[0], values[1], values[2], values[3])
        row_masks = {n: base / row[f"{n}_mask"].strip() for n in masks if (row.get(f"{n}_mask") or "").strip()}
        records.append(Record(key, base / key, label, row_boxes, row_masks, problem))
    if not records:
        raise InvalidInputError(f"nothing to audit: the CSV manifest {path} lists no image")
    return Dataset(records, "csv", tuple(boxes), tuple(masks))


def discover(data: str | os.PathLike[str], exclude: Sequence[str | os.PathLike[str]] = ()) -> Dataset:
    """Find the images of an audit (see the module docstring for the three kinds of ``data``).

    Class folders may be symbolic links (followed, each real folder once, so link loops end).
    Folders in ``exclude`` (the audit's own ``--out``) and any folder holding a camkit run
    (``run.json``) are never read as data. Finding no image at all is an error.

    Example:
        >>> import os, tempfile
        >>> from camkit.runs.data import discover
        >>> root = tempfile.mkdtemp()
        >>> for rel in ("cat/b.png", "cat/a.png", "dog/c.jpg", "dog/notes.txt"):
        ...     os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        ...     open(os.path.join(root, rel), "wb").close()
        >>> found = discover(root)
        >>> found.kind, [(r.key, r.label) for r in found.records]
        ('classes', [('cat/a.png', 'cat'), ('cat/b.png', 'cat'), ('dog/c.jpg', 'dog')])
    """
    root = Path(data)
    if root.is_file():
        if root.suffix.lower() != ".csv":
            raise InvalidInputError(f"DATA {root} is a file but not a .csv manifest; pass a folder or a CSV")
        return read_manifest(root)
    if not root.is_dir():
        raise InvalidInputError(f"DATA {root} does not exist; pass a folder of images or a CSV manifest")
    skip = [Path(p) for p in exclude]
    skipped = {p.resolve() for p in skip}
    subdirs = [
        p for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.resolve() not in skipped and not _is_run_folder(p)
    ]  # fmt: skip
    images = _images_under(root, skip)
    if not images:
        others = sum(1 for p in root.rglob("*") if p.is_file())
        raise InvalidInputError(
            f"nothing to audit: no image files under {root} (looked for {', '.join(IMAGE_SUFFIXES)}; "
            f"found {others} file(s), none an image outside camkit output folders). "
            "Pass a folder of images, a folder of class folders, or a CSV manifest"
        )
    if not subdirs:
        return Dataset([Record(p.relative_to(root).as_posix(), p) for p in images], "folder")
    records = []
    for p in images:
        rel = p.relative_to(root)
        records.append(Record(rel.as_posix(), p, rel.parts[0] if len(rel.parts) > 1 else None))
    return Dataset(records, "classes")


def _check_complete(data: bytes, path: Path) -> None:
    """Raise for PNG/JPEG files whose end is missing (decoders may return a partly grey image)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" not in data[-64:]:
        raise InvalidInputError(f"{path.name} is a truncated PNG (no IEND chunk at the end)")
    if data.startswith(b"\xff\xd8") and not data.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
        raise InvalidInputError(f"{path.name} is a truncated JPEG (no end-of-image marker)")


def read_checked(path: Path, max_pixels: int) -> tuple[np.ndarray, str]:
    """Read an image as uint8 RGB [H, W, 3] with the checks an audit needs.

    Returns ``(rgb, note)``; ``note`` says what was converted (grayscale, alpha, 16-bit).
    Raises :class:`InvalidInputError` for empty, truncated, undecodable and too large files.
    """
    from PIL import Image

    data = path.read_bytes()
    if not data:
        raise InvalidInputError(f"{path.name} is empty (0 bytes)")
    _check_complete(data, path)
    note = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as header:  # reads the header only
                width, height = header.size
                mode = header.mode
    except Image.DecompressionBombError as err:
        raise InvalidInputError(f"{path.name} is too large to decode safely ({err})") from None
    except Exception:  # Pillow cannot read it; let OpenCV decide below
        width = height = 0
        mode = ""
    if width * height > max_pixels:
        raise InvalidInputError(
            f"{path.name} is {width}x{height} = {width * height} pixels, more than max_pixels={max_pixels}; "
            "raise --max-pixels to audit it"
        )
    if mode and mode != "RGB":
        note = f"converted from {_MODES.get(mode, mode)}"
    return read_rgb(path), note


class AuditDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Map-style dataset over records: each item is a dict that the default collate batches.

    Items: ``index`` (position in ``records``), ``x`` float [3, h, w], ``shown`` uint8
    [h, w, 3], ``boxes`` float64 [R_box, 4] in input pixels (NaN rows for absent boxes),
    ``masks`` bool [R_mask, h, w], ``mask_present`` bool [R_mask], ``error`` (``""`` when
    fine) and ``note``. A failed item has zero tensors and the reason in ``error``.
    """

    def __init__(
        self,
        records: Sequence[Record],
        indices: Sequence[int],
        preprocess: Preprocess,
        shape: tuple[int, int],
        box_regions: Sequence[str] = (),
        mask_regions: Sequence[str] = (),
        max_pixels: int = 64_000_000,
    ) -> None:
        self.records = records
        self.indices = list(indices)
        self.preprocess = preprocess
        self.shape = shape
        self.box_regions = tuple(box_regions)
        self.mask_regions = tuple(mask_regions)
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, item: int) -> dict[str, Any]:
        index = self.indices[item]
        record = self.records[index]
        h, w = self.shape
        out: dict[str, Any] = {
            "index": index,
            "x": torch.zeros(3, h, w),
            "shown": torch.zeros(h, w, 3, dtype=torch.uint8),
            "boxes": torch.full((len(self.box_regions), 4), float("nan"), dtype=torch.float64),
            "masks": torch.zeros(len(self.mask_regions), h, w, dtype=torch.bool),
            "mask_present": torch.zeros(len(self.mask_regions), dtype=torch.bool),
            "error": "",
            "note": "",
        }
        try:
            if record.problem:
                raise InvalidInputError(record.problem)
            rgb, out["note"] = read_checked(record.path, self.max_pixels)
            x, shown = self.preprocess(rgb)
            height, width = rgb.shape[:2]
            for r, name in enumerate(self.box_regions):
                if name in record.boxes:
                    box = self.preprocess.transform_boxes(np.array([record.boxes[name]]), height, width)[0]
                    out["boxes"][r] = torch.from_numpy(box)
            for r, name in enumerate(self.mask_regions):
                if name in record.masks:
                    mask = read_rgb(record.masks[name]).max(axis=2)
                    if mask.shape != (height, width):
                        raise InvalidInputError(
                            f"mask {record.masks[name].name} for region {name!r} is {mask.shape[1]}x{mask.shape[0]}, "
                            f"the image is {width}x{height}; masks must match the original image"
                        )
                    out["masks"][r] = self.preprocess.transform_mask(mask)
                    out["mask_present"][r] = True
            out["x"], out["shown"] = x, torch.from_numpy(shown)
        except Exception as err:  # any failure becomes this image's error row; the run goes on
            out["error"] = error_reason(err).replace(str(record.path), record.path.name)
            out["note"] = ""
            out["boxes"].fill_(float("nan"))
            out["masks"].zero_()
            out["mask_present"].zero_()
        return out


def error_reason(err: BaseException) -> str:
    """One line saying why a file failed: the message of camkit's input errors, else the error's type and message.

    Example:
        >>> from camkit.errors import InvalidInputError
        >>> from camkit.runs.data import error_reason
        >>> error_reason(ValueError("bad value")), error_reason(OSError()), error_reason(InvalidInputError("empty"))
        ('ValueError: bad value', 'OSError', 'empty')
    """
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, InvalidInputError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
