"""Thin explainer base classes: input checks, model-state hygiene, the output contract.

The math lives in :mod:`camkit.functional`; hook handling in :mod:`camkit.hooks`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from .._internal import syncs as _syncs
from .._internal.checks import BATCH_SHAPES, check_finite, check_input_batch, check_model_takes
from .._internal.state import eval_mode, preserve_running_stats
from ..detection import default_output, narrowed_scores
from ..errors import CamkitWarning, InferenceModeError, InvalidInputError
from ..explanation import Explanation
from ..functional.concepts import channel_relevance
from ..functional.perturbation import eigen_projection
from ..hooks import LayerCapture
from ..layers.auto import auto_layer, default_score
from ..layers.defaults import unwrap_model
from ..layers.families import check_frames_order
from ..layers.families.torchvision import transform_window
from ..layers.layout import conv_ranks, layer_grid, prefix_token_hint
from ..layers.names import LayerSpec
from ..layers.resolve import resolve_layers
from ..targets.classes import OutputSelector, Target, resolve_target, select_output
from ..targets.neuron import bind_target
from ._binding import Call, InputIndex, bind_inputs, bound, current_call, run_model
from ._output import finish_maps, make_explanation
from ._placement import Placement

__all__ = ["CAMExplainer", "Explainer", "GradientCAM", "Reshape", "finish_maps", "make_explanation"]

Reshape = Callable[[Tensor], Tensor]


def _model_dtype(model: nn.Module) -> torch.dtype | None:
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    for buffer in model.buffers():
        if buffer.is_floating_point():
            return buffer.dtype
    return None


class Explainer:
    """Base class of every camkit explainer.

    Args:
        model: any ``nn.Module``; it is never modified. Each call runs it in eval mode and
            restores every module's ``training`` flag afterwards. ``DataParallel`` /
            ``DistributedDataParallel`` and ``torch.compile`` wrappers are looked through:
            the eager module inside is run (hooks added after compiling are not traced by
            the compiled graph); ``self.model`` is that module, ``self.wrapped_model`` what
            was passed.
        output: what to score when the model does not return a tensor: a tuple index, a
            dict key or attribute name (``"logits"``), or a callable.
        keep_mode: run the model in the caller's modes instead of eval mode. A model in
            ``train()`` then uses batch statistics in its BatchNorm layers, as in training, but
            their running statistics are put back after the call: explaining never changes
            the model.
        input_index: for models that take several inputs, where the explained image goes:
            a position in ``explain(..., inputs=...)`` or a keyword name (the image is then
            passed as ``model(*inputs, **{input_index: x}, **kwargs)``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> class Brightness(camkit.Explainer):  # a toy method: the map is the image's mean channel
        ...     needs_grad = False
        ...     def _explain(self, x, target):
        ...         raw = x.mean(dim=1)
        ...         maps, flat = camkit.methods.base.finish_maps([raw], tuple(x.shape[-2:]))
        ...         return camkit.Explanation(maps, raw, None, x.new_zeros(len(x)), flat, "brightness")
        >>> net = nn.Conv2d(3, 2, 3)
        >>> Brightness(net)(torch.rand(2, 3, 4, 4)).shape
        torch.Size([2, 4, 4])
    """

    key: ClassVar[str] = ""
    needs_grad: ClassVar[bool] = True
    #: Method metadata for ``camkit.list_methods(details=True)``: passes per call, and when to use the method.
    cost: ClassVar[str] = ""
    use_when: ClassVar[str] = ""
    #: The kind shown by ``list_methods(details=True)``; ``None``: "attribution" when the method
    #: needs gradients, else "perturbation". Base classes set theirs, so the registry imports none.
    family: ClassVar[str | None] = None

    def __init__(
        self,
        model: nn.Module,
        *,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.jit.ScriptModule):
            raise TypeError(
                "hooks cannot attach to TorchScript modules; explain the eager nn.Module the script was made from"
            )
        if isinstance(input_index, bool) or not isinstance(input_index, (int, str)):
            raise TypeError(f"input_index must be a position (int) or a keyword name (str), got {input_index!r}")
        self.wrapped_model = model
        self.model = unwrap_model(model)
        check_frames_order(self.model)  # a bare [B, T, C, H, W] video model would read frames as channels
        self.output = output if output is not None else default_output(self.model)  # ultralytics' tuples
        self.keep_mode = keep_mode
        self.input_index = input_index

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={type(self.model).__name__})"

    def __call__(
        self,
        x: Tensor,
        target: Target = None,
        *,
        inputs: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Tensor:
        """Maps [B, *S] (or [B, K, *S]) in [0, 1] at the input's spatial size; see :meth:`explain`."""
        return self.explain(x, target, inputs=inputs, kwargs=kwargs).maps

    def explain(
        self,
        x: Tensor,
        target: Target = None,
        *,
        inputs: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Explanation:
        """Explain a batch.

        Args:
            x: float input on the model's device: a signal [B, C, T], an image [B, C, H, W], or a
                volume or video [B, C, D, H, W]. Every method takes every rank (or says it
                does not); maps come back [B, T], [B, H, W] or [B, D, H, W].
            target: ``None`` (top-1), an int, B ints, a [B, K] LongTensor, or a callable
                ``f(output) -> Tensor[B]``; see :mod:`camkit.targets` and :mod:`camkit.targets.tasks`.
            inputs: for a model taking several positional inputs, all of them, with ``x``
                itself at position ``input_index`` (or a list of ``x``'s images there, for
                models that take a list of images). The model runs as ``model(*inputs, **kwargs)``.
            kwargs: extra keyword inputs of the model, the same for every forward of the call.

        Returns:
            An :class:`~camkit.Explanation`.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> import camkit
            >>> class Masked(nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.conv = nn.Conv2d(3, 4, 3, padding=1)
            ...         self.fc = nn.Linear(4, 2)
            ...     def forward(self, image, mask):
            ...         return self.fc((self.conv(image) * mask).mean(dim=(2, 3)))
            >>> x, mask = torch.rand(2, 3, 8, 8), torch.ones(2, 1, 8, 8)
            >>> camkit.GradCAM(Masked(), "conv").explain(x, 0, inputs=(x, mask)).maps.shape
            torch.Size([2, 8, 8])
        """
        self._check_input(x)
        placement = Placement.of(self.wrapped_model, x)  # DataParallel/DDP: run on the module's device
        if placement is not None:
            x, inputs, kwargs = placement.inputs(x, inputs, kwargs)
        call = self._bind_inputs(x, inputs, kwargs)
        x = self._match_dtype(x)
        with (
            bound([self], call),
            eval_mode(self.model, enabled=not self.keep_mode),
            bind_target(target, self.model),
        ):
            if self.keep_mode:
                with preserve_running_stats(self.model):
                    explanation = self._explain(x, target)
            else:
                explanation = self._explain(x, target)
        _warn_if_not_finite(explanation)
        return explanation if placement is None else placement.back(explanation)

    @property
    def _call(self) -> Call | None:
        """The running call's binding in this thread (``None``: the model runs as ``model(x)``)."""
        return current_call(self)

    def _rows_can_join(self) -> bool:
        """Whether rows of other images may share this call's batch without changing any image's result.

        Not with per-call model inputs (they have the images' rows) or with a module in training
        mode (batch statistics would mix the rows).
        """
        return self._call is None and not any(m.training for m in self.model.modules())

    @contextmanager
    def _lend_call(self, *others: Explainer) -> Iterator[None]:
        """Run explainers this one wraps with this call's model inputs (same thread, same call)."""
        with bound(others, self._call):
            yield

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Call | None:
        return bind_inputs(x, inputs, kwargs, self.input_index)

    def _match_dtype(self, x: Tensor) -> Tensor:
        """``x`` in the model's floating dtype (a float64 or half batch for a float32 model, say).

        Maps always come back as float32 whatever the dtype the model runs in.
        """
        dtype = _model_dtype(self.model)
        if dtype is None or dtype == x.dtype:
            return x
        return x.to(dtype)

    def _call_model(self, x: Tensor) -> Any:
        """Run the model on the image batch ``x`` (with the call's other inputs); the raw output.

        Methods that re-run the model on changed images (perturbations, noise) should use
        this rather than ``self.model(x)``, so that multi-input and keyword-input models work.
        """
        return run_model(self.model, x, self._call)

    def _check_input(self, x: Tensor) -> None:
        check_input_batch(x)
        check_model_takes(self.model, x)
        check_finite(x)
        if self.needs_grad and torch.is_inference_mode_enabled():
            raise InferenceModeError(
                f"{type(self).__name__} needs autograd, which torch.inference_mode() turns off; call it "
                "outside inference_mode (an outer torch.no_grad() is fine: camkit enables only what it needs)."
            )

    def _forward(self, x: Tensor) -> Tensor:
        return select_output(self._call_model(x), self.output)

    def _target_scores(self, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor]:
        """Run the model on ``x`` and resolve ``target``: ``(classes, scores)``, scores attached.

        A target object with ``takes_model_output = True`` (detection targets, say) gets
        the model's raw output when no ``output=`` selector is set.
        """
        raw = self._call_model(x)
        if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw, Tensor):
            return resolve_target(target, raw, batch=x.shape[0])
        return resolve_target(target, select_output(raw, self.output), batch=x.shape[0])

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        raise NotImplementedError


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


def _warn_if_not_finite(explanation: Explanation) -> None:
    """On the host, warn of maps that came out NaN or infinite (the input was checked finite before the call).

    Such maps are the model's own values overflowing, or a ``0 * inf`` in its backward (the gradient
    of a square root or a log at 0): they are returned as they are, never replaced by zeros, which
    would look like a map. On an accelerator nothing is read (the call does not wait for the device).
    """
    maps = explanation.maps
    if maps.numel() == 0 or not _syncs.reads_are_free(maps):
        return
    if bool(torch.isfinite(maps).all()):
        return
    # one text per method, so that Python's filter shows it once per calling line, not once per batch of an audit
    warnings.warn(
        f"{explanation.method}: some maps are NaN or infinite although the input is finite (torch.isnan(maps) "
        "says which): the model's activations or gradients stopped being finite (an overflow, or 0 * inf such as "
        "the gradient of a square root or a log at 0). camkit.debug.find_nonfinite(model, x, target) names the "
        "first module where they do.",
        CamkitWarning,
        stacklevel=3,
    )
