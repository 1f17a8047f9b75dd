"""Pixel-space attributions: Saliency, Input x Gradient, Guided Backprop, DeconvNet, Guided Grad-CAM.

Every explainer here differentiates the target score with respect to a *detached copy* of
the input, so the caller's tensor keeps its values and its ``requires_grad``; gradients are
taken with :func:`torch.autograd.grad`, so no ``param.grad`` is touched.

Output contract (shared with the CAMs), for an input [B, C, *S] of any rank (a signal
[B, C, T], an image [B, C, H, W], a volume or a video [B, C, D, H, W]): ``raw`` is the signed
attribution [B, C, *S] ([B, K, C, *S] for [B, K] targets) and ``maps`` is
``normalize(max_c |raw|)`` [B, *S] (see :func:`camkit.functional.reduce_channels`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from ...errors import InvalidTargetError, NoReLUWarning
from ...explanation import Explanation
from ...functional.attribution import reduce_channels
from ...functional.maps import normalize_maps, upsample_maps
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.cam_base import CAMExplainer, Reshape
from .._core.explainer import Explainer
from ..cam.gradcam import GradCAM
from ..registry import register_method
from .guided import ReLURule, relu_rule

__all__ = [
    "Deconvolution",
    "GradientAttribution",
    "GuidedBackprop",
    "GuidedGradCAM",
    "InputXGradient",
    "Saliency",
    "pixel_maps",
    "score_gradients",
]


def pixel_maps(raw: Tensor, size: Sequence[int]) -> tuple[Tensor, Tensor]:
    """The output contract for signed attributions: ``normalize(max_c |raw|)`` at ``size``.

    Args:
        raw: [..., C, *s] with one spatial axis per entry of ``size``.
        size: the output's spatial size: ``(T,)``, ``(H, W)`` or ``(D, H, W)``; maps at
            another size are resized linearly, bilinearly or trilinearly.

    Returns:
        ``(maps, flat)``: float32 maps [..., *size] in [0, 1] and the bool ``flat`` [...].

    Example:
        >>> import torch
        >>> from camkit.methods.attribution.pixel import pixel_maps
        >>> maps, flat = pixel_maps(torch.tensor([[[[1.0, -3.0]], [[2.0, 0.0]]]]), (1, 2))
        >>> maps.tolist(), flat.tolist()
        ([[[0.0, 1.0]]], [False])
    """
    size = tuple(size)
    n = len(size)
    return normalize_maps(upsample_maps(reduce_channels(raw.float(), spatial_dims=n), size), spatial_dims=n)


def score_gradients(scores: Tensor, inputs: Tensor) -> Tensor:
    """Gradient of each score column with respect to ``inputs`` [N, C, *S] (any rank).

    The samples are independent (eval mode), so the gradient of the summed score is each
    sample's own gradient.

    Returns:
        [N, C, *S] for scores [N]; [N, K, C, *S] for scores [N, K].
    """
    columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
    if not scores.requires_grad:
        raise InvalidTargetError(
            "the target score does not depend on the input (no autograd graph links them); explain "
            "an output that the model computes from its input, or check a callable target."
        )
    grads = []
    for k, column in enumerate(columns):
        (grad,) = torch.autograd.grad(column.sum(), inputs, retain_graph=k < len(columns) - 1, allow_unused=True)
        grads.append(torch.zeros_like(inputs) if grad is None else grad)
    return torch.stack(grads, dim=1) if scores.dim() == 2 else grads[0]


class GradientAttribution(Explainer):
    """Base of the attributions built from the input gradient of the target score.

    Subclasses choose a ReLU backward rule (:attr:`relu`) and how gradients become the
    attribution (:meth:`combine`). One forward and one backward per target column.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> class AbsGradient(camkit.GradientAttribution):  # a toy attribution: |dS/dx|
        ...     def combine(self, x, grads):
        ...         return grads.abs()
        >>> e = AbsGradient(net).explain(torch.rand(2, 3, 8, 8))
        >>> tuple(e.raw.shape), tuple(e.maps.shape)
        ((2, 3, 8, 8), (2, 8, 8))
    """

    family: ClassVar[str | None] = "gradient attribution"

    relu: ClassVar[ReLURule | None] = None

    def maps_from_raw(self, raw: Tensor, size: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Maps [..., *size] from raw attributions [..., C, *s]; see :func:`pixel_maps`."""
        return pixel_maps(raw, size)

    def combine(self, x: Tensor, grads: Tensor) -> Tensor:
        """The attribution from the input ``x`` [B, C, *S] and its gradients [B, (K,) C, *S]."""
        return grads

    @contextmanager
    def _rule(self) -> Iterator[None]:
        if self.relu is None:
            yield
            return
        with relu_rule(self.relu) as seen:
            yield
        if seen.calls == 0:
            warnings.warn(
                f"{type(self).__name__}: the forward pass of {type(self.model).__name__} called no ReLU, so "
                f"the {self.relu} rule changed nothing and the result is the plain input gradient (what "
                "camkit.Saliency gives). Activations such as GELU or SiLU have no guided/DeconvNet rule.",
                NoReLUWarning,
                stacklevel=6,
            )

    def _input_gradients(self, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor, Tensor]:
        leaf = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            with self._rule():
                # The model gets a non-leaf copy, so in-place ops on its input are legal.
                classes, scores = self._target_scores(leaf.clone(), target)
            grads = score_gradients(scores, leaf)
        return classes, scores.detach(), grads

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        classes, scores, grads = self._input_gradients(x, target)
        raw = self.combine(x.detach(), grads)
        maps, flat = self.maps_from_raw(raw, tuple(x.shape[2:]))
        return Explanation(maps=maps, raw=raw, target=classes, scores=scores, flat=flat, method=self.key)


