"""Hugging Face models (``hf:PATH_OR_ID``): a ``save_pretrained`` folder or a hub id, with its image processor.

The model class is the first of the config's ``architectures`` that transformers has (an image
classifier such as ``ViTForImageClassification``), else ``AutoModelForImageClassification``. A hub id
is looked up in transformers' cache first (``local_files_only=True``) and downloaded only when it is
not there; an offline machine without it gets one line saying so. Class names come from the
config's ``id2label`` (``None`` when they are only the default ``LABEL_i``).

The preprocessing is the image processor's, step by step: resize (to ``height``/``width``, or the
shortest edge; DETR's shortest edge with its ``longest_edge`` cap), centre crop (``crop_size``; ConvNeXT's ``crop_pct``), rescale
(``rescale_factor``), normalise (``image_mean``/``image_std``), with the processor's resample
filter and its backend's resizing (torchvision's uint8 kernel, or Pillow). SegFormer's processor
(its extra step is on label maps) and DETR's (its extra step pads a batch to its largest image; one
image is not padded) are reproduced too. A processor with steps camkit does not reproduce is
refused unless ``size``, ``mean`` and ``std`` are given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .statedict import fit_state_dict, read_state_dict

__all__ = ["load_hf", "preprocess_from_processor"]

_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL.Image.Resampling values
# Processors whose own steps only touch labels (SegFormer's reduce_labels) or pad a batch to its
# largest image (DETR: one image needs no pad); their images go through resize, rescale, normalise.
_SEGFORMER, _DETR = ("SegformerImageProcessor",), ("DetrImageProcessor",)


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ModelLoadError(
            "--model hf:PATH_OR_ID needs the transformers package: pip install transformers (or camkit[hf])"
        ) from None
    return transformers


def _get(size: Any, key: str) -> int | None:
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return int(value) if value else None


def _plain_steps(processor: Any) -> bool:
    """Whether the processor runs the generic resize, crop, rescale, normalise steps (no custom ones)."""
    try:
        from transformers.image_processing_backends import PilBackend, TorchvisionBackend
    except ImportError:  # an older transformers: trust the common classifier processors by name
        return type(processor).__name__.removesuffix("Fast") in ("ViTImageProcessor", "DeiTImageProcessor")
    kind = type(processor)
    return any(
        kind._preprocess is base._preprocess and kind.resize is base.resize and kind.center_crop is base.center_crop
        for base in (TorchvisionBackend, PilBackend)
    )


def preprocess_from_processor(processor: Any) -> Preprocess:
    """The :class:`Preprocess` equal to a Hugging Face image processor's steps.

    Example:
        >>> from transformers import ViTImageProcessor
        >>> from camkit.modelload.hf import preprocess_from_processor
        >>> p = preprocess_from_processor(ViTImageProcessor(size={"height": 48, "width": 64}, image_mean=[0.5] * 3,
        ...                                                 image_std=[0.25] * 3))
        >>> p.size, p.crop, p.mean, p.interpolation, p.backend
        ((48, 64), None, (0.5, 0.5, 0.5), 'bilinear', 'tensor')
    """
    name = type(processor).__name__
    base = name.removesuffix("Fast").removesuffix("Pil")
    convnext = base in ("ConvNextImageProcessor",)
    detr = base in _DETR
    if detr and (getattr(processor, "pad_size", None) or getattr(processor, "do_center_crop", False)):
        raise ModelLoadError(f"the image processor {name} pads to a fixed pad_size or crops; camkit does not reproduce that: pass --size")
    if not (convnext or detr or base in _SEGFORMER or _plain_steps(processor)):
        raise ModelLoadError(
            f"the image processor {name} has steps of its own that camkit does not reproduce; pass --size, --mean "
            "and --std (Python: size=, mean=, std=) to set the preprocessing yourself"
        )
    backend = "pil" if getattr(processor, "backend", "") == "pil" or name.endswith("Pil") else "tensor"
    resample = getattr(processor, "resample", 2)
    interpolation = _RESAMPLE.get(int(resample), "") if isinstance(resample, int) else str(getattr(resample, "value", ""))
    if interpolation not in ("nearest", "bilinear", "bicubic", "lanczos") or (interpolation == "lanczos" and backend != "pil"):
        raise ModelLoadError(f"the image processor {name} resamples with {resample!r}, which camkit does not reproduce")
    if not getattr(processor, "do_resize", True):
        raise ModelLoadError(
            f"the image processor {name} does not resize (do_resize=False): pass --size for a fixed input size"
        )
    size = processor.size
    shortest, height, width = _get(size, "shortest_edge"), _get(size, "height"), _get(size, "width")
    longest = _get(size, "longest_edge")
    capped = detr and shortest and longest and not (height or width)  # DETR: shortest edge, longest edge capped
    if (longest and not capped) or _get(size, "max_height") or not (shortest or (height and width)):
        raise ModelLoadError(f"the image processor {name} resizes to {size}, which camkit does not reproduce; pass --size")
    geometry: dict[str, Any]
    if capped:
        geometry = {"resize": shortest, "max_size": longest}
    elif convnext and shortest:  # ConvNeXT: below 384, resize to shortest/crop_pct and crop; else warp to a square
        crop_pct = float(getattr(processor, "crop_pct", 224 / 256))
        geometry = {"resize": int(shortest / crop_pct), "crop": (shortest, shortest)} if shortest < 384 else {"size": (shortest, shortest)}
    elif shortest:
        geometry = {"resize": shortest}
    else:
        geometry = {"size": (height, width)}
    if getattr(processor, "do_center_crop", False):
        crop = processor.crop_size
        geometry["crop"] = (_get(crop, "height"), _get(crop, "width"))
    normalize = bool(getattr(processor, "do_normalize", True))
    mean = tuple(float(v) for v in processor.image_mean) if normalize else (0.0, 0.0, 0.0)
    std = tuple(float(v) for v in processor.image_std) if normalize else (1.0, 1.0, 1.0)
    if len(mean) != 3 or len(std) != 3:
        raise ModelLoadError(f"the image processor {name} normalises {len(mean)} channels; camkit reads RGB images")
    scale = float(processor.rescale_factor) if getattr(processor, "do_rescale", True) else 1.0
    return Preprocess(
        **geometry, mean=mean, std=std, interpolation=interpolation, backend=backend, crop_rounding="floor",
        scale=scale, origin=f"Hugging Face {name}",
    )  # fmt: skip


def _from_pretrained(kind: Any, ident: str, what: str) -> Any:
    """``kind.from_pretrained(ident)``: the cache first, the hub only when it is not there."""
    try:
        return kind.from_pretrained(ident, local_files_only=True)
    except OSError as first:
        if Path(ident).is_dir():
            raise ModelLoadError(f"--model hf:{ident}: the folder has no {what} ({str(first).strip()[:200]})") from None
    try:
        return kind.from_pretrained(ident)
    except Exception as err:  # no network, unknown id, gated repo: one line
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ModelLoadError(
            f"--model hf:{ident}: its {what} is not in transformers' cache and could not be fetched ({type(err).__name__}: "
            f"{text}). Offline, pass a save_pretrained folder or fill the cache first"
        ) from None


def load_hf(
    ident: str, weights: str | None, *, need_processor: bool = True
) -> tuple[nn.Module, Preprocess | None, list[str] | None, list[str]]:
    """A transformers model, its preprocessing (``None`` without a processor when not needed), class names, notes."""
    transformers = _import_transformers()
    if not ident:
        raise ModelLoadError("--model hf: needs a save_pretrained folder or a hub id after 'hf:'")
    config = _from_pretrained(transformers.AutoConfig, ident, "config.json")
    kind = None
    for arch in getattr(config, "architectures", None) or []:
        kind = getattr(transformers, arch, None)
        if kind is not None:
            break
    kind = kind or transformers.AutoModelForImageClassification
    try:
        model = _from_pretrained(kind, ident, "model weights")
    except ValueError as err:  # AutoModelForImageClassification on a config it has no class for
        raise ModelLoadError(f"--model hf:{ident}: transformers cannot build an image model from it ({err})") from None
    notes = [f"{type(model).__name__} from {ident}"]
    if weights is not None:
        path = Path(weights)
        notes += fit_state_dict(model, read_state_dict(path), path)
    pre: Preprocess | None = None
    try:
        pre = preprocess_from_processor(_from_pretrained(transformers.AutoImageProcessor, ident, "image processor"))
    except ModelLoadError as err:
        if need_processor:
            hint = "" if "--mean" in str(err) else "; or pass --size, --mean and --std to set the preprocessing yourself"
            raise ModelLoadError(f"{err}{hint}") from None
        notes.append(f"preprocessing as given ({err})")
    labels = getattr(config, "id2label", None) or {}
    names = [str(labels.get(i, labels.get(str(i), i))) for i in range(len(labels))]
    default = all(n == f"LABEL_{i}" for i, n in enumerate(names))
    return model, pre, (None if default or not names else names), notes
