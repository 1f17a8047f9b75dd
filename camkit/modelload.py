"""Loading a model and its preprocessing from a command-line style description.

Shared by ``camkit explain``, ``camkit audit`` and the other subcommands. A model is given as

* ``torchvision:NAME`` (``torchvision:resnet50``), with ``weights`` a torchvision weights
  name (``DEFAULT``, ``IMAGENET1K_V2``: downloaded by torchvision where there is internet)
  or a local state-dict file; without ``weights`` the model has random weights;
* ``package.module:factory``: a callable returning the ``nn.Module`` (``factory`` may be a
  dotted attribute path), optionally with ``weights`` a state-dict file for it;
* a file written by ``torch.save(model)``: a whole pickled model. Unpickling runs code
  from the file, so it is refused unless ``trust_pickle=True`` (``--trust-pickle``);
* ``demo``: the bundled demo model (:func:`camkit.demo.model.load_shapes_cnn`), with its own
  preprocessing (64x64, no mean/std normalisation) and class names (circle, square,
  triangle, cross); ``weights`` may name another state dict for it.

State dicts are always read with ``torch.load(..., weights_only=True)``. TorchScript files
are refused with an explanation: hooks cannot attach to scripted modules.

Preprocessing (:class:`Preprocess`) comes from ``size``/``mean``/``std`` when given, else
from the torchvision weights' own transforms (resize the shorter side, centre-crop), else
a 224x224 resize with ImageNet statistics. Region boxes in original-image pixels follow
the same resize and crop (:meth:`Preprocess.transform_boxes`).
"""

from __future__ import annotations

