"""The model description grammar: what ``--model`` and :func:`load_model` accept, and what they return."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ModelLoadError
from ..io import IMAGENET_MEAN, IMAGENET_STD
from .digest import state_sha256
from .files import first_line, load_factory, load_whole
from .preprocess import Preprocess
from .statedict import SCRIPT_HINT
from .torchvision import load_torchvision
from .ultralytics import load_ultralytics

__all__ = ["LoadedModel", "load_model", "resolve_device", "warn_random_weights"]

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass
class LoadedModel:
    """What :func:`load_model` returns; unpacks as ``model, preprocess = load_model(...)``.

    Attributes:
        model: the ``nn.Module`` on ``device`` (its modes are as loaded; explainers run it in eval mode).
        preprocess: the :class:`Preprocess` to use for its inputs.
        device: where the model is.
        spec: the model description as given; ``weights`` likewise.
        categories: class names by index when the weights say, else ``None``.
    """

    model: nn.Module
    preprocess: Preprocess
    device: torch.device
    spec: str
    weights: str | None = None
    categories: list[str] | None = None
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        """``model, preprocess``: the two things a notebook needs."""
        return iter((self.model, self.preprocess))

    def weights_sha256(self) -> str:
        """SHA-256 of the model's state dict (names, dtypes, shapes and values): what the weights *are*.

        A weights file replaced at the same path, or a factory that now builds other
        weights, gives another hash (``--resume`` compares it).

        Example:
            >>> import torch
            >>> from camkit.modelload import load_model
            >>> a = load_model(torch.nn.Linear(2, 2), size=4, device="cpu")
            >>> b = load_model(torch.nn.Linear(2, 2), size=4, device="cpu")
            >>> a.weights_sha256() == a.weights_sha256(), a.weights_sha256() == b.weights_sha256()
            (True, False)
        """
        return state_sha256(self.model.state_dict())

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (for manifests)."""
        return {
            "spec": self.spec,
            "weights": self.weights,
            "class": type(self.model).__name__,
            "device": str(self.device),
            "preprocess": self.preprocess.describe(),
            "notes": list(self.notes),
        }


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to use: as given, else CUDA when available, else the CPU.

    Example:
        >>> from camkit.modelload import resolve_device
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None or device == "":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ModelLoadError(f"--device {device!r} is not a device name; use cpu, cuda or cuda:N ({err})") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ModelLoadError(
                f"--device {device}: this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
            )
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ModelLoadError(f"--device {device}: MPS is not available here; use --device cpu")
    return dev


def _load_demo(weights: str | None, spec: str = "demo") -> tuple[nn.Module, Preprocess, list[str], list[str]]:
    from ..bundled.model import load_shapes_cnn
    from ..bundled.shapes import CLASSES, IMAGE_SIZE
    from ..bundled.vit import load_shapes_vit

    load, origin = (
        (load_shapes_vit, "the bundled demo ViT (camkit.bundled.vit.load_shapes_vit)")
        if spec == "demo-vit"
        else (load_shapes_cnn, "the bundled demo model (camkit.bundled.model.load_shapes_cnn)")
    )
    if weights is not None and not Path(weights).is_file():
        raise ModelLoadError(f"--model {spec}: --weights {weights} is not a file (a state dict for the demo model)")
    try:
        model = load(weights)
    except RuntimeError as err:
        raise ModelLoadError(
            f"--model {spec}: the weights in {weights} do not fit the demo model: {first_line(err)}"
        ) from None
    pre = Preprocess(
        size=(IMAGE_SIZE, IMAGE_SIZE), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), origin="the bundled demo model"
    )
    return model, pre, list(CLASSES), [origin]


def _pair(value: int | Sequence[int], option: str) -> tuple[int, int]:
    hw = (int(value), int(value)) if isinstance(value, int) else tuple(int(s) for s in value)
    if len(hw) != 2 or min(hw) < 1:
        raise ModelLoadError(f"--{option} must be a positive int or HEIGHT WIDTH, got {value!r}")
    return hw[0], hw[1]


def _check_stats(mean: Sequence[float] | None, std: Sequence[float] | None) -> None:
    if (mean is None) != (std is None):
        raise ModelLoadError("give both --mean and --std, or neither")
    for label, stat in (("mean", mean), ("std", std)):
        if stat is not None and len(stat) != 3:
            raise ModelLoadError(f"--{label} needs 3 numbers (R G B), got {list(stat)}")
    if std is not None and not all(float(v) > 0 and np.isfinite(float(v)) for v in std):
        raise ModelLoadError(f"--std must be three positive numbers (inputs are divided by it), got {list(std)}")


def _compose(
    known: Preprocess | None,
    size: int | Sequence[int] | None,
    crop: int | Sequence[int] | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
) -> Preprocess:
    """The model's own preprocessing, with what the caller gave in its place."""
    m, sd = (known.mean, known.std) if known else (IMAGENET_MEAN, IMAGENET_STD)
    if mean is not None and std is not None:
        m, sd = (float(mean[0]), float(mean[1]), float(mean[2])), (float(std[0]), float(std[1]), float(std[2]))
    crop_hw = _pair(crop, "crop") if crop is not None else None
    if size is not None:
        if crop_hw is not None and isinstance(size, int):  # as torchvision: Resize(N) then CenterCrop
            return Preprocess(resize=int(size), crop=crop_hw, mean=m, std=sd, origin="given")
        return Preprocess(size=_pair(size, "size"), crop=crop_hw, mean=m, std=sd, origin="given")
    if known is None:
        if crop_hw is not None:
            raise ModelLoadError("--crop needs --size (the resize before the crop) for this model")
        return Preprocess(size=(224, 224), mean=m, std=sd, origin="default (224x224, ImageNet statistics)")
    if crop_hw is None and mean is None:
        return known
    origin = f"{known.origin or 'the model'}'s, with " + " and ".join(
        w for w, given in (("--crop", crop_hw is not None), ("--mean/--std", mean is not None)) if given
    )
    return Preprocess(
        size=known.size, resize=known.resize, crop=crop_hw or known.crop, mean=m, std=sd,
        interpolation=known.interpolation, backend=known.backend, crop_rounding=known.crop_rounding,
        scale=known.scale, origin=origin,
    )  # fmt: skip


