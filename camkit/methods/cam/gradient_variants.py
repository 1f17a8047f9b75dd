"""Grad-CAM variants that change how the gradients weigh the activations: element-wise Grad-CAM,
ShapleyCAM (second-order, a Hessian-vector product) and Finer-CAM (the target against its most
similar classes). The math is in :mod:`camkit.functional.cam_extra`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ... import functional as CF
from ...errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ...explanation import Explanation
from ...functional import cam_extra as CX
from ...hooks import LayerCapture
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from .._core.cam_base import GradientCAM
from ..registry import get_method, register_method

__all__ = ["FinerCAM", "GradCAMElementWise", "ShapleyCAM"]


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
