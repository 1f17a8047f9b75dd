"""torchcam 0.5.0's ``torchcam.explain``: one image's prediction explained, with a bundle to save.

``explain(model, x)`` runs the model once on a ``[1, C, H, W]`` image, explains the predicted
class (and, with ``expected_class_idx``, the expected one after a second forward pass) with a
``torchcam.methods`` extractor of this package, and returns a frozen
:class:`PredictionExplanation`; its ``save`` writes each map as ``.npy``, a greyscale heatmap and
an overlay, then ``manifest.json`` last, so a directory holding a manifest is complete.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from PIL.Image import Image, fromarray
from torch import Tensor, nn

from .methods import GradCAM
from .methods.core import _CAM
from .utils import overlay_mask

__all__ = ["PredictionExplanation", "explain"]


@dataclass(frozen=True)
class PredictionExplanation:
    """The logits, the predicted (and expected) class and their maps, with what reproduces them.

    ``cams`` maps a class index to one ``[h, w]`` float32 CPU map per artefact (one per target
    layer, or one fused map).
    """

    logits: Tensor
    predicted_class_idx: int
    expected_class_idx: int | None
    cams: Mapping[int, tuple[Tensor, ...]]
    method: str
    target_layers: tuple[str, ...]
    model: str
    input_shape: tuple[int, ...]
    versions: Mapping[str, str]
    class_names: tuple[str, ...] | None = None

    def save(self, directory: str | Path, image: Image, alpha: float = 0.5) -> Path:
        """Write maps (``.npy``), heatmaps, overlays on ``image`` and ``manifest.json`` to a new directory.

        Nothing is left behind if a step fails.

        Raises:
            TypeError: if ``image`` is not a PIL image
            FileExistsError: if ``directory`` exists already
        """
        if not isinstance(image, Image):
            raise TypeError(f"`image` must be a PIL image, got {type(image).__name__}")
        root = Path(directory)
        if root.exists():
            raise FileExistsError(f"output directory already exists: {root}; pick a new one")
        root.mkdir(parents=True)
        with ExitStack() as undo:
            undo.callback(shutil.rmtree, root)
            probs = self.logits.softmax(dim=1)[0]
            classes: dict[str, dict[str, Any]] = {}
            for class_idx, maps in sorted(self.cams.items()):
                groups = [self.target_layers] if len(maps) == 1 else [(name,) for name in self.target_layers]
                artifacts = []
                for layer_idx, (layers, cam) in enumerate(zip(groups, maps, strict=True)):
                    stem = f"class-{class_idx}-layer-{layer_idx}"
                    values = cam.numpy()
                    files = {"map": f"{stem}.npy", "heatmap": f"{stem}-heatmap.png", "overlay": f"{stem}-overlay.png"}
                    np.save(root / files["map"], values, allow_pickle=False)
                    grey = (255 * np.clip(values, 0, 1)).round().astype(np.uint8)
                    fromarray(grey).save(root / files["heatmap"])
                    overlay_mask(image, fromarray(values), alpha=alpha).save(root / files["overlay"])
                    artifacts.append({"target_layers": list(layers), **files})
                classes[str(class_idx)] = {
                    "class_idx": class_idx,
                    "class_name": self._name(class_idx),
                    "logit": float(self.logits[0, class_idx]),
                    "probability": float(probs[class_idx]),
                    "artifacts": artifacts,
                }
            manifest = {
                "schema_version": 1,
                "prediction": self._reference(self.predicted_class_idx),
                "expected": self._reference(self.expected_class_idx),
                "classes": classes,
                "method": self.method,
                "target_layers": list(self.target_layers),
                "model": self.model,
                "input_shape": list(self.input_shape),
                "versions": dict(self.versions),
                "image_size": list(image.size),
                "alpha": alpha,
            }
            text = json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n"
            (root / "manifest.json").write_text(text, encoding="utf-8")
            undo.pop_all()
        return root

    def _name(self, class_idx: int) -> str | None:
        return None if self.class_names is None else self.class_names[class_idx]

    def _reference(self, class_idx: int | None) -> dict[str, Any] | None:
        return None if class_idx is None else {"class_idx": class_idx, "class_name": self._name(class_idx)}


def _validate_logits(output: Any) -> Tensor:
    """The model's output, checked to be finite logits of shape ``(1, num_classes)``."""
    if not isinstance(output, Tensor):
        raise TypeError(
            f"model output must be a tensor, got {type(output).__name__}; wrap models that return tuples or dictionaries"
        )
    if output.ndim != 2 or output.shape[0] != 1 or output.shape[1] < 1:
        raise ValueError(f"model output must have shape (1, num_classes), got {tuple(output.shape)}")
    if not bool(torch.isfinite(output).all()):
        raise ValueError("model output contains non-finite logits (NaN or inf)")
    return output


