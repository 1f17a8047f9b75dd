"""Writing a file under a temporary name that keeps its suffix, then renaming it into place."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .._internal.files import file_mode

__all__ = ["write_via_temp"]


def full_suffix(path: Path) -> str:
    """``.nii.gz`` for ``scan.nii.gz``, ``.mp4`` for ``clip.mp4`` (libraries pick the format by it)."""
    return ".nii.gz" if path.name.lower().endswith(".nii.gz") else path.suffix


def write_via_temp(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call ``write(temporary path)`` beside ``path``, then rename: nobody sees half a file.

    The temporary name ends like ``path`` (writers choose the format by it); on any failure it
    is removed and ``path`` is left as it was. Returns ``path``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=full_suffix(target), dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
