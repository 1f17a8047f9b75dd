"""The pytorch-grad-cam 1.5.7 names that camkit has no method for yet: importable, refusing to run."""

from __future__ import annotations

from typing import Any

from ...errors import CamkitError

__all__ = ["missing"]


def missing(name: str) -> type:
    """A class named ``name`` whose construction raises a CamkitError that says camkit lacks the method."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise CamkitError(
            f"{name} (new in pytorch-grad-cam 1.5.7) has no camkit implementation yet, so the compatibility "
            "layer cannot compute it; use the original package for it, or another CAM."
        )

    return type(name, (), {"__init__": __init__, "__doc__": f"pytorch-grad-cam's {name}: not available in camkit yet."})
