"""Pictures for the vision-language tests."""

from __future__ import annotations

import numpy as np


def picture(height: int, width: int, seed: int = 0):
    """A seeded random RGB picture (PIL) of the given size."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype("uint8"))
