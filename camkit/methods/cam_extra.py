"""Further CAMs of pytorch-grad-cam's set: element-wise Grad-CAM, ShapleyCAM, Finer-CAM, FEM,
KPCA-CAM, RandomCAM and FullGrad. The math is in :mod:`camkit.functional.cam_extra`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .. import functional as CF
from .._internal.syncs import to_device
from ..errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ..explanation import Explanation
from ..functional import cam_extra as CX
from ..functional.maps import normalize_maps, upsample_maps
from ..hooks import LayerCapture
from ..layers.families.torchvision import transform_window
from ..layers.names import LayerSpec
from ..layers.resolve import resolve_layers
from ..registry import get_method, register_method
from ..targets.classes import OutputSelector, Target, resolve_target, select_output
from ._forward import Captured, ForwardCAM
from ._output import crop_window
from .base import Explainer, GradientCAM, InputIndex, make_explanation

__all__ = ["FEM", "KPCACAM", "FinerCAM", "FullGrad", "GradCAMElementWise", "RandomCAM", "ShapleyCAM"]


def _same_for_every_target(raw: Tensor, cap: Captured) -> Tensor:
    """A target-independent map [B, *s], repeated K times for [B, K] targets."""
    if cap.multi:
        return raw[:, None].expand(-1, cap.scores.shape[1], *raw.shape[1:]).contiguous()
    return raw


@register_method("gradcamelementwise")
class GradCAMElementWise(GradientCAM):
    """Element-wise Grad-CAM: ``sum_c relu(dS/dA_c * A_c)``, the positive products summed.

    Like HiResCAM it keeps each position's own gradient, but clips every channel's product
    at zero before the sum, so negative evidence in one channel cannot cancel positive
    evidence in another.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.GradCAMElementWise(net, "1")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    cost: ClassVar[str] = "1 forward + 1 backward through the layers after the target layer"
    use_when: ClassVar[str] = (
        "You want HiResCAM's position-exact products without channels of opposite sign cancelling out."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        return CX.gradcam_elementwise(acts, grads)


@register_method("shapleycam")
class ShapleyCAM(GradientCAM):
    """ShapleyCAM (Cai et al. 2025): channels weighted by ``mean_s(dS/dA - H A / 2)``.

    ``H A`` is the Hessian of the score with respect to the layer's activations applied to
    them (a Hessian-vector product by double backward); the map is
    ``relu(sum_c w_c A_c)``. Where the network after the layer is piecewise linear (ReLU
    layers, pooling and a linear head) ``H A`` is zero and the map is Grad-CAM's; it differs
    for smooth heads (GELU, softmax attention, squared terms). Cost: Grad-CAM's backward
    plus a second one through the same part of the network, per target.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.ShapleyCAM(net, "0")(torch.rand(2, 3, 8, 8), target=1).shape
        torch.Size([2, 8, 8])
    """

    cost: ClassVar[str] = "1 forward + 2 backwards (gradient, then a Hessian-vector product) after the target layer"
    use_when: ClassVar[str] = (
        "Your network after the layer is smooth (GELU, attention, softmax) and you want Grad-CAM "
        "corrected by second-order terms; on ReLU heads it equals Grad-CAM."
    )

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:  # pragma: no cover - _explain passes hvp
        return CF.weighted_sum(CX.shapley_weights(grads, torch.zeros_like(grads)), acts)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layers = self.layers(x)
        with LayerCapture(layers, gradients=True, call=self.call) as capture:
            classes, scores = self._target_scores(x, target)
            columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
            recorded = capture.activations()
            acts = self.to_grid([a.detach().float() for a in recorded], x)
            per_layer: list[list[Tensor]] = [[] for _ in layers]
            for column in columns:
                with torch.enable_grad():
                    grads = self._first_order(column, recorded)
                    hvps = self._hvps(grads, recorded)
                grids = self.to_grid([g.detach() for g in grads], x)
                hvp_grids = self.to_grid(hvps, x)
                with torch.no_grad():
                    for maps, act, grad, hvp in zip(per_layer, acts, grids, hvp_grids):
                        weights = CX.shapley_weights(self._check_grad(grad, x).float(), hvp.float())
                        maps.append(CF.weighted_sum(weights, act))
        multi = scores.dim() == 2
        raws = [torch.stack(m, dim=1) if multi else m[0] for m in per_layer]
        return self._explanation(raws, x, classes, scores.detach())

    def _first_order(self, column: Tensor, recorded: list[Tensor]) -> tuple[Tensor, ...]:
        names = self._names()
        if not column.requires_grad:
            raise LayerNotReachedError(
                f"the score does not depend on layer(s) {list(names)}; choose a layer whose output feeds the model's output."
            )
        grads = torch.autograd.grad(column.sum(), recorded, create_graph=True, allow_unused=True)
        for name, grad in zip(names, grads):
            if grad is None:
                raise LayerNotReachedError(
                    f"the score does not depend on layer '{name}'; choose a layer whose output feeds the model's output."
                )
        return grads

    @staticmethod
    def _hvps(grads: tuple[Tensor, ...], recorded: list[Tensor]) -> list[Tensor]:
        out = []
        for grad, act in zip(grads, recorded):
            if not grad.requires_grad:  # linear after the layer: no second-order term
                out.append(torch.zeros_like(act))
                continue
            (hvp,) = torch.autograd.grad(grad, act, grad_outputs=act.detach(), retain_graph=True, allow_unused=True)
            out.append(torch.zeros_like(act) if hvp is None else hvp.detach())
        return out


@register_method("finercam")
class FinerCAM(GradientCAM):
    """Finer-CAM (Zhang et al. 2025): a CAM of the target against its most similar classes.

    The explained score is :func:`camkit.functional.cam_extra.finer_scores`: the target
    logit minus ``alpha`` times the softmax-weighted logits of the ``comparisons`` classes
    whose logits are nearest to it, so the map shows what tells the class apart from its
    look-alikes. Any gradient CAM computes the map from that score (``base``, default
    Grad-CAM). ``scores`` of the explanation are these differences. Class targets only.

    Args:
        model: the model to explain.
        layer: the target layer(s).
        base: the registry key (or class) of a gradient CAM: ``"gradcam"``, ``"hirescam"``,
            ``"layercam"``, ``"gradcam++"``, ``"xgradcam"``, ``"gradcamelementwise"``...
        comparisons: how many nearest classes to compare with (default 3).
        alpha: the weight of the rivals' logits (default 1; 0 gives the base method).
        call, output, keep_mode, reshape, input_index: see :class:`CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 5))
        >>> e = camkit.FinerCAM(net, "1", comparisons=2).explain(torch.rand(2, 3, 8, 8), target=[0, 4])
        >>> tuple(e.maps.shape), e.target.tolist()
        ((2, 8, 8), [0, 4])
    """

    cost: ClassVar[str] = "1 forward + 1 backward after the target layer (as its base CAM)"
    use_when: ClassVar[str] = (
        "The model confuses look-alike classes and you want what separates the target from its nearest rivals."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        base: str | type[GradientCAM] = "gradcam",
        comparisons: int = 3,
        alpha: float = 1.0,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Any = None,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(
            model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape, input_index=input_index
        )
        cls = get_method(base) if isinstance(base, str) else base
        if not (isinstance(cls, type) and issubclass(cls, GradientCAM)) or cls._explain is not GradientCAM._explain:
            raise InvalidInputError(
                f"base must be a gradient CAM computed from one gradient (e.g. 'gradcam', 'hirescam', 'layercam'), "
                f"got {getattr(cls, '__name__', cls)!r}"
            )
        if isinstance(comparisons, bool) or not isinstance(comparisons, int) or comparisons < 1:
            raise InvalidInputError(f"comparisons must be a positive int, got {comparisons!r}")
        self.base = cls
        self._base = cls(model, layer)
        self.comparisons = comparisons
        self.alpha = float(alpha)

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        return self._base.raw_map(acts, grads)

    def _target_scores(self, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor]:
        if callable(target) and not isinstance(target, Tensor):
            raise InvalidTargetError(
                "Finer-CAM compares a class with its nearest classes, so it needs class targets (None, ints "
                "or a LongTensor); a callable target has no class to compare."
            )
        output = select_output(self._call_model(x), self.output)
        classes, _ = resolve_target(target, output, batch=x.shape[0])
        assert classes is not None  # class targets always give classes
        return classes, CX.finer_scores(output, classes, self.comparisons, self.alpha)


@register_method("fem")
class FEM(ForwardCAM):
    """FEM (Fuad et al. 2020): channels weighted by the share of positions above ``mean + k std``.

    ``w_c = mean_s(A_c > mean_s(A_c) + k * std_s(A_c))``, over every spatial axis ``s`` of the
    layer, and the map is ``relu(sum_c w_c A_c)``: channels with a few strong peaks count. One
    forward pass without autograd; the map does not depend on the target (with [B, K] targets it is
    returned K times).

    Args:
        model, layer, call, output, keep_mode: see :class:`CAMExplainer`.
        k: the threshold in standard deviations (default 2).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.FEM(net, "1", k=1.0)(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd)"
    use_when: ClassVar[str] = "You want a cheap, class-agnostic map of the layer's outstanding peaks (no gradients)."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        k: float = 2.0,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode)
        self.k = float(k)

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        act = act.float()
        return _same_for_every_target(CF.weighted_sum(CX.fem_weights(act, self.k), act), cap)


@register_method("kpcacam")
class KPCACAM(ForwardCAM):
    """KPCA-CAM (Karmani et al. 2024): the first kernel principal component of the activations.

    See :func:`camkit.functional.cam_extra.kpca_projection` (pytorch-grad-cam's
    ``KPCA_CAM``). One forward without autograd plus a batched eigendecomposition of an
    ``N x N`` kernel matrix per image (float64), ``N`` the layer's positions (``t`` for a
    signal, ``h w`` for an image, ``d h w`` for a volume: mind the cost of a large 3-D layer);
    the map does not depend on the target. Its sign is fixed to agree with the
    channel-summed activations.

    Args:
        model, layer, call, output, keep_mode: see :class:`CAMExplainer`.
        kernel: ``"sigmoid"`` (default), ``"rbf"``, ``"poly"``, ``"cosine"`` or ``"linear"``.
        gamma: kernel coefficient; ``None`` means ``1 / C``.
        degree, coef0: of the ``"poly"`` and ``"sigmoid"`` kernels.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> camkit.KPCACAM(net, "1", kernel="rbf")(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 8, 8])
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd) + an (h*w) x (h*w) eigendecomposition per image"
    use_when: ClassVar[str] = (
        "You want Eigen-CAM's class-agnostic dominant pattern with a non-linear kernel; mind the cost at large layers."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        kernel: CX.Kernel = "sigmoid",
        gamma: float | None = None,
        degree: int = 3,
        coef0: float = 1.0,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode)
        if kernel not in CX.KERNELS:
            raise InvalidInputError(f"kernel must be one of {', '.join(map(repr, CX.KERNELS))}, got {kernel!r}")
        self.kernel: CX.Kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        raw = CX.kpca_projection(act.float(), self.kernel, self.gamma, self.degree, self.coef0)
        return _same_for_every_target(raw, cap)


