"""The compat gradient extractors' common parts: torchcam's ``_backprop`` contract on camkit's map functions."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Self, cast

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....methods import CAMExplainer, GradientCAM
from .core import _CAM, OutputTarget, _target_scores

__all__ = ["GradCAM", "GradCAMpp", "LayerCAM", "XGradCAM"]


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
