"""What every translated class shares: the legacy keywords, targets, and pytorch-grad-cam's map dressing.

pytorch-grad-cam finishes each layer's raw map as: ReLU, min-max normalisation, resize to the
input's size; it then averages the layers, applies the ReLU again and normalises once more.
:func:`dress_maps` does the same with camkit's own map functions, so maps agree with the
original's to float rounding; it decides flat maps at the layer's resolution (they come back as
zeros) and normalises without the original's ``1e-7`` in the denominator.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, InvalidTargetError
from ...functional.maps import flat_maps, normalize_maps, upsample_maps

__all__ = [
    "augmented",
    "camkit_target",
    "dress_maps",
    "layer_list",
    "model_device",
    "pop_legacy",
    "to_numpy",
]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); the CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def pop_legacy(kwargs: dict[str, Any], owner: str) -> dict[str, Any]:
    """Take the keywords older pytorch-grad-cam releases accepted out of ``kwargs``, each with a DeprecationWarning.

    ``use_cuda`` is dropped (the model's device decides), ``target_layer=m`` becomes
    ``target_layers=[m]`` and ``target_category=k`` becomes ``targets`` of class ``k``.
    Returns the translated keywords; anything else left in ``kwargs`` is an error.
    """
    out: dict[str, Any] = {}
    if "use_cuda" in kwargs:
        kwargs.pop("use_cuda")
        warnings.warn(
            f"{owner}(use_cuda=...) is ignored, as in pytorch-grad-cam since 1.4: the CAM runs on the model's "
            "device. Move the model with model.to(device) and drop use_cuda.",
            DeprecationWarning,
            stacklevel=3,
        )
    if "target_layer" in kwargs:
        layer = kwargs.pop("target_layer")
        warnings.warn(
            f"{owner}(target_layer=m) is the pre-1.3 spelling; pass target_layers=[m].",
            DeprecationWarning,
            stacklevel=3,
        )
        out["target_layers"] = layer if isinstance(layer, (list, tuple)) else [layer]
    if "target_category" in kwargs:
        category = kwargs.pop("target_category")
        warnings.warn(
            f"{owner}(..., target_category=k) is the pre-1.3 spelling; pass "
            "targets=[ClassifierOutputTarget(k) for each image].",
            DeprecationWarning,
            stacklevel=3,
        )
        out["target_category"] = category
    if kwargs:
        raise TypeError(f"{owner} got unexpected keyword arguments {sorted(kwargs)}")
    return out


def category_targets(category: Any, batch: int) -> list[Any] | None:
    """The targets a legacy ``target_category`` meant: one int for every image, or one per image."""
    from .utils.model_targets import ClassifierOutputTarget

    if category is None:
        return None
    if isinstance(category, (int, np.integer)):
        return [ClassifierOutputTarget(int(category)) for _ in range(batch)]
    return [ClassifierOutputTarget(int(c)) for c in category]


def layer_list(target_layers: Any) -> list[nn.Module]:
    """``target_layers`` as a list: pytorch-grad-cam iterates it, so one module is refused with the fix."""
    if isinstance(target_layers, nn.Module) and not isinstance(target_layers, (nn.ModuleList, nn.Sequential)):
        raise InvalidInputError(
            f"target_layers must be a list of modules, got one {type(target_layers).__name__}; pass [layer]."
        )
    return list(target_layers) if target_layers is not None else []


def camkit_target(targets: Sequence[Any] | None, batch: int) -> Any:
    """pytorch-grad-cam's per-image targets as a camkit target.

    ``None`` stays ``None`` (each image's top class). Class targets become their class indices;
    any other per-image callable ``t(output_i)`` becomes one callable on the batch's output that
    scores image ``i`` with ``targets[i]`` (the sum of what it returns, as the original's
    backward of ``sum(t(o) for ...)`` differentiates). A list whose length is not the batch's is
    refused: the original silently leaves the extra images with zero maps.
    """
    from .utils.model_targets import ClassifierOutputTarget

    if targets is None:
        return None
    targets = list(targets)
    if len(targets) != batch:
        raise InvalidTargetError(
            f"got {len(targets)} targets for a batch of {batch} images; pass one target per image "
            "(pytorch-grad-cam would leave the images without a target with a zero map)."
        )
    if all(type(t) is ClassifierOutputTarget for t in targets):
        return [int(t.category) for t in targets]
    fns: list[Callable[[Any], Tensor]] = targets

    def score(output: Any) -> Tensor:
        return torch.stack([torch.as_tensor(fn(row)).sum() for fn, row in zip(fns, output)])

    return score


def _finish(raw: Tensor, size: Sequence[int]) -> Tensor:
    """One layer's raw map [B, *s]: ReLU, flat maps to zero, min-max normalised, then resized to ``size``."""
    n = len(size)
    raw = raw.float().clamp_min(0)
    flat = flat_maps(raw, spatial_dims=n)
    normed, _ = normalize_maps(raw, spatial_dims=n)
    normed = normed.masked_fill(flat.view(*flat.shape, *(1,) * n), 0.0)
    return upsample_maps(normed, size)


def dress_maps(raws: Tensor | Sequence[Tensor], size: Sequence[int]) -> np.ndarray:
    """pytorch-grad-cam's finishing of per-layer raw maps, on camkit's map functions.

    Args:
        raws: one raw map [B, *s] per target layer (one tensor for a single layer).
        size: the input's spatial size ``(H, W)`` (or ``(D, H, W)``, ``(T,)``).

    Returns:
        float32 numpy [B, *size] in [0, 1].
    """
    layers = [raws] if isinstance(raws, Tensor) else list(raws)
    if layers[0].dim() == len(size) + 2:  # [B, K, *s]: one map per target, not a pytorch-grad-cam shape
        raise InvalidInputError(f"expected one raw map per image, got shape {list(layers[0].shape)}")
    return to_numpy(_dress(layers, size))


def _dress(layers: Sequence[Tensor], size: Sequence[int]) -> Tensor:
    """:func:`dress_maps` on tensors: the layers' finished maps averaged, the mean min-max scaled."""
    fused = torch.stack([_finish(raw, size) for raw in layers]).mean(dim=0)
    maps, _ = normalize_maps(fused.clamp_min(0), spatial_dims=len(size))
    return maps


def multiply_dressed(raws: Sequence[Tensor], size: Sequence[int]) -> np.ndarray:
    """pytorch-grad-cam's RefineCAM fusion: each layer's map dressed alone, their product min-max scaled.

    Each raw map [B, *s] is dressed as a one-layer CAM's (:func:`dress_maps`: ReLU, min-max
    scaled, resized, scaled again); the product over layers is min-max scaled per image.
    Returns float32 numpy [B, *size] in [0, 1].
    """
    product = torch.stack([_dress([raw], size) for raw in raws]).prod(dim=0)
    maps, _ = normalize_maps(product, spatial_dims=len(size))
    return to_numpy(maps)


def to_numpy(tensor: Tensor) -> np.ndarray:
    """A float32 numpy copy of ``tensor`` (on the host)."""
    return tensor.detach().to("cpu", torch.float32).numpy()


def augmented(forward: Callable[[Tensor], np.ndarray], x: Tensor, transforms: Any = None) -> np.ndarray:
    """The mean map over test-time augmentations, each mapped back onto the image (``aug_smooth=True``).

    The default augmentations are pytorch-grad-cam's: the image and its mirror image (last axis)
    times 0.9, 1 and 1.1. ``transforms``: a ``ttach.Compose`` (anything iterable whose items have
    ``augment_image`` and ``deaugment_mask``) replaces them.
    """
    cams: list[np.ndarray] = []
    if transforms is not None:
        for transform in transforms:
            mask = torch.from_numpy(forward(transform.augment_image(x)))
            cams.append(transform.deaugment_mask(mask[:, None])[:, 0].numpy())
        return np.mean(np.array(cams, dtype=np.float32), axis=0)
    for flip in (False, True):
        for factor in (0.9, 1.0, 1.1):
            image = x.flip(-1) if flip else x
            cam = forward(image * factor)
            cams.append(np.ascontiguousarray(cam[..., ::-1]) if flip else cam)
    return np.mean(np.array(cams, dtype=np.float32), axis=0)