import argparse
import importlib
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import CamkitError, InvalidInputError
from .io import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "LoadedModel",
    "ModelLoadError",
    "Preprocess",
    "add_model_arguments",
    "load_model",
    "model_from_args",
    "resolve_device",
]

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ModelLoadError(CamkitError, ValueError):
    """A model description, weights file or preprocessing option that cannot be used.

    Example:
        >>> import camkit
        >>> try:
        ...     camkit.load_model("resnet18")  # not one of the forms load_model reads
        ... except camkit.ModelLoadError as err:
        ...     print(err)
        --model 'resnet18' is not torchvision:NAME, package.module:factory, or an existing file
    """


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing: resize, optional centre crop, scale to [0, 1], normalise.

    Exactly one of ``size`` (resize straight to ``(height, width)``) and ``resize``
    (resize the shorter side to this many pixels, keeping the aspect ratio, as
    torchvision's ``Resize(int)``) is set. ``crop`` centre-crops after resizing.
    Resizing is bilinear with antialiasing, in float.

    Example:
        >>> import numpy as np
        >>> from camkit.modelload import Preprocess
        >>> p = Preprocess(resize=4, crop=(4, 4), mean=(0.0,) * 3, std=(1.0,) * 3)
        >>> x, shown = p(np.zeros((8, 16, 3), np.uint8))
        >>> tuple(x.shape), shown.shape
        ((3, 4, 4), (4, 4, 3))
        >>> p.transform_boxes(np.array([[0.0, 0.0, 16.0, 8.0]]), 8, 16).tolist()
        [[-2.0, 0.0, 6.0, 4.0]]
    """

    size: tuple[int, int] | None = None
    resize: int | None = None
    crop: tuple[int, int] | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if (self.size is None) == (self.resize is None):
            raise ModelLoadError("Preprocess needs exactly one of size=(height, width) and resize=shorter_side")

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` after the resize step, before cropping."""
        if self.size is not None:
            return self.size
        resize = int(self.resize or 0)  # set: __post_init__ requires size or resize
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(resize * long / short)
        return (resize, new_long) if height <= width else (new_long, resize)

    def crop_offsets(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, out_height, out_width)`` of the crop in the resized image."""
        rh, rw = self.resized_shape(height, width)
        if self.crop is None:
            return 0, 0, rh, rw
        ch, cw = self.crop
        return round((rh - ch) / 2.0), round((rw - cw) / 2.0), ch, cw

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` of the model input for an original image of this size."""
        _, _, oh, ow = self.crop_offsets(height, width)
        return oh, ow

    def _geometry(self, tensor: Tensor, mode: str) -> Tensor:
        """Resize and crop a float tensor [C, H, W] (crop zero-pads when the image is smaller)."""
        height, width = tensor.shape[-2:]
        rh, rw = self.resized_shape(height, width)
        if (rh, rw) != (height, width):
            if mode == "bilinear":
                tensor = F.interpolate(
                    tensor[None], size=(rh, rw), mode="bilinear", align_corners=False, antialias=True
                )[0]
            else:
                tensor = F.interpolate(tensor[None], size=(rh, rw), mode="nearest-exact")[0]
        top, left, oh, ow = self.crop_offsets(height, width)
        if (top, left, oh, ow) != (0, 0, rh, rw):
            pad = (max(0, -left), max(0, left + ow - rw), max(0, -top), max(0, top + oh - rh))
            if any(pad):
                tensor = F.pad(tensor, pad)
                top, left = top + pad[2], left + pad[0]
            tensor = tensor[:, top : top + oh, left : left + ow]
        return tensor

    def __call__(self, rgb: np.ndarray) -> tuple[Tensor, np.ndarray]:
        """``(x, shown)``: the model input [3, h, w] and the uint8 RGB image [h, w, 3] it shows."""
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            got = f"{rgb.dtype} {list(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
            raise InvalidInputError(f"expected a uint8 RGB image [H, W, 3] (see camkit.read_rgb), got {got}")
        x01 = self._geometry(torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0, "bilinear")
        x01 = x01.clamp(0.0, 1.0)
        shown = (x01 * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
        x = (x01 - torch.tensor(self.mean).view(3, 1, 1)) / torch.tensor(self.std).view(3, 1, 1)
        return x, shown

    def transform_boxes(self, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
        """Boxes [N, 4] ``(x0, y0, x1, y1)`` in original pixels -> the model input's pixels.

        Coordinates are scaled by the resize factors and shifted by the crop; they are
        not clipped (the metrics treat out-of-image coordinates as thresholds).
        """
        rh, rw = self.resized_shape(height, width)
        top, left, _, _ = self.crop_offsets(height, width)
        scale = np.array([rw / width, rh / height, rw / width, rh / height])
        shift = np.array([left, top, left, top], dtype=np.float64)
        return np.asarray(boxes, dtype=np.float64) * scale - shift

    def transform_mask(self, mask: np.ndarray) -> Tensor:
        """A region mask [H, W] (non-zero inside) at original size -> bool [h, w] (nearest)."""
        m = torch.from_numpy(np.ascontiguousarray(mask != 0)).float()[None]
        return self._geometry(m, "nearest")[0] > 0.5

    def invert_map(self, heat: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
        """A map [h, w] at the model input's size taken back to the original image [height, width].

        The map is placed where the crop took its pixels in the resized image, then that frame is
        resized (bilinear) to the original size. Returns ``(map, inside)``: ``inside`` (bool
        [height, width]) marks the pixels the model saw; outside the crop the map is 0.

        Example:
            >>> import torch
            >>> from camkit.modelload import Preprocess
            >>> p = Preprocess(resize=2, crop=(2, 2), mean=(0.0,) * 3, std=(1.0,) * 3)
            >>> full, inside = p.invert_map(torch.ones(2, 2), 2, 4)  # a 2x4 image: the middle 2x2 was seen
            >>> full.tolist(), inside[0].tolist()
            ([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]], [False, True, True, False])
        """
        rh, rw = self.resized_shape(height, width)
        top, left, oh, ow = self.crop_offsets(height, width)
        if tuple(heat.shape) != (oh, ow):
            raise InvalidInputError(f"the map is {list(heat.shape)}; this preprocessing gives inputs of {[oh, ow]}")
        frame = torch.zeros(2, rh, rw, dtype=torch.float32, device=heat.device)
        y0, x0, y1, x1 = max(0, top), max(0, left), min(rh, top + oh), min(rw, left + ow)
        frame[0, y0:y1, x0:x1] = heat.float()[y0 - top : y1 - top, x0 - left : x1 - left]
        frame[1, y0:y1, x0:x1] = 1.0
        if (rh, rw) != (height, width):
            values = F.interpolate(frame[None, :1], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
            inside = F.interpolate(frame[None, 1:], size=(height, width), mode="nearest-exact")[0, 0] > 0.5
        else:
            values, inside = frame[0], frame[1] > 0.5
        return torch.where(inside, values, torch.zeros_like(values)), inside

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (for manifests)."""
        return {"size": self.size, "resize": self.resize, "crop": self.crop, "mean": self.mean, "std": self.std}


@dataclass
class LoadedModel:
    """What :func:`load_model` returns.

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
        import hashlib

        digest = hashlib.sha256()
        for key, value in sorted(self.model.state_dict().items()):
            tensor = value.detach().to("cpu").contiguous()
            digest.update(f"{key}|{tensor.dtype}|{list(tensor.shape)}|".encode())
            if tensor.numel():
                digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

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


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


_SCRIPT_HINT = (
    "is a TorchScript file; camkit needs forward and backward hooks on the model's layers, and hooks "
    "cannot attach to scripted modules. Pass the eager model instead: --model package.module:factory "
    "(or torchvision:NAME) with --weights a state dict saved by torch.save(model.state_dict(), path)."
)


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from a file, read with ``weights_only=True``; common checkpoint wrappers unwrapped."""
    if not path.is_file():
        raise ModelLoadError(f"no weights file at {path}")
    if _is_torchscript(path):
        raise ModelLoadError(f"--weights {path} {_SCRIPT_HINT}")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on foreign files
        raise ModelLoadError(
            f"--weights {path} is not a plain state dict readable with weights_only=True ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Save the weights with "
            "torch.save(model.state_dict(), path)."
        ) from None
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, Tensor) for v in inner.values()):
                loaded = inner
                break
    if not isinstance(loaded, Mapping) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise ModelLoadError(
            f"--weights {path} holds a {type(loaded).__name__}, not a state dict (a mapping of names to tensors)"
        )
    state = dict(loaded)
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _apply_state_dict(model: nn.Module, state: Mapping[str, Tensor], source: Path) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        lines = str(err).splitlines()
        detail = "; ".join(line.strip() for line in lines[1:4]) or lines[0]
        raise ModelLoadError(
            f"the weights in {source} do not fit {type(model).__name__}: {detail[:500]}. Check that --model names "
            "the architecture the state dict was saved from."
        ) from None


def _classes_in(state: Mapping[str, Tensor]) -> int | None:
    """The output count of the last 2-D weight in a state dict (the classifier head), if any."""
    heads = [v for k, v in state.items() if k.endswith(".weight") and v.dim() == 2]
    return int(heads[-1].shape[0]) if heads else None


def _load_torchvision(
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
        state = _read_state_dict(path)
        model = torchvision.models.get_model(name, weights=None)
        classes = _classes_in(state)
        head = _classes_in(model.state_dict())
        if classes is not None and head is not None and classes != head:
            model = torchvision.models.get_model(name, weights=None, num_classes=classes)
            notes.append(f"num_classes={classes} taken from the state dict")
        _apply_state_dict(model, state, path)
        return model, None, None, notes
    enum = torchvision.models.get_model_weights(name)
    try:
        chosen = enum[weights]
    except KeyError:
        raise ModelLoadError(
            f"--weights {weights!r} is neither a file nor a weights name of {name}; known names: "
            f"{', '.join(enum.__members__)} (DEFAULT is the best available)"
        ) from None
    model = torchvision.models.get_model(name, weights=chosen)  # downloads into the torch hub cache
    return model, _preprocess_from_weights(chosen), list(chosen.meta.get("categories") or []) or None, notes


def _preprocess_from_weights(weights: Any) -> Preprocess | None:
    """Preprocessing read from torchvision weights' ``transforms()`` (resize, crop, mean, std) when it has them.

    Example:
        >>> import torchvision
        >>> from camkit.modelload import _preprocess_from_weights
        >>> p = _preprocess_from_weights(torchvision.models.ResNet18_Weights.DEFAULT)
        >>> p.resize, p.crop, p.mean
        (256, (224, 224), (0.485, 0.456, 0.406))
    """
    transform = weights.transforms()
    resize, crop = getattr(transform, "resize_size", None), getattr(transform, "crop_size", None)
    mean, std = getattr(transform, "mean", None), getattr(transform, "std", None)
    if not resize or not crop or mean is None or std is None or len(resize) != 1:
        return None
    crop_hw = (int(crop[0]), int(crop[-1]))
    return Preprocess(resize=int(resize[0]), crop=crop_hw, mean=tuple(mean), std=tuple(std))


def _load_factory(spec: str, weights: str | None) -> tuple[nn.Module, list[str]]:
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelLoadError(
            f"cannot import {module_name!r} for --model {spec} ({err}); is it installed or on PYTHONPATH?"
        ) from err
    except Exception as err:  # the module itself fails while importing (SyntaxError, NameError, ...)
        raise ModelLoadError(
            f"importing {module_name!r} for --model {spec} failed: {type(err).__name__}: {_first_line(err)}"
        ) from err
    factory: Any = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ModelLoadError(f"module {module_name!r} has no attribute {attr!r} (from --model {spec})")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ModelLoadError(f"--model {spec}: {attr} is a {type(factory).__name__}, not a callable returning a model")
    try:
        model = factory()
    except Exception as err:  # the user's factory failed: say so in one line (the cause stays chained)
        raise ModelLoadError(f"--model {spec}: {attr}() raised {type(err).__name__}: {_first_line(err)}") from err
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"--model {spec}: {attr}() returned a {type(model).__name__}, not a torch.nn.Module")
    notes: list[str] = []
    if weights is not None:
        path = Path(weights)
        _apply_state_dict(model, _read_state_dict(path), path)
    else:
        notes.append("weights as built by the factory (no --weights given)")
    return model, notes


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def _load_demo(weights: str | None) -> tuple[nn.Module, Preprocess, list[str], list[str]]:
    from .demo.model import load_shapes_cnn
    from .demo.shapes import CLASSES, IMAGE_SIZE

    if weights is not None and not Path(weights).is_file():
        raise ModelLoadError(f"--model demo: --weights {weights} is not a file (a state dict for the demo model)")
    try:
        model = load_shapes_cnn(weights)
    except RuntimeError as err:
        raise ModelLoadError(
            f"--model demo: the weights in {weights} do not fit the demo model: {_first_line(err)}"
        ) from None
    pre = Preprocess(size=(IMAGE_SIZE, IMAGE_SIZE), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    return model, pre, list(CLASSES), ["the bundled demo model (camkit.demo.model.load_shapes_cnn)"]


def _load_whole(path: Path, weights: str | None, trust_pickle: bool) -> nn.Module:
    if not path.is_file():
        raise ModelLoadError(
            f"--model {str(path)!r} is not torchvision:NAME, package.module:factory, or an existing file"
        )
    if _is_torchscript(path):
        raise ModelLoadError(f"--model {path} {_SCRIPT_HINT}")
    if weights is not None:
        raise ModelLoadError(
            f"--weights goes with --model torchvision:NAME or package.module:factory, not with a saved model file ({path})"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # not loadable as plain tensors: a pickled object
        loaded = None
    else:
        raise ModelLoadError(
            f"--model {path} holds a {type(loaded).__name__} (a state dict?), not a model; pass the architecture "
            f"as --model torchvision:NAME or package.module:factory and this file as --weights"
        )
    if not trust_pickle:
        raise ModelLoadError(
            f"--model {path} is a whole pickled model: loading it runs code stored in the file. Pass --trust-pickle "
            "(Python: trust_pickle=True) only for files you trust; safer, save model.state_dict() and pass "
            "--model package.module:factory --weights FILE."
        )
    loaded = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(loaded, nn.Module):
        raise ModelLoadError(f"--model {path} unpickles to a {type(loaded).__name__}, not a torch.nn.Module")
    return loaded


def load_model(
    spec: str | nn.Module,
    weights: str | None = None,
    *,
    trust_pickle: bool = False,
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str | torch.device | None = None,
) -> LoadedModel:
    """Load a model and its preprocessing (see the module docstring for the forms of ``spec``).

    Args:
        spec: ``torchvision:NAME``, ``package.module:factory``, a path to a whole saved
            model, or an ``nn.Module`` (used as is).
        weights: a torchvision weights name or a state-dict file.
        trust_pickle: allow unpickling a whole saved model (runs code from the file).
        size: resize straight to this (an int for a square, or ``(height, width)``);
            overrides the weights' transforms.
        mean, std: per-channel normalisation; both or neither.
        device: where to put the model; default CUDA when available.

    Example:
        >>> from camkit.modelload import load_model
        >>> loaded = load_model("torch.nn:Identity", size=8, device="cpu")
        >>> type(loaded.model).__name__, loaded.preprocess.size
        ('Identity', (8, 8))
    """
    notes: list[str] = []
    categories: list[str] | None = None
    known: Preprocess | None = None
    if isinstance(spec, nn.Module):
        model, name = spec, type(spec).__name__
    elif not isinstance(spec, str) or not spec:
        raise ModelLoadError(f"model must be a description string or an nn.Module, got {spec!r}")
    elif spec == "demo":
        model, known, categories, notes = _load_demo(weights)
        name = spec
    elif spec.startswith("torchvision:"):
        model, known, categories, notes = _load_torchvision(spec.split(":", 1)[1], weights)
        name = spec
    elif _FACTORY.match(spec) and not Path(spec).exists():
        model, notes = _load_factory(spec, weights)
        name = spec
    else:
        model, name = _load_whole(Path(spec), weights, trust_pickle), spec
    if isinstance(model, torch.jit.ScriptModule):
        raise ModelLoadError(f"the model {name} {_SCRIPT_HINT}")
    if (mean is None) != (std is None):
        raise ModelLoadError("give both --mean and --std, or neither")
    for label, stat in (("mean", mean), ("std", std)):
        if stat is not None and len(stat) != 3:
            raise ModelLoadError(f"--{label} needs 3 numbers (R G B), got {list(stat)}")
    if std is not None and not all(float(v) > 0 and np.isfinite(float(v)) for v in std):
        raise ModelLoadError(f"--std must be three positive numbers (inputs are divided by it), got {list(std)}")
    if size is not None:
        hw = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
        if len(hw) != 2 or min(hw) < 1:
            raise ModelLoadError(f"--size must be a positive int or HEIGHT WIDTH, got {size!r}")
        base = Preprocess(
            size=(hw[0], hw[1]), mean=known.mean if known else IMAGENET_MEAN, std=known.std if known else IMAGENET_STD
        )
    else:
        base = known or Preprocess(size=(224, 224))
    if mean is not None and std is not None:
        base = Preprocess(
            size=base.size, resize=base.resize, crop=base.crop,
            mean=(float(mean[0]), float(mean[1]), float(mean[2])), std=(float(std[0]), float(std[1]), float(std[2])),
        )  # fmt: skip
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

    from .errors import CamkitWarning

    for note in loaded.notes:
        if note.startswith("random weights"):
            warnings.warn(
                f"{loaded.spec} has {note}: its maps say nothing about a trained model; pass --weights "
                "(e.g. DEFAULT for torchvision's pretrained weights)",
                CamkitWarning, stacklevel=3,
            )  # fmt: skip


def _size_arg(text: str) -> tuple[int, int]:
    parts = re.split(r"[x,]", text.lower())
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or HxW, got {text!r}") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected N or HxW with positive numbers, got {text!r}")
    return values[0], values[1]


def add_model_arguments(parser: argparse.ArgumentParser, *, preprocessing: bool = True) -> None:
    """Add the shared model options to a subcommand's parser.

    ``--model``, ``--weights``, ``--trust-pickle`` and ``--device``; with ``preprocessing``
    also ``--size``, ``--mean`` and ``--std`` (commands that build their own inputs, such
    as ``camkit layers``, pass ``preprocessing=False``). Read them back with :func:`model_from_args`.
    """
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model", required=True,
        help="torchvision:NAME, package.module:factory, demo (the bundled demo model with its preprocessing and "
        "class names), or a whole model saved with torch.save (needs --trust-pickle)",
    )  # fmt: skip
    group.add_argument("--weights", help="torchvision weights name (e.g. DEFAULT) or a state-dict file")
    group.add_argument(
        "--trust-pickle", action="store_true",
        help="allow loading a whole pickled model (this runs code from the file: only for files you trust)",
    )  # fmt: skip
    if preprocessing:
        group.add_argument(
            "--size", type=_size_arg, help="resize inputs to N or HxW (default: the weights' transforms, else 224)"
        )
        group.add_argument(
            "--mean", type=float, nargs=3, metavar=("R", "G", "B"), help="normalisation mean (default ImageNet's)"
        )
        group.add_argument(
            "--std", type=float, nargs=3, metavar=("R", "G", "B"), help="normalisation std (default ImageNet's)"
        )
    group.add_argument("--device", help="cpu, cuda, cuda:N (default: CUDA when available)")


def model_from_args(args: argparse.Namespace) -> LoadedModel:
    """:func:`load_model` from the options added by :func:`add_model_arguments`."""
    return load_model(
        args.model, args.weights, trust_pickle=args.trust_pickle, size=getattr(args, "size", None),
        mean=getattr(args, "mean", None), std=getattr(args, "std", None), device=args.device,
    )  # fmt: skip
