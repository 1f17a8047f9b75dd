"""torchvision models by name, with their weights' own preprocessing and class names.

A user's state dict for a torchvision architecture gets the preprocessing of that architecture's
``DEFAULT`` weights (resize, centre crop, interpolation, mean and std): a model fine-tuned from
those weights expects it, and a plain resize would explain another input than the one it sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .statedict import classes_in, fit_state_dict, read_state_dict

__all__ = ["load_torchvision", "preprocess_from_weights"]


def load_torchvision(
    name: str, weights: str | None
) -> tuple[nn.Module, Preprocess | None, list[str] | None, list[str]]:
    import torchvision

    known = torchvision.models.list_models()
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelLoadError(f"torchvision has no model {name!r}{hint} See torchvision.models.list_models().")
    notes: list[str] = []
    if weights is None:
        notes.append("random weights (no --weights given)")
        return torchvision.models.get_model(name, weights=None), None, None, notes
    path = Path(weights)
    if path.is_file():
        state = read_state_dict(path)
        model = torchvision.models.get_model(name, weights=None)
        classes = classes_in(state)
        head = classes_in(model.state_dict())
        if classes is not None and head is not None and classes != head:
            model = torchvision.models.get_model(name, weights=None, num_classes=classes)
            notes.append(f"num_classes={classes} taken from the state dict")
        notes += fit_state_dict(model, state, path)
        return model, _default_preset(name), None, notes
    enum = torchvision.models.get_model_weights(name)
    try:
        chosen = enum[weights]
    except KeyError:
        raise ModelLoadError(
            f"--weights {weights!r} is neither a file nor a weights name of {name}; known names: "
            f"{', '.join(enum.__members__)} (DEFAULT is the best available)"
        ) from None
    model = torchvision.models.get_model(name, weights=chosen)  # downloads into the torch hub cache
    return model, preprocess_from_weights(chosen), list(chosen.meta.get("categories") or []) or None, notes


def _default_preset(name: str) -> Preprocess | None:
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None
    default = getattr(enum, "DEFAULT", None)
    return preprocess_from_weights(default) if default is not None else None


def preprocess_from_weights(weights: Any) -> Preprocess | None:
    """Preprocessing read from torchvision weights' ``transforms()`` (resize, crop, interpolation, mean, std).

    The resize is Pillow's, as the transforms do on a PIL image. ``None`` when the transforms
    are not a resize and centre crop (video and optical-flow weights, say).

    Example:
        >>> import torchvision
        >>> from camkit.modelload.torchvision import preprocess_from_weights
        >>> p = preprocess_from_weights(torchvision.models.ResNet18_Weights.DEFAULT)
        >>> p.resize, p.crop, p.mean, p.interpolation
        (256, (224, 224), (0.485, 0.456, 0.406), 'bilinear')
    """
    transform = weights.transforms()
    resize, crop = getattr(transform, "resize_size", None), getattr(transform, "crop_size", None)
    mean, std = getattr(transform, "mean", None), getattr(transform, "std", None)
    if not resize or not crop or mean is None or std is None or len(resize) != 1:
        return None
    crop_hw = (int(crop[0]), int(crop[-1]))
    interpolation = getattr(getattr(transform, "interpolation", None), "value", "bilinear")
    if interpolation not in ("nearest", "bilinear", "bicubic"):
        return None
    return Preprocess(
        resize=int(resize[0]), crop=crop_hw, mean=tuple(mean), std=tuple(std), interpolation=interpolation,
        backend="pil", origin=f"torchvision weights {weights}",
    )  # fmt: skip
