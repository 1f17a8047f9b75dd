"""Tiny vision-language models built from code (no download), shared by the tests of this folder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="session")
def llava():
    import tiny_llava

    return tiny_llava.build()


@pytest.fixture(scope="session")
def llava_next():
    import tiny_llava_next

    return tiny_llava_next.build()


@pytest.fixture(scope="session")
def paligemma():
    import tiny_paligemma

    return tiny_paligemma.build()


def picture(height: int, width: int, seed: int = 0):
    """A seeded random RGB picture (PIL) of the given size."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype("uint8"))


@pytest.fixture
def photo():
    return picture(40, 70)
