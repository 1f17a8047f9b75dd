"""Quantus's ``explain``, ``get_explanation`` and its captum and zennit branches, computed by camkit.

The captum branch (``xai_lib="captum"``, the default), by ``method``: camkit's own explainers
for ``"Saliency"`` (the absolute gradient), ``"Gradient"`` (the signed gradient),
``"InputXGradient"``, ``"IntegratedGradients"`` (zero baseline or ``baseline=``, ten trapezoid
points as Quantus asks captum for, weights summing to 1), ``"GradientShap"`` and ``"LayerGradCam"``
(``xai_lib_kwargs={"layer": module}`` or ``gc_layer=``, a module or Quantus's string naming it;
its map on the layer's grid, or resized by ``interpolate=(H, W)``); Quantus's control variates,
which ignore the model: ``"Control Var. Sobel Filter"``, ``"Control Var. Random Uniform"`` (torch's
global generator, U(0, 1)) and ``"Control Var. Constant"`` (``constant_value=``); and the other
methods of Quantus's captum branch (``Occlusion``, ``FeatureAblation``, ``DeepLift``,
``DeepLiftShap``, ``GuidedGradCam``, ``Deconvolution``, ``Lime``, ``KernelShap``, ``LRP``, the layer
methods) through :mod:`camkit.compat.captum` (see ``_explain_routes``). The zennit branch
(``xai_lib="zennit"``) is in ``_explain_routes`` too. The map keeps the input's shape, then is
summed over ``reduce_axes`` (default ``(1,)``, kept as an axis of one with ``keepdims=True``);
the control variates are averaged instead. ``softmax=`` explains the model with or without its
softmax output, as Quantus does. A method camkit does not compute raises a clear error.
"""

from __future__ import annotations

import re
import typing
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor, nn

import camkit
from camkit.errors import InvalidInputError, UnknownMethodError

from .._base import AddAxis, model_dtype
from ._explain_routes import CAPTUM_ROUTED, captum_route, zennit_maps
from .indices import baseline_values
from .model_interface import ModelInterface

Union = typing.Union  # a star-import name of Quantus's module, with ModelInterface
_STAR_NAMES = (ModelInterface,)

# No __all__, as in Quantus: a star import of this module also gives ``np`` and, where zennit is
# installed, its composites as ``zcomp``, which scripts written for Quantus (and its own tests) rely on.
try:
    from zennit import composites as zcomp  # noqa: F401
except ImportError:  # pragma: no cover - zennit is optional, as in Quantus
    pass


def _zero_or(kwargs: dict[str, Any], x: Tensor) -> Tensor:
    base = kwargs.get("baseline")
    return torch.zeros_like(x[:1]) if base is None else torch.as_tensor(np.asarray(base), dtype=x.dtype)


def _raw(explainer: camkit.Explainer, x: Tensor, y: Tensor) -> Tensor:
    raw = explainer.explain(x, y).raw
    if not isinstance(raw, Tensor):
        raise InvalidInputError(f"{type(explainer).__name__} gave no single raw map for these inputs")
    return raw


METHODS: dict[str, Callable[[nn.Module, Tensor, Tensor, dict[str, Any]], Tensor]] = {
    "Saliency": lambda m, x, y, k: _raw(camkit.Saliency(m), x, y).abs(),
    "Gradient": lambda m, x, y, k: _raw(camkit.Saliency(m), x, y),
    "InputXGradient": lambda m, x, y, k: _raw(camkit.InputXGradient(m), x, y),
    "IntegratedGradients": lambda m, x, y, k: _raw(
        camkit.IntegratedGradients(m, steps=10, rule="trapezoid", baseline=_zero_or(k, x)), x, y
    ),
    "GradientShap": lambda m, x, y, k: _raw(camkit.GradientShap(m, _zero_or(k, x), seed=0), x, y),
}


def _sobel(m: nn.Module, x: Tensor, y: Tensor, k: dict[str, Any]) -> Tensor:
    rows = [np.clip(ndimage.sobel(sample), 0, 1) for sample in x.detach().cpu().numpy()]
    return torch.as_tensor(np.stack(rows), dtype=torch.float32)


