"""Layer-wise relevance propagation (Bach et al. 2015; Montavon et al. 2019) as modified gradients.

camkit keeps, for every tensor ``a`` of the forward pass, a modified gradient ``g`` whose
product ``a * g`` is the relevance of ``a``; the attribution is ``x * g`` at the input
(plus the bound terms of the z-box rule). The rules then read:

* **Convolutions and linear layers** (``nn.Conv1d/2d/3d``, ``nn.Linear`` *and* direct
  ``F.conv2d`` / ``F.linear`` calls: a :class:`~torch.overrides.TorchFunctionMode` sees the
  calls, not the modules): the chosen rule, via
  :func:`camkit.functional.relevance_gradient`. The layer's output keeps its value; only
  its backward changes. Nothing of the model is replaced, hooked or patched.
* **Batch norm in eval mode** (``nn.BatchNorm1d/2d/3d``, all one ``F.batch_norm`` call): where it
  reads the output of a convolution or linear layer, the two are one layer for LRP, as the network
  computes them: the rule applies to ``W' = s W``, ``b' = s (b - running_mean) + bias`` with
  ``s = weight / sqrt(running_var + eps)`` (the merged parameters are computed inside the rule; the
  model's parameters are never changed). This is what zennit's canonizers do to the modules; captum
  instead applies the epsilon rule to the batch norm on its own, which gives other maps wherever the
  statistics are not the identity. A batch norm that no such layer feeds (DenseNet's, after a
  concatenation) passes relevance through unchanged (zennit's pass rule); only where its input is
  exactly zero is that relevance lost, as a bias absorbs relevance. Batch norm with batch statistics
  (training mode) has no rule (warned; plain gradient).
* **ReLU and leaky ReLU, every spelling, in place or not**: their own gradient is exactly
  LRP's rule for them (relevance passes unchanged, since ``f(z) = f'(z) z``), so no
  interception is needed and none can be missed.
* **Average pooling (plain and adaptive, 1-D to 3-D), means, additions (residual
  connections), concatenation, reshapes**: their own gradient is the z-rule (relevance
  shared in proportion to the contributions, conserved exactly); **max-pooling** of every
  rank: winner takes all (conserved exactly).

Every rule is written for any rank: an input [B, C, *S] may be a signal [B, C, T], an image
[B, C, H, W] or a volume or a video [B, C, D, H, W].
* **Other non-linearities** (sigmoid, tanh, GELU, SiLU, softmax, layer norm, ...): no rule;
  their plain gradient is used and one :class:`~camkit.errors.NoRuleWarning` per call names them.
  On a model with attention the one warning says to use :class:`~camkit.AttnLRP` instead.
* **Transposed convolutions**: refused with :class:`~camkit.errors.InvalidInputError`.

Rules (``rule=``): ``"epsilon"``, ``"gamma"``, ``"zplus"``, ``"alphabeta"`` (on every
convolution and linear layer), and the composites ``"epsilonplus"`` (z+ on convolutions, epsilon on linear layers),
``"epsilongammabox"`` (z-box on the first convolution or linear layer called, gamma on the
other convolutions, epsilon on linear layers) and ``"epsilonalpha2beta1"`` (alpha=2,
beta=1 on convolutions, epsilon on linear layers), as zennit names them. ``epsilon`` stabilises the
epsilon rule, ``stabilizer`` the others, as in zennit. With zennit 0.5.1's canonizers on torchvision's
VGG, ResNet and DenseNet, the maps equal zennit's within 1e-5 of their scale (float64, same
``epsilon`` and ``stabilizer``); the differences that remain: zennit's merged-away batch norm still
divides by ``sqrt(1 + eps)``; zennit stabilises average pools and ResNet's sums by ``stabilizer``
where camkit shares them exactly (about ``stabilizer / |z|`` there); zennit shares relevance evenly
over a functional ``F.adaptive_avg_pool2d`` (DenseNet's), where camkit shares it by contribution.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..._internal import syncs as _syncs
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.propagation import gamma_params, relevance_gradient, split_by_sign
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from ..registry import register_method
from ._activations import ZERO_AT_ZERO, match_activation, pass_relevance, unruled_name, warn_unruled
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
from .pixel import GradientAttribution, score_gradients

__all__ = ["LRP", "LRPRule"]

LRPRule = Literal["epsilon", "gamma", "zplus", "alphabeta", "epsilonplus", "epsilongammabox", "epsilonalpha2beta1"]
Bound = Union[float, Tensor, None]

_RULES = ("epsilon", "gamma", "zplus", "alphabeta")
# composite -> {"first": rule for the first layer called, "conv": ..., "linear": ...}
_COMPOSITES: dict[str, dict[str, str]] = {
    "epsilonplus": {"conv": "zplus", "linear": "epsilon"},
    "epsilongammabox": {"first": "zbox", "conv": "gamma", "linear": "epsilon"},
    "epsilonalpha2beta1": {"conv": "alphabeta", "linear": "epsilon"},
}
_CONVS = {F.conv1d: "conv", F.conv2d: "conv", F.conv3d: "conv", F.linear: "linear"}
_REFUSED = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.bilinear}
# Elementwise activations whose own gradient is LRP's rule (f(z) = f'(z) z).
_PASSING = {"relu", "leaky_relu"}
_ATTENTION = {"softmax", "scaled_dot_product_attention", "multi_head_attention_forward"}


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
    rule: str


class _LRPMode(TorchFunctionMode):
    def __init__(self, explainer: LRP) -> None:
        super().__init__()
        self.lrp = explainer
        self.layers = 0
        self.bounds: list[tuple[Tensor, Tensor]] = []  # z-box leaves (low, high), in call order
        self.unruled: set[str] = set()
        self.pending: _Pending | None = None
        self.merged: list[tuple[weakref.ref[Tensor], _Pending]] = []  # layer outputs a batch norm took

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
        rule = self.lrp._rule_for(kind, first)
        with torch.set_grad_enabled(rule == "epsilon"):  # only the epsilon rule uses the plain gradient
            z = func(*args, **kwargs)
        if not isinstance(z, Tensor):
            return z

        def run(inp: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
            out: Tensor = func(inp, w, b, *rest, **call)
            return out

        out = z.detach().clone() if rule == "epsilon" else z
        self.pending = _Pending(out, z, run, kind, a, weight, bias, rule)
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
            if pending.rule == "epsilon":
                AttachEpsilon.apply(out, pending.z, self.lrp.epsilon)
            else:
                parts = self._parts(pending, pending.weight, pending.bias, pending.z)
                Attach.apply(out, relevance_gradient(pending.z, parts, self.lrp.stabilizer))

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
            if pending.rule == "epsilon":
                y = EpsilonBatchNorm.apply(pending.z, bn, self.lrp.epsilon)
            else:
                value = batch_norm_value(pending.z, bn)
                weight, bias = merged_params(pending.weight, pending.bias, bn)
                y = relevance_gradient(value, self._parts(pending, weight, bias, value), self.lrp.stabilizer)
        if pending.out is not None:
            self.merged.append((weakref.ref(pending.out), pending))
            pending.out = None  # the record must not keep the output alive
        return y

    def _parts(self, pending: _Pending, weight: Tensor, bias: Tensor | None, z: Tensor) -> list[tuple[float, Tensor]]:
        """The rule's terms for :func:`relevance_gradient`: the layer recomputed with modified inputs or parameters."""
        lrp, run, a, rule = self.lrp, pending.run, pending.a, pending.rule
        if rule == "zbox":
            low, high = lrp._box(a)
            self.bounds.append((low, high))
            w_pos, w_neg = split_by_sign(weight)
            return [(1.0, run(a, weight, None) - run(low, w_pos, None) - run(high, w_neg, None))]
        a_pos, a_neg = (a, None) if _known_non_negative(a) else split_by_sign(a)  # after a ReLU: no a- terms

        def both(w_for_pos: Tensor, b: Tensor | None, w_for_neg: Tensor) -> Tensor:
            out = run(a_pos, w_for_pos, b)
            return out if a_neg is None else out + run(a_neg, w_for_neg, None)

        if rule == "gamma":  # the generalised gamma rule: outputs of either sign keep their sign
            w_up, b_up = gamma_params(weight, bias, lrp.gamma)
            w_down = weight + lrp.gamma * weight.clamp_max(0)
            b_down = None if bias is None else bias + lrp.gamma * bias.clamp_max(0)
            return [(1.0, torch.where(z > 0, both(w_up, b_up, w_down), both(w_down, b_down, w_up)))]
        w_pos, w_neg = split_by_sign(weight)
        b_pos, b_neg = (None, None) if bias is None else split_by_sign(bias)
        positive = both(w_pos, b_pos, w_neg)
        if rule == "zplus":
            return [(1.0, positive)]
        return [(lrp.alpha, positive), (-lrp.beta, both(w_neg, b_neg, w_pos))]

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


