"""AttnLRP (Achtibat et al. 2024): layer-wise relevance propagation through transformers, as modified gradients.

How it is computed: as :class:`~camkit.LRP` is, by gradient x input where each op's backward
carries its rule. The forward runs under a :class:`~torch.overrides.TorchFunctionMode`, which sees
every ``torch`` function and ``Tensor`` method the model calls, whoever calls it; the calls that
need a rule are answered by autograd nodes that compute the same value with the rule's backward
(:mod:`._attnlrp_rules`), every other call runs as it is. Nothing of the model is patched,
hooked or replaced, no attention implementation is switched: the mode is the only state, and it
ends with the forward. The alternatives (patching module classes as LXT does, or module hooks as
zennit does) change the model for the call and miss what runs outside a known module (a fused
kernel, a functional call); the mode misses nothing that goes through ``torch``. A call costs about one forward and one backward,
as a plain gradient does; ``benchmarks/case_attnlrp.py`` times it beside LXT and a no-grad forward.
Which tensors depend on the explained input is followed call by call (weakly held tags), so a
product with a tensor computed from parameters alone stays a linear map.

The rules, op by op:

* **Softmax**: its own gradient, which in gradient x input form is AttnLRP's softmax rule.
* **The attention products** ``q k^T`` and ``A v`` and any other product of two (or more)
  tensors computed from the input (``matmul``, ``bmm``, ``@``, ``einsum``, elementwise ``*``,
  as in gated MLPs): the uniform rule, each factor's share ``1/n``. A product with a parameter
  (a linear map, LayerScale) keeps its gradient.
* **Fused attention** (``F.scaled_dot_product_attention``: timm, Hugging Face's ``"sdpa"``;
  ``F.multi_head_attention_forward``: ``nn.MultiheadAttention``, fast path or not) is written out
  as product, softmax, product (:mod:`._attnlrp_attention`); masks, causal attention, grouped
  heads and relative position biases (Swin) are kept.
* ``attention="cp"`` (CP-LRP, Ali et al. 2022): the attention weights are constants, so relevance
  flows through the values only (every softmax over a [..., N, N]-like tensor of three or more
  axes is held constant). ``attention="attnlrp"`` (the default): the rules above, relevance also
  through queries and keys.
* **Layer norm and RMS norm** (``F.layer_norm``, ``F.rms_norm``, and norms written out by hand:
  a division by, or a ``rsqrt`` of, a statistic with a last axis of size 1): the identity rule,
  the normalising factor held constant.
* **GELU, SiLU, sigmoid, tanh, ELU, softplus, ReLU6, hardtanh** (every spelling, as
  :class:`~camkit.LRP` recognises them): the identity rule, relevance passed element by element.
  ReLU and leaky ReLU already pass it by their own gradient.
* **Additions, concatenations, reshapes, means**: their own gradient, which conserves
  relevance exactly (the epsilon rule with ``epsilon = 0``); what an added constant (a bias,
  a position embedding, a class token) takes is absorbed.
* **Linear layers and convolutions** (``F.linear``, ``F.conv1d/2d/3d``: patch embeddings,
  projections, MLPs): ``rule="epsilon"`` or ``rule="gamma"`` (the generalised gamma rule,
  valid for inputs of either sign).

Other non-linearities have no rule; their plain gradient is used and one
:class:`~camkit.errors.NoRuleWarning` per call names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.propagation import relevance_gradient
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from ..registry import register_method
from ._activations import match_activation, unruled_name, warn_unruled
from ._attnlrp_attention import multi_head_attention, sdpa
from ._attnlrp_rules import (
    InputTags,
    gamma_linear,
    generalized_gamma,
    identity_rule,
    layer_norm_identity,
    rms_norm_identity,
    uniform,
)
from .pixel import GradientAttribution, score_gradients

__all__ = ["AttnLRP"]

AttentionRule = Literal["attnlrp", "cp"]
LayerRule = Literal["epsilon", "gamma"]

_LAYERS = {F.conv1d: "conv", F.conv2d: "conv", F.conv3d: "conv", F.linear: "linear"}
_REFUSED = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.bilinear}
_PRODUCTS = {
    torch.matmul, torch.bmm, torch.mul, torch.einsum, Tensor.matmul, Tensor.bmm, Tensor.mul,
    Tensor.__matmul__, Tensor.__rmatmul__, Tensor.__mul__, Tensor.__rmul__,
}  # fmt: skip
_IN_PLACE_PRODUCTS = {Tensor.mul_, Tensor.__imul__}
_SOFTMAX = {F.softmax, torch.softmax, Tensor.softmax}
_DIVISIONS = {torch.div, torch.true_divide, Tensor.div, Tensor.__truediv__}
_RSQRT = {torch.rsqrt, Tensor.rsqrt}
_PASSING = {"relu", "leaky_relu"}  # their own gradient is the identity rule


def _lookup(table: Any, func: Callable[..., Any]) -> Any:
    try:
        return table.get(func) if isinstance(table, dict) else func in table
    except TypeError:
        return None


class _AttnLRPMode(TorchFunctionMode):
    def __init__(self, explainer: AttnLRP, x: Tensor) -> None:
        super().__init__()
        self.lrp = explainer
        self.unruled: set[str] = set()
        self.tags = InputTags()  # what the explained input reaches
        self.tags.add(x)

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = self._dispatch(func, args, kwargs)
        self.tags.follow(func, args, kwargs, out)
        return out

    def _statistic(self, t: Any) -> bool:
        """A per-row statistic of the input (last axis of size 1), such as a norm's standard deviation."""
        return self.tags.depends(t) and t.dim() >= 1 and t.shape[-1] == 1

    def _dispatch(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        depends = self.tags.depends
        kind = _lookup(_LAYERS, func)
        if kind is not None:
            return self._layer(kind, func, args, kwargs)
        if _lookup(_PRODUCTS, func):
            return self._product(func, args, kwargs)
        if _lookup(_SOFTMAX, func):
            out = func(*args, **kwargs)
            return out.detach() if self.lrp.attention == "cp" and out.dim() >= 3 else out
        if func is F.scaled_dot_product_attention:
            return sdpa(args, kwargs, self.lrp.attention, depends)
        if func is F.multi_head_attention_forward:
            return multi_head_attention(args, kwargs, self.lrp.attention, self._linear, depends)
        if func is F.layer_norm or func is torch.layer_norm:
            return self._norm(layer_norm_identity, func, args, kwargs, ("weight", "bias", "eps"), 1e-5)
        if func is F.rms_norm or func is torch.rms_norm:
            return self._norm(rms_norm_identity, func, args, kwargs, ("weight", "eps"), None)
        if _lookup(_DIVISIONS, func) and len(args) >= 2 and depends(args[0]) and self._statistic(args[1]):
            return func(args[0], args[1].detach(), *args[2:], **kwargs)
        if _lookup(_RSQRT, func):
            out = func(*args, **kwargs)
            return out.detach() if args and self._statistic(args[0]) else out
        if _lookup(_REFUSED, func):
            raise InvalidInputError(
                f"AttnLRP has no rule for {getattr(func, '__name__', func)} in camkit; explain a model without "
                "transposed convolutions (or use camkit.IntegratedGradients)."
            )
        return self._other(func, args, kwargs)

    def _other(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        depends = self.tags.depends
        if _lookup(_IN_PLACE_PRODUCTS, func) and sum(depends(a) for a in args) >= 2:
            self.unruled.add("in-place product")
        activation = match_activation(func, args, kwargs)
        if activation is not None:
            if activation.name in _PASSING or not depends(activation.x):
                return func(*args, **kwargs)
            return identity_rule(activation.x, activation.fn)  # an in-place call returns the result out of place
        name = unruled_name(func)
        if name is not None and "max_pool" not in name:  # max-pooling: winner takes all, conserved
            self.unruled.add(name)
        return func(*args, **kwargs)

    def _product(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func is torch.einsum:
            operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
            return func(args[0], *uniform(operands, self.tags.depends), **kwargs)
        return func(*uniform(args, self.tags.depends), **kwargs)

    def _linear(self, a: Tensor, weight: Tensor, bias: Tensor | None, dependent: bool) -> Tensor:
        return self._layer("linear", F.linear, (a, weight, bias), {}, dependent)

    def _layer(
        self, kind: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        dependent: bool | None = None,
    ) -> Any:  # fmt: skip
        z = func(*args, **kwargs)
        call = dict(kwargs)
        for name, value in zip(("input", "weight", "bias"), args):
            call[name] = value
        rest = args[3:]
        a, weight, bias = call.pop("input", None), call.pop("weight", None), call.pop("bias", None)
        dependent = self.tags.depends(a) if dependent is None else dependent and a.requires_grad
        if not isinstance(z, Tensor) or not isinstance(weight, Tensor) or not dependent:
            return z
        gamma = self.lrp.conv_gamma if kind == "conv" else self.lrp.gamma
        if self.lrp.rule == "epsilon" or gamma == 0:
            return relevance_gradient(z, [(1.0, z)], self.lrp.epsilon)
        if kind == "linear" and not call and not rest:  # the bulk of a transformer: the weights rebuilt in backward
            return gamma_linear(a, weight, bias, gamma, self.lrp.epsilon)

        def run(inp: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
            out: Tensor = func(inp, w.detach(), None if b is None else b.detach(), *rest, **call)
            return out

        return generalized_gamma(z, run, a, weight.detach(), None if bias is None else bias.detach(), gamma,
                                 self.lrp.epsilon)  # fmt: skip

    def _norm(
        self,
        rule: Callable[..., Tensor],
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        names: tuple[str, ...],
        eps: float | None,
    ) -> Any:
        call = dict(zip(("input", "normalized_shape", *names), args), **kwargs)
        x = call.get("input")
        if not self.tags.depends(x):
            return func(*args, **kwargs)
        params = [call.get(name) for name in names[:-1]]
        return rule(x, tuple(call["normalized_shape"]), *params, call.get("eps", eps))


@register_method("attnlrp")
class AttnLRP(GradientAttribution):
    """AttnLRP: LRP through attention, normalisation and gated non-linearities (Achtibat et al., ICML 2024).

    The target score's relevance flows back to the input through every op with a rule that
    conserves it (see :mod:`camkit.methods.attribution.attnlrp` for each op's rule): the uniform
    rule on the attention products, AttnLRP's softmax rule, the identity rule on normalisations and
    elementwise activations, and ``rule`` on linear layers and convolutions. Any vision transformer
    camkit knows works as it is, fused attention included (timm, torchvision, Hugging Face ViT,
    DeiT, CLIP, DINOv2, SigLIP, Swin), as do CNNs, video and 1-D transformers: nothing is read by
    module class.

    Defaults: ``attention="attnlrp"``, the paper's own rules, under which relevance reaches the
    input through queries and keys as well as values (what the attention computes); ``"cp"``
    holds the attention weights constant, LXT's choice for ViTs, where the gamma rule is then
    easier to tune. ``rule="epsilon"``: needs no tuning and conserves on bias-free layers; on
    ViTs, ``rule="gamma"`` (LXT tunes ``conv_gamma`` and ``gamma`` per model, e.g. 0.25 and 0.05)
    gives less noisy maps.

    ``raw`` is the relevance of each input value [B, C, *S] ([B, K, C, *S] for [B, K]
    targets), ``maps`` [B, *S] its normalised ``max_c |raw|``. Conservation, per sample (and
    target column): ``extras["relevance"]`` is ``sum(raw)``, ``extras["delta"]`` ``sum(raw) -
    score``, and ``extras["absorbed"]`` the share of the score not found at the input
    (``-delta / score``): what biases, position embeddings and tokens, the stabiliser and the
    softmax's bias term took. It is zero on a network without biases with ``attention="cp"``
    and ``epsilon=0``.

    Args:
        model: the model to explain.
        attention: ``"attnlrp"`` (default) or ``"cp"``.
        rule: ``"epsilon"`` (default) or ``"gamma"`` on linear layers and convolutions.
        epsilon: the stabiliser of both rules (default ``1e-6``, in the units of the layer outputs).
        gamma: the gamma rule's weight on linear layers (default ``0.25``).
        conv_gamma: the gamma rule's weight on convolutions (default: ``gamma``).
        output, keep_mode, input_index: see :class:`~camkit.Explainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        >>> net = nn.Sequential(nn.Flatten(2), nn.Linear(4, 8), layer, nn.Flatten(), nn.Linear(8 * 3, 2)).eval()
        >>> e = camkit.AttnLRP(net).explain(torch.rand(2, 3, 2, 2), target=1)
        >>> tuple(e.raw.shape), tuple(e.extras["relevance"].shape)
        ((2, 3, 2, 2), (2,))
    """

    cost: ClassVar[str] = "1 forward + 1 backward (the gamma rule adds 4 products per linear layer)"
    use_when: ClassVar[str] = (
        "You explain a transformer and want an attribution that follows the score through attention, norms and "
        "MLPs and conserves it."
    )

    def __init__(
        self,
        model: nn.Module,
        attention: AttentionRule = "attnlrp",
        rule: LayerRule = "epsilon",
        *,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        conv_gamma: float | None = None,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if attention not in ("attnlrp", "cp"):
            raise InvalidInputError(f"attention must be 'attnlrp' or 'cp', got {attention!r}")
        if rule not in ("epsilon", "gamma"):
            raise InvalidInputError(
                f"rule must be 'epsilon' or 'gamma' (for other rules on CNNs use camkit.LRP), got {rule!r}"
            )
        conv_gamma = gamma if conv_gamma is None else conv_gamma
        for name, value in (("epsilon", epsilon), ("gamma", gamma), ("conv_gamma", conv_gamma)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidInputError(f"{name} must be a finite number >= 0, got {value!r}")
        self.attention, self.rule = attention, rule
        self.epsilon, self.gamma, self.conv_gamma = float(epsilon), float(gamma), float(conv_gamma)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        leaf = x.clone().requires_grad_(True)
        mode = _AttnLRPMode(self, leaf)
        with torch.enable_grad():
            with mode:
                raw_out = self._call_model(leaf.clone())
            if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw_out, Tensor):
                classes, scores = resolve_target(target, raw_out, batch=x.shape[0])
            else:
                classes, scores = resolve_target(target, select_output(raw_out, self.output), batch=x.shape[0])
            grads = score_gradients(scores, leaf)
        raw = (leaf.detach().unsqueeze(1) if scores.dim() == 2 else leaf.detach()) * grads
        warn_unruled("AttnLRP", mode.unruled, "their plain gradient is used, so relevance is not conserved through them.")
        scores = scores.detach()
        size = tuple(x.shape[2:])
        maps, flat = self.maps_from_raw(raw, size)
        relevance = raw.sum(dim=tuple(range(-(len(size) + 1), 0)))
        delta = relevance - scores.to(relevance.dtype)
        safe = torch.where(scores == 0, torch.ones_like(delta), scores.to(delta.dtype))
        absorbed = torch.where(scores == 0, torch.zeros_like(delta), -delta / safe)
        return Explanation(
            maps=maps, raw=raw, target=classes, scores=scores, flat=flat, method=self.key,
            extras={"delta": delta, "relevance": relevance, "absorbed": absorbed, "rule": self.rule,
                    "attention": self.attention},
        )  # fmt: skip