def _like_grads(x: Tensor, grads: Tensor) -> Tensor:
    return x.unsqueeze(1) if grads.dim() == x.dim() + 1 else x


@register_method("saliency")
class Saliency(GradientAttribution):
    """Saliency (Simonyan et al. 2014): the gradient of the target score with respect to the input.

    ``raw`` is the signed gradient [B, C, *S]; ``maps`` [B, *S] the maximum over channels of
    its absolute value at each position, min-max normalised (on any rank).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, -3.0], [0.0, 1.0]]))
        >>> explanation = camkit.Saliency(net).explain(torch.ones(1, 1, 1, 2), target=0)
        >>> explanation.raw.tolist(), explanation.maps.tolist()
        ([[[[1.0, -3.0]]]], [[[0.0, 1.0]]])
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the input"
    use_when: ClassVar[str] = (
        "You want the cheapest pixel-level sensitivity; expect noise (smooth it with SmoothGrad)."
    )


@register_method("inputxgradient")
class InputXGradient(GradientAttribution):
    """Input x Gradient (Shrikumar et al. 2016): ``raw = x * dS/dx`` [B, C, *S] (any rank).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, -3.0]]))
        >>> camkit.InputXGradient(net).explain(torch.tensor([[[[2.0, 1.0]]]]), target=0).raw.tolist()
        [[[[2.0, -3.0]]]]
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the input"
    use_when: ClassVar[str] = (
        "You want pixel attributions that weigh sensitivity by the input's value (first-order contribution)."
    )

    def combine(self, x: Tensor, grads: Tensor) -> Tensor:
        return _like_grads(x, grads) * grads


