"""The base classes of the explainers that read layers: :class:`CAMExplainer` (layers, grids,
the eigen-smooth option) and :class:`GradientCAM` (one backward to the layers, a map from
activations and gradients).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from ..._internal import syncs as _syncs
from ..._internal.checks import BATCH_SHAPES
from ..._internal.state import module_tree_version
from ...detection import narrowed_scores
from ...errors import CaptureWarning, InvalidInputError
from ...explanation import Explanation
from ...functional.concepts import channel_relevance
from ...functional.perturbation import eigen_projection
from ...hooks import HookScope, LayerCapture
from ...layers.auto import auto_layer, default_score
from ...layers.families.torchvision import transform_window
from ...layers.layout import conv_ranks, layer_grid, prefix_token_hint
from ...layers.names import LayerSpec
from ...layers.resolve import resolve_layers
from ...targets.classes import OutputSelector, Target, check_class_range, given_classes, select_output
from . import replay as _replay
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
        self._as_is: set[tuple[Any, ...]] = set()  # layer outputs read as channel-first maps (see to_grid)

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        """The resolved ``(name, module)`` pairs (the architecture's default, or auto-detected from ``x``)."""
        if self._layers is None:
            self._layers = resolve_layers(
                self.model, None, x, forward=self._call_model, score=self._dry_run_score(), plain_forward=self._call is None
            )
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
        size = x.shape[2:]
        version = module_tree_version()
        grids = []
        for (name, module), tensor in zip(self.layers(x), tensors):
            # A channel-first map is used as it is; that reading, once made for a layer, shape and input
            # size, is kept (it reads only the module's type and structure and the shapes).
            key = (name, tensor.shape, size, version)
            if self.reshape is None and key in self._as_is:
                grids.append(tensor)
                continue
            grid = layer_grid(
                name,
                module,
                tensor,
                tuple(int(side) for side in size),
                prefix_hint=self._prefix,
                conv_model=len(size) in self._conv_ranks,
                reshape=self.reshape,
                last_spatial=lambda: self._last_spatial(x),
            )
            if grid is tensor and self.reshape is None:
                if len(self._as_is) >= 64:
                    self._as_is.clear()
                self._as_is.add(key)
            grids.append(grid)
        return grids

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

    ``compile=True`` (opt-in, for repeated calls of one shape: audits, the explorer): on a CUDA
    device the whole call (the forward with the layer's activation kept, the target's score, the
    gradient at the layer, the weights, the map and its finishing) is captured once per input
    shape, target kind (top-1 or given classes) and set of weights as a CUDA graph and then
    replayed, which removes the kernel-launch cost that dominates small batches; maps equal the
    eager path's. A model whose forward reads values on the host (data-dependent control flow,
    ``.item()``, ``nonzero``) cannot be captured: a :class:`~camkit.CaptureWarning` says so once
    per shape and those calls run eagerly. Calls with a callable or [B, K] target, ``inputs=`` or
    ``kwargs=``, ``keep_mode=True``, and every call on another device, run eagerly too (on the
    CPU, ``torch.compile`` of this step was measured: minutes to compile for no gain). The
    replay runs the model as captured: hooks added to it afterwards do not run, and parameters
    replaced (not updated in place) start a new capture. At most four captures are kept.

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
        compile: bool = False,
    ) -> None:
        super().__init__(
            model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape, input_index=input_index,
            eigen_smooth=eigen_smooth,
        )
        if compile and type(self)._explain is not GradientCAM._explain:
            raise InvalidInputError(f"{type(self).__name__} has no compiled path; drop compile=True")
        self.compile = bool(compile)
        self._graphs = _replay.StepGraphs()
        self._classes_seen: dict[Hashable, int] = {}

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
        if self.compile:
            replayed = self._replayed(x, target)
            if replayed is not None:
                return replayed
        return self._explain_eager(x, target)

    def _replayed(self, x: Tensor, target: Target) -> Explanation | None:
        """The call replayed from the CUDA graph captured for its input's shape; ``None``: the eager path runs.

        Captured: a CUDA input with ``None``, an int or B class indices as the target, the model run
        as ``model(x)`` in eval mode. Anything else runs eagerly, as does a step whose capture failed
        (warned once per input shape).
        """
        if not _replay.can_capture(x.device) or self.keep_mode or self.record_relevance or self._call is not None:
            return None
        classes = None if target is None else given_classes(target, x.shape[0])
        if target is not None and (classes is None or classes.dim() != 1):
            return None  # a callable target, [B, K] classes, or a target the eager path refuses
        tensors = [*self.model.parameters(), *self.model.buffers()]
        if any(is_lazy(t) for t in tensors):
            return None  # a lazy module not yet run: its weights have no memory to key the capture on
        weights = tuple(t.data_ptr() for t in tensors)
        key = (tuple(x.shape), x.dtype, x.device, classes is None, weights)
        # Classes given on the host (ints, a list, a CPU tensor) are checked there, as on the eager path.
        on_device = isinstance(target, Tensor) and not _syncs.reads_are_free(target)
        host = None if classes is None or on_device else classes
        if classes is not None and classes.device != x.device:
            classes = _syncs.to_device(classes, x.device)
        inputs = (x,) if classes is None else (x, classes)
        tried = self._graphs.failed(key) is not None
        captured = self._graphs.get(key, lambda *static: self._step(key, *static), inputs)
        if captured is None:
            if not tried:
                warnings.warn(
                    f"{type(self).__name__}(compile=True) could not capture its call on {list(x.shape)} inputs as a CUDA "
                    f"graph ({self._graphs.failed(key)}); calls of that shape run eagerly. A model whose forward reads "
                    "values on the host (.item(), data-dependent control flow, nonzero) cannot be captured.",
                    CaptureWarning,
                    stacklevel=4,
                )
            return None
        if host is not None:
            check_class_range(host, self._classes_seen[key])
        maps, flat, scores, chosen, *raws = captured.run(*inputs)
        raw: Tensor | tuple[Tensor, ...] = raws[0] if len(raws) == 1 else tuple(raws)
        return Explanation(maps, raw, chosen, scores, flat, self.key, self._names())

    def _step(self, key: Hashable, x: Tensor, classes: Tensor | None = None) -> tuple[Tensor, ...]:
        """The eager call on static inputs, as the tensors a replay refreshes; records the class count."""
        def count(module: nn.Module, args: Any, out: Any) -> None:
            self._classes_seen[key] = select_output(out, self.output).shape[-1]

        with HookScope() as hooks:
            hooks.forward(self.model, count)
            explanation = self._explain_eager(x, classes)
        raws = explanation.raw if isinstance(explanation.raw, tuple) else (explanation.raw,)
        return (explanation.maps, explanation.flat, explanation.scores, cast(Tensor, explanation.target), *raws)

    def _explain_eager(self, x: Tensor, target: Target) -> Explanation:
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
