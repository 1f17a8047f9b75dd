"""Deep Feature Factorization (Collins et al. 2018): a layer's activations split into concepts."""

from __future__ import annotations

import colorsys
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Union

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, InvalidTargetError, LayerNotFoundError
from ...functional.cam_extra import nmf
from ...functional.maps import normalize_maps, upsample_maps
from ...io import to_uint8_rgb
from ...layers.names import LayerSpec
from ...layers.resolve import resolve_layers
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.forward import Captured, ForwardCAM, check_positive
from ..registry import register_method

__all__ = ["DeepFeatureFactorization", "factorization_image"]

Head = Union[str, nn.Module, Callable[[Tensor], Tensor], None]


@register_method("dff")
class DeepFeatureFactorization(ForwardCAM):
    """Deep Feature Factorization: non-negative factorisation of a layer's activations into concepts.

    Per image, the activations [C, *s] (any rank: ``t``; ``h, w``; ``d, h, w``) are read as a
    matrix ``A`` [C, prod(s)], shifted by each
    channel's minimum so that it is non-negative, and factorised as ``A ≈ W H`` with
    ``concepts`` components (:func:`camkit.functional.cam_extra.nmf`: deterministic, no
    random start). Column ``W[:, j]`` (plus the shift) is concept ``j``'s vector in the
    layer's channel space; row ``H[j]`` says where the concept is. Each image is factorised
    on its own, so a batch equals its images one by one (pytorch-grad-cam factorises the
    whole batch jointly, so an image's concepts there depend on the other images).

    The concepts are scored by ``head`` (the classifier applied to the concept vectors, as
    in the paper), and ``maps`` shows, per image and target class, the concept the head
    scores highest for that class. Everything else is in ``extras``: ``"concept_maps"``
    [B, concepts, *S] (each normalised to [0, 1], at the input's size: [B, concepts, T] for
    signals, [B, concepts, H, W] for images, [B, concepts, D, H, W] for volumes and videos),
    ``"concepts"`` [B, C, concepts], ``"concept_scores"`` [B, concepts, classes] and
    ``"chosen"`` (the concept index per image, [B] or [B, K]). :func:`factorization_image`
    colours the concept maps of one image (images only; a volume's maps can be coloured slice
    by slice, ``concept_maps[i, :, d]``).

    Args:
        model: the model to explain.
        layer: one layer with [B, C, *s] output (tokens and channel-last layers are laid out
            as for the other CAMs).
        concepts: number of concepts (at most ``min(C, prod(s))``, the channels and the
            positions; default 5).
        head: what scores a concept vector [n, C] -> [n, classes]: an ``nn.Module`` or its dotted
            name, or a callable; ``None`` finds the model's one ``nn.Linear`` with ``in_features == C``.
        iterations: factorisation rounds (default 200).
        call, output, keep_mode, input_index: see :class:`CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(6, 3))
        >>> e = camkit.DeepFeatureFactorization(net, "1", concepts=3).explain(torch.rand(2, 3, 8, 8))
        >>> tuple(e.maps.shape), tuple(e.extras["concept_maps"].shape), tuple(e.extras["concept_scores"].shape)
        ((2, 8, 8), (2, 3, 8, 8), (2, 3, 3))
    """

    cost: ClassVar[str] = "1 forward (no autograd) + a non-negative factorisation (iterations x small matrix products)"
    use_when: ClassVar[str] = (
        "You want to see which parts of the image the layer groups together (concepts) and what each one votes for."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        concepts: int = 5,
        head: Head = None,
        iterations: int = 200,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index)
        self.concepts = check_positive("concepts", concepts)
        self.iterations = check_positive("iterations", iterations)
        if isinstance(head, str):
            head = resolve_layers(self.model, head)[0][1]
        if head is not None and not callable(head):
            raise InvalidInputError(f"head must be a module, its name or a callable, got {type(head).__name__}")
        self.head = head

    def _head(self, channels: int) -> Callable[[Tensor], Tensor]:
        if self.head is not None:
            return self.head
        found = [m for m in self.model.modules() if isinstance(m, nn.Linear) and m.in_features == channels]
        if len(found) != 1:
            raise LayerNotFoundError(
                f"Deep Feature Factorization scores its concepts with the classifier reading the layer's "
                f"{channels} channels, and found {len(found)} nn.Linear with in_features={channels}; pass head= "
                "(a module, its dotted name, or a callable [n, C] -> [n, classes])."
            )
        return found[0]

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        if len(self.layers()) != 1:
            raise InvalidInputError("Deep Feature Factorization explains one layer at a time; pass a single layer")
        if cap.classes is None:
            raise InvalidTargetError(
                "Deep Feature Factorization picks the concept its head scores highest for a class; pass class "
                "targets (None, ints or a LongTensor), not a callable."
            )
        b, c, *grid = act.shape
        positions = math.prod(grid)
        if not self.concepts <= min(c, positions):
            raise InvalidInputError(
                f"concepts={self.concepts} is more than the layer allows: min(channels, positions) = {min(c, positions)}"
            )
        matrix = act.float().reshape(b, c, positions)
        shift = matrix.amin(dim=2, keepdim=True)
        weights, where = nmf(matrix - shift, self.concepts, self.iterations)
        vectors = weights + shift  # [B, C, r]
        with torch.no_grad():
            scores = self._head(c)(vectors.transpose(1, 2).reshape(b * self.concepts, c)).float()
        scores = scores.reshape(b, self.concepts, -1)
        classes = cap.classes if cap.multi else cap.classes[:, None]  # [B, K]
        if int(classes.max()) >= scores.shape[2]:
            raise InvalidTargetError(
                f"target class {int(classes.max())} is out of range for the head's {scores.shape[2]} outputs"
            )
        chosen = scores.gather(2, classes[:, None, :].expand(-1, self.concepts, -1)).argmax(dim=1)  # [B, K]
        concept_maps = where.reshape(b, self.concepts, *grid)
        raw = concept_maps.gather(1, chosen.view(*chosen.shape, *(1,) * len(grid)).expand(-1, -1, *grid))
        size = tuple(x.shape[2:])
        extras["concept_maps"] = normalize_maps(upsample_maps(concept_maps, size), spatial_dims=len(size))[0]
        extras["concepts"] = vectors
        extras["concept_scores"] = scores
        extras["chosen"] = chosen if cap.multi else chosen[:, 0]
        return raw if cap.multi else raw[:, 0]


