"""Gradient x input on the image-token embeddings the language model reads.

For target ``t`` (a token's log-probability, or a phrase's sum) and image token ``i`` at sequence
position ``p_i``, the score is ``sum_c e[p_i, c] * d(score_t) / d(e[p_i, c])``, where ``e`` [L, D]
are the input embeddings of the language model (the projected image features where the image
tokens stand): the first-order Taylor share of each image token's embedding in the target
(Shrikumar et al. 2016; Simonyan et al. 2014 for the gradient).

The embeddings are read as the language model receives them (a forward pre-hook on the model's
decoder, scoped to the call), replaced by a leaf that requires grad; autograd runs only from there
on, so neither the vision tower nor any parameter gets a gradient. One forward for the whole batch,
then one backward per target index ``t`` (at most ``batch_tokens`` samples' targets in one backward,
each sample's gradient its own: the samples of a batch do not mix).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._internal.state import GradModes
from ...errors import UnsupportedModelError
from ...hooks import HookScope
from ._language import Targets, decoder_of, logits_of, model_inputs, per_sample
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["gradient_input", "input_embeddings_leaf"]


def _missing(decoder: nn.Module) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"the language model ({type(decoder).__name__}) was not called with inputs_embeds, so camkit cannot read "
        "the image tokens' embeddings; use method='gradcam', 'occlusion' or 'rise' for this model"
    )


def input_embeddings_leaf(request: MethodRequest, targets: Targets) -> tuple[Tensor, Tensor]:
    """One forward with the language model's input embeddings as a leaf: ``(leaf [B, L, D], scores [B, T])``.

    Runs without autograd up to the language model, with it from there; call it under
    ``torch.no_grad()`` or not, the mode is put back when it returns.
    """
    model = request.model
    decoder = decoder_of(model)
    leaves: list[Tensor] = []
    with HookScope() as scope, GradModes() as modes:
        modes.enter(False)

        def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            embeds = kwargs.get("inputs_embeds")
            if not isinstance(embeds, Tensor) or leaves:
                raise _missing(decoder)
            leaves.append(embeds.detach().clone().requires_grad_(True))
            modes.enter(True)
            return args, {**kwargs, "inputs_embeds": leaves[0]}

        scope.forward_pre(decoder, before, with_kwargs=True)
        output = model(**model_inputs(request, targets))
        scores = targets.scores(logits_of(output))
        if not leaves:
            raise _missing(decoder)
        return leaves[0], scores


def _chunks(samples: list[int], size: int | None) -> list[list[int]]:
    step = len(samples) if not size or size <= 0 else size
    return [samples[i : i + step] for i in range(0, len(samples), step)]


@register_vlm_method("gradient_input")
def gradient_input(request: MethodRequest) -> UnitScores:
    """Gradient x input of each target at each image token's embedding, summed over channels: [T_b, N_b].

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("gradient_input") is gradient_input
        True
    """
    targets = Targets.of(request)
    with torch.enable_grad():
        leaf, scores = input_embeddings_leaf(request, targets)
        values = torch.zeros(scores.shape[0], targets.length, leaf.shape[1], dtype=torch.float32, device=leaf.device)
        jobs = [(t, chunk) for t in range(targets.length)
                for chunk in _chunks([b for b, n in enumerate(targets.counts) if t < n], request.batch_tokens)]  # fmt: skip
        for number, (t, chunk) in enumerate(jobs):
            (grad,) = torch.autograd.grad(scores[chunk, t].sum(), leaf, retain_graph=number < len(jobs) - 1)
            values[chunk, t] = (grad[chunk].float() * leaf.detach()[chunk].float()).sum(dim=-1)
    positions = [layout.positions for layout in request.layouts]
    log_probs = [scores.detach()[b, :n].float() for b, n in enumerate(targets.counts)]
    return UnitScores(per_sample(values, positions, targets.counts), "tokens", log_probs,
                      extras={"inputs": "the language model's input embeddings"})  # fmt: skip