def _constant(m: nn.Module, x: Tensor, y: Tensor, k: dict[str, Any]) -> Tensor:
    if "constant_value" not in k:
        raise InvalidInputError('method="Control Var. Constant" needs constant_value= (a number, or "black"...)')
    values = [float(baseline_values(k["constant_value"], sample, (1,))[0]) for sample in x.detach().cpu().numpy()]
    return torch.tensor(values, dtype=torch.float32).view(-1, *(1,) * (x.dim() - 1)).expand(x.shape).clone()


#: Quantus's control variates: maps that do not look at the model, averaged (not summed) over reduce_axes
CONTROLS: dict[str, Callable[[nn.Module, Tensor, Tensor, dict[str, Any]], Tensor]] = {
    "Control Var. Sobel Filter": _sobel,
    "Control Var. Random Uniform": lambda m, x, y, k: torch.rand(x.shape),
    "Control Var. Constant": _constant,
}
METHODS.update(CONTROLS)
#: Quantus's old method names and the names they stand for
DEPRECATED = {"GradCam": "LayerGradCam"}


def _layer(model: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """The Grad-CAM layer: ``gc_layer=`` or ``xai_lib_kwargs={"layer": ...}``, a module or Quantus's string.

    Quantus evaluates a string as Python (``"model._modules.get('conv_2')"``); camkit reads the
    module path from the forms ``model._modules.get('a')``, ``model._modules['a']``, ``model.a.b``
    and ``a.b`` instead, and refuses any other string.
    """
    layer = kwargs.get("gc_layer", dict(kwargs.get("xai_lib_kwargs") or {}).get("layer"))
    if layer is None:
        raise InvalidInputError('method="LayerGradCam" needs gc_layer= or xai_lib_kwargs={"layer": <the module>}')
    if not isinstance(layer, str):
        return layer
    text = layer.strip()
    match = re.fullmatch(r"model\._modules(?:\.get\(|\[)\s*['\"]([\w.]+)['\"]\s*[)\]]", text)
    path = match.group(1) if match else text.removeprefix("model.")
    try:
        if not re.fullmatch(r"[\w.]+", path):
            raise AttributeError(path)
        return model.get_submodule(path)
    except AttributeError:
        raise InvalidInputError(
            f"gc_layer {layer!r} names no submodule of the model: camkit reads 'model._modules.get(\"name\")', "
            "'model.a.b' or 'a.b' (it does not evaluate code); or pass the module itself"
        ) from None


def _gradcam(model: nn.Module, x: Tensor, y: Tensor, kwargs: dict[str, Any]) -> Tensor:
    raw = _raw(camkit.GradCAM(model, _layer(model, kwargs)), x, y)
    raw = raw[:, None] if raw.dim() == x.dim() - 1 else raw
    size = kwargs.get("interpolate")
    if isinstance(size, tuple):  # as captum's LayerAttribution.interpolate: nearest unless interpolate_mode
        raw = torch.nn.functional.interpolate(raw, size=size, mode=kwargs.get("interpolate_mode", "nearest"))
    return raw


class ReduceAxesError(InvalidInputError, AssertionError):
    """``reduce_axes`` names the batch axis or more axes than a sample has (an ``AssertionError`` too, as Quantus's)."""


def _reduce_axes(kwargs: dict[str, Any], ndim: int) -> tuple[int, ...]:
    axes = tuple(kwargs.get("reduce_axes", (1,)))
    if 0 in axes:
        raise ReduceAxesError("reduce_axes cannot include the batch axis 0")
    if len(axes) > ndim - 1:
        raise ReduceAxesError(f"reduce_axes {axes} names more axes than each sample has ({ndim - 1})")
    return axes


def _tensors(model: nn.Module, inputs: Any, targets: Any) -> tuple[Tensor, Tensor]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x = torch.as_tensor(np.asarray(inputs), dtype=model_dtype(model), device=device)
    return x, torch.as_tensor(np.asarray(targets), device=device).long().reshape(-1)


def _softmax_model(model: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """Quantus's ``softmax=`` of the explanation functions: the model with or without its softmax output."""
    if kwargs.get("softmax") is None:
        return model
    warnings.warn(
        "softmax was passed to the explanation function: make sure the method is meant for that output",
        UserWarning,
        stacklevel=3,
    )
    from .pytorch_model import PyTorchModel

    return PyTorchModel(model, softmax=bool(kwargs["softmax"])).get_softmax_arg_model()


def _captum_maps(model: nn.Module, x: Tensor, y: Tensor, method: str, kwargs: dict[str, Any]) -> Tensor:
    if method in CAPTUM_ROUTED:
        return captum_route(method, model, x, y, kwargs, _layer)
    flat = x.dim() < 3
    net = AddAxis(model) if flat else model
    xs = x[:, None] if flat else x
    maps = _gradcam(net, xs, y, kwargs) if method == "LayerGradCam" else METHODS[method](net, xs, y, kwargs)
    return maps[:, 0] if flat else maps


def generate_captum_explanation(model: nn.Module, inputs: Any, targets: Any, device: Any = None, **kwargs: Any) -> np.ndarray:
    """Quantus's captum branch: a numpy map per input, computed by camkit (see the module docstring).

    Example:
        >>> import numpy as np, torch
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> generate_captum_explanation(net, np.ones((3, 2, 1, 2)), np.array([0, 1, 0]), method="Saliency").shape
        (3, 1, 1, 2)
    """
    method = kwargs.get("method", "Gradient")
    if method in DEPRECATED:
        warnings.warn(f"method {method!r} is deprecated: use {DEPRECATED[method]!r}", UserWarning, stacklevel=2)
        method = DEPRECATED[method]
    known = sorted([*METHODS, "LayerGradCam", *CAPTUM_ROUTED])
    if method not in known:
        raise UnknownMethodError(
            f"camkit.compat.quantus's explain computes {known} (Quantus's captum branch); got method={method!r}. "
            "Use the original Quantus for the rest, or pass a camkit explainer as explain_func."
        )
    model = _softmax_model(model, kwargs)
    x, y = _tensors(model, inputs, targets)
    axes = _reduce_axes(kwargs, x.dim())
    out = _captum_maps(model, x, y, method, kwargs).detach().cpu().numpy()
    if axes and x.dim() >= 3:
        reduce = np.mean if method in CONTROLS else np.sum
        out = reduce(out, axis=axes, keepdims=kwargs.get("keepdims", True))
    return out


def generate_zennit_explanation(model: nn.Module, inputs: Any, targets: Any, device: Any = None, **kwargs: Any) -> np.ndarray:
    """Quantus's zennit branch (``attributor``, ``composite``, ``canonizer``), computed by camkit.

    The map is summed over ``reduce_axes`` (default ``(1,)``), as Quantus sums it.
    """
    model = _softmax_model(model, kwargs)
    x, y = _tensors(model, inputs, targets)
    axes = _reduce_axes(kwargs, x.dim())
    flat = x.dim() < 3
    maps = zennit_maps(AddAxis(model) if flat else model, x[:, None] if flat else x, y, kwargs)
    out = (maps[:, 0] if flat else maps).detach().cpu().numpy()
    return np.sum(out, axis=axes, keepdims=kwargs.get("keepdims", True))


def get_explanation(model: nn.Module, inputs: Any, targets: Any, **kwargs: Any) -> np.ndarray:
    """Quantus's ``get_explanation``: the captum branch, or the zennit branch with ``xai_lib="zennit"``."""
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"the model must be a torch.nn.Module; got {type(model).__name__}")
    xai_lib = kwargs.get("xai_lib", "captum")
    if xai_lib == "zennit":
        return generate_zennit_explanation(model, inputs, targets, **kwargs)
    if xai_lib != "captum":
        raise InvalidInputError(f"xai_lib {xai_lib!r}: camkit computes the captum and zennit branches of Quantus")
    return generate_captum_explanation(model, inputs, targets, **kwargs)


def explain(model: nn.Module, inputs: Any, targets: Any, **kwargs: Any) -> np.ndarray:
    """Quantus's ``explain``: a numpy map per input, computed by camkit (see the module docstring).

    Example:
        >>> import numpy as np, torch
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> explain(net, np.ones((3, 2, 1, 2)), np.array([0, 1, 0]), method="Saliency").shape
        (3, 1, 1, 2)
    """
    return get_explanation(model, inputs, targets, **kwargs)
