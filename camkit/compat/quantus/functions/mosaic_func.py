"""Quantus's mosaic builders (data preparation for ``Focus``), computed by camkit.

A mosaic is a 2x2 grid of four images: two of its target class and two of other classes, in
random quadrants. :func:`mosaic_creation` returns what ``Focus`` takes: the mosaics, and for each
one the source indices, the labels, which quadrants hold the target class (``custom_batch``) and
the target. camkit draws with its own numpy generator (``seed``), so its mosaics are not
Quantus's, but they keep Quantus's contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from camkit.errors import InvalidInputError

# No __all__, as in Quantus: ``from quantus.functions.mosaic_func import *`` also gives ``np``, which
# scripts (and Quantus's own tests) written for Quantus rely on.

Mosaics = tuple[np.ndarray, list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[int, ...]], list[Any]]


def build_single_mosaic(mosaic_images_list: Sequence[np.ndarray]) -> np.ndarray:
    """Four images [C, H, W] as one [C, 2H, 2W]: top left, top right, bottom left, bottom right.

    Example:
        >>> tiles = [np.full((1, 1, 1), v) for v in (1, 2, 3, 4)]
        >>> build_single_mosaic(tiles)[0].tolist()
        [[1, 2], [3, 4]]
    """
    if len(mosaic_images_list) != 4:
        raise InvalidInputError(f"a mosaic takes four images, got {len(mosaic_images_list)}")
    top_left, top_right, bottom_left, bottom_right = (np.asarray(image) for image in mosaic_images_list)
    return np.concatenate(
        [np.concatenate([top_left, top_right], axis=-1), np.concatenate([bottom_left, bottom_right], axis=-1)], axis=-2
    )


def _cycle(rng: np.random.Generator, pool: np.ndarray, count: int) -> np.ndarray:
    """``count`` items of ``pool``, each shuffled copy of the pool used before the next (every item as often)."""
    rounds = math.ceil(count / len(pool))
    return np.concatenate([rng.permutation(pool) for _ in range(rounds)])[:count]


def mosaic_creation(images: np.ndarray, labels: np.ndarray, mosaics_per_class: int, seed: int | None = None) -> Mosaics:
    """``mosaics_per_class`` mosaics of each class in ``labels``, as Quantus's ``Focus`` takes them.

    Each mosaic holds two images of its target class (each image of the class used about as often
    as the others) and two of other classes (the other classes taken in turn, an image of each at
    random), in shuffled quadrants.

    Args:
        images: [N, C, H, W] images.
        labels: [N] their labels (at least two classes).
        mosaics_per_class: mosaics to build per class.
        seed: the seed of the draws (None: fresh entropy).

    Returns:
        ``(mosaics [M, C, 2H, 2W], indices, labels, custom_batch, targets)``: per mosaic the four
        source indices, their labels and 0/1 flags of the target class (quadrants in the order of
        :func:`build_single_mosaic`), and the target class.

    Example:
        >>> imgs, labs = np.arange(4.0).reshape(4, 1, 1, 1), np.array([0, 0, 1, 1])
        >>> mosaics, idx, labels, flags, targets = mosaic_creation(imgs, labs, 2, seed=0)
        >>> mosaics.shape, [int(t) for t in targets], [sum(f) for f in flags]
        ((4, 1, 2, 2), [0, 0, 1, 1], [2, 2, 2, 2])
    """
    images, labels = np.asarray(images), np.asarray(labels).reshape(-1)
    if len(images) != len(labels):
        raise InvalidInputError(f"{len(images)} images and {len(labels)} labels")
    classes = list(np.unique(labels))
    if len(classes) < 2 or mosaics_per_class < 1:
        raise InvalidInputError("mosaics need at least two classes and mosaics_per_class >= 1")
    rng = np.random.default_rng(seed)
    mosaics: list[np.ndarray] = []
    out: Mosaics = (np.empty(0), [], [], [], [])
    for target in classes:
        own = _cycle(rng, np.flatnonzero(labels == target), 2 * mosaics_per_class)
        others = _cycle(rng, np.array([c for c in classes if c != target]), 2 * mosaics_per_class)
        strangers = [rng.choice(np.flatnonzero(labels == c)) for c in others]
        for m in range(mosaics_per_class):
            chosen = [(own[2 * m], target), (own[2 * m + 1], target), (strangers[2 * m], others[2 * m]),
                      (strangers[2 * m + 1], others[2 * m + 1])]  # fmt: skip
            chosen = [chosen[i] for i in rng.permutation(4)]
            mosaics.append(build_single_mosaic([images[i] for i, _ in chosen]))
            out[1].append(tuple(int(i) for i, _ in chosen))
            out[2].append(tuple(label for _, label in chosen))
            out[3].append(tuple(int(label == target) for _, label in chosen))
            out[4].append(target)
    return (np.stack(mosaics), *out[1:])