def concept_colors(count: int) -> Tensor:
    """``count`` fully saturated colours with hues evenly spaced around the circle, RGB in [0, 1], [count, 3].

    Example:
        >>> from camkit.methods.cam.dff import concept_colors
        >>> concept_colors(3).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    return torch.tensor([colorsys.hsv_to_rgb(i / count, 1.0, 1.0) for i in range(count)], dtype=torch.float32)


def factorization_image(
    image: Any,
    concept_maps: Tensor | np.ndarray,
    colors: Sequence[Sequence[float]] | Tensor | None = None,
    image_weight: float = 0.5,
) -> np.ndarray:
    """Colour each pixel by the concept that is strongest there, brighter where it is stronger.

    ``out = round(255 * (image_weight * image + (1 - image_weight) * v * colour[j]))`` with
    ``j`` the concept with the largest map value ``v`` at the pixel (first one on ties), the
    image in [0, 1]. The inputs are not modified (pytorch-grad-cam's
    ``show_factorization_on_image`` zeroes the losing pixels of the maps it is given).

    Args:
        image: uint8 [H, W, 3] array, PIL image, or float tensor [3, H, W] in [0, 1].
        concept_maps: [n, H, W] in [0, 1], e.g. ``explanation.extras["concept_maps"][i]``.
        colors: n RGB colours in [0, 1]; default :func:`concept_colors`.
        image_weight: the image's share in [0, 1].

    Returns:
        A new uint8 RGB array [H, W, 3].

    Example:
        >>> import numpy as np
        >>> import torch
        >>> from camkit import factorization_image
        >>> maps = torch.tensor([[[1.0, 0.2]], [[0.5, 0.4]]])  # 2 concepts on a 1x2 image
        >>> factorization_image(np.zeros((1, 2, 3), np.uint8), maps, image_weight=0.0).tolist()
        [[[255, 0, 0], [0, 102, 102]]]
    """
    if not 0.0 <= image_weight <= 1.0:
        raise InvalidInputError(f"image_weight must be in [0, 1], got {image_weight}")
    base = torch.from_numpy(to_uint8_rgb(image)).float() / 255
    maps = torch.as_tensor(concept_maps).detach().float().cpu()
    if maps.dim() != 3 or tuple(maps.shape[1:]) != tuple(base.shape[:2]):
        raise InvalidInputError(
            f"concept_maps must be [n, H, W] with the image's size {tuple(base.shape[:2])}, got {list(maps.shape)}; "
            "pass one image's maps, e.g. explanation.extras['concept_maps'][i]"
        )
    palette = concept_colors(maps.shape[0]) if colors is None else torch.as_tensor(colors, dtype=torch.float32)[:, :3]
    if palette.shape[0] != maps.shape[0]:
        raise InvalidInputError(f"need one colour per concept ({maps.shape[0]}), got {palette.shape[0]}")
    value, winner = maps.max(dim=0)
    paint = palette[winner] * value[:, :, None]
    out = image_weight * base + (1 - image_weight) * paint
    return (out.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
