"""torchcam 0.5.0's gradient-based extractors on camkit: GradCAM, GradCAMpp, SmoothGradCAMpp, XGradCAM, LayerCAM."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Self, cast

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....errors import CamkitError
from ....functional.maps import upsample_maps
from ....methods.base import CAMExplainer, GradientCAM
from .core import _CAM, OutputTarget, _target_scores
from .legrad import LeGrad

__all__ = ["CompatNotTranslatedError", "FinerCAM", "GradCAM", "GradCAMpp", "LayerCAM", "LeGrad", "RefineCAM", "SmoothGradCAMpp", "XGradCAM"]


class CompatNotTranslatedError(CamkitError, NotImplementedError):
    """A torchcam name that camkit.compat.torchcam does not translate yet."""


class _GradCAM(_CAM):
    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, input_shape, **kwargs)
        self._score_used = True
        self._targets_supported = True
        for idx, name in enumerate(self.target_names):
            self.hook_handles.append(self._scope.forward(self.submodule_dict[name], self._output_hook(idx)))

    def reset_hooks(self) -> None:
        """Clear stored activations, gradients and the layers' outputs kept for backpropagation."""
        super().reset_hooks()
        self._hook_outputs: list[Tensor | None] = [None] * len(self.target_names)

    def _output_hook(self, idx: int) -> Callable[..., Tensor | None]:
        def hook(_: nn.Module, _input: tuple[Tensor, ...], output: Tensor) -> Tensor | None:
            if not self._hooks_enabled:
                return None
            self._hook_outputs[idx] = output
            # The rest of the model gets a copy, so that an in-place op after the layer
            # (nn.ReLU(inplace=True)) leaves the layer's own output, and its gradient, as they were.
            return output.clone() if isinstance(output, Tensor) and output.requires_grad else None

        return hook

    def _backprop(
        self,
        scores: Any,
        class_idx: int | list[int] | None,
        retain_graph: bool = False,
        targets: OutputTarget | list[OutputTarget] | None = None,
    ) -> None:
        """Store in ``hook_g`` the gradients of the selected scores w.r.t. each layer's recorded output.

        Raises:
            RuntimeError: if the selected score does not depend on a target layer's output
        """
        if targets is not None:
            score = _target_scores(scores, targets).sum()
        elif isinstance(class_idx, int):
            score = scores[:, class_idx].sum()
        else:
            score = scores.gather(1, torch.tensor(class_idx, device=scores.device).view(-1, 1)).sum()
        outputs = cast(list[Tensor], self._hook_outputs)
        try:
            grads = torch.autograd.grad(score, outputs, retain_graph=retain_graph)
        except RuntimeError as exc:
            raise RuntimeError(
                "target score is not connected to every target layer: the scores passed must come from the "
                "model's forward pass that the extractor recorded (run scores = model(x) inside the extractor)"
            ) from exc
        for idx, grad in enumerate(grads):
            if self._reshape_transform is not None:
                grad = self._reshape_transform(grad)
            self.hook_g[idx] = grad.detach()

    def _in_graph(self, scores: Any) -> bool:
        """Whether the scores were computed from the recorded layer outputs (so they can be backpropagated)."""
        outputs = self._hook_outputs
        if any(not isinstance(out, Tensor) or not out.requires_grad for out in outputs):
            return False
        if isinstance(scores, Tensor):
            return scores.requires_grad
        return isinstance(scores, list) and any(
            isinstance(v, Tensor) and v.requires_grad for sample in scores for v in _leaves(sample)
        )

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """One map per target layer [N, *s], from the gradients of the scores passed (torchcam's contract).

        ``class_idx`` (or ``targets``) selects entries of ``scores``, which must come from the
        forward pass the extractor recorded: any function of the logits works (a softmax, a
        contrast of two classes). When ``scores`` carry no graph (computed under ``no_grad``),
        the recorded input is explained again and ``class_idx`` indexes the model's output.
        """
        if not self._in_graph(scores):
            return super().compute_cams(class_idx, scores, normalized, targets=targets, **kwargs)
        self._backprop(scores, class_idx, retain_graph=bool(kwargs.get("retain_graph", True)), targets=targets)
        explainer = cast(GradientCAM, self._explainer())
        dtype = scores.dtype if isinstance(scores, Tensor) and scores.is_floating_point() else None
        cams = []
        with torch.no_grad():
            for act, grad in zip(self.hook_a, self.hook_g, strict=True):
                cam = explainer.raw_map(cast(Tensor, act), cast(Tensor, grad))
                cam = cam.to(dtype) if dtype is not None else cam
                cams.append(self._normalize(cam) if normalized else cam)
        return cams


