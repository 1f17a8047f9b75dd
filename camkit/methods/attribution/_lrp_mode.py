"""LRP's rules as a :class:`~torch.overrides.TorchFunctionMode`; private to :mod:`camkit.methods.attribution.lrp`.

:class:`_LRPMode` sees every convolution, linear layer and batch norm the model calls and attaches
the rule its :class:`RuleBook` names to each layer's output (a modified backward); activations
without a rule are noted for one warning. See :mod:`camkit.methods.attribution.lrp` for the rules.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..._internal import syncs as _syncs
from ...errors import InvalidInputError
from ...functional.propagation import gamma_params, relevance_gradient, split_by_sign
from ...hooks import HookScope
from ._activations import ZERO_AT_ZERO, match_activation, pass_relevance, passed_on, unruled_name
from ._canonize import (
    Attach,
    AttachEpsilon,
    EpsilonBatchNorm,
    PassBatchNorm,
    batch_norm_call,
    batch_norm_value,
    is_metadata,
    merged_params,
)

__all__ = ["ATTENTION", "COMPOSITES", "LAYER_RULES", "RULES", "Bound", "LayerRule", "RuleBook", "_LRPMode"]

Bound = Union[float, Tensor, None]

RULES = ("epsilon", "gamma", "zplus", "alphabeta")
#: the rules one layer may be given (``layer_rules``): also "pass", relevance handed on unchanged
LAYER_RULES = (*RULES, "pass")
# composite -> {"first": rule for the first layer called, "conv": ..., "linear": ...}
COMPOSITES: dict[str, dict[str, str]] = {
    "epsilonplus": {"conv": "zplus", "linear": "epsilon"},
    "epsilongammabox": {"first": "zbox", "conv": "gamma", "linear": "epsilon"},
    "epsilonalpha2beta1": {"conv": "alphabeta", "linear": "epsilon"},
}
_CONVS = {F.conv1d: "conv", F.conv2d: "conv", F.conv3d: "conv", F.linear: "linear"}
_REFUSED = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.bilinear}
# Elementwise activations whose own gradient is LRP's rule (f(z) = f'(z) z).
_PASSING = {"relu", "leaky_relu"}
ATTENTION = {"softmax", "scaled_dot_product_attention", "multi_head_attention_forward"}


def _known_non_negative(a: Tensor) -> bool:
    """Whether ``a`` has no negative entry, checked only where reading a value costs no device sync."""
    return _syncs.reads_are_free(a) and not bool((a < 0).any())


def _lookup(table: Any, func: Callable[..., Any]) -> Any:
    try:
        return table.get(func) if isinstance(table, dict) else func in table
    except TypeError:
        return None


@dataclass
class _Pending:
    """A convolution's or linear layer's output whose rule waits for the next call (a batch norm may merge it)."""

    out: Tensor | None  # what the model got: the layer's output, without a graph until its rule is attached
    z: Tensor  # the same values; under the epsilon rule it carries the layer's plain gradient
    run: Callable[[Tensor, Tensor, Tensor | None], Tensor]  # the layer with other parameters
    kind: str
    a: Tensor
    weight: Tensor
    bias: Tensor | None
    spec: LayerRule


@dataclass(frozen=True)
class LayerRule:
    """One layer's rule and the settings it reads."""

    rule: str
    epsilon: float
    stabilizer: float
    gamma: float
    alpha: float
    beta: float


