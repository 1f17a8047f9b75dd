"""torchcam 0.5.0's extractor contract on camkit explainers: ``_CAM`` and ``OutputTarget``.

An extractor is built on the model (its hooks stay registered, in one long-lived
:class:`camkit.hooks.HookScope`, until :meth:`_CAM.remove_hooks` or the end of a ``with``
block); the user runs ``scores = model(x)``; ``extractor(class_idx, scores)`` then explains the
recorded input with the camkit explainer behind the class and returns one map per target layer,
at the layer's resolution, as torchcam does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from difflib import get_close_matches
from types import TracebackType
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...._internal.state import eval_mode
from ....hooks import HookScope
from ....methods import CAMExplainer
from ._utils import locate_candidate_layer

__all__ = ["_CAM", "OutputTarget"]

logger = logging.getLogger(__name__)

OutputTarget = Callable[[Any], Tensor]


def _resolve_targets(targets: OutputTarget | list[OutputTarget], batch_size: int) -> list[OutputTarget]:
    if callable(targets):
        return [cast(OutputTarget, targets)] * batch_size
    if not isinstance(targets, list) or any(not callable(target) for target in targets):
        raise TypeError("targets must be a callable or a list of callables")
    if len(targets) != batch_size:
        raise ValueError("per-sample targets must match the batch size")
    return targets


def _target_scores(output: Any, targets: OutputTarget | list[OutputTarget]) -> Tensor:
    """One scalar per sample of ``output`` (a tensor with a batch axis, or a per-sample list)."""
    if isinstance(output, Tensor):
        if output.ndim == 0:
            raise ValueError("model output must have a batch dimension")
        samples: list[Any] = list(output.unbind(0))
    elif isinstance(output, list):
        samples = output
    else:
        raise TypeError("model output must be a tensor or a per-sample list")
    values = [fn(sample) for fn, sample in zip(_resolve_targets(targets, len(samples)), samples, strict=True)]
    if any(not isinstance(v, Tensor) for v in values):
        raise TypeError("each target must return a tensor")
    if any(v.numel() != 1 for v in values):
        raise ValueError("each target must return a scalar tensor")
    return torch.stack([v.reshape(()) for v in values])


def _batch_target(targets: list[OutputTarget]) -> Callable[[Any], Tensor]:
    """camkit's callable target from torchcam's per-sample targets; it reads the model's raw output."""

    def score(output: Any) -> Tensor:
        batch = output.shape[0] if isinstance(output, Tensor) else len(output)
        fns = targets if len(targets) == batch else [targets[0]] * batch
        return _target_scores(output, fns)

    score.takes_model_output = True  # type: ignore[attr-defined]  # lists of per-sample outputs reach it
    score.per_sample = targets  # type: ignore[attr-defined]  # for explainers that score rows of mixed samples
    return score


