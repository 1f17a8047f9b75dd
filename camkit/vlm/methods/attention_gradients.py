"""Gradient-weighted attention over the language model's layers: Chefer et al.'s rollout and LeGrad.

Both read each attention module of the language model as :mod:`camkit.vlm.methods.attention` does
(a scoped forward hook recomputes the probabilities ``P_l`` [B, H, L, L] from what the module
received, whatever its kernel: eager, SDPA, flash, flex), but here the module's output is *replaced*
by ``o_proj(P_l V_l)`` computed from those probabilities, so that ``P_l`` is on autograd's graph
between the module's inputs and everything after it. The replaced output is checked against the
module's own (a layer camkit does not recompute exactly is refused, naming it). A token written at
position ``p`` is predicted from position ``p - 1``: each target reads the row(s) ``p - 1``.

* **Chefer** (Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
  and Encoder-Decoder Transformers", ICCV 2021): ``Ā_l = mean_heads((∂s/∂P_l ⊙ P_l)^+)``, with
  ``s`` the target's log-probability (every path from ``P_l`` to ``s`` counted, through the later
  layers' attention too), and ``R = I``, ``R <- R + Ā_l R`` from the first layer to the last. The
  scores are the target's row(s) of ``R`` at the image tokens' columns.
* **LeGrad** (Bousselham et al., "LeGrad: An Explainability Method for Vision Transformers via
  Feature Formation Sensitivity", 2024): layer ``l``'s own score ``s_l`` reads that layer's output
  through the model's final norm and head (its logits soft-capping too) as the last layer's output
  is read, ``s_l`` the target's log-probability from it; ``E_l`` is ``ReLU(∂s_l/∂P_l)`` averaged
  over heads and summed over the query rows, and the scores are the mean of ``E_l`` over the layers
  at the image tokens' columns. ``s_l`` reads only the rows ``p - 1`` of layer ``l``'s output, which
  depend on the rows ``p - 1`` of ``P_l`` alone: every other query row's gradient is exactly zero, so
  the sum over queries is those rows (the paper's mean over queries, times the sequence's length,
  which would otherwise make a sample's scores depend on how far its batch was padded). Each layer's
  input is cut from the graph, so one backward gives every layer its own ``∂s_l/∂P_l``.

The model's parameters never get ``requires_grad``; gradients are taken with ``torch.autograd.grad``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..._internal.state import GradModes
from ...errors import InvalidInputError, UnsupportedModelError
from ...functional.attention import weighted_attention
from ...hooks import HookScope
from ._language import Targets, decoder_of, logits_of, model_inputs, per_sample
from .attention import (
    attention_modules,
    check_output,
    head_probabilities,
    module_output,
    project_mixed,
    recomputed_parts,
    target_rows,
)
from .gradient_input import input_embeddings_leaf
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["chefer", "chefer_values", "legrad", "legrad_values"]


class _Replaced:
    """The forward hook: each module's output recomputed from its probabilities, which are kept.

    ``leaf=True``: the probabilities are computed without graph and made leaves (LeGrad: only what
    follows them is differentiated); otherwise they stay on the graph of the module's inputs.
    """

    def __init__(self, *, leaf: bool) -> None:
        self.leaf = leaf
        self.probabilities: list[Tensor] = []

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.leaf):
            hidden, q, k, v, settings = recomputed_parts(module, args, kwargs)
            probabilities = head_probabilities(q, k, settings)
        if self.leaf:
            probabilities.requires_grad_(True)
        again = project_mixed(module, probabilities, v, hidden.dtype)
        given = module_output(output)
        check_output(module, again.detach(), given)
        self.probabilities.append(probabilities)
        return again if isinstance(output, Tensor) else (again, *output[1:])


def _jobs(targets: Targets, size: int | None) -> list[tuple[int, list[int]]]:
    """``(t, samples)`` per backward: each target column over the samples that have it, ``size`` at most."""
    jobs = []
    for t in range(targets.length):
        samples = [b for b, n in enumerate(targets.counts) if t < n]
        step = len(samples) if not size or size <= 0 else size
        jobs += [(t, samples[i : i + step]) for i in range(0, len(samples), step)]
    return jobs


def _read(count: int, found: int) -> None:
    if found != count:
        raise UnsupportedModelError(f"{found} of the language model's {count} attention modules ran in one forward; "
                                    "camkit reads each once")  # fmt: skip


def chefer_values(request: MethodRequest, targets: Targets) -> tuple[Tensor, Tensor]:
    """Chefer's relevance of every target over the whole sequence [B, T, L] and the log-probabilities [B, T]."""
    modules = attention_modules(decoder_of(request.model))
    replaced = _Replaced(leaf=False)
    with torch.enable_grad():
        with HookScope() as scope:
            for module in modules:
                scope.forward(module, replaced, with_kwargs=True, own_thread=True)
            _, scores = input_embeddings_leaf(request, targets)  # the graph starts at the language model's input
        _read(len(modules), len(replaced.probabilities))
        kept = replaced.probabilities
        batch, length = kept[0].shape[0], kept[0].shape[-1]
        rows = target_rows(targets, batch, length, kept[0].device)
        values = torch.zeros_like(rows)
        jobs = _jobs(targets, request.batch_tokens)
        for number, (t, samples) in enumerate(jobs):
            grads = torch.autograd.grad(scores[samples, t].sum(), kept, retain_graph=number < len(jobs) - 1)
            out = rows[samples, t]  # [b, L]: R read through the target's rows, from the last layer down
            for probabilities, grad in zip(reversed(kept), reversed(grads)):
                cam = weighted_attention(probabilities.detach()[samples], grad[samples])
                out = out + (out[:, None] @ cam)[:, 0]
            values[samples, t] = out
    return values, scores.detach()


