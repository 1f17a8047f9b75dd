"""The demo's small CNN and the loader of its bundled, trained weights."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from .shapes import CLASSES

M = TypeVar("M", bound=nn.Module)

__all__ = ["CAM_LAYER", "WEIGHTS", "ShapesCNN", "load_shapes_cnn"]

CAM_LAYER = "last_conv"
"""Name of the model's last convolutional block, the layer Grad-CAM reads ([B, 64, 8, 8])."""

WEIGHTS = Path(__file__).resolve().parent.parent / "assets" / "shapes_cnn.pt"
"""The bundled state dict, produced by ``python -m camkit.demo.train``."""


def _block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class ShapesCNN(nn.Module):
    """A four-block CNN for the 64x64 shapes dataset (about 47k parameters).

    Input: RGB in [0, 1], [B, 3, 64, 64] (no mean/std normalisation). Output: logits
    [B, 4] in :data:`~camkit.bundled.shapes.CLASSES` order. ``features`` holds a strided conv-BN-ReLU
    stem and two conv-BN-ReLU-maxpool blocks (64 -> 8 pixels); ``last_conv`` (:data:`CAM_LAYER`) is the
    last conv-BN-ReLU block, whose [B, 64, 8, 8] output is global-max-pooled into ``fc`` (max pooling keeps each
    class score tied to the locations that support it, which sharpens the CAMs).

    Example:
        >>> import torch
        >>> from camkit.bundled.model import ShapesCNN
        >>> ShapesCNN()(torch.rand(2, 3, 64, 64)).shape
        torch.Size([2, 4])
    """

    def __init__(self, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _block(3, 16, stride=2), _block(16, 32), nn.MaxPool2d(2), _block(32, 48), nn.MaxPool2d(2)
        )
        self.last_conv = _block(48, 64)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.pool(self.last_conv(self.features(x))), 1))


def load_shapes_cnn(path: str | os.PathLike[str] | None = None, map_location: str | torch.device = "cpu") -> ShapesCNN:
    """The trained demo model in eval mode: :class:`ShapesCNN` with the bundled weights.

    Args:
        path: a state dict saved by :mod:`camkit.demo.train`; the bundled :data:`WEIGHTS`
            by default. Loaded with ``weights_only=True`` (no code runs).
        map_location: where to put the weights.

    Example:
        >>> from camkit.bundled.model import load_shapes_cnn
        >>> load_shapes_cnn().training
        False
    """
    return load_weights(ShapesCNN(), WEIGHTS if path is None else path, map_location, "")


def load_weights(model: M, path: str | os.PathLike[str], map_location: str | torch.device, train_options: str) -> M:
    """``model`` with the state dict at ``path`` (``weights_only=True``), on ``map_location``, in eval mode.

    A missing file names the training command that makes it (``train_options`` go before ``--out``).
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(
            f"no weights file at {path}; regenerate the bundled one with "
            f"`python -m camkit.demo.train {train_options}--out camkit/assets/{path.name}`"
        )
    model.load_state_dict(torch.load(path, map_location=map_location, weights_only=True))
    return model.to(map_location).eval()
