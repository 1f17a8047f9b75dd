"""FullGrad: the input gradient times the input plus every layer's bias gradients, taken back to the
input. The math is in :mod:`camkit.functional.cam_extra`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional import cam_extra as CX
from ...functional.maps import normalize_maps, upsample_maps
from ...hooks import LayerCapture
from ...layers.families.torchvision import transform_window
from ...layers.names import LayerSpec
from ...layers.resolve import resolve_layers
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.explainer import Explainer
from .._core.output import crop_window, make_explanation
from ..registry import register_method

__all__ = ["FullGrad"]


_CONVS = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}
_NORMS = {nn.BatchNorm1d: 1, nn.BatchNorm2d: 2, nn.BatchNorm3d: 3}


def _frozen_norm(module: nn.Module) -> bool:
    """torchvision's ``FrozenBatchNorm2d`` (pretrained detectors' backbones), known by name: no import."""
    return type(module).__name__ == "FrozenBatchNorm2d" and all(
        isinstance(getattr(module, key, None), Tensor) for key in ("weight", "bias", "running_mean", "running_var")
    )


def _bias_rank(module: nn.Module) -> int | None:
    """How many spatial axes the convolution or batch norm takes (1, 2 or 3); ``None`` for other modules."""
    if _frozen_norm(module):
        return 2
    for kinds in (_CONVS, _NORMS):
        for kind, rank in kinds.items():
            if isinstance(module, kind):
                return rank
    return None


def _effective_bias(module: nn.Module) -> Tensor | None:
    """The bias a convolution adds (Conv1d/2d/3d), or a batch norm's (BatchNorm1d/2d/3d) in eval mode:
    ``beta - mean * gamma / sqrt(var + eps)``."""
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return None if module.bias is None else module.bias.detach()
    if _frozen_norm(module):
        frozen: Any = module
        scale = frozen.weight * torch.rsqrt(frozen.running_var + getattr(frozen, "eps", 1e-5))
        return frozen.bias - frozen.running_mean * scale
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)) and module.running_mean is not None and module.running_var is not None:
        scale = torch.rsqrt(module.running_var + module.eps)
        if module.weight is not None:
            scale = scale * module.weight.detach()
        shift = -module.running_mean * scale
        return shift if module.bias is None else shift + module.bias.detach()
    return None


def _fullgrad(input_term: Tensor, bias_terms: list[Tensor], window: tuple[int, int, int, int] | None) -> Tensor:
    """FullGrad's map [B, *S]; with a ``window`` (the layers saw the image resized and padded), each
    layer's channel sum of ``psi`` is taken back to the image as a Grad-CAM map is (:func:`crop_window`).

    ``psi`` is linear after its per-channel min-max, so summing the channels on the layer's grid
    and then cropping and resizing equals cropping and resizing each channel first.
    """
    if window is None:
        return CX.fullgrad_map(input_term, bias_terms)
    size = tuple(int(side) for side in input_term.shape[2:])
    total = CX.fullgrad_map(input_term, [])
    for term in bias_terms:
        on_grid = normalize_maps(term.abs(), spatial_dims=term.dim() - 2)[0].sum(dim=1)
        total = total + upsample_maps(crop_window(on_grid, window), size)
    return total


@register_method("fullgrad")
class FullGrad(Explainer):
    """FullGrad (Srinivas & Fleuret 2019): input-gradient and bias-gradient maps of every layer, summed.

    ``map = sum_c psi(x * dS/dx)_c + sum_l sum_c psi(b_l * dS/dz_l)_c`` over the layers ``l``
    that add a spatial bias ``b_l`` (a convolution with a bias and a batch norm, whose
    bias is ``beta - running_mean * gamma / sqrt(running_var + eps)``; also without affine
    parameters, which pytorch-grad-cam skips), ``z_l`` the layer's output; ``psi`` is
    :func:`camkit.functional.cam_extra.fullgrad_map`'s per-channel ``|.|``, min-max and
    upsampling. One forward and one full backward per target; a layer run several times in
    one forward contributes its last call.

    Any rank: for a signal [B, C, T] the bias layers are the ``nn.Conv1d`` and
    ``nn.BatchNorm1d``, for an image the ``Conv2d`` and ``BatchNorm2d``, for a volume or a
    video the ``Conv3d`` and ``BatchNorm3d``; layers of another rank (a ``Conv1d`` over the
    channels inside an image model, say) add no bias over the input's positions and are left
    out (a ``BatchNorm1d`` on pooled features [B, C] too).

    Detectors: torchvision's ``FrozenBatchNorm2d`` (pretrained backbones) counts as a batch
    norm. A detector that resizes and pads the image inside (torchvision's transform) gets
    each layer's bias term taken back to the image as Grad-CAM's maps are: ``psi``'s
    per-channel min-max on the layer's grid, the channels summed, the map upsampled to the
    padded size, cropped to the image and resized to the input's size (the input term is on
    the input's pixels already: the gradient goes through the resize). Layers whose output
    is not one map per image (R-CNN's per-region box and mask heads) are left out.

    Args:
        model: the model to explain.
        layers: the bias layers (names or modules); ``None``: every such layer of the model
            that has the input's rank.
        output, keep_mode, input_index: see :class:`Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        ...                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
        >>> e = camkit.FullGrad(net.eval()).explain(torch.rand(2, 3, 8, 8))
        >>> tuple(e.maps.shape), e.layers
        ((2, 8, 8), ('0', '1'))
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the input"
    use_when: ClassVar[str] = (
        "You want a sharp, whole-network map that accounts for the biases, which input gradients alone miss."
    )

    def __init__(
        self,
        model: nn.Module,
        layers: LayerSpec = None,
        *,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        self._chosen = layers is not None
        if layers is None:
            found = [(n, m) for n, m in self.model.named_modules() if _effective_bias(m) is not None]
        else:
            found = resolve_layers(self.model, layers)
            plain = [n for n, m in found if _effective_bias(m) is None]
            if plain:
                raise InvalidInputError(
                    f"FullGrad reads the bias of convolutions (nn.Conv1d/2d/3d) and batch norms "
                    f"(nn.BatchNorm1d/2d/3d); {plain} add none. Pass layers with a bias, or layers=None for all of them."
                )
        self._layers = found

    def _rank_layers(self, x: Tensor) -> list[tuple[str, nn.Module]]:
        """The bias layers of ``x``'s rank; a chosen layer of another rank is refused."""
        rank = x.dim() - 2
        other = [(n, _bias_rank(m)) for n, m in self._layers if _bias_rank(m) != rank]
        if other and self._chosen:
            raise InvalidInputError(
                f"FullGrad on {list(x.shape)} input ({rank} spatial axes) reads the biases of layers of that rank; "
                f"{[n for n, _ in other]} take {sorted({r for _, r in other if r is not None})} spatial axes. Pass layers of the "
                "input's rank, or layers=None."
            )
        return [(n, m) for n, m in self._layers if _bias_rank(m) == rank]

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        window = transform_window(self.model, x)
        image = x.detach().requires_grad_(True)
        layers = self._rank_layers(x)
        if window is not None:  # per-region layers (R-CNN's box and mask heads) are not on the image's grid
            layers = [(n, m) for n, m in layers if not n.startswith("roi_heads.")]
        biases = [_effective_bias(m) for _, m in layers]
        with LayerCapture(layers, gradients=True) as capture, torch.enable_grad():
            classes, scores = self._target_scores(image, target)
            outputs = capture.activations() if layers else []
            columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
            raws = []
            for k, column in enumerate(columns):
                grads = torch.autograd.grad(
                    column.sum(), [image, *outputs], retain_graph=k < len(columns) - 1, allow_unused=True
                )
                with torch.no_grad():
                    input_term = image.detach() * (torch.zeros_like(image) if grads[0] is None else grads[0])
                    bias_terms = [
                        bias.to(out.dtype).view(1, -1, *(1,) * (out.dim() - 2))
                        * (torch.zeros_like(out) if g is None else g)
                        for bias, out, g in zip(biases, outputs, grads[1:])
                        if bias is not None and out.dim() == x.dim() and out.shape[0] == x.shape[0]
                    ]
                    raws.append(_fullgrad(input_term.float(), [t.float() for t in bias_terms], window))
        raw = torch.stack(raws, dim=1) if scores.dim() == 2 else raws[0]
        names = tuple(n for n, _ in layers)
        return make_explanation(self.key, [raw], x, classes, scores.detach(), names)
