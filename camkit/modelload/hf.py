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

Vision-language models (:func:`load_hf_generation`: a config with a ``vision_config`` and a
``text_config``, such as LLaVA's) are read from a local ``save_pretrained`` folder only, with their
whole processor (``AutoProcessor``: image processor, tokenizer and chat template), never fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .statedict import fit_state_dict, read_state_dict

__all__ = ["is_generation_model", "load_hf", "load_hf_generation", "preprocess_from_processor"]

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


_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
           "fp16": "float16", "half": "float16"}  # fmt: skip


def is_generation_model(ident: str) -> bool:
    """Whether ``ident`` is a local folder holding a vision-language model's config (``vision_config`` and ``text_config``).

    Example:
        >>> import tempfile
        >>> from camkit.modelload.hf import is_generation_model
        >>> is_generation_model(tempfile.mkdtemp()), is_generation_model("no/such/folder")
        (False, False)
    """
    import json

    path = Path(ident) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config and "text_config" in config


def _generation_class(transformers: Any, config: Any) -> Any:
    """The config's own architecture class when transformers has it, else ``AutoModelForImageTextToText``."""
    for arch in getattr(config, "architectures", None) or []:
        kind = getattr(transformers, arch, None)
        if kind is not None and hasattr(kind, "generate"):
            return kind
    return transformers.AutoModelForImageTextToText


def load_hf_generation(
    path: str, *, dtype: str | None = None, device: Any = None, attn_implementation: str | None = None
) -> tuple[nn.Module, Any, list[str]]:
    """A vision-language model and its processor from a local ``save_pretrained`` folder: ``(model, processor, notes)``.

    The model class is the config's architecture (``LlavaForConditionalGeneration``...) or
    ``AutoModelForImageTextToText``; the processor is ``AutoProcessor``'s. Nothing is downloaded
    (``local_files_only=True``). The model is returned in eval mode on ``device``.

    Args:
        path: the folder ``model.save_pretrained`` and ``processor.save_pretrained`` wrote.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (default: as saved, ``"auto"``).
        device: where to put the model (default: where it loads, the CPU).
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``... (default: transformers' choice).

    Raises:
        ModelLoadError: not a folder, no ``config.json``, no weights, no processor (naming the file
            that is missing), a config that is no vision-language model, or an unknown dtype.

    Example:
        >>> import tempfile
        >>> from camkit.errors import ModelLoadError
        >>> from camkit.modelload.hf import load_hf_generation
        >>> try:
        ...     load_hf_generation(tempfile.mkdtemp())
        ... except ModelLoadError as err:
        ...     print(str(err).split(":")[-1].strip())
        no config.json (save the model there with model.save_pretrained(folder))
    """
    transformers = _import_transformers()
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(
            f"--model hf:{path}: vision-language models are read from a local folder written by save_pretrained "
            "(model and processor); no such folder"
        )
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"--model hf:{path}: no config.json (save the model there with model.save_pretrained(folder))")
    if dtype is not None and dtype != "auto" and dtype not in _DTYPES:
        raise ModelLoadError(f"--dtype {dtype!r} is not one of auto, {', '.join(sorted(set(_DTYPES.values())))}")
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if not (hasattr(config, "vision_config") and hasattr(config, "text_config")):
        raise ModelLoadError(
            f"--model hf:{path}: its config ({type(config).__name__}) is not a vision-language model's (no "
            "vision_config and text_config); image classifiers load without --prompt"
        )
    processor = _generation_processor(transformers, folder, path)  # the cheaper check first
    kind = _generation_class(transformers, config)
    options: dict[str, Any] = {"local_files_only": True, "dtype": _DTYPES.get(dtype or "auto", "auto")}
    if attn_implementation:
        options["attn_implementation"] = attn_implementation
    try:
        model = kind.from_pretrained(str(folder), **options)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"--model hf:{path}: the model weights could not be read (model.safetensors or pytorch_model.bin; "
            f"{type(err).__name__}: {str(err).strip()[:200]})"
        ) from None
    model.eval()
    if device is not None:
        model.to(device)
    notes = [f"{type(model).__name__} from {path}", f"dtype {next(model.parameters()).dtype}"]
    return model, processor, notes


def _generation_processor(transformers: Any, folder: Path, path: str) -> Any:
    """``AutoProcessor`` from the folder, or an error naming the processor files it lacks."""
    try:
        processor = transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(
            f"--model hf:{path}: no processor could be read (processor_config.json or preprocessor_config.json, "
            f"and the tokenizer files; save it with processor.save_pretrained(folder)): {type(err).__name__}: "
            f"{str(err).strip()[:200]}"
        ) from None
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise ModelLoadError(
            f"--model hf:{path}: the folder's processor ({type(processor).__name__}) has no tokenizer and image "
            "processor; save the model's whole processor with processor.save_pretrained(folder)"
        )
    return processor
