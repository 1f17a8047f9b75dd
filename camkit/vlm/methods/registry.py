"""The registry of vision-language methods, and the contract every method keeps.

A method is a callable ``method(request: MethodRequest) -> UnitScores`` registered under a
lower-case key with :func:`register_vlm_method`. :func:`camkit.explain_generation` builds the
request (the teacher-forced batch, the layout of its image tokens, the targets), calls the
method, and paints what it returns into maps on each original image.

The contract:

* **Targets.** Sample ``b`` has ``T_b`` targets; target ``t`` is the sum, over ``k``, of the
  log-probability of token ``request.token_ids[b][t, k]`` at position ``request.positions[b][t, k]``
  of the teacher-forced sequence (the log-softmax of the logits at ``p - 1``, as
  :class:`camkit.TokenTarget` computes it; :func:`camkit.targets.tokens.token_log_probs` does the
  arithmetic). One token per target for a whole answer (``K_b = 1``), a phrase's tokens for
  ``span`` (``T_b = 1``).
* **Scores.** The method returns one float32 score per unit for every target: ``[T_b, N_b]``
  over the sample's language-model image tokens (``units="tokens"``, painted with
  ``ImageTokens.boxes``) or ``[T_b, R_b]`` over its feature rows (``units="rows"``, painted with
  ``ImageTokens.feature_boxes``), and ``log_probs`` [T_b], each target's log-probability in the
  unperturbed forward (detached, float32). Scores are raw: the caller paints, normalises and
  marks flat maps.
* **Batching.** ``request.batch_tokens`` (``None``: no bound) bounds how many targets one
  backward (or one perturbed forward batch) carries; a batch of samples must give what each
  sample gives alone.
* **Hygiene.** The model's parameters never get ``requires_grad`` (gradients are taken with
  respect to captured activations or inputs only, with ``torch.autograd.grad``); no hook
  outlives the call (register them through :class:`camkit.hooks.HookScope`); the model's
  ``training`` flags, ``config.use_cache``, attention implementation and the inputs are left as
  they were.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import Tensor, nn

from ...errors import UnknownMethodError
from ..families.base import Family, ImageTokens

__all__ = ["VLM_METHODS", "MethodRequest", "UnitScores", "VLMMethod", "get_vlm_method", "list_vlm_methods", "register_vlm_method"]


@dataclass(frozen=True)
class MethodRequest:
    """What a vision-language method is asked to explain.

    Attributes:
        model: the transformers model (its generation head included), as loaded.
        family: the model's family.
        inputs: the teacher-forced batch on the model's device: ``input_ids`` [B, L] (prompt,
            then answer, right-padded), ``attention_mask`` and every other tensor the processor
            made (``pixel_values``...), ready for ``model(**inputs)``.
        layouts: one :class:`ImageTokens` per sample.
        positions: per sample a LongTensor [T_b, K_b] of sequence positions (see the module docstring).
        token_ids: per sample a LongTensor [T_b, K_b], the tokens at those positions.
        layer: the module given as ``layer=`` (``None``: the method's default).
        batch_tokens: at most this many targets per backward or perturbed batch (``None``: no bound).
        progress: whether the user asked to see progress.
        options: the method's own keyword options (``**method_options`` of the call).

    Example:
        >>> from camkit.vlm.methods.registry import MethodRequest
        >>> sorted(MethodRequest.__dataclass_fields__)[:3]
        ['batch_tokens', 'family', 'inputs']
    """

    model: nn.Module
    family: Family
    inputs: Mapping[str, Tensor]
    layouts: list[ImageTokens]
    positions: list[Tensor]
    token_ids: list[Tensor]
    layer: nn.Module | None = None
    batch_tokens: int | None = None
    progress: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitScores:
    """What a vision-language method returns (see the module docstring).

    Attributes:
        scores: per sample, float32 [T_b, N_b] (``units="tokens"``) or [T_b, R_b] (``units="rows"``).
        units: ``"tokens"`` (the language model's image tokens) or ``"rows"`` (the feature rows).
        log_probs: per sample, float32 [T_b], each target's log-probability, detached.
        layers: the dotted names of the modules the method read (empty if none).
        extras: method-specific values (kept in each ``Explanation.extras``).

    Example:
        >>> import torch
        >>> from camkit.vlm.methods.registry import UnitScores
        >>> UnitScores([torch.ones(2, 4)], "tokens", [torch.zeros(2)]).units
        'tokens'
    """

    scores: list[Tensor]
    units: Literal["tokens", "rows"]
    log_probs: list[Tensor]
    layers: tuple[str, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict)


VLMMethod = Callable[[MethodRequest], UnitScores]

#: The registered methods: key -> callable.
VLM_METHODS: dict[str, VLMMethod] = {}


def register_vlm_method(name: str) -> Callable[[VLMMethod], VLMMethod]:
    """Register the decorated callable under ``name`` (a lower-case key).

    Example:
        >>> from camkit.vlm.methods.registry import VLM_METHODS, register_vlm_method
        >>> @register_vlm_method("example_constant")
        ... def constant(request):
        ...     raise NotImplementedError
        >>> VLM_METHODS.pop("example_constant") is constant
        True
    """
    if name != name.lower():
        raise ValueError(f"method keys are lower-case, got {name!r}")

    def add(method: VLMMethod) -> VLMMethod:
        if name in VLM_METHODS and VLM_METHODS[name] is not method:
            raise ValueError(f"a vision-language method named {name!r} is already registered")
        VLM_METHODS[name] = method
        return method

    return add


def list_vlm_methods() -> list[str]:
    """The registered keys, sorted.

    Example:
        >>> from camkit.vlm.methods import list_vlm_methods
        >>> "gradcam" in list_vlm_methods()
        True
    """
    return sorted(VLM_METHODS)


def get_vlm_method(name: str) -> VLMMethod:
    """The method registered under ``name``.

    Raises:
        UnknownMethodError: no such key; the message lists the keys.

    Example:
        >>> import camkit
        >>> from camkit.vlm.methods import get_vlm_method
        >>> try:
        ...     get_vlm_method("gradcamm")
        ... except camkit.UnknownMethodError:
        ...     print("raised")
        raised
    """
    try:
        return VLM_METHODS[name]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"no vision-language method {name!r}; methods for these models: {', '.join(sorted(VLM_METHODS))}"
        ) from None
