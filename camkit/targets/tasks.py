"""Targets beyond class logits: segmentation, similarity, regression, binary and detection scores.

Each helper is a small callable object ``target(output) -> Tensor[B]`` to pass as
``target=`` to any explainer. They compute batched scores on the output's device, keep the
autograd graph, and check shapes with errors that say what was expected.

==========================  ===============================================================
helper                      score of sample ``b``
==========================  ===============================================================
:class:`SegmentationTarget`  ``sum_hw mask[b] * logits[b, class]`` (over every spatial axis of
                             [B, K, T], [B, K, H, W] or [B, K, D, H, W]); the mask defaults to
                             the pixels predicted as that class (``argmax == class``)
:class:`SimilarityTarget`    ``cos(embedding[b], reference[b])``
:class:`RegressionTarget`    ``output[b, index]`` (``-output[b, index]`` with ``negate``)
:class:`BinaryTarget`        ``z[b]`` for the positive class, ``-z[b]`` for the negative one
:class:`DetectionTarget`     the score of the detection best matching a reference box (IoU);
                             in :mod:`camkit.detection`, re-exported here
==========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._internal.checks import per_sample as _per_sample
from ..detection.outputs import box_iou
from ..detection.target import DetectionTarget
from ..errors import InvalidTargetError, OutputSelectionError

__all__ = [
    "BinaryTarget", "DetectionTarget", "RegressionTarget", "SegmentationTarget", "SimilarityTarget", "box_iou",
]  # fmt: skip

#: Segmentation logits by their number of dimensions, and the spatial axes of their masks.
_LOGITS = {3: "[B, K, T]", 4: "[B, K, H, W]", 5: "[B, K, D, H, W]"}
_MASK_AXES = {1: "T", 2: "H, W", 3: "D, H, W"}
_KINDS = {1: "a signal", 2: "an image", 3: "a volume or video"}
_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _tensor(output: Any, what: str) -> Tensor:
    if not isinstance(output, Tensor):
        raise OutputSelectionError(
            f"{what} needs a tensor output, got {type(output).__name__}; pass output= to the explainer "
            "to select it (a dict key, tuple index, attribute name or callable)."
        )
    return output


class SegmentationTarget:
    """A class's logits summed over a mask: explain a segmentation.

    Args:
        category: the class index, one for all samples or one per sample.
        mask: one mask for all samples or one per sample, of the output's rank and size
            (bool or float weights): [T] or [B, T] for a signal's logits [B, K, T], [H, W]
            or [B, H, W] for an image's [B, K, H, W], [D, H, W] or [B, D, H, W] for a
            volume's or video's [B, K, D, H, W]. A mask of another rank (an image's
            [H, W] for a volume) raises :class:`~camkit.errors.InvalidTargetError`.
            ``None`` uses the positions each sample predicts as ``category`` (a sample
            with no such position scores 0 and gets a flat map).

    Accepts the output [B, K, *S], a dict holding it under ``"out"`` as torchvision's
    FCN / DeepLabV3 return (MONAI's UNet and SegResNet return the tensor itself), or a
    Hugging Face output holding it as ``logits`` (SegFormer's ``SemanticSegmenterOutput``).

    Logits coarser than the image (SegFormer's are at a quarter of its size): a mask larger
    than the logits on every axis (one drawn on the image) is applied to the logits
    upsampled to the mask's size (linear, bilinear or trilinear, ``align_corners=False``,
    as Hugging Face's post-processing upsamples them), so the score is the class's
    logits summed over the mask's pixels. A mask of the logits' own size is used as it is.

    Example:
        >>> import torch
        >>> from camkit import SegmentationTarget
        >>> logits = torch.tensor([[[[1.0, 3.0]], [[2.0, 0.0]]]])  # B=1, K=2, H=1, W=2
        >>> SegmentationTarget(1)(logits)                           # class 1 wins pixel 0 only
        tensor([2.])
        >>> SegmentationTarget(0, mask=torch.tensor([[1.0, 1.0]]))({"out": logits})
        tensor([4.])
        >>> volume = torch.zeros(1, 2, 2, 2, 2); volume[:, 1, 0] = 1.0  # class 1 wins the first slice
        >>> SegmentationTarget(1)(volume), SegmentationTarget(1, mask=torch.ones(2, 2, 2))(volume)
        (tensor([4.]), tensor([4.]))
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(self, category: int | Sequence[int] | Tensor, mask: Tensor | None = None) -> None:
        self.category = category
        self.mask = mask

    def __repr__(self) -> str:
        return f"SegmentationTarget(category={self.category!r}, mask={'given' if self.mask is not None else 'predicted'})"

    def __call__(self, output: Any) -> Tensor:
        if isinstance(output, Mapping) and "out" in output:
            output = output["out"]
        elif isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
            output = output["logits"]  # a Hugging Face ModelOutput (SegFormer)
        logits = _tensor(output, "SegmentationTarget")
        if logits.dim() not in _LOGITS:
            raise InvalidTargetError(
                f"SegmentationTarget needs logits [B, K, *S]: [B, K, T], [B, K, H, W] or [B, K, D, H, W], "
                f"got shape {list(logits.shape)}"
            )
        batch, classes, *spatial = logits.shape
        n = len(spatial)
        if isinstance(self.mask, Tensor) and self.mask.dim() in (n, n + 1) and all(
            m > s for m, s in zip(self.mask.shape[self.mask.dim() - n :], spatial)
        ):  # a mask drawn on the image, for logits at a coarser resolution: upsample the logits
            spatial = list(self.mask.shape[self.mask.dim() - n :])
            logits = F.interpolate(logits, size=spatial, mode=_MODES[n], align_corners=False)
        category = _per_sample(self.category, batch, logits.device, "category")
        if category.device.type == "cpu" and category.numel() and not 0 <= int(category.min()) <= int(category.max()) < classes:
            raise InvalidTargetError(f"category {self.category} is out of range for {classes} classes")
        picked = logits.gather(1, category.view(batch, 1, *(1,) * n).expand(batch, 1, *spatial))[:, 0]
        if self.mask is None:
            weight = (logits.detach().argmax(dim=1) == category.view(batch, *(1,) * n)).to(picked.dtype)
        else:
            weight = self._weight(batch, spatial, logits.device).to(picked.dtype)
        return (picked * weight).sum(dim=tuple(range(-n, 0)))

    def _weight(self, batch: int, spatial: list[int], device: torch.device) -> Tensor:
        """The given mask, checked against the output's batch, rank and spatial size."""
        mask, n = self.mask, len(spatial)
        if not isinstance(mask, Tensor) or not (
            mask.dim() in (n, n + 1)
            and tuple(mask.shape[mask.dim() - n :]) == tuple(spatial)
            and (mask.dim() == n or mask.shape[0] == batch)
        ):
            got = f"shape {list(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            axes = _MASK_AXES[n]
            raise InvalidTargetError(
                f"mask must be [{axes}] or [B, {axes}] = {[batch, *spatial]} (the output's size: logits "
                f"{_LOGITS[n + 2]} of {_KINDS[n]}), got {got}"
            )
        return mask.to(device=device)


class SimilarityTarget:
    """Cosine similarity of each embedding to a reference embedding.

    Args:
        reference: [D] (one reference for all samples) or [B, D]. Outputs [B, D, ...] are
            flattened to [B, D * ...] first, and the reference must match that size.

    Example:
        >>> import torch
        >>> from camkit import SimilarityTarget
        >>> SimilarityTarget(torch.tensor([1.0, 0.0]))(torch.tensor([[3.0, 4.0], [0.0, 2.0]]))
        tensor([0.6000, 0.0000])
    """

    def __init__(self, reference: Tensor) -> None:
        if not isinstance(reference, Tensor) or reference.dim() not in (1, 2):
            got = list(reference.shape) if isinstance(reference, Tensor) else type(reference).__name__
            raise InvalidTargetError(f"reference must be a tensor [D] or [B, D], got {got}")
        self.reference = reference.detach()

    def __repr__(self) -> str:
        return f"SimilarityTarget(reference={list(self.reference.shape)})"

    def __call__(self, output: Any) -> Tensor:
        embedding = _tensor(output, "SimilarityTarget").flatten(1)
        reference = self.reference.to(device=embedding.device, dtype=embedding.dtype)
        if reference.shape[-1] != embedding.shape[1] or (reference.dim() == 2 and reference.shape[0] != embedding.shape[0]):
            raise InvalidTargetError(
                f"reference has shape {list(reference.shape)} but the embeddings are {list(embedding.shape)}; "
                "give [D] or [B, D] with the same D."
            )
        return F.cosine_similarity(embedding, reference.expand_as(embedding), dim=1)


class RegressionTarget:
    """One unit of a regression output (or its negative: what lowers the prediction).

    Args:
        index: the unit: an int for [B, U] outputs, a tuple for [B, ...] outputs, ``None``
            for a [B] or [B, 1] output.
        negate: score ``-output`` instead, to see what pushes the value down.

    Example:
        >>> import torch
        >>> from camkit import RegressionTarget
        >>> out = torch.tensor([[0.5, 2.0], [1.5, -1.0]])
        >>> RegressionTarget(1)(out), RegressionTarget(0, negate=True)(out)
        (tensor([ 2., -1.]), tensor([-0.5000, -1.5000]))
    """

    def __init__(self, index: int | tuple[int, ...] | None = None, *, negate: bool = False) -> None:
        self.index = index
        self.negate = negate

    def __repr__(self) -> str:
        return f"RegressionTarget(index={self.index!r}, negate={self.negate})"

    def __call__(self, output: Any) -> Tensor:
        values = _tensor(output, "RegressionTarget")
        if self.index is None:
            if values.dim() == 2 and values.shape[1] == 1:
                values = values[:, 0]
            if values.dim() != 1:
                raise InvalidTargetError(
                    f"RegressionTarget() without index needs a [B] or [B, 1] output, got {list(values.shape)}; "
                    "pass index= the unit to explain."
                )
            picked = values
        else:
            index = (self.index,) if isinstance(self.index, int) else tuple(self.index)
            if values.dim() != 1 + len(index):
                raise InvalidTargetError(
                    f"index {self.index!r} needs an output with {1 + len(index)} dimensions, got {list(values.shape)}"
                )
            for i, size in zip(index, values.shape[1:]):
                if not -size <= i < size:
                    raise InvalidTargetError(f"index {self.index!r} is out of range for output {list(values.shape)}")
            key: tuple[slice | int, ...] = (slice(None), *index)
            picked = values[key]
        return -picked if self.negate else picked


class BinaryTarget:
    """A binary classifier with a single logit ``z``: ``z`` for the positive class, ``-z`` for the negative.

    ``-z`` is the negative class's log-odds, ``log(p(neg) / p(pos))`` with ``p(pos) = sigmoid(z)``.

    Args:
        positive: explain the positive class (True) or the negative class (False).

    Example:
        >>> import torch
        >>> from camkit import BinaryTarget
        >>> BinaryTarget()(torch.tensor([[2.0], [-1.0]])), BinaryTarget(positive=False)(torch.tensor([2.0, -1.0]))
        (tensor([ 2., -1.]), tensor([-2.,  1.]))
    """

    def __init__(self, positive: bool = True) -> None:
        self.positive = positive

    def __repr__(self) -> str:
        return f"BinaryTarget(positive={self.positive})"

    def __call__(self, output: Any) -> Tensor:
        logit = _tensor(output, "BinaryTarget")
        if logit.dim() == 2 and logit.shape[1] == 1:
            logit = logit[:, 0]
        if logit.dim() != 1:
            raise InvalidTargetError(
                f"BinaryTarget needs a single logit per sample ([B] or [B, 1]), got {list(logit.shape)}; "
                "for two or more logits use a class index as target."
            )
        return logit if self.positive else -logit