@dataclass
class RuleBook:
    """What :class:`_LRPMode` needs of an LRP explainer: the rule of each layer and the rules' settings."""

    rule: str
    epsilon: float
    stabilizer: float
    gamma: float
    alpha: float
    beta: float
    low: Bound
    high: Bound
    activations: str
    #: rules given per module (``LRP(layer_rules=...)``), over ``rule`` for the layers they call
    layers: list[tuple[nn.Module, LayerRule]] = field(default_factory=list)

    def spec_for(self, kind: str, first: bool, active: list[nn.Module]) -> LayerRule:
        """The rule of a layer called while the modules ``active`` run (innermost last)."""
        for module in reversed(active):
            for owner, spec in self.layers:
                if owner is module:
                    return spec
        return LayerRule(self.rule_for(kind, first), self.epsilon, self.stabilizer, self.gamma, self.alpha, self.beta)

    def rule_for(self, kind: str, first: bool) -> str:
        """The rule of a convolution (``kind='conv'``) or linear layer, ``first`` for the first one called."""
        composite = COMPOSITES.get(self.rule)
        if composite is None:
            return self.rule
        if first and "first" in composite:
            return composite["first"]
        return composite[kind]

    def box(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """Leaves holding the z-box bounds, shaped like the first layer's input ``a``."""
        dims = tuple(range(1, a.dim()))
        leaves = []
        for bound, reduce in ((self.low, torch.amin), (self.high, torch.amax)):
            if bound is None:
                value = reduce(a.detach(), dim=dims, keepdim=True) if dims else a.detach()
            else:
                value = torch.as_tensor(bound, dtype=a.dtype, device=a.device)
            try:
                leaf = value.expand_as(a).clone()
            except RuntimeError:
                raise InvalidInputError(
                    f"the z-box bound has shape {list(value.shape)}, which does not broadcast to the first layer's "
                    f"input {list(a.shape)}; pass a number or a tensor of that shape."
                ) from None
            leaves.append(leaf.requires_grad_(True))
        return leaves[0], leaves[1]


class _LRPMode(TorchFunctionMode):
    def __init__(self, book: RuleBook) -> None:
        super().__init__()
        self.lrp = book
        self.layers = 0
        self.bounds: list[tuple[Tensor, Tensor]] = []  # z-box leaves (low, high), in call order
        self.unruled: set[str] = set()
        self.pending: _Pending | None = None
        self.merged: list[tuple[weakref.ref[Tensor], _Pending]] = []  # layer outputs a batch norm took
        self.active: list[nn.Module] = []  # the modules of ``book.layers`` running now, innermost last

    @contextmanager
    def layer_scope(self) -> Iterator[None]:
        """Track which of the modules given rules are running (their calls get those rules)."""
        with HookScope() as scope:
            for module, _ in self.lrp.layers:
                scope.forward_pre(module, lambda m, args: self.active.append(m))
                scope.forward(module, lambda m, args, out: self._leave(m), always_call=True)
            yield

    def _leave(self, module: nn.Module) -> None:
        if self.active and self.active[-1] is module:
            self.active.pop()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if (self.pending is not None or self.merged) and not is_metadata(func):
            if func is F.batch_norm and self.pending is not None:
                merged = self._merge(batch_norm_call(args, kwargs))
                if merged is not None:
                    return merged
            self._settle_pending(args, kwargs)
        kind = _lookup(_CONVS, func)
        if kind is not None:
            return self._layer(kind, func, args, kwargs)
        if func is F.batch_norm:
            return self._batch_norm(func, args, kwargs)
        if _lookup(_REFUSED, func):
            raise InvalidInputError(
                f"LRP has no rule for {getattr(func, '__name__', func)} in camkit; explain a model without "
                "transposed convolutions (or use camkit.IntegratedGradients / camkit.DeepLift)."
            )
        if func is F.multi_head_attention_forward:  # its inner calls are hidden from the mode
            self.unruled.add("multi_head_attention_forward")
        activation = match_activation(func, args, kwargs)
        if activation is not None and activation.name not in _PASSING:
            if self.lrp.activations == "pass" and activation.name in ZERO_AT_ZERO and not activation.inplace:
                return pass_relevance(activation)
            self.unruled.add(activation.name)
        elif activation is None:
            name = unruled_name(func)
            if name is not None and "max_pool" not in name:  # max-pooling: winner takes all, conserved
                self.unruled.add(name)
        return func(*args, **kwargs)

    def _layer(self, kind: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the layer; its rule is attached at the next call, unless a batch norm merges it first."""
        call = dict(kwargs)
        for name, value in zip(("input", "weight", "bias"), args):
            call[name] = value
        rest = args[3:]
        a, weight, bias = call.pop("input", None), call.pop("weight", None), call.pop("bias", None)
        if not isinstance(a, Tensor) or not isinstance(weight, Tensor) or not a.requires_grad:
            return func(*args, **kwargs)
        first = self.layers == 0
        self.layers += 1
        spec = self.lrp.spec_for(kind, first, self.active)
        rule = spec.rule
        if rule == "pass":
            return _passed_layer(func, args, kwargs, a)
        with torch.set_grad_enabled(rule == "epsilon"):  # only the epsilon rule uses the plain gradient
            z = func(*args, **kwargs)
        if not isinstance(z, Tensor):
            return z

        def run(inp: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
            out: Tensor = func(inp, w, b, *rest, **call)
            return out

        out = z.detach().clone() if rule == "epsilon" else z
        self.pending = _Pending(out, z, run, kind, a, weight, bias, spec)
        return out

    def _settle_pending(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Attach the waiting layer's rule; and a merged layer's own rule where its output is read again."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._attach(pending, pending.out)
        if self.merged:
            seen = [*args, *kwargs.values()]
            seen += [v for value in seen if isinstance(value, (list, tuple)) for v in value]
            alive = []
            for ref, pending in self.merged:
                out = ref()
                if out is not None and any(value is out for value in seen):
                    self._attach(pending, out)
                elif out is not None:
                    alive.append((ref, pending))
            self.merged = alive

    def finish(self) -> None:
        """After the model's forward: attach every rule still waiting (its output may be the model's)."""
        self._settle_pending((), {})
        for ref, pending in self.merged:
            out = ref()
            if out is not None:
                self._attach(pending, out)
        self.merged = []

    def _attach(self, pending: _Pending, out: Tensor | None) -> None:
        if out is None:
            return
        with torch.enable_grad():
            if pending.spec.rule == "epsilon":
                AttachEpsilon.apply(out, pending.z, pending.spec.epsilon)
            else:
                parts = self._parts(pending, pending.weight, pending.bias, pending.z)
                Attach.apply(out, relevance_gradient(pending.z, parts, pending.spec.stabilizer))

    def _merge(self, bn: dict[str, Any]) -> Tensor | None:
        """The batch norm merged into the layer whose output it takes: that layer's rule with merged parameters."""
        pending = self.pending
        if pending is None or bn.get("input") is not pending.out or bn.get("training", False):
            return None
        mean, var = bn.get("running_mean"), bn.get("running_var")
        channels = pending.weight.shape[0]
        if not (isinstance(mean, Tensor) and isinstance(var, Tensor) and mean.numel() == var.numel() == channels):
            return None
        if pending.z.dim() < 2 or pending.z.shape[1] != channels or (pending.kind == "linear" and pending.z.dim() != 2):
            return None
        self.pending = None
        with torch.enable_grad():
            if pending.spec.rule == "epsilon":
                y = EpsilonBatchNorm.apply(pending.z, bn, pending.spec.epsilon)
            else:
                value = batch_norm_value(pending.z, bn)
                weight, bias = merged_params(pending.weight, pending.bias, bn)
                y = relevance_gradient(value, self._parts(pending, weight, bias, value), pending.spec.stabilizer)
        if pending.out is not None:
            self.merged.append((weakref.ref(pending.out), pending))
            pending.out = None  # the record must not keep the output alive
        return y

    def _parts(self, pending: _Pending, weight: Tensor, bias: Tensor | None, z: Tensor) -> list[tuple[float, Tensor]]:
        """The rule's terms for :func:`relevance_gradient`: the layer recomputed with modified inputs or parameters."""
        spec, run, a, rule = pending.spec, pending.run, pending.a, pending.spec.rule
        if rule == "zbox":
            low, high = self.lrp.box(a)
            self.bounds.append((low, high))
            w_pos, w_neg = split_by_sign(weight)
            return [(1.0, run(a, weight, None) - run(low, w_pos, None) - run(high, w_neg, None))]
        a_pos, a_neg = (a, None) if _known_non_negative(a) else split_by_sign(a)  # after a ReLU: no a- terms

        def both(w_for_pos: Tensor, b: Tensor | None, w_for_neg: Tensor) -> Tensor:
            out = run(a_pos, w_for_pos, b)
            return out if a_neg is None else out + run(a_neg, w_for_neg, None)

        if rule == "gamma":  # the generalised gamma rule: outputs of either sign keep their sign
            w_up, b_up = gamma_params(weight, bias, spec.gamma)
            w_down = weight + spec.gamma * weight.clamp_max(0)
            b_down = None if bias is None else bias + spec.gamma * bias.clamp_max(0)
            return [(1.0, torch.where(z > 0, both(w_up, b_up, w_down), both(w_down, b_down, w_up)))]
        w_pos, w_neg = split_by_sign(weight)
        b_pos, b_neg = (None, None) if bias is None else split_by_sign(bias)
        positive = both(w_pos, b_pos, w_neg)
        if rule == "zplus":
            return [(1.0, positive)]
        return [(spec.alpha, positive), (-spec.beta, both(w_neg, b_neg, w_pos))]

    def _batch_norm(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A batch norm no layer's output feeds: relevance passes through it unchanged (training mode: no rule)."""
        call = batch_norm_call(args, kwargs)
        if call.get("training", False):
            self.unruled.add("batch_norm (training mode)")
            return func(*args, **kwargs)
        x, mean, var = call.get("input"), call.get("running_mean"), call.get("running_var")
        if (
            isinstance(x, Tensor) and isinstance(mean, Tensor) and isinstance(var, Tensor)
            and x.requires_grad and x.dim() >= 2 and x.is_floating_point()
        ):  # fmt: skip
            return PassBatchNorm.apply(x, call)
        return func(*args, **kwargs)


def _passed_layer(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], a: Tensor) -> Tensor:
    """A layer under the pass rule: its output, each value's relevance handed to the input value at its place."""
    with torch.no_grad():
        z = func(*args, **kwargs)
    if not isinstance(z, Tensor) or z.shape != a.shape:
        shape = list(z.shape) if isinstance(z, Tensor) else type(z).__name__
        raise InvalidInputError(
            f"the 'pass' rule hands each output value's relevance to the input value at its place, so the layer's "
            f"output must have its input's shape {list(a.shape)}, got {shape}; give this layer another rule."
        )
    return passed_on(a, z)