class _CAM:
    """A class activation map extractor with torchcam 0.5.0's contract.

    Args:
        model: input model
        target_layer: the target layer, its name, or a list of those; ``None``: the last layer
            with a spatial output for an input of ``input_shape`` (torchcam's rule)
        input_shape: shape of the expected input tensor excluding the batch dimension
        enable_hooks: should hooks be enabled by default
        reshape_transform: optional transform applied to the activations (and gradients)
    """

    #: the camkit explainer class that computes the maps
    _method: ClassVar[type[CAMExplainer] | None] = None
    #: keyword arguments for it, set by subclasses
    _keep_mode: ClassVar[bool] = True
    #: torchcam lists a model input hook in ``hook_handles`` only for the methods that use the input
    _lists_input_hook: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        enable_hooks: bool = True,
        reshape_transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        if reshape_transform is not None and not callable(reshape_transform):
            raise TypeError("`reshape_transform` must be callable")
        if reshape_transform is not None and target_layer is None:
            raise ValueError("`target_layer` must be specified when using `reshape_transform`")
        self.submodule_dict = dict(model.named_modules())
        if isinstance(target_layer, str):
            names = [target_layer]
        elif isinstance(target_layer, nn.Module):
            names = [self._resolve_layer_name(target_layer)]
        elif isinstance(target_layer, list):
            if any(not isinstance(elt, (str, nn.Module)) for elt in target_layer):
                raise TypeError("invalid argument type for `target_layer`")
            names = [self._resolve_layer_name(e) if isinstance(e, nn.Module) else e for e in target_layer]
        elif target_layer is None:
            found = locate_candidate_layer(model, input_shape)
            if not isinstance(found, str):
                raise ValueError("specify `target_layer` (see `model.named_modules()`) or fix `input_shape`")
            logger.warning(f"no value was provided for `target_layer`, thus set to '{found}'.")
            names = [found]
        else:
            raise TypeError("invalid argument type for `target_layer`")
        if missing := [name for name in names if name not in self.submodule_dict]:
            hints = {n: m for n in missing if (m := get_close_matches(n, self.submodule_dict))}
            found_hint = f", closest matches: {hints}" if hints else ""
            raise ValueError(f"unknown `target_layer` names: {missing}{found_hint}; see `model.named_modules()`")
        self.target_names = names
        self.model = model
        self._reshape_transform = reshape_transform
        self.reset_hooks()
        self._scope = HookScope()
        self.hook_handles: list[torch.utils.hooks.RemovableHandle] = []
        for idx, name in enumerate(names):
            self.hook_handles.append(self._scope.forward(self.submodule_dict[name], self._activation_hook(idx)))
        input_hook = self._scope.forward_pre(model, self._store_input)
        if self._lists_input_hook:
            self.hook_handles.append(input_hook)
        self._hooks_enabled = enable_hooks
        self._relu = True
        self._score_used = False
        self._targets_supported = False
        self._input: Tensor | None = None

    # --- hooks --------------------------------------------------------------------------------

    def _activation_hook(self, idx: int) -> Callable[..., None]:
        def hook(_: nn.Module, _input: tuple[Tensor, ...], output: Tensor) -> None:
            if self._hooks_enabled:
                if self._reshape_transform is not None:
                    output = self._reshape_transform(output)
                self.hook_a[idx] = output.detach()

        return hook

    def _store_input(self, _: nn.Module, input_: tuple[Any, ...]) -> None:
        if self._hooks_enabled and input_ and isinstance(input_[0], Tensor):
            self._input = input_[0].detach()

    def enable_hooks(self) -> None:
        """Enable hooks."""
        self._hooks_enabled = True

    def disable_hooks(self) -> None:
        """Disable hooks."""
        self._hooks_enabled = False

    @contextmanager
    def _hooks_off(self) -> Iterator[None]:
        previous = self._hooks_enabled
        self._hooks_enabled = False
        try:
            yield
        finally:
            self._hooks_enabled = previous

    def _eval_mode(self) -> AbstractContextManager[Any]:
        return eval_mode(self.model)

    def __enter__(self) -> _CAM:
        return self

    def __exit__(
        self, exct_type: type[BaseException] | None, exce_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self.remove_hooks()
        finally:
            self.reset_hooks()

    def _resolve_layer_name(self, target_layer: nn.Module) -> str:
        name = next((k for k, v in self.submodule_dict.items() if v is target_layer), None)
        if name is None:
            raise ValueError("unable to locate module inside the specified model.")
        return name

    def reset_hooks(self) -> None:
        """Clear stored activations and gradients."""
        self.hook_a: list[Tensor | None] = [None] * len(self.target_names)
        self.hook_g: list[Tensor | None] = [None] * len(self.target_names)

    def remove_hooks(self) -> None:
        """Remove the model hooks (the extractor's scope closes)."""
        self._scope.remove()
        self.hook_handles.clear()

    # --- maps ---------------------------------------------------------------------------------

    @staticmethod
    @torch.no_grad()
    def _normalize(cams: Tensor, spatial_dims: int | None = None, eps: float = 1e-8) -> Tensor:
        """torchcam's normalisation ``(m - min) / (max - min + eps)`` over the trailing axes (in place, as torchcam)."""
        spatial_dims = cams.ndim - 1 if spatial_dims is None else spatial_dims
        dims = tuple(range(cams.ndim - spatial_dims, cams.ndim))
        cams.sub_(cams.amin(dim=dims, keepdim=True))
        cams.div_(cams.amax(dim=dims, keepdim=True) + eps)
        return cams

    def _precheck(self, class_idx: int | list[int] | None, scores: Any = None, targets: Any = None) -> None:
        if (class_idx is None) == (targets is None):
            raise ValueError("provide exactly one of class_idx or targets")
        if targets is not None and not self._targets_supported:
            raise ValueError(f"{self.__class__.__name__} does not support arbitrary output targets")
        for fmap in self.hook_a:
            if not isinstance(fmap, Tensor):
                raise AssertionError("Inputs need to be forwarded in the model for the conv features to be hooked")
            if isinstance(class_idx, list) and fmap.shape[0] != len(class_idx):
                raise ValueError("expected batch size and length of `class_idx` to be the same.")
        if targets is not None:
            _resolve_targets(targets, cast(Tensor, self.hook_a[0]).shape[0])
        if (
            targets is None
            and (not isinstance(class_idx, int) or class_idx < 0)
            and (not isinstance(class_idx, list) or any(idx < 0 for idx in class_idx))
        ):
            raise ValueError("Incorrect `class_idx` argument value")
        if self._score_used and scores is None:
            raise ValueError("model output scores is required to be passed to compute CAMs")
        if self._score_used and targets is None and not isinstance(scores, Tensor):
            raise TypeError("model output scores must be a tensor when using class_idx")

    def __call__(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        self._precheck(class_idx, scores, targets)
        return self.compute_cams(class_idx, scores, normalized, targets=targets, **kwargs)

    def _explainer(self) -> CAMExplainer:
        if self._method is None:
            raise NotImplementedError(f"{type(self).__name__} names no camkit explainer")
        options = self._options()
        if self._reshape_transform is not None:
            options["reshape"] = self._reshape_transform
        return self._method(self.model, self.target_names, keep_mode=self._keep_mode, **options)

    def _options(self) -> dict[str, Any]:
        return {}

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        explanation = self._explainer().explain(x, target)
        raw = explanation.raw
        return list(raw) if isinstance(raw, tuple) else [raw]

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The class activation maps [N, *s], one per target layer, at the layer's resolution.

        Args:
            class_idx: the class index, or one per sample.
            scores: the model's output for the recorded input (torchcam reads gradients from it;
                here the input is explained again, so only its presence is checked).
            normalized: min-max normalise each map (``(m - min) / (max - min + 1e-8)``).
            targets: a scalar output target shared by the batch, or one per sample.
            kwargs: ignored (torchcam passes them to its weight computation).
        """
        if self._input is None:
            raise AssertionError("Inputs need to be forwarded in the model for the conv features to be hooked")
        x = self._input.clone()  # a plain tensor even if the forward ran under inference_mode
        batch = x.shape[0]
        if targets is not None:
            target: Any = _batch_target(_resolve_targets(targets, batch))
        elif isinstance(class_idx, int):
            target = torch.full((batch,), class_idx, dtype=torch.long, device=x.device)
        else:
            target = torch.tensor(class_idx, dtype=torch.long, device=x.device)
        with self._hooks_off():
            cams = self._raw_maps(x, target)
        dtype = x.dtype if x.is_floating_point() else None
        with torch.no_grad():
            cams = [cam.detach().to(dtype).clone() if dtype is not None else cam.detach().clone() for cam in cams]
            if normalized:
                cams = [self._normalize(cam) for cam in cams]
        return cams

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}"

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self._extra_repr()})"

    @classmethod
    def fuse_cams(cls, cams: list[Tensor], target_shape: tuple[int, ...] | None = None) -> Tensor:
        """Fuse maps of several layers: resized to the largest (or ``target_shape``), their element-wise maximum.

        Raises:
            TypeError: if the argument type is invalid
            ValueError: if the argument is an empty list
        """
        if not isinstance(cams, list) or any(not isinstance(elt, Tensor) for elt in cams):
            raise TypeError("invalid argument type for `cams`")
        if len(cams) == 0:
            raise ValueError("argument `cams` cannot be an empty list")
        if len(cams) == 1:
            return cams[0]
        if isinstance(target_shape, tuple):
            shape = target_shape
        else:
            shape = tuple(map(max, zip(*[tuple(cam.shape[1:]) for cam in cams], strict=True)))
        scaled = cls._scale_cams(cams)
        mode = "bilinear" if scaled[0].ndim == 3 else "trilinear" if scaled[0].ndim == 4 else "nearest"
        resized = [F.interpolate(cam.unsqueeze(1), shape, mode=mode, align_corners=False) for cam in scaled]
        fused = resized[0]
        for cam in resized[1:]:
            fused = torch.where(fused.isnan() | (fused >= cam), fused, cam)
        return fused.squeeze(1)

    @staticmethod
    def _scale_cams(cams: list[Tensor]) -> list[Tensor]:
        return cams