@register_method("lrp")
class LRP(GradientAttribution):
    """Layer-wise relevance propagation with the epsilon, gamma, z+, alpha-beta and z-box rules and composites.

    The relevance starts as the target score and flows back layer by layer, each layer
    sharing it among its inputs by its rule (``R_out`` is a layer's output relevance,
    ``z = W a + b`` its output, ``s(t) = t + epsilon * sign(t)``):

    * ``"epsilon"``: ``R_i = sum_j a_i w_ij / s(z_j) R_j``; conserves relevance as
      ``epsilon -> 0`` on layers without bias.
    * ``"gamma"`` (generalised): a unit with ``z_j > 0`` shares by its contributions with
      ``w + gamma * max(w, 0)`` for ``a_i > 0`` and ``w + gamma * min(w, 0)`` for ``a_i < 0`` (the
      bias as the weight of the input 1); one with ``z_j < 0`` the other way round, so that the
      denominator keeps the output's sign. On non-negative inputs and positive outputs it is
      Montavon et al.'s gamma rule.
    * ``"zplus"``: only positive contributions ``(a_i w_ij)^+`` (a positive bias among them in the
      denominator); conserves relevance wherever a unit has a positive contribution.
    * ``"alphabeta"``: ``alpha`` times the positive contributions' share minus ``beta`` times
      the negative ones' (bias split by sign into both); needs ``alpha - beta = 1``. A unit
      without negative contributions passes ``alpha`` times its relevance (as in zennit).
    * z-box (first layer of ``"epsilongammabox"``), for pixels in ``[low, high]``:
      ``R_i = sum_j (a_i w_ij - low_i w+_ij - high_i w-_ij) / s(z_j) R_j`` (bias ignored). It
      assumes the first layer reads the image itself or a flattened view of it (normalise
      outside the model).

    A batch norm is merged into the convolution or linear layer before it (the rule applies to
    the merged layer, as in zennit) or, where none precedes it, passes relevance through. See
    :mod:`camkit.methods.attribution.lrp` for the composites, which layers get which rule, how
    every ReLU spelling is handled, and how the maps compare with zennit's and captum's. ``raw`` is the relevance of each input value [B, C, *S]
    for an input of any rank [B, C, *S] ([B, K, C, *S] for [B, K] targets), ``maps`` [B, *S]
    its normalised ``max_c |raw|``; ``extras["delta"]`` is ``sum(raw) - score`` per input
    (zero where relevance is conserved).

    Args:
        model: the model to explain.
        rule: a rule or composite name (default ``"epsilon"``).
        epsilon: the epsilon rule's stabiliser (default ``1e-6``; in the units of the layer outputs).
        stabilizer: the stabiliser of the other rules' denominators (default ``1e-6``), zennit's
            ``stabilizer``.
        gamma: the gamma rule's weight on positive parameters (default ``0.25``).
        alpha, beta: the alpha-beta rule's weights (default ``2`` and ``1``).
        low, high: the z-box rule's input bounds: numbers or tensors broadcasting to the first
            layer's input; ``None`` (default) takes each image's own minimum / maximum.
        activations: ``"gradient"`` (default): activations without a rule keep their gradient (warned);
            ``"pass"``: those with ``f(0) = 0`` (tanh, GELU, SiLU, ELU, hardtanh) pass relevance on unchanged,
            as zennit's and captum's pass rule (see :func:`~camkit.methods.attribution._activations.pass_relevance`).
        output, keep_mode, input_index: see :class:`~camkit.Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        ...     _ = net[3].weight.copy_(torch.tensor([[1.0, 2.0]]))
        >>> e = camkit.LRP(net, "epsilon", epsilon=0.0).explain(torch.tensor([[[[3.0, 1.0]]]]), target=0)
        >>> e.scores.tolist(), e.raw.tolist()  # h = [4, 2]; R_h = [4, 4]; R_x = [3 + 6, 1 - 2]
        ([8.0], [[[[9.0, -1.0]]]])
    """

    cost: ClassVar[str] = "1 forward + 1 backward (gamma, z+, alpha-beta and z-box add 1 to 4 convolutions per layer)"
    use_when: ClassVar[str] = (
        "You want a single-pass attribution that conserves the score, with rules tuned per layer type (composites)."
    )

    def __init__(
        self,
        model: nn.Module,
        rule: LRPRule = "epsilon",
        *,
        epsilon: float = 1e-6,
        stabilizer: float = 1e-6,
        gamma: float = 0.25,
        alpha: float = 2.0,
        beta: float = 1.0,
        low: Bound = None,
        high: Bound = None,
        activations: Literal["gradient", "pass"] = "gradient",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if rule not in _RULES and rule not in _COMPOSITES:
            raise InvalidInputError(
                f"rule must be one of {', '.join(repr(r) for r in (*_RULES, *_COMPOSITES))}, got {rule!r}"
            )
        for name, value in (("epsilon", epsilon), ("stabilizer", stabilizer), ("gamma", gamma), ("beta", beta)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidInputError(f"{name} must be a finite number >= 0, got {value!r}")
        if not math.isclose(alpha - beta, 1.0, abs_tol=1e-9):
            raise InvalidInputError(
                f"the alpha-beta rule needs alpha - beta = 1 to conserve relevance, got alpha={alpha}, beta={beta}"
            )
        self.rule = rule
        self.epsilon, self.stabilizer = float(epsilon), float(stabilizer)
        self.gamma, self.alpha, self.beta = float(gamma), float(alpha), float(beta)
        self.low, self.high = low, high
        if activations not in ("gradient", "pass"):
            raise InvalidInputError(f"activations must be 'gradient' or 'pass', got {activations!r}")
        self.activations = activations

    def _rule_for(self, kind: str, first: bool) -> str:
        composite = _COMPOSITES.get(self.rule)
        if composite is None:
            return self.rule
        if first and "first" in composite:
            return composite["first"]
        return composite[kind]

    def _box(self, a: Tensor) -> tuple[Tensor, Tensor]:
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

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        leaf = x.clone().requires_grad_(True)
        mode = _LRPMode(self)
        with torch.enable_grad():
            with mode:
                raw_out = self._call_model(leaf.clone())
            mode.finish()
            if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw_out, Tensor):
                classes, scores = resolve_target(target, raw_out, batch=x.shape[0])
            else:
                classes, scores = resolve_target(target, select_output(raw_out, self.output), batch=x.shape[0])
            raw = _relevance(scores, leaf, mode.bounds)
        if mode.unruled & _ATTENTION:  # one warning that names the method with rules for transformers
            warn_unruled("LRP", {"attention"}, "use camkit.AttnLRP(model), whose rules cover attention, layer norm "
                         "and GELU and conserve relevance through them.")  # fmt: skip
        else:
            warn_unruled(
                "LRP", mode.unruled, "their plain gradient is used, so relevance is not conserved through them."
            )
        scores = scores.detach()
        size = tuple(x.shape[2:])
        maps, flat = self.maps_from_raw(raw, size)
        delta = raw.sum(dim=tuple(range(-(len(size) + 1), 0))) - scores.float()  # over C and every spatial axis
        return Explanation(
            maps=maps, raw=raw, target=classes, scores=scores, flat=flat, method=self.key,
            extras={"delta": delta, "rule": self.rule},
        )


def _relevance(scores: Tensor, leaf: Tensor, bounds: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """Input relevance ``x * g`` (plus the z-box bound terms) for each score column."""
    if not bounds or not scores.requires_grad:  # score_gradients raises the usual error for the latter
        grads = score_gradients(scores, leaf)
        return (leaf.detach().unsqueeze(1) if scores.dim() == 2 else leaf.detach()) * grads
    columns = scores.unbind(dim=1) if scores.dim() == 2 else (scores,)
    inputs = [leaf] + [t for pair in bounds for t in pair]
    out = []
    for k, column in enumerate(columns):
        parts = torch.autograd.grad(column.sum(), inputs, retain_graph=k < len(columns) - 1, allow_unused=True)
        total = torch.zeros_like(leaf)
        for tensor, grad in zip(inputs, parts):
            if grad is not None:
                contribution = tensor.detach() * grad
                if contribution.numel() != leaf.numel():
                    raise InvalidInputError(
                        f"the z-box rule's first layer takes a {list(contribution.shape)} input, not the image "
                        f"{list(leaf.shape)} (or a flattened view of it); use rule='epsilonplus' or 'gamma' here."
                    )
                total = total + contribution.reshape(leaf.shape)
        out.append(total)
    return torch.stack(out, dim=1) if scores.dim() == 2 else out[0]
