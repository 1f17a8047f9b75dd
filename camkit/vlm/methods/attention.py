"""Attention rollout from a generated token to the image tokens, over the language model's layers.

What is computed (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, attention
rollout): in each layer ``l`` of the language model, ``A_l`` [L, L] is the attention probabilities
averaged over heads; with the residual connection counted as half the flow,
``Â_l = (1 - r) A_l + r I`` (``r = residual``, 0.5 in the paper). The rollout is the product
``Â_n ... Â_2 Â_1``; a token written at position ``p`` is predicted from position ``p - 1``, so its
scores are the row ``p - 1`` of the product at the image tokens' columns (for a phrase, the sum of its
tokens' rows). Each row sums to one over the sequence, so a score is the share of the token's
attention flow that comes from that image token.

How the probabilities are read, whatever the attention kernel (eager, SDPA, flash, flex, or one the
user registered): the model runs as loaded, its implementation never switched. A scoped forward hook
on each attention module of the language model sees what the module received (the hidden states,
the rotary ``(cos, sin)``, the mask) and what it returned, and camkit computes the probabilities
again with the module's own parts: its query and key projections, its query and key norms where it
has them (Gemma 3, Qwen3), its modelling file's rotary function, its ``scaling``, its logit
soft-capping, and the mask it got (a 4-D mask as given; none, or a 2-D padding mask: causal, within
the module's sliding window). Grouped key heads are repeated. As a check that nothing was missed,
the values are projected too and ``o_proj(P V)`` is compared with what the module returned; a layer
where they differ is refused with an error that names it. No gradient is taken.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ...hooks import HookScope
from ._language import Targets, decoder_of, logits_of, model_inputs, per_sample
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = [
    "attention_modules",
    "attention_probabilities",
    "attention_rollout",
    "check_output",
    "head_probabilities",
    "module_output",
    "project_mixed",
    "recomputed_parts",
    "rollout_values",
    "target_rows",
]

_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _allowed(mask: Tensor | None, length: int, source: int, causal: bool, window: int | None,
             device: torch.device) -> Tensor | None:  # fmt: skip
    """Which keys each query may see [B or 1, L, S] (bool) when the mask is not a 4-D one; None: all."""
    keep = None
    if causal or window is not None:
        rows = torch.arange(length, device=device)[:, None] + (source - length)
        cols = torch.arange(source, device=device)[None, :]
        keep = torch.ones(length, source, dtype=torch.bool, device=device)
        if causal:
            keep = keep & (cols <= rows)
        if window is not None:
            keep = keep & (cols > rows - window)
        keep = keep[None]
    if mask is not None and mask.dim() == 2:  # a padding mask [B, S]
        pad = mask[:, None, -source:].bool()
        keep = pad if keep is None else keep & pad
    return keep


def _dense(mask: Any, device: torch.device) -> Tensor | None:
    """A flex-attention ``BlockMask`` as the boolean [B, H, L, S] mask its ``mask_mod`` describes; other masks as given."""
    if mask is None or isinstance(mask, Tensor):
        return mask
    mask_mod, shape = getattr(mask, "mask_mod", None), getattr(mask, "shape", None)
    if mask_mod is None or shape is None:
        raise UnsupportedModelError(f"attention rollout cannot read an attention mask of type {type(mask).__name__}")
    from torch.nn.attention.flex_attention import create_mask

    b, h, length, source = shape
    return create_mask(mask_mod, b, h, length, source, device=device)


def _heads(q: Tensor, k: Tensor, mask: Tensor | None, *, causal: bool, scale: float | None,
           window: int | None, softcap: float | None) -> Iterator[tuple[int, Tensor]]:  # fmt: skip
    """Each head's probabilities ``(h, [B, L, S])`` in float32; rows with nothing to attend to are zero."""
    heads, groups = q.shape[-3], q.shape[-3] // k.shape[-3]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    length, source = q.shape[-2], k.shape[-2]
    mask = _dense(mask, q.device)
    four = mask is not None and mask.dim() == 4
    keep = None if four else _allowed(mask, length, source, causal, window, q.device)
    for h in range(heads):
        logits = q[:, h].float() @ k[:, h // groups].float().transpose(-2, -1) * scale
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        if four and mask is not None:
            m = mask[:, min(h, mask.shape[1] - 1), :, -source:]
            logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
        elif keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        yield h, torch.nan_to_num(logits.softmax(dim=-1), nan=0.0)


def attention_probabilities(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, causal: bool = False, scale: float | None = None,
    window: int | None = None, softcap: float | None = None,
) -> Tensor:
    """``softmax(q k^T * scale + mask)`` averaged over heads, float32 [B, L, S], one head at a time.

    ``q`` [B, H, L, E], ``k`` [B, Hk, S, E] (``H`` a multiple of ``Hk``: grouped heads). ``mask``: a
    4-D one, boolean (True: attend) or additive, broadcasting to [B, H, L, S], is taken as it is; a
    2-D padding mask [B, S] (1: a real key) or none adds ``causal`` attention and a sliding
    ``window`` (a query sees the ``window`` latest keys), as flash kernels do. ``softcap``: the
    logits become ``softcap * tanh(logits / softcap)`` before the mask. Rows with nothing to
    attend to are zero.

    Example:
        >>> import torch
        >>> q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        >>> p = attention_probabilities(q, k, causal=True)
        >>> p.sum(-1).tolist(), p[0, 0].tolist()
        ([[1.0, 1.0, 1.0]], [1.0, 0.0, 0.0])
    """
    total = torch.zeros(q.shape[0], q.shape[-2], k.shape[-2], dtype=torch.float32, device=q.device)
    for _, probabilities in _heads(q, k, mask, causal=causal, scale=scale, window=window, softcap=softcap):
        total += probabilities
    return total / q.shape[-3]


def attention_modules(decoder: nn.Module) -> list[nn.Module]:
    """The language model's attention modules (those with query, key, value and output projections), in order."""
    found = [m for m in decoder.modules() if all(isinstance(getattr(m, n, None), nn.Module) for n in _PARTS)]
    expected = getattr(getattr(decoder, "config", None), "num_hidden_layers", None)
    if not found or (expected is not None and len(found) != expected):
        raise UnsupportedModelError(
            f"camkit found {len(found)} attention modules with q_proj, k_proj, v_proj and o_proj in the language "
            f"model ({type(decoder).__name__}), which has {expected} layers; use method='gradient_input', 'attnlrp' "
            "or 'gradcam' with this model"
        )
    return found


def _rotary(module: nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    rotate = getattr(module, "rotary_fn", None) or getattr(sys.modules[type(module).__module__],
                                                          "apply_rotary_pos_emb", None)  # fmt: skip
    if not callable(rotate):
        raise UnsupportedModelError(f"{type(module).__name__} gets rotary embeddings but its modelling file has no "
                                    "apply_rotary_pos_emb camkit can apply")  # fmt: skip
    return rotate


def _received(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The module's call by parameter name (what ``**kwargs`` collected merged in)."""
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    named = dict(bound)
    for name, parameter in inspect.signature(module.forward).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(name, {}))
    return named


def _split(module: nn.Module, projection: str, hidden: Tensor) -> Tensor:
    """``projection(hidden)`` as heads [B, H, L, E], through the module's norm of that projection if it has one."""
    out = getattr(module, projection)(hidden)
    out = out.view(*hidden.shape[:-1], -1, int(module.head_dim))  # type: ignore[arg-type]
    norm = getattr(module, {"q_proj": "q_norm", "k_proj": "k_norm"}.get(projection, ""), None)
    if isinstance(norm, nn.Module):
        out = norm(out)
    return out.transpose(1, 2)


def recomputed_parts(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
    """What an attention module computed from what it received: ``(hidden, q, k, v, settings)``.

    ``q`` [B, H, L, E], ``k`` and ``v`` [B, Hk, S, E] after the module's norms and rotary embedding;
    ``settings`` are the keyword arguments of :func:`_heads` (mask, causality, scale, window, soft cap).
    Autograd records what it computes when its mode is on (the gradient methods keep the graph).
    """
    call = _received(module, args, kwargs)
    hidden = call.get("hidden_states", args[0] if args else None)
    if not isinstance(hidden, Tensor):
        raise UnsupportedModelError(f"{type(module).__name__} was called without hidden states camkit can read")
    q, k, v = (_split(module, name, hidden) for name in _PARTS[:3])
    rotary = call.get("position_embeddings")
    if rotary is not None:
        q, k = _rotary(module)(q, k, *rotary)
    settings = {"mask": call.get("attention_mask"), "causal": bool(getattr(module, "is_causal", True)),
                "scale": getattr(module, "scaling", None), "window": getattr(module, "sliding_window", None),
                "softcap": getattr(module, "attn_logit_softcapping", None)}  # fmt: skip
    return hidden, q, k, v, settings


def head_probabilities(q: Tensor, k: Tensor, settings: dict[str, Any]) -> Tensor:
    """Every head's probabilities [B, H, L, S] in float32 (see :func:`attention_probabilities`), in autograd's graph."""
    mask = settings["mask"]
    rest = {key: value for key, value in settings.items() if key != "mask"}
    return torch.stack([p for _, p in _heads(q, k, mask, **rest)], dim=1)


def project_mixed(module: nn.Module, probabilities: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
    """``o_proj(P V)`` [B, L, D] from probabilities [B, H, L, S] (float32) and values [B, Hk, S, E]."""
    groups = probabilities.shape[1] // v.shape[1]
    mixed = probabilities @ v.float().repeat_interleave(groups, dim=1)  # [B, H, L, E]
    return cast(nn.Module, module.o_proj)(mixed.transpose(1, 2).flatten(2).to(dtype))


def module_output(output: Any) -> Tensor:
    """The attention output of what an attention module returned (its first element when it returns a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output


class _Reader:
    """The forward hook: head-mean probabilities of each attention module, checked against its output."""

    def __init__(self) -> None:
        self.layers: list[Tensor] = []

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        hidden, q, k, v, settings = recomputed_parts(module, args, kwargs)
        total = torch.zeros(q.shape[0], q.shape[2], k.shape[2], dtype=torch.float32, device=q.device)
        values = []
        for h, p in _heads(q, k, settings.pop("mask"), **settings):
            total += p
            values.append(p @ v[:, h // (q.shape[1] // v.shape[1])].float())
        mixed = torch.stack(values, dim=2).flatten(2).to(hidden.dtype)  # [B, L, H * E]
        project = cast(nn.Module, module.o_proj)
        check_output(module, project(mixed), module_output(output))
        self.layers.append(total / q.shape[1])


def check_output(module: nn.Module, again: Tensor, given: Tensor) -> None:
    """Refuse a layer whose recomputed output is not the module's own (beyond the dtype's rounding)."""
    tolerance = 1e-3 if given.dtype in (torch.float32, torch.float64) else 5e-2
    again, given = again.detach().float(), given.detach().float()
    error = float((again - given).norm() / given.norm().clamp(min=1e-12))
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"camkit's reading of {type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) gives an output "
            f"{error:.2g} away from the module's own (relative): its attention does something camkit does not "
            "recompute; use method='gradient_input', 'attnlrp' or 'gradcam' with this model"
        )


def _layer_probabilities(request: MethodRequest, targets: Targets) -> tuple[list[Tensor], Tensor]:
    """The language model's layers' head-mean probabilities and the targets' log-probabilities [B, T]."""
    modules = attention_modules(decoder_of(request.model))
    reader = _Reader()
    with torch.no_grad(), HookScope() as scope:
        for module in modules:
            scope.forward(module, reader, with_kwargs=True, own_thread=True)
        output = request.model(**model_inputs(request, targets))
        scores = targets.scores(logits_of(output))
    if len(reader.layers) != len(modules):
        raise UnsupportedModelError(f"{len(reader.layers)} of the language model's {len(modules)} attention modules "
                                    "ran in one forward; camkit reads each once")  # fmt: skip
    return reader.layers, scores


def attention_rollout(layers: list[Tensor], rows: Tensor, residual: float = 0.5) -> Tensor:
    """Rows of ``Â_n ... Â_1`` with ``Â_l = (1 - residual) A_l + residual I``: ``rows`` [B, T, L] times the product.

    ``layers`` are the head-mean probabilities [B, L, L] from the first layer to the last; ``rows``
    selects (and sums) rows of the product: a one-hot row ``p - 1`` per target.

    Example:
        >>> import torch
        >>> a = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
        >>> attention_rollout([a, a], torch.tensor([[[0.0, 1.0]]])).tolist()  # (0.5 A + 0.5 I)^2, row 1
        [[[0.4375, 0.5625]]]
    """
    out = rows.float()
    for probabilities in reversed(layers):
        out = (1.0 - residual) * (out @ probabilities) + residual * out
    return out


def target_rows(targets: Targets, batch: int, length: int, device: torch.device) -> Tensor:
    """Each target's rows ``p - 1`` of a relevance matrix as a row vector: [B, T, L], the sum of one-hot rows.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> request = SimpleNamespace(inputs={"input_ids": torch.zeros(1, 4, dtype=torch.long)},
        ...                           positions=[torch.tensor([[2, 3]])], token_ids=[torch.tensor([[5, 6]])])
        >>> target_rows(Targets.of(request), 1, 4, torch.device("cpu")).tolist()  # a phrase: rows 1 and 2
        [[[0.0, 1.0, 1.0, 0.0]]]
    """
    picks = torch.where(targets.valid, targets.rows[targets.index], -1)  # [B, T, K] rows p - 1
    rows = torch.zeros(batch, targets.length, length + 1, device=device)
    rows.scatter_add_(2, (picks % (length + 1)).to(device), targets.valid.float().to(device))
    return rows[..., :length]


def rollout_values(request: MethodRequest, targets: Targets, residual: float = 0.5) -> tuple[Tensor, Tensor]:
    """The rollout of every target over the whole sequence [B, T, L] and the targets' log-probabilities [B, T]."""
    if not 0.0 <= residual <= 1.0:
        raise InvalidInputError(f"residual must lie in [0, 1], got {residual}")
    layers, scores = _layer_probabilities(request, targets)
    batch, length = layers[0].shape[0], layers[0].shape[-1]
    rows = target_rows(targets, batch, length, layers[0].device)
    return attention_rollout(layers, rows, residual), scores


@register_vlm_method("attention")
def attention(request: MethodRequest) -> UnitScores:
    """Attention rollout from each target's token(s) to the image tokens: [T_b, N_b] (see the module docstring).

    Options: ``residual`` (default 0.5), the identity's share in each layer.

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("attention") is attention
        True
    """
    residual = float(request.options.get("residual", 0.5))
    targets = Targets.of(request)
    rolled, scores = rollout_values(request, targets, residual)
    positions = [layout.positions for layout in request.layouts]
    log_probs = [scores[b, :n].float() for b, n in enumerate(targets.counts)]
    return UnitScores(per_sample(rolled, positions, targets.counts), "tokens", log_probs,
                      extras={"rollout": "Abnar & Zuidema 2020, head mean", "residual": residual,
                              "read": "recomputed from each attention module's inputs"})  # fmt: skip
