"""Concept relevance (Achtibat et al. 2023, CRP): how much each channel of a layer gave the score, and where.

:class:`ConceptRelevance` runs one forward pass and one backward to the layer: each channel's
relevance there is ``A * dS/dA`` summed over the layer's positions (the gradient rule), or
``A`` times LRP's modified gradient (any rule of :class:`camkit.LRP`, the whole model then runs
under that rule, as in CRP). The conditional map of a channel continues the backward from
the layer with only that channel's relevance kept, down to the input, and multiplies by the
input (gradient x input, or the LRP rules below the layer). K chosen channels cost K backward
passes through the layers *below* the layer, from the same forward. :class:`ConceptReferences`
streams a dataset and keeps, per channel, the images where it was most relevant and the
region of each (CRP's relevance-based reference samples, not activation maximisation).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from contextvars import ContextVar
from typing import Any, ClassVar, Union

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ...explanation import Explanation
from ...functional.concepts import channel_mask, channel_relevance, merge_top, relevance_boxes
from ...hooks import HookScope
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from .._core.cam_base import CAMExplainer
from ._activations import warn_unruled
from ._lrp_mode import _LRPMode
from .lrp import LRP
from .pixel import pixel_maps

__all__ = ["ConceptReferences", "ConceptRelevance"]

Channels = Union[int, Sequence[int], Tensor, None]
_CHANNELS: ContextVar[Channels] = ContextVar("camkit_concept_channels", default=1)


class ConceptRelevance(CAMExplainer):
    """Each channel's relevance at a layer, ``[B, C]``, and conditional maps of chosen channels, ``[B, K, *S]``.

    ``rule="gradient"`` (default): the relevance at the layer is ``R = A * dS/dA`` and a channel's
    relevance ``R_c = sum_p A_cp dS/dA_cp`` (over the layer's positions ``p``); its conditional
    map is ``x * J^T (dS/dA masked to channel c)``, the input gradient of the score with the
    backward restricted to that channel at the layer, times the input. With an LRP rule
    (``"epsilon"``, ``"epsilonplus"``, ...: see :class:`camkit.LRP`) the gradients are LRP's
    modified ones throughout, so ``R_c`` is the channel's LRP relevance and its conditional
    map the relevance propagated from it alone. The conditional maps of every channel add up
    to the plain attribution (gradient x input, or ``camkit.LRP``'s ``raw``).

    :meth:`explain` returns an :class:`~camkit.Explanation` whose ``raw`` holds the conditional
    relevance of each input value [B, K, C_in, *S], ``maps`` [B, K, *S] its normalised
    ``max_c |raw|``, and ``extras``: ``"relevance"`` [B, C], ``"channels"`` [B, K],
    ``"layer_maps"`` [B, K, *s] (each chosen channel's relevance at the layer, signed),
    ``"rule"``. :meth:`relevance` gives [B, C] alone (no backward below the layer).

    The layer's output must be channel-first: [B, C, *s] with the input's number of spatial
    axes, or [B, C] (a vector layer, no positions). Targets: one class per image (``None``,
    an int, B ints or a callable); for several classes, call once per class.

    Args:
        model: the model to explain.
        layer: the layer whose channels are the concepts (``None``: as for Grad-CAM).
        rule: ``"gradient"`` or an LRP rule or composite (see :class:`camkit.LRP`).
        epsilon, gamma, alpha, beta, low, high: the LRP rules' settings (see :class:`camkit.LRP`).
        call, output, keep_mode, input_index: see :class:`~camkit.CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv1d(1, 2, 1, bias=False), nn.Flatten(), nn.Linear(4, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.tensor([[[1.0]], [[-2.0]]]))
        ...     _ = net[2].weight.copy_(torch.tensor([[1.0, 1.0, 3.0, 0.0]]))
        >>> x = torch.tensor([[[1.0, 2.0]]])  # A = [[1, 2], [-2, -4]], dS/dA = [[1, 1], [3, 0]]
        >>> e = camkit.ConceptRelevance(net, "0").explain(x, 0, channels=[0, 1])
        >>> e.extras["relevance"].tolist(), e.raw[0, :, 0].tolist()  # channel 1 only reads x[0]
        ([[3.0, -6.0]], [[1.0, 2.0], [-6.0, 0.0]])
    """

    cost: ClassVar[str] = "1 forward + 1 backward to the layer + 1 backward below it per chosen channel"
    use_when: ClassVar[str] = "You want to know which channels (concepts) a decision used, and where each one looked."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        rule: str = "gradient",
        *,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        alpha: float = 2.0,
        beta: float = 1.0,
        low: Any = None,
        high: Any = None,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index)
        self.rule = rule
        self._lrp: LRP | None = None
        if rule != "gradient":
            try:
                self._lrp = LRP(model, rule, epsilon=epsilon, gamma=gamma, alpha=alpha, beta=beta, low=low, high=high)  # type: ignore[arg-type]
            except InvalidInputError as err:
                raise InvalidInputError(f"ConceptRelevance: rule must be 'gradient' or an LRP rule; {err}") from None

    def explain(
        self,
        x: Tensor,
        target: Target = None,
        *,
        channels: Channels = 1,
        inputs: Sequence[Any] | None = None,
        kwargs: Any = None,
    ) -> Explanation:
        """Explain a batch: relevance of every channel, conditional maps of ``channels``.

        Args:
            x: the input [B, C, *S] (any rank).
            target: one class per image (see :class:`~camkit.Explainer`).
            channels: an int ``K`` (each image's ``K`` most relevant channels, the default 1),
                a list of channel indices (the same K for every image), or a LongTensor [B, K].
                ``0`` or ``[]``: no conditional map (relevance only).
            inputs, kwargs: see :meth:`camkit.Explainer.explain`.
        """
        token = _CHANNELS.set(channels)
        try:
            return super().explain(x, target, inputs=inputs, kwargs=kwargs)
        finally:
            _CHANNELS.reset(token)

    def relevance(self, x: Tensor, target: Target = None) -> Tensor:
        """Each channel's relevance at the layer, float32 [B, C] (no backward below the layer).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> import camkit
            >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False))
            >>> with torch.no_grad():
            ...     _ = net[1].weight.copy_(torch.eye(2)); _ = net[2].weight.copy_(torch.tensor([[2.0, -1.0]]))
            >>> camkit.ConceptRelevance(net, "1").relevance(torch.tensor([[[1.0, 3.0]]]), 0).tolist()
            [[2.0, -3.0]]
        """
        rel: Tensor = self.explain(x, target, channels=0).extras["relevance"]
        return rel

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        name, module = self._one_layer(x)
        leaf = x.detach().clone().requires_grad_(True)
        mode = _LRPMode(self._lrp._book) if self._lrp is not None else None
        records: list[Tensor] = []

        def hook(mod: nn.Module, args: Any, out: Any) -> Any:
            if not isinstance(out, Tensor):
                raise InvalidInputError(f"layer '{name}' returns {type(out).__name__}; ConceptRelevance needs a tensor")
            records.append(out)
            return out.clone()  # in-place ops after the layer change the copy; ``out`` stays as recorded

        with torch.enable_grad(), HookScope() as hooks:
            hooks.forward(module, hook, own_thread=True, prepend=True)
            with mode if mode is not None else nullcontext():
                raw_out = self._call_model(leaf if mode is None else leaf.clone())
            if mode is not None:
                mode.finish()
            if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw_out, Tensor):
                classes, scores = resolve_target(target, raw_out, batch=x.shape[0])
            else:
                classes, scores = resolve_target(target, select_output(raw_out, self.output), batch=x.shape[0])
        if scores.dim() != 1:
            raise InvalidTargetError(
                f"ConceptRelevance explains one class per image, got targets of shape {list(scores.shape)}; "
                "call it once per class"
            )
        act = self._pick(records, name, x)
        if not scores.requires_grad:
            raise LayerNotReachedError(f"the score does not depend on layer '{name}'; choose a layer that feeds the output")
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(scores.sum(), act, retain_graph=True, allow_unused=True)
        if grad is None:
            raise LayerNotReachedError(f"the score does not depend on layer '{name}'; choose a layer that feeds the output")
        relevance_at = act.detach().float() * grad.float()
        rel = channel_relevance(relevance_at)
        chosen = _choose(_CHANNELS.get(), rel)
        masks = channel_mask(chosen, rel.shape[1], tuple(act.shape)).to(relevance_at.dtype)
        layer_maps = (relevance_at[None] * masks).sum(dim=2).transpose(0, 1)  # [B, K, *s]
        bounds = mode.bounds if mode is not None else []
        raw = self._below(act, grad, masks, leaf, bounds)
        if mode is not None:
            warn_unruled("ConceptRelevance", mode.unruled, "their plain gradient is used, so relevance is not conserved.")
        maps, flat = pixel_maps(raw, tuple(x.shape[2:]))
        return Explanation(
            maps=maps, raw=raw, target=classes, scores=scores.detach(), flat=flat, method="conceptrelevance",
            layers=(name,), extras={"relevance": rel, "channels": chosen, "layer_maps": layer_maps, "rule": self.rule},
        )  # fmt: skip

    def _one_layer(self, x: Tensor) -> tuple[str, nn.Module]:
        layers = self.layers(x)
        if len(layers) != 1:
            raise InvalidInputError(
                f"ConceptRelevance reads one layer, got {len(layers)} ({[n for n, _ in layers]}); make one per layer"
            )
        return layers[0]

    def _pick(self, records: list[Tensor], name: str, x: Tensor) -> Tensor:
        if not records:
            raise LayerNotReachedError(f"layer '{name}' was not called during the forward pass (see camkit.list_layers)")
        try:
            act = records[self.call]
        except IndexError:
            raise LayerNotReachedError(f"layer '{name}' ran {len(records)} time(s); call={self.call} is out of range") from None
        if act.dim() not in (2, x.dim()) or act.shape[0] != x.shape[0]:
            raise InvalidInputError(
                f"ConceptRelevance needs the layer's output channel-first, [B, C, *s] with {x.dim() - 2} spatial "
                f"axes or [B, C]; layer '{name}' gives {list(act.shape)}. Pick a convolutional layer."
            )
        return act

    def _below(self, act: Tensor, grad: Tensor, masks: Tensor, leaf: Tensor, bounds: list[tuple[Tensor, Tensor]]) -> Tensor:
        """Input relevance [B, K, C_in, *S] of each masked channel, one backward below the layer each."""
        count = masks.shape[0]
        if count == 0:
            return leaf.new_zeros((leaf.shape[0], 0, *leaf.shape[1:]), dtype=torch.float32)
        inputs = [leaf] + [t for pair in bounds for t in pair]
        out = []
        with torch.enable_grad():
            for k in range(count):
                parts = torch.autograd.grad(
                    act, inputs, grad_outputs=grad * masks[k].to(grad.dtype), retain_graph=k < count - 1,
                    allow_unused=True,
                )  # fmt: skip
                total = torch.zeros_like(leaf, dtype=torch.float32)
                for tensor, part in zip(inputs, parts):
                    if part is not None:
                        total = total + (tensor.detach() * part).float().reshape(leaf.shape)
                out.append(total)
        return torch.stack(out, dim=1)


def _choose(channels: Channels, rel: Tensor) -> Tensor:
    """The chosen channels [B, K] from an int K (top K per image), a list, or a [B, K] tensor."""
    batch, count = rel.shape
    if isinstance(channels, bool):
        raise InvalidInputError(f"channels must be an int, a list of channel indices or a [B, K] tensor, got {channels!r}")
    if isinstance(channels, int):
        if not 0 <= channels <= count:
            raise InvalidInputError(f"channels={channels} asks for more than the layer's {count} channels (or is < 0)")
        return rel.topk(channels, dim=1).indices if channels else rel.new_zeros((batch, 0), dtype=torch.long)
    chosen = torch.as_tensor(channels, dtype=torch.long, device=rel.device)
    if chosen.dim() == 1:
        chosen = chosen[None].expand(batch, -1)
    return chosen


class ConceptReferences:
    """Per channel, the ``k`` images of a stream where it was most relevant, with the region of each.

    CRP's relevance-based reference samples: feed batches with :meth:`update` (their dataset
    indices alongside); ``values`` [K, k] holds each channel's highest relevances, ``indices``
    [K, k] the images', ``boxes`` [K, k, 2 * n] where on each image the channel's relevance at
    the layer is at least half its maximum (starts then stops per spatial axis, on the input;
    :func:`camkit.functional.relevance_boxes`). Memory is ``O(K k)`` whatever the stream's length.

    Args:
        explainer: a :class:`ConceptRelevance`.
        channels: the channel indices to collect references for.
        k: images kept per channel.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.Flatten(), nn.Linear(8, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(1.0); _ = net[2].weight.fill_(1.0)
        >>> refs = camkit.ConceptReferences(camkit.ConceptRelevance(net, "0"), channels=[1], k=1)
        >>> x = torch.zeros(3, 1, 2, 2); x[2, 0, 1, 0] = 5.0; x[1, 0, 0, 0] = 1.0
        >>> refs.update(x, 0, torch.tensor([10, 11, 12]))
        >>> refs.indices.tolist(), refs.values.tolist(), refs.boxes.tolist()
        ([[12]], [[5.0]], [[[1, 0, 2, 1]]])
    """

    def __init__(self, explainer: ConceptRelevance, channels: Sequence[int], k: int = 8) -> None:
        if k < 1:
            raise InvalidInputError(f"k must be at least 1, got {k}")
        self.explainer = explainer
        self.channels = [int(c) for c in channels]
        self.k = k
        count = len(self.channels)
        self.values = torch.empty(count, 0)
        self.indices = torch.empty(count, 0, dtype=torch.long)
        self.boxes: Tensor | None = None

    def update(self, x: Tensor, target: Target, index: Tensor) -> None:
        """Fold in a batch ``x`` [B, C, *S] with its dataset indices ``index`` [B]."""
        e = self.explainer.explain(x, target, channels=self.channels)
        layer_maps: Tensor = e.extras["layer_maps"]  # [B, K, *s]
        batch, count = layer_maps.shape[:2]
        boxes = relevance_boxes(layer_maps.flatten(0, 1), tuple(x.shape[2:])).view(batch, count, -1).cpu()
        values = e.extras["relevance"][:, self.channels].t().float().cpu()  # [K, B]
        if self.boxes is None:
            self.boxes = boxes.new_zeros(count, 0, boxes.shape[2])
        pool_values = torch.cat([self.values, values], dim=1)  # [K, m + B]
        pool_index = torch.cat([self.indices, index.detach().cpu().long()[None].expand(count, -1)], dim=1)
        pool_boxes = torch.cat([self.boxes, boxes.transpose(0, 1)], dim=1)  # [K, m + B, 2n]
        slots = torch.arange(pool_values.shape[1])[None].expand(count, -1)
        self.values, keep = merge_top(pool_values[:, :0], slots[:, :0], pool_values, slots, self.k)
        self.indices = pool_index.gather(1, keep)
        self.boxes = pool_boxes.gather(1, keep[..., None].expand(-1, -1, pool_boxes.shape[2]))