def _leaves(sample: Any) -> list[Any]:
    if isinstance(sample, dict):
        return [v for value in sample.values() for v in _leaves(value)]
    if isinstance(sample, (list, tuple)):
        return [v for value in sample for v in _leaves(value)]
    return [sample]


class GradCAM(_GradCAM):
    """Grad-CAM on :class:`camkit.GradCAM`: channels weighted by their mean gradient."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAM


class GradCAMpp(_GradCAM):
    """Grad-CAM++ on :class:`camkit.GradCAMPlusPlus` (the paper's closed-form alpha; torchcam's differs)."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAMPlusPlus


class XGradCAM(_GradCAM):
    """XGrad-CAM on :class:`camkit.XGradCAM`."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.XGradCAM


class LayerCAM(_GradCAM):
    """LayerCAM on :class:`camkit.LayerCAM`; :meth:`fuse_cams` scales each map by ``tanh(2 m)`` first (eq. 9)."""

    _method: ClassVar[type[CAMExplainer] | None] = _methods.LayerCAM

    @staticmethod
    def _scale_cams(cams: list[Tensor], gamma: float = 2.0) -> list[Tensor]:
        return [torch.tanh(gamma * cam) for cam in cams]


class SmoothGradCAMpp(_GradCAM):
    """Smooth Grad-CAM++ on :class:`camkit.SmoothGrad` around :class:`camkit.GradCAMPlusPlus`.

    camkit averages the Grad-CAM++ maps of ``num_samples`` noisy copies of the input; the noise
    standard deviation ``std`` is absolute, as torchcam's (camkit's ``sigma`` is set to
    ``std`` over the batch's value range).

    Args:
        model: input model
        target_layer: the target layer(s)
        num_samples: noisy copies of the input
        std: standard deviation of the noise added to the input
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    _method: ClassVar[type[CAMExplainer] | None] = _methods.GradCAMPlusPlus
    _lists_input_hook: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        num_samples: int = 4,
        std: float = 0.3,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, input_shape, **kwargs)
        self._score_used = False
        self.num_samples = num_samples
        self.std = std

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The maps averaged over noisy copies of the recorded input (``scores`` is not backpropagated)."""
        return _CAM.compute_cams(self, class_idx, scores, normalized, targets=targets, **kwargs)

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        spread = float((x.amax() - x.amin()).clamp_min(1e-12))
        smooth = _methods.SmoothGrad(self._explainer(), samples=self.num_samples, sigma=self.std / spread)
        raw = smooth.explain(x, target).raw
        return list(raw) if isinstance(raw, tuple) else [raw]

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}, num_samples={self.num_samples}, std={self.std}"


class _Wrapper:
    """The lifecycle of an extractor built on a base extractor ``base_cam`` (its hooks, model and layers)."""

    base_cam: _CAM

    @property
    def model(self) -> nn.Module:
        """The base extractor's model."""
        return self.base_cam.model

    @property
    def target_names(self) -> list[str]:
        """The base extractor's layer names."""
        return self.base_cam.target_names

    def enable_hooks(self) -> None:
        """Enable the base extractor's hooks."""
        self.base_cam.enable_hooks()

    def disable_hooks(self) -> None:
        """Disable the base extractor's hooks."""
        self.base_cam.disable_hooks()

    def reset_hooks(self) -> None:
        """Clear the base extractor's stored activations."""
        self.base_cam.reset_hooks()

    def remove_hooks(self) -> None:
        """Remove the base extractor's hooks."""
        self.base_cam.remove_hooks()

    def _hooks_off(self) -> AbstractContextManager[None]:
        return self.base_cam._hooks_off()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.base_cam.__exit__(None, None, None)


