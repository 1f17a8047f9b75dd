"""Quantus's ``explain(model, inputs, targets, method=..., **kwargs)`` on camkit's explainers.

The gradient methods of Quantus's captum branch that camkit computes: ``"Saliency"`` (the
absolute gradient), ``"Gradient"`` (the signed gradient), ``"InputXGradient"``,
``"IntegratedGradients"`` (zero baseline or ``baseline=``, ten trapezoid points as Quantus
asks captum for), ``"GradientShap"`` (zero baseline or ``baseline=``) and ``"LayerGradCam"``
(``xai_lib_kwargs={"layer": module}``; its map on the layer's grid, as captum's). The map keeps
the input's shape, then is summed over ``reduce_axes`` (default ``(1,)``, the channels, kept as
an axis of one with ``keepdims=True``; ``()`` or inputs without a spatial axis: no sum).
Any other ``method`` (or ``xai_lib="zennit"``) raises a clear error: use the original Quantus.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import camkit
from camkit.errors import InvalidInputError

from .._base import AddAxis

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts written
# for Quantus (and its own tests) rely on.


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


def _gradcam(model: nn.Module, x: Tensor, y: Tensor, kwargs: dict[str, Any]) -> Tensor:
    layer = dict(kwargs.get("xai_lib_kwargs") or {}).get("layer")
    if layer is None:
        raise InvalidInputError('method="LayerGradCam" needs xai_lib_kwargs={"layer": <the module>}')
    raw = _raw(camkit.GradCAM(model, layer), x, y)
    return raw[:, None] if raw.dim() == x.dim() - 1 else raw


def explain(model: nn.Module, inputs: Any, targets: Any, **kwargs: Any) -> np.ndarray:
    """Quantus's ``explain``: a numpy map per input, computed by camkit (see the module docstring).

    Example:
        >>> import numpy as np, torch
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> explain(net, np.ones((3, 2, 1, 2)), np.array([0, 1, 0]), method="Saliency").shape
        (3, 1, 1, 2)
    """
    method = kwargs.get("method", "Gradient")
    if kwargs.get("xai_lib", "captum") != "captum" or (method not in METHODS and method != "LayerGradCam"):
        raise InvalidInputError(
            f"camkit.compat.quantus's explain computes {sorted([*METHODS, 'LayerGradCam'])} (Quantus's captum "
            f"branch); got xai_lib={kwargs.get('xai_lib', 'captum')!r}, method={method!r}. Use the original "
            "Quantus for the rest, or pass a camkit explainer as explain_func."
        )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x = torch.as_tensor(np.asarray(inputs), dtype=torch.float32, device=device)
    y = torch.as_tensor(np.asarray(targets), device=device).long().reshape(-1)
    flat = x.dim() < 3
    net = AddAxis(model) if flat else model
    xs = x[:, None] if flat else x
    maps = _gradcam(net, xs, y, kwargs) if method == "LayerGradCam" else METHODS[method](net, xs, y, kwargs)
    maps = maps[:, 0] if flat else maps
    out = maps.detach().cpu().numpy()
    axes = tuple(kwargs.get("reduce_axes", (1,)))
    if 0 in axes:
        raise InvalidInputError("reduce_axes cannot include the batch axis 0")
    if axes and out.ndim >= 3:
        out = out.sum(axis=axes, keepdims=kwargs.get("keepdims", True))
    return out