def load_model(
    spec: str | nn.Module,
    weights: str | None = None,
    *,
    trust_pickle: bool = False,
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str | torch.device | None = None,
    crop: int | Sequence[int] | None = None,
) -> LoadedModel:
    """Load a model and its preprocessing (see the module docstring for the forms of ``spec``).

    The preprocessing is the model's own (torchvision weights' transforms, also for a state
    dict of a torchvision architecture; timm's data config; the Hugging Face image processor),
    unless ``size``, ``crop``, ``mean`` or ``std`` are given.

    Args:
        spec: ``torchvision:NAME``, ``timm:NAME``, ``hf:PATH_OR_ID``, ``ultralytics:PATH.pt`` (a
            YOLO checkpoint, a pickle: needs ``trust_pickle``; letterboxed as ultralytics does),
            ``package.module:factory``, ``demo`` (the bundled CNN), ``demo-vit`` (the bundled ViT),
            a path to a whole saved model, or an ``nn.Module`` (used as is).
        weights: a torchvision weights name, ``"pretrained"`` (timm), or a state-dict file
            (``.safetensors``, ``.pth``/``.pt``, a Lightning ``.ckpt``).
        trust_pickle: allow unpickling a whole saved model (runs code from the file).
        size: resize straight to this (an int for a square, or ``(height, width)``); with ``crop``
            an int resizes the shorter side, as torchvision's ``Resize(int)``.
        mean, std: per-channel normalisation; both or neither.
        device: where to put the model; default CUDA when available.
        crop: centre crop after the resize (an int for a square, or ``(height, width)``).

    Example:
        >>> from camkit.modelload import load_model
        >>> loaded = load_model("torch.nn:Identity", size=8, device="cpu")
        >>> type(loaded.model).__name__, loaded.preprocess.size
        ('Identity', (8, 8))
        >>> model, preprocess = loaded
        >>> preprocess.describe()["origin"]
        'given'
    """
    notes: list[str] = []
    categories: list[str] | None = None
    known: Preprocess | None = None
    _check_stats(mean, std)
    if isinstance(spec, nn.Module):
        model, name = spec, type(spec).__name__
    elif not isinstance(spec, str) or not spec:
        raise ModelLoadError(f"model must be a description string or an nn.Module, got {spec!r}")
    elif spec in ("demo", "demo-vit"):
        model, known, categories, notes = _load_demo(weights, spec)
        name = spec
    elif spec.startswith("torchvision:"):
        model, known, categories, notes = load_torchvision(spec.split(":", 1)[1], weights)
        name = spec
    elif spec.startswith("timm:"):
        from .timm import load_timm

        model, known, categories, notes = load_timm(spec.split(":", 1)[1], weights)
        name = spec
    elif spec.startswith("hf:"):
        from .hf import load_hf

        given = size is not None and mean is not None
        model, known, categories, notes = load_hf(spec.split(":", 1)[1], weights, need_processor=not given)
        name = spec
    elif spec.startswith("ultralytics:"):  # a YOLO checkpoint with ultralytics' letterbox (modelload/ultralytics.py)
        if crop is not None:
            raise ModelLoadError("--model ultralytics:...: the letterbox keeps the whole image; drop --crop")
        model, known, categories, notes = load_ultralytics(spec.split(":", 1)[1], trust_pickle, size, mean, std)
        name, size, mean, std = spec, None, None, None
    elif _FACTORY.match(spec) and not Path(spec).exists():
        model, notes = load_factory(spec, weights)
        name = spec
    else:
        model, name = load_whole(Path(spec), weights, trust_pickle), spec
    if isinstance(model, torch.jit.ScriptModule):
        raise ModelLoadError(f"the model {name} {SCRIPT_HINT}")
    base = _compose(known, size, crop, mean, std)
    dev = resolve_device(device)
    return LoadedModel(model.to(dev), base, dev, name, weights, categories, notes)


def warn_random_weights(loaded: LoadedModel) -> None:
    """Warn (:class:`~camkit.errors.CamkitWarning`) when the model has random weights: its maps mean nothing.

    Example:
        >>> import warnings
        >>> from camkit.modelload import load_model, warn_random_weights
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_random_weights(load_model("torchvision:resnet18", size=8, device="cpu"))
        >>> str(caught[0].message)[:46]
        'torchvision:resnet18 has random weights (no --'
    """
    import warnings

    from ..errors import CamkitWarning

    for note in loaded.notes:
        if note.startswith("random weights"):
            warnings.warn(
                f"{loaded.spec} has {note}: its maps say nothing about a trained model; pass --weights "
                "(e.g. DEFAULT for torchvision's pretrained weights, pretrained for timm's, or a state-dict file)",
                CamkitWarning, stacklevel=3,
            )  # fmt: skip