@register_method("guidedbackprop")
class GuidedBackprop(GradientAttribution):
    """Guided backpropagation (Springenberg et al. 2015) through every ReLU the forward calls.

    At each ReLU only positive gradients pass, and only where the ReLU was active. ReLUs
    are found by call, not by module (see :mod:`camkit.methods.attribution.guided`), so ``F.relu``,
    ``torch.relu`` and ``x.relu_()`` count as much as ``nn.ReLU``. A model that calls no
    ReLU gets a :class:`~camkit.errors.NoReLUWarning` (its result is the plain gradient).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.eye(2))
        ...     _ = net[3].weight.copy_(torch.tensor([[1.0, -1.0]]))
        >>> camkit.GuidedBackprop(net).explain(torch.ones(1, 1, 1, 2), target=0).raw.tolist()
        [[[[1.0, 0.0]]]]
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the input"
    use_when: ClassVar[str] = (
        "You want crisp edge-level detail; check it with the randomization sanity check first."
    )

    relu = "guided"


@register_method("deconvolution")
class Deconvolution(GradientAttribution):
    """DeconvNet (Zeiler & Fergus 2014): at every ReLU only positive gradients pass, wherever the ReLU was.

    Like :class:`GuidedBackprop`, every ReLU call is seen, whatever its spelling.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.eye(2))
        ...     _ = net[3].weight.copy_(torch.tensor([[1.0, 2.0]]))
        >>> camkit.Deconvolution(net).explain(torch.tensor([[[[1.0, -1.0]]]]), target=0).raw.tolist()
        [[[[1.0, 2.0]]]]
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the input"
    use_when: ClassVar[str] = (
        "You want Zeiler & Fergus's deconvnet view of what patterns drive the score; not class-faithful."
    )

    relu = "deconv"


@register_method("guidedgradcam")
class GuidedGradCAM(CAMExplainer):
    """Guided Grad-CAM (Selvaraju et al. 2017): guided backprop times the upsampled Grad-CAM map.

    ``raw = guided_backprop(x) * gradcam_map`` [B, C, *S], where ``gradcam_map`` is
    :class:`~camkit.GradCAM`'s contract map [B, *S] (upsampled from the layer's grid by the
    rank's mode: linear for a signal, bilinear for an image, trilinear for a volume or a
    video; then min-max to [0, 1]) broadcast over channels; ``maps`` follow the pixel rule
    (``max_c |raw|``, normalised).
    A call costs a guided forward and backward plus a Grad-CAM pass (Grad-CAM's gradient is
    the plain one, as in the paper).

    Args:
        model, layer, call, output, keep_mode, reshape, input_index: as for :class:`~camkit.GradCAM`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> explanation = camkit.GuidedGradCAM(net, "0").explain(torch.rand(2, 3, 8, 8))
        >>> tuple(explanation.raw.shape), tuple(explanation.maps.shape), explanation.layers
        ((2, 3, 8, 8), (2, 8, 8), ('0',))
    """

    cost: ClassVar[str] = "1 forward + 2 backwards (guided to the input, and Grad-CAM's partial one)"
    use_when: ClassVar[str] = (
        "You want Guided Backprop's detail made class-specific by a Grad-CAM mask."
    )

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
        super().__init__(
            model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape, input_index=input_index
        )
        self._guided = GuidedBackprop(model, output=output, keep_mode=keep_mode, input_index=input_index)
        self._cam = GradCAM(
            model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape, input_index=input_index
        )

    def layers(self, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
        return self._cam.layers(x)

    def maps_from_raw(self, raw: Tensor, size: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Maps [..., *size] from raw attributions [..., C, *s]; see :func:`pixel_maps`."""
        return pixel_maps(raw, size)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        # Both parts run inside this call's eval mode, with this call's model inputs.
        with self._lend_call(self._guided, self._cam):
            guided = self._guided._explain(x, target)
            # The Grad-CAM pass explains the very classes guided backprop used (top-1 resolved once).
            cam = self._cam._explain(x, target if guided.target is None else guided.target)
        guided_raw = cast(Tensor, guided.raw)
        size = tuple(x.shape[2:])
        # the CAM map [B, (K,) *S] at the input's size, over the channel axis of raw [B, (K,) C, *S]
        raw = guided_raw * cam.maps.to(guided_raw.dtype).unsqueeze(-(len(size) + 1))
        maps, flat = self.maps_from_raw(raw, size)
        return Explanation(
            maps=maps,
            raw=raw,
            target=guided.target,
            scores=guided.scores,
            flat=flat,
            method=self.key,
            layers=cam.layers,
        )
