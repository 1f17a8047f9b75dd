"""The base classes of the explainers that read layers: :class:`CAMExplainer` (layers, grids,
the eigen-smooth option) and :class:`GradientCAM` (one backward to the layers, a map from
activations and gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from ..._internal import syncs as _syncs
from ..._internal.checks import BATCH_SHAPES
from ...detection import narrowed_scores
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.concepts import channel_relevance
from ...functional.perturbation import eigen_projection
from ...hooks import LayerCapture
from ...layers.auto import auto_layer, default_score
from ...layers.families.torchvision import transform_window
from ...layers.layout import conv_ranks, layer_grid, prefix_token_hint
from ...layers.names import LayerSpec
from ...layers.resolve import resolve_layers
from ...targets.classes import OutputSelector, Target, select_output
from .binding import InputIndex
from .explainer import Explainer
from .output import make_explanation

__all__ = ["CAMExplainer", "GradientCAM", "Reshape"]

Reshape = Callable[[Tensor], Tensor]


class CAMExplainer(Explainer):
    """An explainer that reads one or several layers' activations.

    Args:
        model: the model to explain.
        layer: a dotted name, a module, or a list of them; ``None``: the architecture's
            default (:func:`camkit.layers.defaults.default_layer`), else the last layer that
            qualifies as a CAM layer for the first input (:func:`camkit.layers.auto_layer`:
            found by a dry run on the first call, then kept).
        call: for a module that runs several times in one forward, which call to use
            (``-1``: the last, the default; ``0``: the first).
        reshape: a callable turning the layer's output (and its gradient) into
            [B, C, h, w]; it overrides the automatic handling of tokens and channel-last
            maps (see :meth:`to_grid`).
        eigen_smooth: replace the channel sum of the method's weighted activations by their
            projection on the first principal component (then the ReLU), as
            pytorch-grad-cam's ``eigen_smooth=True``: less noisy maps. Methods whose map is
            not a channel sum (EigenCAM itself, the class activation of ``CAM``) refuse it.
        output: see :class:`Explainer`.
        keep_mode: see :class:`Explainer`.
        input_index: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> explainer = camkit.GradCAM(net)  # a CAMExplainer; layer=None: found by a dry run
        >>> explainer.layers(torch.rand(1, 3, 8, 8))[0][0]
        '1'
    """

    family: ClassVar[str | None] = "CAM"

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Reshape | None = None,
        input_index: InputIndex = 0,
        eigen_smooth: bool = False,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if reshape is not None and not callable(reshape):
            raise TypeError(f"reshape must be a callable f(tensor) -> Tensor[B, C, h, w], got {type(reshape).__name__}")
        if isinstance(call, bool) or not isinstance(call, int):
            raise TypeError(f"call must be an int (-1: the layer's last call in the forward), got {call!r}")
        self.layer = layer
        self.call = call
        self.reshape = reshape
        self.eigen_smooth = bool(eigen_smooth)
        self._prefix = prefix_token_hint(self.model)
        self._conv_ranks = conv_ranks(self.model)
        self._layers: list[tuple[str, nn.Module]] | None = (
            None if layer is None else resolve_layers(self.model, layer)
        )

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        """The resolved ``(name, module)`` pairs (the architecture's default, or auto-detected from ``x``)."""
        if self._layers is None:
            self._layers = resolve_layers(self.model, None, x, forward=self._call_model, score=self._dry_run_score())
        return self._layers

    def _dry_run_score(self) -> Callable[[Any], Tensor] | None:
        if self.output is None:
            return None
        selector = self.output
        return lambda out: default_score(select_output(out, selector))

    def to_grid(self, tensors: Sequence[Tensor], x: Tensor) -> list[Tensor]:
        """Bring each layer's output (or gradient) to a channel-first grid [B, C, *s].

        The grid has one axis per spatial axis of ``x``: [B, C, h, w] for an image, [B, C, t]
        for a signal, [B, C, d, h, w] for a volume or a video.

        ``reshape=`` when given; otherwise :func:`camkit.layers.layout.layer_grid`: tokens [B, N, D]
        lose their prefix tokens and go onto the grid inferred from N and ``x``'s aspect
        ratio (prefix count taken from the model when it says); maps are read as
        channel-first or channel-last from their shape, and only when both fit, from the
        layer's type (on a signal or a volume, the layer's type first, and channel-first for
        any layer of a plain convolutional network: :func:`camkit.layers.layout.conv_ranks`);
        an ambiguous layout or a ``1 x 1`` grid raises. Methods built on
        activations call this before the CAM math.
        """
        size = tuple(int(side) for side in x.shape[2:])
        return [
            layer_grid(
                name,
                module,
                tensor,
                size,
                prefix_hint=self._prefix,
                conv_model=len(size) in self._conv_ranks,
                reshape=self.reshape,
                last_spatial=lambda: self._last_spatial(x),
            )
            for (name, module), tensor in zip(self.layers(x), tensors)
        ]

    def _last_spatial(self, x: Tensor) -> str | None:
        try:
            return auto_layer(self.model, x, forward=self._call_model, score=self._dry_run_score())[0]
        except Exception:  # only words an error message; the error being raised matters more
            return None

    def _reduce(self, contributions: Tensor) -> Tensor:
        """Raw map from per-channel contributions [B, C, h, w]: ReLU of their channel sum, or of
        their first principal component with ``eigen_smooth``."""
        if self.eigen_smooth:
            return eigen_projection(contributions, exact=_syncs.reads_are_free(contributions)).clamp_min(0)
        return contributions.sum(dim=1).clamp_min(0)

    def _refuse_eigen_smooth(self) -> None:
        if self.eigen_smooth:
            raise InvalidInputError(
                f"{type(self).__name__} does not compute a channel sum, so eigen_smooth=True has no meaning for it; "
                "drop it (EigenCAM is the principal component of the activations already)."
            )

    def _names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.layers())

    def _window(self, x: Tensor) -> tuple[int, int, int, int] | None:
        """Where ``x`` lies in what the layers saw, for models that resize it inside (torchvision's detectors)."""
        return transform_window(self.model, x)

    def __repr__(self) -> str:
        layers = [n for n, _ in self._layers] if self._layers is not None else "auto"
        return f"{type(self).__name__}(model={type(self.model).__name__}, layer={layers})"