class RefineCAM(_Wrapper):
    """RefineCAM as torchcam 0.5.0 defines it: a base extractor's normalised maps at several layers,
    resized to the largest layer's grid and multiplied (:func:`camkit.functional.multiply_maps`'s rule).

    camkit's own :class:`camkit.RefineCAM` fuses at the input's resolution; this one keeps
    torchcam's (the largest layer's).

    Args:
        model: input model
        target_layer: at least two target layers, as modules or names
        input_shape: shape of the expected input tensor excluding the batch dimension
        base_method: the extractor class producing the per-layer maps (default :class:`GradCAMpp`)
        base_kwargs: keyword arguments for ``base_method``
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: list[nn.Module | str],
        input_shape: tuple[int, ...] = (3, 224, 224),
        *,
        base_method: type[_CAM] = GradCAMpp,
        **base_kwargs: Any,
    ) -> None:
        if not isinstance(target_layer, list) or len(target_layer) < 2:
            raise ValueError("RefineCAM requires at least two target layers")
        if not isinstance(base_method, type) or not issubclass(base_method, _CAM):
            raise TypeError("base_method must be a CAM extractor class")
        self.base_cam = base_method(model, target_layer, input_shape=input_shape, **base_kwargs)

    def __call__(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        target_shape: tuple[int, ...] | None = None,
        *,
        targets: Any = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        cams = self.base_cam(class_idx, scores, normalized=True, targets=targets, **kwargs)
        return [self.fuse_cams(cams, target_shape, normalized)]

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        target_shape: tuple[int, ...] | None = None,
        *,
        targets: Any = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The refined map, without the base extractor's checks."""
        cams = self.base_cam.compute_cams(class_idx, scores, normalized=True, targets=targets, **kwargs)
        return [self.fuse_cams(cams, target_shape, normalized)]

    @staticmethod
    @torch.no_grad()
    def fuse_cams(cams: list[Tensor], target_shape: tuple[int, ...] | None = None, normalized: bool = True) -> Tensor:
        """Normalise each map, resize to ``target_shape`` (default: the largest), multiply, normalise.

        Raises:
            TypeError: if ``cams`` is not a list of tensors
            ValueError: if ``cams`` is empty
        """
        if not isinstance(cams, list) or any(not isinstance(cam, Tensor) for cam in cams):
            raise TypeError("invalid argument type for `cams`")
        if not cams:
            raise ValueError("argument `cams` cannot be an empty list")
        shape = target_shape or tuple(map(max, zip(*[tuple(cam.shape[1:]) for cam in cams], strict=True)))
        product = upsample_maps(_CAM._normalize(cams[0].clone()), shape)
        for cam in cams[1:]:
            product = product * upsample_maps(_CAM._normalize(cam.clone()), shape)
        return _CAM._normalize(product) if normalized else product

    def __repr__(self) -> str:
        return f"RefineCAM(base_method={self.base_cam.__class__.__name__}, target_layer={self.target_names})"