@register_method("randomcam")
class RandomCAM(ForwardCAM):
    """Random-CAM, the sanity baseline: ``relu(sum_c w_c A_c)`` with ``w_c ~ U(-1, 1)``.

    A map that knows the layer but nothing of the target or the model's decision: a method
    (or a metric) that cannot beat it says little. The weights are drawn on the CPU from
    ``seed`` once per call, one per channel, and shared by every image and target of the
    call, so a batch equals its images one by one and the result does not depend on the
    device. Without a seed it is drawn from torch's global generator. No gradients are
    computed (pytorch-grad-cam's ``RandomCAM`` runs a backward pass it does not use).

    Args:
        model, layer, call, output, keep_mode: see :class:`CAMExplainer`.
        seed: the weights' seed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 3))
        >>> x = torch.rand(2, 3, 8, 8)
        >>> torch.equal(camkit.RandomCAM(net, "1", seed=3)(x), camkit.RandomCAM(net, "1", seed=3)(x))
        True
    """

    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward (no autograd)"
    use_when: ClassVar[str] = (
        "You need a baseline that ignores the model's decision, to check that a method or metric beats chance."
    )

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        seed: int | None = None,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode)
        self.seed = seed

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)))
        generator = torch.Generator().manual_seed(seed + index)
        weights = torch.rand(act.shape[1], generator=generator, dtype=torch.float64) * 2 - 1
        weights = to_device(weights, act.device, torch.float32)
        extras.setdefault("seed", seed)
        raw = torch.einsum("c,bc...->b...", weights, act.float()).clamp_min(0)
        return _same_for_every_target(raw, cap)


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
