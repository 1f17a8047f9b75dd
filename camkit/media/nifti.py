"""NIfTI volumes in and out, with their affine, through nibabel (an optional dependency).

A volume is kept in its file's voxel order: the array ``data[i, j, k]`` is voxel ``(i, j, k)``
and ``affine`` maps it to the scanner's millimetres. Nothing is reoriented or resampled, so a
map computed on ``data`` and written with the same affine (:func:`write_volume`) lies on the
scan voxel for voxel in any viewer (ITK-SNAP, 3D Slicer, FSLeyes). A model sees the volume as
``[1, 1, I, J, K]``: its first spatial axis is the file's first voxel axis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ._atomic import write_via_temp

__all__ = ["INTENSITY_MODES", "NIFTI_SUFFIXES", "Volume", "normalize_intensity", "read_volume", "write_volume"]

NIFTI_SUFFIXES = (".nii", ".nii.gz")
"""File endings read as NIfTI volumes (case-insensitive)."""

INTENSITY_MODES = ("none", "minmax", "zscore", "percentile")
"""Intensity normalisations of :func:`normalize_intensity`."""


def _nibabel() -> Any:
    try:
        import nibabel
    except ImportError as err:
        raise ImportError(
            "reading and writing NIfTI volumes needs nibabel, an optional dependency: "
            "pip install 'camkit[medical]' (or pip install nibabel)"
        ) from err
    return nibabel


def is_nifti(path: str | os.PathLike[str]) -> bool:
    """Whether a path names a NIfTI file by its ending (``.nii`` or ``.nii.gz``)."""
    return str(path).lower().endswith(NIFTI_SUFFIXES)


@dataclass(frozen=True)
class Volume:
    """A volume read from a NIfTI file.

    Attributes:
        data: float32 [I, J, K], the voxels in the file's order (scaling slope and intercept applied).
        affine: float64 [4, 4], voxel indices to millimetres.
        zooms: the voxel sizes in millimetres, one per axis.

    Example:
        >>> import numpy as np
        >>> from camkit.media import Volume
        >>> Volume(np.zeros((4, 5, 6), np.float32), np.eye(4), (1.0, 1.0, 2.0)).shape
        (4, 5, 6)
    """

    data: np.ndarray
    affine: np.ndarray
    zooms: tuple[float, ...] = (1.0, 1.0, 1.0)

    @property
    def shape(self) -> tuple[int, ...]:
        """The voxel grid's shape ``(I, J, K)``."""
        return tuple(int(s) for s in self.data.shape)


def read_volume(path: str | os.PathLike[str], max_voxels: int | None = None) -> Volume:
    """Read a 3-D NIfTI file (``.nii`` or ``.nii.gz``) as a :class:`Volume`.

    Trailing axes of size one are dropped (``[I, J, K, 1]`` is a volume). A time series
    (a fourth axis longer than one) is refused: pick one volume of it first. With
    ``max_voxels``, a larger volume is refused from its header, before its voxels are read.

    Raises:
        ImportError: nibabel is not installed.
        InvalidInputError: the file is missing, empty, not NIfTI, not 3-D, or too large.

    Example:
        >>> import os, tempfile, numpy as np
        >>> from camkit.media import read_volume, write_volume
        >>> path = os.path.join(tempfile.mkdtemp(), "scan.nii.gz")
        >>> affine = np.diag([2.0, 2.0, 3.0, 1.0])
        >>> write_volume(path, np.zeros((4, 5, 6), np.float32), affine)
        >>> volume = read_volume(path)
        >>> volume.shape, volume.zooms, bool((volume.affine == affine).all())
        ((4, 5, 6), (2.0, 2.0, 3.0), True)
    """
    nib = _nibabel()
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no NIfTI file at {path}")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path.name} is empty (0 bytes)")
    try:
        image = nib.load(str(path))
        shape = tuple(int(s) for s in image.shape)
    except Exception as err:  # nibabel raises several kinds for a file it cannot parse
        raise InvalidInputError(f"{path.name} could not be read as NIfTI ({type(err).__name__}: {err})") from None
    while len(shape) > 3 and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) == 4:
        raise InvalidInputError(
            f"{path.name} is 4-D {list(shape)}: a time series of {shape[3]} volumes; camkit explains one "
            "volume [I, J, K]: save one of them first (e.g. nibabel's image.slicer[..., t])"
        )
    if len(shape) != 3:
        raise InvalidInputError(f"{path.name} has shape {list(shape)}; camkit reads 3-D volumes [I, J, K]")
    voxels = shape[0] * shape[1] * shape[2]
    if max_voxels is not None and voxels > max_voxels:
        raise InvalidInputError(
            f"{path.name} is {'x'.join(map(str, shape))} = {voxels} voxels, more than max_voxels={max_voxels}; "
            "raise --max-voxels to explain it"
        )
    try:
        data = np.asarray(image.get_fdata(dtype=np.float32)).reshape(shape)
    except Exception as err:
        raise InvalidInputError(f"{path.name}: its voxels could not be read ({type(err).__name__}: {err})") from None
    zooms = tuple(float(z) for z in image.header.get_zooms()[:3])
    return Volume(np.ascontiguousarray(data), np.asarray(image.affine, dtype=np.float64), zooms)