class FinerCAM(_Wrapper):
    """Finer-CAM as torchcam 0.5.0 defines it: a base extractor's map of ``y_c - gamma mean_t(y_{d_t})``.

    The contrastive score (the target's score minus ``gamma`` times the mean score of its
    references) is formed before the base method's ReLU; by default the references are the
    ``num_references`` classes whose scores are closest to the target's. camkit's native
    :class:`camkit.FinerCAM` weighs its rivals by a softmax of their logits instead (pytorch-grad-cam's rule).

    Args:
        model: input model
        target_layer: the target layer(s), as modules or names
        input_shape: shape of the expected input tensor excluding the batch dimension
        base_method: :class:`GradCAM`, :class:`GradCAMpp` or :class:`LayerCAM`
        gamma: weight of the references' mean score (finite, non-negative)
        num_references: how many automatic references (capped by the other classes available)
        base_kwargs: keyword arguments for ``base_method``
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        *,
        base_method: type[_GradCAM] = GradCAM,
        gamma: float = 0.6,
        num_references: int = 3,
        **base_kwargs: Any,
    ) -> None:
        if base_method not in (GradCAM, GradCAMpp, LayerCAM):
            raise TypeError(f"base_method must be GradCAM, GradCAMpp, or LayerCAM, got {base_method!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
            raise TypeError(f"gamma must be a real number, got {gamma!r}")
        if not math.isfinite(gamma) or gamma < 0:
            raise ValueError(f"gamma must be finite and non-negative, got {gamma!r}")
        if isinstance(num_references, bool) or not isinstance(num_references, int):
            raise TypeError(f"num_references must be an integer, got {num_references!r}")
        if num_references < 1:
            raise ValueError(f"num_references must be positive, got {num_references}")
        self.gamma = float(gamma)
        self.num_references = num_references
        self.base_cam = base_method(model, target_layer, input_shape=input_shape, **base_kwargs)

    @staticmethod
    def _targets(class_idx: Any, batch: int, num_classes: int) -> list[int]:
        if isinstance(class_idx, int) and not isinstance(class_idx, bool):
            targets = [class_idx] * batch
        elif isinstance(class_idx, list):
            if len(class_idx) != batch:
                raise ValueError(f"class_idx has {len(class_idx)} entries but the batch size is {batch}")
            if any(isinstance(i, bool) or not isinstance(i, int) for i in class_idx):
                raise TypeError(f"class_idx must contain integers, got {class_idx!r}")
            targets = class_idx
        else:
            raise TypeError(f"class_idx must be an integer or a list of integers, got {class_idx!r}")
        if any(i < 0 or i >= num_classes for i in targets):
            raise ValueError(f"class_idx {class_idx!r} holds an out-of-range index for {num_classes} classes")
        return targets

    @staticmethod
    def _reference_rows(comparison_idx: Any, batch: int) -> list[list[int]]:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if is_int(comparison_idx):
            return [[comparison_idx]] * batch
        if not isinstance(comparison_idx, list):
            raise TypeError(f"comparison_idx must be an integer, a list, or a nested list, got {comparison_idx!r}")
        if not comparison_idx:
            raise ValueError("comparison_idx cannot be empty: give at least one reference class")
        if all(isinstance(row, list) for row in comparison_idx):
            if len(comparison_idx) != batch:
                raise ValueError(f"per-sample comparison_idx has {len(comparison_idx)} rows, the batch size is {batch}")
            if any(not row for row in comparison_idx):
                raise ValueError("comparison_idx rows cannot be empty")
            if len({len(row) for row in comparison_idx}) != 1:
                raise ValueError("per-sample comparison_idx rows must have equal lengths")
            return comparison_idx
        if all(is_int(v) for v in comparison_idx):
            return [comparison_idx] * batch
        raise TypeError(f"comparison_idx must contain integers or lists of integers, got {comparison_idx!r}")

    def _references(self, comparison_idx: Any, scores: Tensor, targets: list[int]) -> Tensor:
        batch, num_classes = scores.shape
        index = torch.tensor(targets, device=scores.device).view(-1, 1)
        if comparison_idx is None:
            distance = (scores.detach() - scores.detach().gather(1, index)).abs()
            distance.scatter_(1, index, float("inf"))
            return distance.topk(min(self.num_references, num_classes - 1), dim=1, largest=False).indices
        rows = self._reference_rows(comparison_idx, batch)
        for sample, (target, row) in enumerate(zip(targets, rows, strict=True)):
            if any(isinstance(v, bool) or not isinstance(v, int) for v in row):
                raise TypeError(f"comparison_idx must contain integers, got {row!r} for sample {sample}")
            if any(v < 0 or v >= num_classes for v in row):
                raise ValueError(f"comparison_idx {row!r} holds an out-of-range index for sample {sample}")
            if len(set(row)) != len(row):
                raise ValueError(f"comparison_idx {row!r} contains duplicates for sample {sample}")
            if target in row:
                raise ValueError(f"comparison_idx {row!r} contains the target class {target} for sample {sample}")
        return torch.tensor(rows, device=scores.device)

    def _contrast(self, class_idx: Any, scores: Any, comparison_idx: Any) -> tuple[Tensor, list[int], Tensor]:
        if scores is None:
            raise ValueError("model output scores is required to compute FinerCAM: pass extractor(class_idx, scores)")
        if not isinstance(scores, Tensor):
            raise TypeError(f"scores must be a tensor, got {type(scores).__name__}")
        if scores.ndim != 2 or scores.shape[0] < 1:
            raise ValueError(f"scores must have shape (batch_size, num_classes), got {tuple(scores.shape)}")
        if scores.shape[1] < 2:
            raise ValueError("FinerCAM requires at least one comparison class: the scores hold a single class")
        targets = self._targets(class_idx, scores.shape[0], scores.shape[1])
        refs = self._references(comparison_idx, scores, targets)
        index = torch.tensor(targets, device=scores.device).view(-1, 1)
        contrast = scores.gather(1, index) - self.gamma * scores.gather(1, refs).mean(dim=1, keepdim=True)
        return contrast, targets, refs

    def _maps(self, run: Callable[..., list[Tensor]], class_idx: Any, scores: Any, comparison_idx: Any,
              normalized: bool, kwargs: dict[str, Any]) -> list[Tensor]:
        if kwargs.pop("targets", None) is not None:
            raise ValueError("FinerCAM does not support arbitrary output targets: give class_idx (and comparison_idx)")
        contrast, targets, refs = self._contrast(class_idx, scores, comparison_idx)
        if contrast.requires_grad:  # the contrast is the only score column: class 0 of it
            return run([0] * contrast.shape[0], contrast, normalized, **kwargs)
        gamma = self.gamma

        def objective(target: int, row: Tensor) -> OutputTarget:
            return lambda out: out[target] - gamma * out[row].mean()

        fns = [objective(t, row) for t, row in zip(targets, refs, strict=True)]
        return run(None, scores, normalized, targets=fns, **kwargs)

    def __call__(
        self,
        class_idx: int | list[int],
        scores: Tensor | None = None,
        comparison_idx: int | list[int] | list[list[int]] | None = None,
        normalized: bool = True,
        **kwargs: Any,
    ) -> list[Tensor]:
        """One Finer-CAM per target layer [N, *s].

        Raises:
            ValueError: if ``targets`` are given (Finer-CAM contrasts classes), or an argument is out of range
            TypeError: if an argument has the wrong type
        """
        return self._maps(self.base_cam, class_idx, scores, comparison_idx, normalized, kwargs)

    def compute_cams(
        self,
        class_idx: int | list[int],
        scores: Tensor | None = None,
        comparison_idx: int | list[int] | list[list[int]] | None = None,
        normalized: bool = True,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The maps, without the base extractor's checks."""
        return self._maps(self.base_cam.compute_cams, class_idx, scores, comparison_idx, normalized, kwargs)

    def fuse_cams(self, cams: list[Tensor], target_shape: tuple[int, ...] | None = None) -> Tensor:
        """Fuse maps with the base extractor's rule."""
        return self.base_cam.fuse_cams(cams, target_shape)

    def __repr__(self) -> str:
        return (
            f"FinerCAM(base_method={type(self.base_cam).__name__}, target_layer={self.target_names}, "
            f"gamma={self.gamma}, num_references={self.num_references})"
        )