def _prepare_maps(maps: list[Tensor]) -> tuple[Tensor, ...]:
    """The extractor's ``[1, h, w]`` maps as finite ``[h, w]`` float32 CPU tensors."""
    if not maps:
        raise ValueError("extractor returned no CAMs")
    prepared = []
    for cam in maps:
        if not isinstance(cam, Tensor) or cam.ndim != 3 or cam.shape[0] != 1:
            shape = tuple(cam.shape) if isinstance(cam, Tensor) else type(cam).__name__
            raise ValueError(f"CAMs must have shape (1, height, width), got {shape}")
        if not bool(torch.isfinite(cam).all()):
            raise ValueError("CAM contains non-finite values (NaN or inf)")
        prepared.append(cam[0].detach().to(device="cpu", dtype=torch.float32).contiguous())
    return tuple(prepared)


def _check_request(model: Any, x: Any, expected: Any, method: Any, method_kwargs: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    if any(m.training for m in model.modules()):
        raise ValueError("`model` must be in evaluation mode; call model.eval() first")
    if not isinstance(x, Tensor):
        raise TypeError(f"`input_tensor` must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"`input_tensor` must have shape (1, channels, height, width), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"`input_tensor` must have a floating-point dtype, got {x.dtype}")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
        raise TypeError(f"`expected_class_idx` must be an integer or None, got {expected!r}")
    if not isinstance(method, type) or not issubclass(method, _CAM):
        raise TypeError(f"`method` must be a torchcam extractor class (torchcam.methods), got {method!r}")
    if method_kwargs is not None and not isinstance(method_kwargs, Mapping):
        raise TypeError(f"`method_kwargs` must be a mapping or None, got {type(method_kwargs).__name__}")


def _check_classes(expected: int | None, names: Sequence[str] | None, num_classes: int) -> tuple[str, ...] | None:
    if expected is not None and not 0 <= expected < num_classes:
        raise ValueError(f"`expected_class_idx` {expected} is outside the model output range [0, {num_classes})")
    if names is None:
        return None
    if isinstance(names, str) or len(names) != num_classes:
        raise ValueError(f"`class_names` length must match the number of model classes ({num_classes})")
    if any(not isinstance(name, str) for name in names):
        raise TypeError("every class name must be a string")
    return tuple(names)


def explain(
    model: nn.Module,
    input_tensor: Tensor,
    *,
    expected_class_idx: int | None = None,
    class_names: Sequence[str] | None = None,
    method: type[_CAM] = GradCAM,
    target_layer: nn.Module | str | list[nn.Module | str] | None = None,
    method_kwargs: Mapping[str, Any] | None = None,
) -> PredictionExplanation:
    """Explain the predicted class (and ``expected_class_idx``) of one image ``[1, C, H, W]``.

    The model must be in eval mode; its parameters' ``.grad``, flags and hooks are left as found.

    Raises:
        RuntimeError: inside ``torch.inference_mode()`` (the maps need gradients)
        ValueError: if an argument, the model's output or a map has an unsupported value
        TypeError: if an argument has the wrong type
    """
    if torch.is_inference_mode_enabled():
        raise RuntimeError("`explain` cannot run inside torch.inference_mode(): CAM extraction needs gradients")
    _check_request(model, input_tensor, expected_class_idx, method, method_kwargs)
    kwargs = dict(method_kwargs or {})
    if "target_layer" in kwargs:
        raise ValueError("pass `target_layer` directly to explain(), not through `method_kwargs`")
    if target_layer is not None:
        kwargs["target_layer"] = target_layer
    elif method is GradCAM:
        kwargs.setdefault("input_shape", tuple(input_tensor.shape[1:]))
    x = input_tensor.detach().requires_grad_(True)
    params = tuple(model.parameters())
    grads = tuple(p.grad for p in params)
    try:
        with torch.enable_grad(), method(model, **kwargs) as extractor:
            logits = _validate_logits(model(x))
            predicted = int(logits[0].argmax())
            names = _check_classes(expected_class_idx, class_names, logits.shape[1])
            cams = {predicted: _prepare_maps(extractor(predicted, logits))}
            if expected_class_idx is not None and expected_class_idx != predicted:
                again = _validate_logits(model(x))
                if again.shape != logits.shape:
                    raise ValueError(
                        f"model output shape changed between explanation forwards: {tuple(logits.shape)} then "
                        f"{tuple(again.shape)}"
                    )
                cams[expected_class_idx] = _prepare_maps(extractor(expected_class_idx, again))
            result = PredictionExplanation(
                logits=logits.detach().cpu(),
                predicted_class_idx=predicted,
                expected_class_idx=expected_class_idx,
                cams=MappingProxyType(cams),
                method=method.__name__,
                target_layers=tuple(extractor.target_names),
                model=f"{type(model).__module__}.{type(model).__qualname__}",
                input_shape=tuple(input_tensor.shape),
                versions=MappingProxyType({
                    "python": platform.python_version(),
                    "torch": str(torch.__version__),
                    "torchcam": _torchcam_version(),
                }),
                class_names=names,
            )
    finally:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
    return result


def _torchcam_version() -> str:
    try:
        return importlib.metadata.version("torchcam")
    except importlib.metadata.PackageNotFoundError:
        return "0.5.0"