def _layers_of(decoder: nn.Module, count: int) -> list[nn.Module]:
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) != count:
        raise UnsupportedModelError(
            f"LeGrad reads each layer of the language model ({type(decoder).__name__}) through its final norm and "
            "head, but camkit finds no list of its layers (.layers) with one attention module each; use "
            "method='chefer' or 'attention' with this model"
        )
    return list(layers)


def _lens(model: nn.Module, decoder: nn.Module) -> Any:
    """``hidden [B, U, D] -> logits [B, U, V]``: the final norm, the head and the logits' soft cap, as the model reads."""
    get = getattr(model, "get_output_embeddings", None)
    norm, head = getattr(decoder, "norm", None), get() if callable(get) else None
    if not isinstance(norm, nn.Module) or not isinstance(head, nn.Module):
        raise UnsupportedModelError(
            f"LeGrad reads each layer through the model's final norm and head; camkit finds no .norm in "
            f"{type(decoder).__name__} or no output embeddings in {type(model).__name__}; use method='chefer'"
        )
    config: Any = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(config, "final_logit_softcapping", None)

    def lens(hidden: Tensor) -> Tensor:
        logits = cast(Tensor, head(norm(hidden)))
        return torch.tanh(logits / cap) * cap if cap else logits

    return lens


def _cut_inputs(modes: GradModes) -> Any:
    """A pre-hook: the layer's input cut from the graph, autograd on for the layer."""

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        modes.enter(True)
        if args and isinstance(args[0], Tensor):
            return (args[0].detach(), *args[1:]), kwargs
        if isinstance(kwargs.get("hidden_states"), Tensor):
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()}
        raise UnsupportedModelError("a language model layer was called without hidden states camkit can read")

    return before


