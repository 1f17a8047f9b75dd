"""captum's ``LayerLRP``: the relevance at a layer's output (or input), computed by camkit's LRP.

camkit's LRP gives the relevance of the tensor it explains, ``a * g`` with ``g`` the rules'
modified gradient of the score. The relevance at a layer is that of the model read as a
function of the layer's tensors (each layer computing the values given, see
:mod:`._layer_values`): the translated :class:`~._lrp.LRP` (the same rule objects, captum's
defaults) explains that function at the layer's values of the input. A list of layers is
explained one layer at a time, each with its own delta ``score - sum(relevance)``, as captum's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from .._pack import Layout, as_tuple, forward_args
from ._base import LayerAttribution
from ._layer_values import layer_values, substituted
from ._lrp import LRP

__all__ = ["LayerLRP"]


class _Rest(nn.Module):
    """The model as a function of a layer's tensors (``forward(*layer_tensors, *inputs)``); its modules are the model's."""

    def __init__(self, model: nn.Module, forward: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self._forward = forward

    def forward(self, *args: Any) -> Any:
        return self._forward(*args)


class LayerLRP(LayerAttribution):
    """captum's ``LayerLRP`` on :class:`camkit.LRP` (through the translated ``LRP``, rule objects included).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.captum.attr import LayerLRP
        >>> net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.eye(2)); _ = net[2].weight.fill_(1.0)
        >>> LayerLRP(net, net[0]).attribute(torch.tensor([[1.0, 2.0]]), target=0)  # the hidden units' relevance
        tensor([[1., 2.]])
    """

    def __init__(self, model: nn.Module, layer: nn.Module | list[nn.Module], device_ids: Any = None) -> None:
        LRP(model)  # the rule objects checked when built, as captum does
        super().__init__(model, layer, device_ids)  # type: ignore[arg-type]
        self.model = model

    def has_convergence_delta(self) -> bool:
        return True

    _multiply = True

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  verbose: bool = False) -> Any:
        several = isinstance(self.layer, list)
        layers: list[nn.Module] = self.layer if several else [self.layer]  # type: ignore[assignment]
        found = [self._at(layer, inputs, target, additional_forward_args, attribute_to_layer_input) for layer in layers]
        relevance = found if several else found[0]
        if not return_convergence_delta:
            return relevance
        score = self._score(inputs, target, additional_forward_args)
        deltas = [score - sum(p.reshape(p.shape[0], -1).sum(dim=1) for p in as_tuple(f)) for f in found]
        return relevance, (deltas if several else deltas[0])

    def _score(self, inputs: Any, target: Any, extra: Any) -> Tensor:
        """The target's output per example, which captum's delta compares the relevance with (``score - sum``)."""
        xs, args = as_tuple(inputs), forward_args(extra)
        index = self._target_index(xs, target, args)
        with torch.no_grad():
            out = self.forward_func(*xs, *args)
        return out.reshape(xs[0].shape[0], -1).gather(1, index[:, None].to(out.device))[:, 0]

    def _at(self, layer: nn.Module, inputs: Any, target: Any, extra: Any, to_input: bool) -> Any:
        """One layer's relevance: a tensor, or a tuple for a layer of several tensors."""
        xs = as_tuple(inputs)
        [(values, slots)] = layer_values(self.forward_func, [layer], xs, extra, to_input)
        rest = _Rest(self.model, substituted(self.forward_func, [layer], [slots], to_input))
        lrp = LRP(rest)
        # the layer's tensors side by side, flattened: camkit would read a [B, C, H, W] layer output as an image and
        # hold its channels against the model's first convolution
        lrp._layout_override = replace(Layout.of(values), as_is=False)  # type: ignore[attr-defined]
        parts = as_tuple(lrp.attribute(values, target, xs + forward_args(extra)))
        return parts if slots.several else parts[0]
