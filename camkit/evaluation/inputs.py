"""Checks on an evaluation's data made before anything runs (so a bad input is one clear error, early)."""

from __future__ import annotations

import warnings

from ..errors import InvalidInputError
from ..runs.data import Dataset

__all__ = ["check_masks"]


def _size(path: object) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as header:  # type: ignore[arg-type]
                return header.size
    except Exception:  # unreadable: the image's own row reports it
        return None


def check_masks(dataset: Dataset, region: str) -> None:
    """Raise when a mask of ``region`` does not have its image's size (read from the file headers only).

    Example:
        >>> import tempfile, numpy as np, camkit
        >>> from pathlib import Path
        >>> from camkit.runs.data import Dataset, Record
        >>> from camkit.evaluation.inputs import check_masks
        >>> root = Path(tempfile.mkdtemp())
        >>> camkit.save_png(root / "a.png", np.zeros((8, 8, 3), np.uint8))
        >>> camkit.save_png(root / "m.png", np.zeros((4, 8, 3), np.uint8))
        >>> data = Dataset([Record("a.png", root / "a.png", masks={"object": root / "m.png"})], "csv", (), ("object",))
        >>> try:
        ...     check_masks(data, "object")
        ... except ValueError as err:
        ...     print(str(err)[:60])
        the mask m.png of region 'object' is 8x4 but its image a.png
    """
    if region not in dataset.mask_regions:
        return
    for record in dataset.records:
        mask = record.masks.get(region)
        if mask is None:
            continue
        image_size, mask_size = _size(record.path), _size(mask)
        if image_size is not None and mask_size is not None and image_size != mask_size:
            raise InvalidInputError(
                f"the mask {mask.name} of region {region!r} is {mask_size[0]}x{mask_size[1]} but its image "
                f"{record.path.name} is {image_size[0]}x{image_size[1]}; masks must have their image's size"
            )
