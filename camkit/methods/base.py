"""Thin explainer base classes: input checks, model-state hygiene, the output contract.

The math lives in :mod:`camkit.functional`; hook handling in :mod:`camkit.hooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .._state import eval_mode
from ..errors import InferenceModeError, InvalidInputError
from ..explanation import Explanation
from ..functional.maps import normalize_maps, upsample_maps
from ..hooks import LayerCapture
from ..layers import LayerSpec, resolve_layers
from ..targets import OutputSelector, Target, resolve_target, select_output

__all__ = ["CAMExplainer", "Explainer", "GradientCAM", "finish_maps"]


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


class Explainer:
    """Base class of every camkit explainer.

    Args:
        model: any ``nn.Module``; it is never modified. Each call runs it in eval mode and
            restores every module's ``training`` flag afterwards.
        output: what to score when the model does not return a tensor: a tuple index, a
            dict key or attribute name (``"logits"``), or a callable.
        keep_mode: run the model in the caller's modes instead of eval mode.
    """

    key: ClassVar[str] = ""
    needs_grad: ClassVar[bool] = True

    def __init__(self, model: nn.Module, *, output: OutputSelector = None, keep_mode: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.jit.ScriptModule):
            raise TypeError(
                "hooks cannot attach to TorchScript modules; explain the eager nn.Module the script was made from"
            )
        self.model = model
        self.output = output
        self.keep_mode = keep_mode

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={type(self.model).__name__})"

    def __call__(self, x: Tensor, target: Target = None) -> Tensor:
        """Maps [B, H, W] (or [B, K, H, W]) in [0, 1]; see :meth:`explain`."""
        return self.explain(x, target).maps

    def explain(self, x: Tensor, target: Target = None) -> Explanation:
        """Explain a batch.

        Args:
            x: float input [B, C, H, W] on the model's device.
            target: ``None`` (top-1), an int, B ints, a [B, K] LongTensor, or a callable
                ``f(output) -> Tensor[B]``; see :mod:`camkit.targets`.

        Returns:
            An :class:`~camkit.Explanation`.
        """
        self._check_input(x)
        with eval_mode(self.model, enabled=not self.keep_mode):
            return self._explain(x, target)

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise InvalidInputError(f"x must be a tensor [B, C, H, W], got {type(x).__name__}")
        if x.dim() != 4:
            hint = " (add a batch dimension with x[None])" if x.dim() == 3 else ""
            raise InvalidInputError(f"x must be a batch [B, C, H, W], got shape {list(x.shape)}{hint}")
        if not x.is_floating_point():
            raise InvalidInputError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        if self.needs_grad and torch.is_inference_mode_enabled():
            raise InferenceModeError(
                f"{type(self).__name__} needs autograd, which torch.inference_mode() turns off; call it "
                "outside inference_mode (an outer torch.no_grad() is fine: camkit enables only what it needs)."
            )

    def _forward(self, x: Tensor) -> Tensor:
        return select_output(self.model(x), self.output)

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
        output, keep_mode: see :class:`Explainer`.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode)
        self.layer = layer
        self.call = call
        self._layers: list[tuple[str, nn.Module]] | None = None if layer is None else resolve_layers(model, layer)

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        """The resolved ``(name, module)`` pairs (auto-detected from ``x`` on first use)."""
        if self._layers is None:
            self._layers = resolve_layers(self.model, None, x)
        return self._layers

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
    """

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        """The raw map [B, h, w] from float32 activations and gradients [B, C, h, w]."""
        raise NotImplementedError

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layers = self.layers(x)
        with LayerCapture(layers, gradients=True, call=self.call) as capture:
            classes, scores = resolve_target(target, self._forward(x))
            columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
            acts = [a.detach().float() for a in capture.activations()]
            per_layer: list[list[Tensor]] = [[] for _ in layers]
            for k, column in enumerate(columns):
                grads = capture.gradients(column, retain_graph=k < len(columns) - 1)
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
        maps, flat = finish_maps(raws, (x.shape[-2], x.shape[-1]))
        return Explanation(
            maps=maps.to(x.device),
            raw=raws[0] if len(raws) == 1 else tuple(raws),
            target=classes,
            scores=scores,
            flat=flat.to(x.device),
            method=self.key,
            layers=self._names(),
            extras=extras,
        )