def _layer_forward(request: MethodRequest, targets: Targets) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """One forward, each layer's input cut and its probabilities leaves: ``(probabilities, outputs, scores)``."""
    decoder = decoder_of(request.model)
    modules = attention_modules(decoder)
    layers = _layers_of(decoder, len(modules))
    replaced, outputs = _Replaced(leaf=True), []

    def after(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        outputs.append(module_output(output))
        modes.leave()

    with HookScope() as scope, GradModes() as modes:
        modes.enter(False)
        for layer, module in zip(layers, modules):
            scope.forward_pre(layer, _cut_inputs(modes), with_kwargs=True)
            scope.forward(layer, after, own_thread=True)
            scope.forward(module, replaced, with_kwargs=True, own_thread=True)
        scores = targets.scores(logits_of(request.model(**model_inputs(request, targets))))
    _read(len(modules), len(replaced.probabilities))
    return replaced.probabilities, outputs, scores


def legrad_values(request: MethodRequest, targets: Targets, layers: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
    """LeGrad's relevance of every target over the whole sequence [B, T, L] and the log-probabilities [B, T]."""
    kept, outputs, scores = _layer_forward(request, targets)
    count = len(kept)
    picked = list(range(count)) if layers is None else [int(i) for i in layers]
    if not picked or any(not -count <= i < count for i in picked):
        raise InvalidInputError(f"layers must be indices of the language model's {count} layers, got {layers}")
    picked = sorted({i % count for i in picked})
    lens = _lens(request.model, decoder_of(request.model))
    rows = targets.rows.to(outputs[0].device)
    with torch.enable_grad():
        layer_scores = [targets.scores(lens(outputs[i][:, rows])) for i in picked]  # [B, T] each
    if picked[-1] == count - 1:  # the last layer's score is the model's own: a check that the lens is its head
        error = float((layer_scores[-1].detach() - scores).abs().max())
        if not error <= 1e-3 * max(1.0, float(scores.abs().max())):
            raise UnsupportedModelError(
                f"the model's final norm and head read from its last layer give log-probabilities {error:.2g} away from "
                "the model's own: it does something after its last layer camkit does not; use method='chefer'"
            )
    values = torch.zeros(scores.shape[0], targets.length, kept[0].shape[-1], device=kept[0].device)
    jobs = _jobs(targets, request.batch_tokens)
    for number, (t, samples) in enumerate(jobs):
        with torch.enable_grad():
            total = torch.stack([s[samples, t].sum() for s in layer_scores]).sum()
        grads = torch.autograd.grad(total, [kept[i] for i in picked], retain_graph=number < len(jobs) - 1)
        found = torch.stack([g[samples].float().clamp_min(0).mean(dim=1).sum(dim=1) for g in grads])  # [layers, b, L]
        values[samples, t] = found.mean(dim=0)
    return values, scores.detach()


def _unit_scores(request: MethodRequest, targets: Targets, values: Tensor, scores: Tensor, extras: dict[str, Any]) -> UnitScores:
    positions = [layout.positions for layout in request.layouts]
    log_probs = [scores[b, :n].float() for b, n in enumerate(targets.counts)]
    return UnitScores(per_sample(values.detach(), positions, targets.counts), "tokens", log_probs,
                      extras={**extras, "read": "recomputed from each attention module's inputs"})  # fmt: skip


@register_vlm_method("chefer")
def chefer(request: MethodRequest) -> UnitScores:
    """Chefer et al.'s gradient-weighted rollout from each target's token(s) to the image tokens: [T_b, N_b].

    See the module docstring. Cost: one forward keeping the language model's graph (every layer's
    probabilities [B, H, L, L] in float32), one backward per target column (``batch_tokens`` bounds
    the samples of one).

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("chefer") is chefer
        True
    """
    targets = Targets.of(request)
    values, scores = chefer_values(request, targets)
    return _unit_scores(request, targets, values, scores, {"rollout": "Chefer et al. 2021, relu(grad * attention)"})


@register_vlm_method("legrad")
def legrad(request: MethodRequest) -> UnitScores:
    """LeGrad from each target's token(s) to the image tokens, each layer read through the model's head: [T_b, N_b].

    See the module docstring. Options: ``layers`` (indices of the language model's layers averaged,
    negative from the end; default all). Cost: one forward keeping each layer's graph from its
    attention on, one backward per target column.

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("legrad") is legrad
        True
    """
    targets = Targets.of(request)
    values, scores = legrad_values(request, targets, request.options.get("layers"))
    return _unit_scores(request, targets, values, scores, {"legrad": "Bousselham et al. 2024, logit lens per layer"})