def write_volume(path: str | os.PathLike[str], data: Any, affine: Any) -> None:
    """Write a 3-D array as a NIfTI file (``.nii`` or ``.nii.gz``) with this affine.

    ``data`` ([I, J, K], numpy or a CPU tensor) is stored as float32 (a map keeps its values);
    ``affine`` [4, 4] is stored as both the qform and the sform, so viewers place the
    volume where the scan it came from lies. The file appears whole or not at all.

    Example:
        >>> import os, tempfile, numpy as np
        >>> from camkit.media import write_volume
        >>> path = os.path.join(tempfile.mkdtemp(), "map.nii")
        >>> write_volume(path, np.ones((2, 2, 2)), np.eye(4))
        >>> os.path.getsize(path) > 352
        True
    """
    nib = _nibabel()
    if not is_nifti(path):
        raise InvalidInputError(f"{path}: a NIfTI file name ends in .nii or .nii.gz")
    array = np.asarray(data.detach().cpu() if hasattr(data, "detach") else data, dtype=np.float32)
    matrix = np.asarray(affine, dtype=np.float64)
    if array.ndim != 3:
        raise InvalidInputError(f"write_volume takes a 3-D array [I, J, K], got shape {list(array.shape)}")
    if matrix.shape != (4, 4):
        raise InvalidInputError(f"the affine must be a 4x4 matrix, got shape {list(matrix.shape)}")
    image = nib.Nifti1Image(np.ascontiguousarray(array), matrix)
    image.set_qform(matrix, code=1)
    image.set_sform(matrix, code=1)
    write_via_temp(path, lambda tmp: nib.save(image, tmp))


def normalize_intensity(data: np.ndarray, mode: str = "minmax") -> np.ndarray:
    """Scale a volume's intensities for a model: a new float32 array.

    Modes: ``"none"`` (as stored), ``"minmax"`` (to [0, 1]), ``"zscore"`` (mean 0, standard
    deviation 1) and ``"percentile"`` (clip to the 0.5th and 99.5th percentiles, then to [0, 1]:
    a few very bright voxels do not flatten the rest). A constant volume becomes zeros.

    Example:
        >>> import numpy as np
        >>> from camkit.media.nifti import normalize_intensity
        >>> normalize_intensity(np.array([1.0, 2.0, 3.0]), "minmax").tolist()
        [0.0, 0.5, 1.0]
        >>> [round(float(v), 4) for v in normalize_intensity(np.array([1.0, 2.0, 3.0]), "zscore")]
        [-1.2247, 0.0, 1.2247]
    """
    if mode not in INTENSITY_MODES:
        raise InvalidInputError(f"intensity normalisation {mode!r} is not one of {', '.join(INTENSITY_MODES)}")
    values = np.asarray(data, dtype=np.float32)
    if mode == "none":
        return values.copy()
    if mode == "zscore":
        std = float(values.std())
        return ((values - values.mean()) / std).astype(np.float32) if std > 0 else np.zeros_like(values)
    if mode == "percentile":
        low, high = np.percentile(values, [0.5, 99.5])
        values = np.clip(values, low, high)
    low, high = float(values.min()), float(values.max())
    return ((values - low) / (high - low)).astype(np.float32) if high > low else np.zeros_like(values)
