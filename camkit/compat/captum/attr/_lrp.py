"""captum's ``LRP`` and its rule objects on :class:`camkit.LRP`.

captum sets a rule object on each layer (``layer.rule = GammaRule()``), with the epsilon rule
(epsilon 1e-9) on every convolution, linear, pooling and batch-norm layer that has none. The
translation gives each convolution and linear layer its rule through camkit's
``LRP(layer_rules=...)`` (``IdentityRule`` is camkit's ``"pass"`` rule), with captum's stabiliser
(the rule's ``STABILITY_FACTOR``, 1e-9) as camkit's ``stabilizer``; ``set_bias_to_zero=True``,
which camkit does not have, is refused.

The gamma and alpha1-beta0 rules keep camkit's (and zennit's) meaning where captum's departs from
the published rules: captum scales or clamps the weights alone, so its gamma rule leaves a positive
bias unscaled and its alpha1-beta0 rule keeps a negative bias in the positive part's normaliser; it
splits by the weight's sign where the rules split contributions (a negative input times a negative
weight is a positive contribution); and its gamma rule favours the positive weights on a negative
output too, where the generalised rule favours the contributions of the output's sign.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import Layout
from ._base import GradientAttribution, NotComputedError, gathered

__all__ = ["LRP", "Alpha1_Beta0_Rule", "EpsilonRule", "GammaRule", "IdentityRule", "PropagationRule"]


class PropagationRule:
    """captum's rule base: a rule object set on a layer as ``layer.rule``."""

    #: captum's stabiliser of every rule's denominator (the epsilon of the epsilon rule)
    STABILITY_FACTOR = 1e-9

    def _key(self) -> tuple[Any, ...]:
        return (type(self).__name__, *sorted(vars(self).items()))


class EpsilonRule(PropagationRule):
    """The epsilon rule (camkit's ``rule="epsilon"``)."""

    def __init__(self, epsilon: float = 1e-9) -> None:
        self.STABILITY_FACTOR = epsilon


class GammaRule(PropagationRule):
    """The gamma rule (camkit's ``rule="gamma"``)."""

    def __init__(self, gamma: float = 0.25, set_bias_to_zero: bool = False) -> None:
        self.gamma = gamma
        self.set_bias_to_zero = set_bias_to_zero


class Alpha1_Beta0_Rule(PropagationRule):
    """The alpha-beta rule with alpha 1, beta 0 (camkit's ``rule="alphabeta", alpha=1, beta=0``)."""

    def __init__(self, set_bias_to_zero: bool = False) -> None:
        self.set_bias_to_zero = set_bias_to_zero


class IdentityRule(EpsilonRule):
    """Relevance passed on unchanged, value by value (camkit's ``rule="pass"`` for one layer).

    On a weighted layer its output must have its input's shape, as in captum.
    """


#: layers captum gives the epsilon rule by default, and the activations it passes relevance through
_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_RULED = (
    *_WEIGHTED, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
    nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Dropout, nn.Flatten, nn.Identity,
)


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if not list(m.children())]


def _camkit_layer_rule(rule: PropagationRule, name: str) -> dict[str, Any]:
    """captum's rule object of one weighted layer as a rule of camkit's ``LRP(layer_rules=...)``."""
    if getattr(rule, "set_bias_to_zero", False):
        raise NotComputedError(f"LRP with {type(rule).__name__}(set_bias_to_zero=True) on layer {name!r}")
    if isinstance(rule, IdentityRule):
        return {"rule": "pass"}
    if isinstance(rule, GammaRule):
        return {"rule": "gamma", "gamma": rule.gamma, "stabilizer": rule.STABILITY_FACTOR}
    if isinstance(rule, Alpha1_Beta0_Rule):
        return {"rule": "alphabeta", "alpha": 1.0, "beta": 0.0, "stabilizer": rule.STABILITY_FACTOR}
    if isinstance(rule, EpsilonRule):
        return {"rule": "epsilon", "epsilon": rule.STABILITY_FACTOR}
    raise NotComputedError(f"LRP with {type(rule).__name__} on layer {name!r}: camkit has no such rule")


class LRP(GradientAttribution):
    """captum's ``LRP`` on :class:`camkit.LRP`, each convolution's and linear layer's rule object as camkit's ``layer_rules``."""

    _whole_batch = True

    def __init__(self, model: nn.Module) -> None:
        for name, module in model.named_modules():
            rule = getattr(module, "rule", None)
            if rule is not None and not isinstance(rule, PropagationRule):
                raise TypeError(f"the rule of layer {name!r} must be a PropagationRule, got {type(rule).__name__}")
        super().__init__(model)
        self.model = model

    _multiply = True

    def has_convergence_delta(self) -> bool:
        return True


    def _camkit_rule(self) -> dict[str, Any]:
        for name, module in _leaves(self.model):
            if getattr(module, "rule", None) is None and not isinstance(module, _RULED):
                raise TypeError(
                    f"Module of type {type(module).__name__} ({name!r}) has no LRP rule in camkit; captum refuses it too "
                    "unless a rule is set on it"
                )
        layers: dict[nn.Module, dict[str, Any]] = {}
        for name, module in _leaves(self.model):
            if isinstance(module, _WEIGHTED):
                layers[module] = _camkit_layer_rule(getattr(module, "rule", None) or EpsilonRule(), name)
        return {"rule": "epsilon", "epsilon": 1e-9, "layer_rules": layers}


    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  return_convergence_delta: bool = False, verbose: bool = False) -> Any:
        options = self._camkit_rule()

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return km.LRP(model, activations="pass", **options)  # captum passes relevance through tanh

        raw, explanations = self._run(inputs, target, additional_forward_args, build)
        if not return_convergence_delta:
            return raw
        first = raw[0] if isinstance(raw, tuple) else raw
        # captum's delta is the score minus the relevance; camkit's extras["delta"] is the relevance minus the score
        return raw, -gathered(explanations, "delta", first.dtype)
