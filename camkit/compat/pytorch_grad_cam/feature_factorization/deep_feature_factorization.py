"""``DeepFeatureFactorization`` and ``run_dff_on_image`` on :class:`camkit.DeepFeatureFactorization`.

camkit factorises each image on its own; the original factorises a batch jointly, so its
concepts are shared by the batch. For one image (``run_dff_on_image``, the usual case) the
results have the original's shapes; for a batch, ``concepts`` is [B, C, n] and the concept
outputs [B, n, classes].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ....errors import InvalidInputError
from ....functional.cam_extra import nmf
from ....methods import DeepFeatureFactorization as _DFF
from .._support import to_numpy
from ..utils.image import create_labels_legend, show_factorization_on_image

__all__ = ["DeepFeatureFactorization", "dff", "run_dff_on_image"]


def dff(activations: np.ndarray, n_components: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Deep Feature Factorization of a batch's activations jointly, by :func:`camkit.functional.cam_extra.nmf`.

    Each channel's minimum over the batch is subtracted, the non-negative matrix [C, B*H*W]
    is factorised into ``n_components`` concepts, and the minimum is added back to the concepts.
    NaNs count as zeros. camkit's NMF starts deterministically (NNDSVDa), the original's from
    scikit-learn's seeded random start, so the two find factorisations of about the same error,
    not the same factors. The activations are not modified (the original zeroes their NaNs).

    Args:
        activations: [B, C, H, W].
        n_components: the number of concepts ``n``.

    Returns:
        ``(concepts, explanations)``: [C, n] and [B, n, H, W], in the activations' float dtype.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.feature_factorization.deep_feature_factorization import dff
        >>> concepts, maps = dff(np.random.default_rng(0).random((2, 6, 4, 4)), n_components=3)
        >>> concepts.shape, maps.shape
        ((6, 3), (2, 3, 4, 4))
    """
    arr = np.asarray(activations)
    if arr.ndim != 4:
        raise InvalidInputError(f"dff expects activations [B, C, H, W], got shape {arr.shape}")
    batch, channels, h, w = arr.shape
    x = torch.nan_to_num(torch.from_numpy(np.array(arr, dtype=np.float64)), nan=0.0)
    rows = x.transpose(0, 1).reshape(channels, -1)
    offset = rows.amin(dim=1, keepdim=True)
    concepts, explanations = nmf((rows - offset)[None], n_components)
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
    concepts_np = (concepts[0] + offset).numpy().astype(dtype)
    maps = explanations[0].reshape(n_components, batch, h, w).transpose(0, 1).numpy().astype(dtype)
    return concepts_np, maps


class DeepFeatureFactorization:
    """NMF of a layer's activations into ``n_components`` concepts, per image.

    Called as ``dff(input_tensor, n_components=16)``: ``(concepts, explanations)``, plus the
    concept outputs when ``computation_on_concepts`` (a classifier over concept vectors) is given.
    ``explanations`` is a list of float32 [n, H, W] arrays in [0, 1], one per image.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import DeepFeatureFactorization
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> concepts, maps = DeepFeatureFactorization(net, net[1])(torch.rand(1, 3, 8, 8), n_components=2)
        >>> concepts.shape, maps[0].shape
        ((4, 2), (2, 8, 8))
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module,
        reshape_transform: Callable[[Tensor], Tensor] | None = None,
        computation_on_concepts: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.model = model
        self.target_layer = target_layer
        self.reshape_transform = reshape_transform
        self.computation_on_concepts = computation_on_concepts

    def __call__(self, input_tensor: Tensor, n_components: int = 16) -> Any:
        head = self.computation_on_concepts or (lambda vectors: vectors)
        explainer = _DFF(self.model, [self.target_layer], concepts=n_components, head=head)
        if self.reshape_transform is not None:
            explainer.reshape = self.reshape_transform
        extras = explainer.explain(input_tensor, 0).extras
        maps = [to_numpy(m) for m in extras["concept_maps"]]
        concepts = to_numpy(extras["concepts"])
        single = input_tensor.shape[0] == 1
        concepts = concepts[0] if single else concepts
        if self.computation_on_concepts is None:
            return concepts, maps
        outputs = to_numpy(extras["concept_scores"])
        return concepts, maps, outputs[0] if single else outputs

    def __enter__(self) -> DeepFeatureFactorization:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def run_dff_on_image(
    model: nn.Module,
    target_layer: nn.Module,
    classifier: Callable[[Tensor], Tensor],
    img_pil: Any,
    img_tensor: Tensor,
    reshape_transform: Callable[[Tensor], Tensor] | None = None,
    n_components: int = 5,
    top_k: int = 2,
) -> np.ndarray:
    """The image beside its concept picture with a legend of each concept's ``top_k`` labels (uint8 RGB).

    ``model.config.id2label`` names the classes (Hugging Face models), as in the original.
    """
    dff = DeepFeatureFactorization(model, target_layer, reshape_transform, classifier)
    _, maps, outputs = dff(img_tensor[None], n_components)
    probabilities = torch.softmax(torch.from_numpy(outputs), dim=-1).numpy()
    names: dict[int, str] = model.config.id2label  # type: ignore[union-attr,assignment]
    labels = create_labels_legend(probabilities, labels=names, top_k=top_k)
    rgb = np.array(img_pil)
    picture = show_factorization_on_image(rgb / 255, maps[0], image_weight=0.3, concept_labels=labels)
    return np.hstack((rgb, picture))
