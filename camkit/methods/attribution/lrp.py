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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from ..registry import register_method
from ._activations import warn_unruled
from ._lrp_mode import ATTENTION, COMPOSITES, LAYER_RULES, RULES, Bound, LayerRule, RuleBook, _LRPMode
from .pixel import GradientAttribution, score_gradients

__all__ = ["LRP", "LRPRule"]

LRPRule = Literal["epsilon", "gamma", "zplus", "alphabeta", "epsilonplus", "epsilongammabox", "epsilonalpha2beta1"]


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
        layer_rules: rules for chosen layers, over ``rule``: a mapping from a module of the model (or
            its dotted name, ``"features.0"``) to a rule name (``"epsilon"``, ``"gamma"``, ``"zplus"``,
            ``"alphabeta"``, or ``"pass"``: each output value's relevance handed unchanged to the input
            value at its place, for a layer whose output has its input's shape, as captum's
            ``IdentityRule``; an input value of exactly 0 gets none) or a dict with ``"rule"`` and any of
            ``epsilon``, ``stabilizer``, ``gamma``, ``alpha``, ``beta`` (the others are this explainer's).
            Every convolution and linear layer called while that module runs gets it (the innermost
            module named wins).
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
        >>> mixed = camkit.LRP(net, "epsilon", epsilon=0.0, stabilizer=0.0, layer_rules={"1": "zplus"})
        >>> mixed.explain(torch.tensor([[[[3.0, 1.0]]]]), target=0).raw.round(decimals=5).tolist()  # z+ on layer "1"
        [[[[7.0, 1.0]]]]
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
        layer_rules: Mapping[str | nn.Module, str | Mapping[str, Any]] | None = None,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if rule not in RULES and rule not in COMPOSITES:
            raise InvalidInputError(
                f"rule must be one of {', '.join(repr(r) for r in (*RULES, *COMPOSITES))}, got {rule!r}"
            )
        _check_settings(epsilon, stabilizer, gamma, alpha, beta)
        self.rule = rule
        self.epsilon, self.stabilizer = float(epsilon), float(stabilizer)
        self.gamma, self.alpha, self.beta = float(gamma), float(alpha), float(beta)
        self.low, self.high = low, high
        if activations not in ("gradient", "pass"):
            raise InvalidInputError(f"activations must be 'gradient' or 'pass', got {activations!r}")
        self.activations = activations
        self._book = RuleBook(rule, self.epsilon, self.stabilizer, self.gamma, self.alpha, self.beta, low, high,
                              activations)
        defaults = LayerRule("epsilon", self.epsilon, self.stabilizer, self.gamma, self.alpha, self.beta)
        self._book.layers = [(_module_of(model, key), _layer_rule(value, defaults, key))
                             for key, value in (layer_rules or {}).items()]

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        leaf = x.clone().requires_grad_(True)
        mode = _LRPMode(self._book)
        with torch.enable_grad():
            with mode.layer_scope(), mode:
                raw_out = self._call_model(leaf.clone())
            mode.finish()
            if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw_out, Tensor):
                classes, scores = resolve_target(target, raw_out, batch=x.shape[0])
            else:
                classes, scores = resolve_target(target, select_output(raw_out, self.output), batch=x.shape[0])
            raw = _relevance(scores, leaf, mode.bounds)
        if mode.unruled & ATTENTION:  # one warning that names the method with rules for transformers
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


def _check_settings(epsilon: float, stabilizer: float, gamma: float, alpha: float, beta: float) -> None:
    for name, value in (("epsilon", epsilon), ("stabilizer", stabilizer), ("gamma", gamma), ("beta", beta)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise InvalidInputError(f"{name} must be a finite number >= 0, got {value!r}")
    if not math.isclose(alpha - beta, 1.0, abs_tol=1e-9):
        raise InvalidInputError(
            f"the alpha-beta rule needs alpha - beta = 1 to conserve relevance, got alpha={alpha}, beta={beta}"
        )


def _module_of(model: nn.Module, key: str | nn.Module) -> nn.Module:
    """The module ``layer_rules`` names: a module of the model, or its dotted name."""
    if isinstance(key, nn.Module):
        if not any(m is key for m in model.modules()):
            raise InvalidInputError(f"layer_rules: {type(key).__name__} is not a module of the model")
        return key
    try:
        return model.get_submodule(key)
    except AttributeError:
        raise InvalidInputError(f"layer_rules: the model has no module named {key!r}") from None


def _layer_rule(value: str | Mapping[str, Any], defaults: LayerRule, key: object) -> LayerRule:
    """A ``layer_rules`` value (a rule name, or ``{"rule": name, "gamma": ...}``) with the explainer's settings."""
    settings = {"rule": value} if isinstance(value, str) else dict(value)
    unknown = set(settings) - {"rule", "epsilon", "stabilizer", "gamma", "alpha", "beta"}
    if settings.get("rule") not in LAYER_RULES or unknown:
        raise InvalidInputError(
            f"layer_rules[{key!r}] must be one of {', '.join(repr(r) for r in LAYER_RULES)} or a dict with 'rule' and "
            f"any of epsilon, stabilizer, gamma, alpha, beta; got {value!r}"
        )
    numbers = {k: float(v) for k, v in settings.items() if k != "rule"}
    spec = replace(defaults, rule=str(settings["rule"]), **numbers)
    _check_settings(spec.epsilon, spec.stabilizer, spec.gamma, spec.alpha, spec.beta)
    return spec


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