class GradientCAM(CAMExplainer):
    """Base of the CAMs computed from a layer's activations and gradients.

    A call costs one forward pass plus a backward pass through only the layers after the
    target layer: autograd is off until the target layer returns (see
    :class:`camkit.hooks.LayerCapture`), no parameter gradient is computed, and
    ``param.grad`` is never touched. On an R-CNN detector with a
    :class:`~camkit.DetectionTarget`, the graph after the layer holds only the picked
    detections' proposals (the ROI heads run without autograd, then again for those
    proposals alone); on an ultralytics detector, only the class branch at the picked
    candidates (run again on the few rows and columns around each); on torchvision's RetinaNet,
    FCOS, SSD and SSDlite, only the class branch of the level that holds each picked detection's
    anchor (on the window around it, or the level's whole map where a group norm spans it): the
    same score and gradient. Subclasses implement :meth:`raw_map`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> class GradientNormCAM(camkit.GradientCAM):  # a toy CAM: the gradient's L2 norm over channels
        ...     def raw_map(self, acts, grads):
        ...         return grads.norm(dim=1)
        >>> GradientNormCAM(net, "1")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    family: ClassVar[str | None] = "CAM (gradient)"
    #: When True, ``extras["channel_relevance"]`` holds each channel's relevance at the (first)
    #: layer from the same pass: ``A * dS/dA`` summed over positions, float32 [B, C] ([B, K, C] for
    #: [B, K] targets), what :meth:`camkit.ConceptRelevance.relevance` gives with its gradient rule.
    #: Audits set it to cluster concept vectors at no extra pass.
    record_relevance: bool = False

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        """The raw map [B, h, w] from float32 activations and gradients [B, C, h, w].

        The default is the ReLU of the channel sum of :meth:`contributions` (or of their first
        principal component with ``eigen_smooth=True``); a method overrides one or the other.
        """
        contributions = self.contributions(acts, grads)
        if contributions is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither raw_map nor contributions")
        return self._reduce(contributions)

    def contributions(self, acts: Tensor, grads: Tensor) -> Tensor | None:
        """Per-channel contributions [B, C, h, w] whose channel sum is the map (before the ReLU).

        ``None`` for a method whose map is not such a sum; it then refuses ``eigen_smooth``.
        """
        return None

    def _raw(self, acts: Tensor, grads: Tensor) -> Tensor:
        if not self.eigen_smooth:
            return self.raw_map(acts, grads)
        contributions = self.contributions(acts, grads)
        if contributions is None:
            self._refuse_eigen_smooth()
        return self._reduce(cast(Tensor, contributions))

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layers = self.layers(x)
        names = [name for name, _ in layers]
        with (
            LayerCapture(layers, gradients=True, call=self.call) as capture,
            narrowed_scores(self.model, target, names, self.output) as (narrow, unreached_zero),
        ):
            classes, scores = self._target_scores(x, target)
            scores = narrow(scores)
            columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
            acts = self.to_grid([a.detach().float() for a in capture.activations()], x)
            per_layer: list[list[Tensor]] = [[] for _ in layers]
            relevance: list[Tensor] = []
            for k, column in enumerate(columns):
                last = k == len(columns) - 1
                grads = self.to_grid(capture.gradients(column, retain_graph=not last, unreached_zero=unreached_zero), x)
                with torch.no_grad():
                    for maps, act, grad in zip(per_layer, acts, grads):
                        maps.append(self._raw(act, self._check_grad(grad, x).float()))
                    if self.record_relevance:
                        relevance.append(channel_relevance(acts[0] * grads[0].float()))
        multi = scores.dim() == 2
        raws = [torch.stack(m, dim=1) if multi else m[0] for m in per_layer]
        extras = {"channel_relevance": torch.stack(relevance, dim=1) if multi else relevance[0]} if relevance else {}
        return self._explanation(raws, x, classes, scores.detach(), **extras)

    @staticmethod
    def _check_grad(grad: Tensor, x: Tensor) -> Tensor:
        if grad.dim() != x.dim():
            raise InvalidInputError(
                f"the target layer's output has shape {list(grad.shape)}; CAMs of a {list(x.shape)} input need "
                f"{BATCH_SHAPES[x.dim()].replace('[B, C', '[B, K')} activations. Pick a convolutional layer (see "
                "camkit.list_layers(model, x))."
            )
        return grad

    def _explanation(
        self, raws: list[Tensor], x: Tensor, classes: Tensor | None, scores: Tensor, **extras: Any
    ) -> Explanation:
        return make_explanation(self.key, raws, x, classes, scores, self._names(), window=self._window(x), **extras)
