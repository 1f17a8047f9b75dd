"""timm models by name (``timm:NAME``), with timm's own evaluation preprocessing.

The architecture comes from ``timm.create_model(NAME)``; its weights from a state dict
(``.safetensors`` or ``.pth``, the class count read from the head) or, with ``weights="pretrained"``,
through timm's own loading (its Hugging Face hub cache). The preprocessing is what
``timm.data.resolve_data_config`` and ``create_transform`` do at evaluation: resize the shorter side
to ``input size / crop_pct`` with the config's interpolation (Pillow, as timm does on PIL images),
centre-crop the input size, normalise with the config's mean and std.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .statedict import classes_in, fit_state_dict, read_state_dict

__all__ = ["load_timm", "preprocess_from_timm"]


def _import_timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ModelLoadError("--model timm:NAME needs the timm package: pip install timm (or camkit[timm])") from None
    return timm


def preprocess_from_timm(config: dict[str, Any]) -> Preprocess:
    """The :class:`Preprocess` equal to timm's evaluation transform for a data config.

    ``config`` is what ``timm.data.resolve_data_config(model=model)`` returns (``input_size``,
    ``interpolation``, ``crop_pct``, ``crop_mode``, ``mean``, ``std``).

    Example:
        >>> from camkit.modelload.timm import preprocess_from_timm
        >>> p = preprocess_from_timm({"input_size": (3, 160, 160), "interpolation": "bilinear", "crop_pct": 0.95,
        ...                           "crop_mode": "center", "mean": (0.5,) * 3, "std": (0.5,) * 3})
        >>> p.resize, p.crop, p.interpolation, p.backend
        (168, (160, 160), 'bilinear', 'pil')
    """
    _, height, width = (int(v) for v in config["input_size"])
    crop_pct = float(config.get("crop_pct") or 0.875)
    mode = config.get("crop_mode") or "center"
    interpolation = str(config.get("interpolation") or "bilinear")
    if interpolation not in ("nearest", "bilinear", "bicubic", "lanczos"):
        raise ModelLoadError(
            f"timm's data config asks for {interpolation!r} resizing, which camkit does not reproduce; pass --size, "
            "--mean and --std to set the preprocessing yourself"
        )
    scaled = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    stats: dict[str, Any] = {
        "mean": tuple(float(v) for v in config["mean"]), "std": tuple(float(v) for v in config["std"]),
        "interpolation": interpolation, "backend": "pil", "origin": "timm data config",
    }  # fmt: skip
    if mode == "squash":
        return Preprocess(size=scaled, crop=(height, width), **stats)
    if mode == "center" and scaled[0] == scaled[1]:
        return Preprocess(resize=scaled[0], crop=(height, width), **stats)
    raise ModelLoadError(
        f"timm's data config has crop_mode={mode!r} with input size {height}x{width}, which camkit does not "
        "reproduce; pass --size, --mean and --std to set the preprocessing yourself"
    )


def load_timm(
    name: str, weights: str | None
) -> tuple[nn.Module, Preprocess, list[str] | None, list[str]]:
    """A timm model, its preprocessing, class names (ImageNet's for pretrained weights) and notes."""
    timm = _import_timm()
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelLoadError(f"timm has no model {name!r}{hint} See timm.list_models().")
    notes: list[str] = []
    categories: list[str] | None = None
    if weights is None:
        model = timm.create_model(name, pretrained=False)
        notes.append("random weights (no --weights given)")
    elif weights == "pretrained":
        try:
            model = timm.create_model(name, pretrained=True)
        except Exception as err:  # hub errors, offline, missing cache: one line with the cause
            text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            raise ModelLoadError(
                f"--model timm:{name} --weights pretrained: timm could not load its pretrained weights "
                f"({type(err).__name__}: {text}). Offline, they must already be in timm's Hugging Face cache; "
                "otherwise pass --weights a state-dict file"
            ) from None
        notes.append("timm's pretrained weights")
        categories = _imagenet_names(timm, model)
    else:
        path = Path(weights)
        if not path.is_file():
            raise ModelLoadError(f"--weights {weights!r} is neither a file nor 'pretrained' (for timm:{name})")
        state = read_state_dict(path)
        model = timm.create_model(name, pretrained=False)
        count, head = classes_in(state), classes_in(model.state_dict())
        if count is not None and head is not None and count != head:
            model = timm.create_model(name, pretrained=False, num_classes=count)
            notes.append(f"num_classes={count} taken from the state dict")
        notes += fit_state_dict(model, state, path)
    config = timm.data.resolve_data_config({}, model=model)
    return model, preprocess_from_timm(config), categories, notes


def _imagenet_names(timm: Any, model: nn.Module) -> list[str] | None:
    try:
        subset = timm.data.infer_imagenet_subset(model)
        return list(timm.data.ImageNetInfo(subset).label_descriptions()) if subset else None
    except Exception:  # class names are a nicety: a timm without them still loads the model
        return None
