"""Thin explainer base classes: input checks, model-state hygiene, the output contract.

The math lives in :mod:`camkit.functional`; hook handling in :mod:`camkit.hooks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Union

import torch
from torch import Tensor, nn

from .._checks import check_image_batch
from .._state import eval_mode
from ..architectures import known_channels_last, prefix_token_hint, unwrap_model
from ..errors import InferenceModeError, InvalidInputError
from ..explanation import Explanation
from ..functional.maps import normalize_maps, upsample_maps
from ..functional.tokens import channels_last_to_grid, guess_channels_last, infer_token_grid, tokens_to_grid
from ..hooks import LayerCapture
from ..layers import LayerSpec, resolve_layers
from ..neuron import bind_target
from ..targets import OutputSelector, Target, resolve_target, select_output

__all__ = ["CAMExplainer", "Explainer", "GradientCAM", "Reshape", "finish_maps", "make_explanation"]

Reshape = Callable[[Tensor], Tensor]
InputIndex = Union[int, str]


class _Call(NamedTuple):
    """How one explain call runs the model: the image ``x`` goes into a slot of args/kwargs."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot: InputIndex
    as_list: bool


def finish_maps(raws: Sequence[Tensor], size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Apply the output contract to raw maps: upsample, then normalise per map.

    Several raw maps (one per layer) are fused by this rule: each is upsampled to
    ``size`` and min-max normalised, the results are averaged, and the average is
    normalised again.
    """
    raws = [r.float() for r in raws]
    if len(raws) == 1:
        return normalize_maps(upsample_maps(raws[0], size))
    per_layer = [normalize_maps(upsample_maps(r, size))[0] for r in raws]
    return normalize_maps(torch.stack(per_layer).mean(dim=0))


def make_explanation(
    key: str,
    raws: Sequence[Tensor],
    x: Tensor,
    classes: Tensor | None,
    scores: Tensor,
    layers: tuple[str, ...] = (),
    **extras: Any,
) -> Explanation:
    """Apply the output contract (:func:`finish_maps`) to raw maps and wrap them in an :class:`Explanation`."""
    maps, flat = finish_maps(raws, (x.shape[-2], x.shape[-1]))
    return Explanation(
        maps=maps.to(x.device),
        raw=raws[0] if len(raws) == 1 else tuple(raws),
        target=classes,
        scores=scores,
        flat=flat.to(x.device),
        method=key,
        layers=layers,
        extras=extras,
    )


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
        keep_mode: run the model in the caller's modes instead of eval mode.
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
        self.output = output
        self.keep_mode = keep_mode
        self.input_index = input_index
        self._call: _Call | None = None

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
        """Maps [B, H, W] (or [B, K, H, W]) in [0, 1]; see :meth:`explain`."""
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
            x: float input [B, C, H, W] on the model's device: the image explained.
            target: ``None`` (top-1), an int, B ints, a [B, K] LongTensor, or a callable
                ``f(output) -> Tensor[B]``; see :mod:`camkit.targets` and :mod:`camkit.target_fns`.
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
        call = self._bind_inputs(x, inputs, kwargs)
        previous, self._call = self._call, call
        try:
            with eval_mode(self.model, enabled=not self.keep_mode), bind_target(target, self.model):
                return self._explain(x, target)
        finally:
            self._call = previous

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> _Call | None:
        if inputs is None and not kwargs and self.input_index == 0:
            return None
        if inputs is not None and (isinstance(inputs, (Tensor, str)) or not isinstance(inputs, Sequence)):
            raise InvalidInputError(
                f"inputs must be a tuple of the model's positional inputs, got {type(inputs).__name__}; "
                "for a single image just pass x."
            )
        args = tuple(inputs) if inputs is not None else ()
        extra = dict(kwargs or {})
        slot = self.input_index
        if isinstance(slot, str):
            if slot in extra and extra[slot] is not x:
                raise InvalidInputError(
                    f"kwargs[{slot!r}] is not x; the image explained goes in as keyword {slot!r} (input_index), "
                    "so leave it out of kwargs or pass x itself there."
                )
            extra.pop(slot, None)
            return _Call(args, extra, slot, False)
        if inputs is None:
            if slot != 0:
                raise InvalidInputError(
                    f"input_index={slot} needs inputs=(...), the model's positional inputs with x at position {slot}"
                )
            return _Call((x,), extra, 0, False)
        if not -len(args) <= slot < len(args):
            raise InvalidInputError(f"input_index={slot} is out of range for {len(args)} inputs")
        held = args[slot]
        if held is x:
            return _Call(args, extra, slot, False)
        if self._is_image_list(held, x):
            return _Call(args, extra, slot, True)
        where = [i for i, a in enumerate(args) if a is x]
        hint = f"; x is inputs[{where[0]}]: pass input_index={where[0]} to the explainer" if where else ""
        raise InvalidInputError(
            f"inputs[{slot}] (input_index={slot}) must be x itself or a list of its images, got "
            f"{type(held).__name__}{hint}."
        )

    @staticmethod
    def _is_image_list(held: Any, x: Tensor) -> bool:
        if not isinstance(held, (list, tuple)) or len(held) != x.shape[0]:
            return False
        if not all(isinstance(t, Tensor) and t.shape == x.shape[1:] for t in held):
            return False
        return bool(torch.equal(torch.stack(list(held)), x))

    def _call_model(self, x: Tensor) -> Any:
        """Run the model on the image batch ``x`` (with the call's other inputs); the raw output.

        Methods that re-run the model on changed images (perturbations, noise) should use
        this rather than ``self.model(x)``, so that multi-input and keyword-input models work.
        """
        call = self._call
        if call is None:
            return self.model(x)
        value: Any = list(x.unbind(0)) if call.as_list else x
        if isinstance(call.slot, str):
            return self.model(*call.args, **call.kwargs, **{call.slot: value})
        args = list(call.args)
        args[call.slot] = value
        return self.model(*args, **call.kwargs)

    def _check_input(self, x: Tensor) -> None:
        check_image_batch(x)
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
        layer: a dotted name, a module, or a list of them; ``None`` picks the last layer with
            a spatial 4-D output (found by a dry run on the first call, then kept).
        call: for a module that runs several times in one forward, which call to use
            (``-1``: the last, the default; ``0``: the first).
        reshape: a callable turning the layer's output (and its gradient) into
            [B, C, h, w]; it overrides the automatic handling of tokens and channel-last
            maps (see :meth:`to_grid`).
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
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if reshape is not None and not callable(reshape):
            raise TypeError(f"reshape must be a callable f(tensor) -> Tensor[B, C, h, w], got {type(reshape).__name__}")
        self.layer = layer
        self.call = call
        self.reshape = reshape
        self._prefix = prefix_token_hint(self.model)
        self._layers: list[tuple[str, nn.Module]] | None = (
            None if layer is None else resolve_layers(self.model, layer)
        )

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        """The resolved ``(name, module)`` pairs (the architecture's default, or auto-detected from ``x``)."""
        if self._layers is None:
            self._layers = resolve_layers(self.model, None, x, forward=self._call_model)
        return self._layers

    def to_grid(self, tensors: Sequence[Tensor], x: Tensor) -> list[Tensor]:
        """Bring each layer's output (or gradient) to a channel-first grid [B, C, h, w].

        In order: ``reshape=`` when given; tokens [B, N, D] go through
        :func:`camkit.functional.tokens_to_grid` (prefix tokens dropped, grid inferred from N
        and ``x``'s aspect ratio, prefix count taken from the model when it says);
        4-D outputs are channel-last when the layer's type says so (Swin blocks, ``Permute``
        to NHWC, ``LayerNorm``, ``Linear``), channel-first for convolution-family types, and
        otherwise decided by :func:`camkit.functional.guess_channels_last`, which raises on
        an ambiguous shape. Methods built on activations call this before the CAM math.
        """
        size = (int(x.shape[-2]), int(x.shape[-1]))
        out = []
        for (name, module), tensor in zip(self.layers(x), tensors):
            if self.reshape is not None:
                grid = self.reshape(tensor)
                if not isinstance(grid, Tensor) or grid.dim() != 4:
                    got = list(grid.shape) if isinstance(grid, Tensor) else type(grid).__name__
                    raise InvalidInputError(f"reshape= must return a tensor [B, C, h, w], got {got} for layer '{name}'")
            elif tensor.dim() == 3:
                grid = tokens_to_grid(tensor, size, prefix=self._token_prefix(tensor.shape[1], size))
            elif tensor.dim() == 4:
                layout = known_channels_last(module)
                if layout is None:
                    layout = guess_channels_last(tuple(tensor.shape), size)
                grid = channels_last_to_grid(tensor) if layout else tensor
            else:
                raise InvalidInputError(
                    f"layer '{name}' gives shape {list(tensor.shape)}; CAMs need [B, C, H, W] maps, [B, H, W, C] "
                    "maps or [B, N, D] tokens. Pick another layer (camkit.list_layers(model, x)) or pass reshape=."
                )
            out.append(grid)
        return out

    def _token_prefix(self, count: int, size: tuple[int, int]) -> int | None:
        hint = self._prefix
        if hint is None:
            return None
        try:
            infer_token_grid(count, size, prefix=hint)
        except InvalidInputError:
            return None  # the model's hint does not fit this layer: infer instead
        return hint

    def _names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.layers())

    def __repr__(self) -> str:
        layers = [n for n, _ in self._layers] if self._layers is not None else "auto"
        return f"{type(self).__name__}(model={type(self.model).__name__}, layer={layers})"


class GradientCAM(CAMExplainer):
    """Base of the CAMs computed from a layer's activations and gradients.

    A call costs one forward pass plus a backward pass through only the layers after the
    target layer: autograd is off until the target layer returns (see
    :class:`camkit.hooks.LayerCapture`), no parameter gradient is computed, and
    ``param.grad`` is never touched. Subclasses implement :meth:`raw_map`.

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

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        """The raw map [B, h, w] from float32 activations and gradients [B, C, h, w]."""
        raise NotImplementedError

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layers = self.layers(x)
        with LayerCapture(layers, gradients=True, call=self.call) as capture:
            classes, scores = self._target_scores(x, target)
            columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
            acts = self.to_grid([a.detach().float() for a in capture.activations()], x)
            per_layer: list[list[Tensor]] = [[] for _ in layers]
            for k, column in enumerate(columns):
                grads = self.to_grid(capture.gradients(column, retain_graph=k < len(columns) - 1), x)
                with torch.no_grad():
                    for maps, act, grad in zip(per_layer, acts, grads):
                        maps.append(self.raw_map(act, self._check_grad(grad).float()))
        multi = scores.dim() == 2
        raws = [torch.stack(m, dim=1) if multi else m[0] for m in per_layer]
        return self._explanation(raws, x, classes, scores.detach())

    @staticmethod
    def _check_grad(grad: Tensor) -> Tensor:
        if grad.dim() != 4:
            raise InvalidInputError(
                f"the target layer's output has shape {list(grad.shape)}; CAMs need [B, C, H, W] "
                "activations. Pick a convolutional layer (see camkit.list_layers(model, x))."
            )
        return grad

    def _explanation(
        self, raws: list[Tensor], x: Tensor, classes: Tensor | None, scores: Tensor, **extras: Any
    ) -> Explanation:
        return make_explanation(self.key, raws, x, classes, scores, self._names(), **extras)
