"""Fused attention written out as matrix product, softmax, matrix product, with AttnLRP's rules on each.

``F.scaled_dot_product_attention`` (timm's fused attention, Hugging Face's ``"sdpa"``) and
``F.multi_head_attention_forward`` (``nn.MultiheadAttention``: torchvision's ViT, SigLIP's pooling
head) compute attention in one kernel whose backward is the plain gradient. :func:`attention`
computes the same values in three steps so that each step carries its rule: the uniform rule on
``q k^T`` and on ``A v`` (``variant="attnlrp"``), or the attention weights ``A`` held constant so
that relevance flows through the values alone (``variant="cp"``). :func:`multi_head_attention`
does the same for ``nn.MultiheadAttention`` with its projections passed through ``linear`` (the
caller's rule for linear layers).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import InvalidInputError
from ._attnlrp_rules import uniform

__all__ = ["attention", "multi_head_attention", "sdpa"]

# the caller's linear layer: (input, weight, bias, whether the input is computed from the explained input)
Linear = Callable[[Tensor, Tensor, "Tensor | None", bool], Tensor]
Depends = Callable[[Any], bool]

_SDPA = inspect.signature(
    lambda query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False: None
)
_MHA = inspect.signature(F.multi_head_attention_forward)


def _product(a: Tensor, b: Tensor, split: bool) -> Tensor:
    """``a @ b``; ``split``: both factors computed from the input, each gets half of the relevance."""
    if split:
        a, b = uniform([a, b], lambda _: True)
    return torch.matmul(a, b)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    variant: str,
    depends: tuple[bool, bool, bool],
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """``(softmax(q k^T * scale + mask) v, A)`` for ``q`` [..., L, E], ``k`` [..., S, E], ``v`` [..., S, Ev].

    ``depends`` says which of ``q``, ``k``, ``v`` are computed from the explained input. ``mask`` is
    boolean (``True`` where attending is allowed, as in ``scaled_dot_product_attention``) or
    additive, broadcasting to [..., L, S]; ``causal`` keeps the lower triangle.
    """
    from_q, from_k, from_v = depends
    if variant == "cp":  # the attention weights are constants: no relevance reaches q and k
        q, k = q.detach(), k.detach()
        from_q = from_k = False
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = _product(q, k.transpose(-2, -1), from_q and from_k) * scale
    if causal:
        length, source = logits.shape[-2:]
        keep = torch.ones(length, source, dtype=torch.bool, device=logits.device).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    # a row with nothing to attend to (a padded query under a causal or sliding-window mask) gives
    # zeros, as scaled_dot_product_attention does, and no NaN in either pass
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True)
    weights = logits.masked_fill(dead, 0.0).softmax(dim=-1).masked_fill(dead, 0.0)
    mixed = F.dropout(weights, dropout) if dropout > 0 else weights
    return _product(mixed, v, (from_q or from_k) and from_v), weights


def sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], variant: str, depends: Depends) -> Tensor:
    """``F.scaled_dot_product_attention(*args, **kwargs)`` by :func:`attention`."""
    call = _SDPA.bind(*args, **kwargs).arguments
    q, k, v = call["query"], call["key"], call["value"]
    flags = (depends(q), depends(k), depends(v))  # before the grouped heads are repeated (untagged copies)
    if call.get("enable_gqa", False) and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    out, _ = attention(
        q, k, v, variant, flags, mask=call.get("attn_mask"), causal=bool(call.get("is_causal", False)),
        scale=call.get("scale"), dropout=float(call.get("dropout_p", 0.0)),
    )  # fmt: skip
    return out


def _additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``nn.MultiheadAttention``'s masks (boolean ``True`` = blocked, or additive) as an additive mask."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def _heads(t: Tensor, heads: int) -> Tensor:
    """[L, B, E] -> [B, heads, L, E / heads]."""
    length, batch, width = t.shape
    return t.reshape(length, batch, heads, width // heads).permute(1, 2, 0, 3)


def _projections(call: dict[str, Any], linear: Linear, flags: tuple[bool, ...]) -> tuple[Tensor, Tensor, Tensor]:
    weight, bias = call["in_proj_weight"], call.get("in_proj_bias")
    biases = (None, None, None) if bias is None else bias.chunk(3)
    if call.get("use_separate_proj_weight", False):
        weights = (call["q_proj_weight"], call["k_proj_weight"], call["v_proj_weight"])
    else:
        weights = weight.chunk(3)
    q = linear(call["query"], weights[0], biases[0], flags[0])
    k = linear(call["key"], weights[1], biases[1], flags[1])
    v = linear(call["value"], weights[2], biases[2], flags[2])
    return q, k, v


def multi_head_attention(
    args: tuple[Any, ...], kwargs: dict[str, Any], variant: str, linear: Linear, depends: Depends
) -> tuple[Tensor, Tensor | None]:
    """``F.multi_head_attention_forward(*args, **kwargs)`` by :func:`attention`, projections by ``linear``."""
    call = _MHA.bind(*args, **kwargs).arguments
    unsupported = [name for name in ("bias_k", "bias_v", "static_k", "static_v") if call.get(name) is not None]
    if call.get("add_zero_attn", False):
        unsupported.append("add_zero_attn")
    if unsupported:
        raise InvalidInputError(
            f"AttnLRP reads nn.MultiheadAttention without {', '.join(unsupported)}; this module sets them. "
            "Explain the model with camkit.LRP or a gradient attribution (camkit.IntegratedGradients)."
        )
    query = call["query"]
    flags = (depends(query), depends(call["key"]), depends(call["value"]))
    unbatched = query.dim() == 2
    if unbatched:
        for name in ("query", "key", "value"):
            call[name] = call[name].unsqueeze(1)
    length, batch, width = call["query"].shape
    heads = int(call["num_heads"])
    q, k, v = (_heads(t, heads) for t in _projections(call, linear, flags))
    mask = _additive(call.get("attn_mask"), q.dtype)
    if mask is not None and mask.dim() == 3:  # [B * heads, L, S]
        mask = mask.view(batch, heads, *mask.shape[-2:])
    padding = _additive(call.get("key_padding_mask"), q.dtype)
    if padding is not None:
        padding = padding.view(batch, 1, 1, -1)
        mask = padding if mask is None else mask + padding
    causal = bool(call.get("is_causal", False)) and mask is None
    dropout = float(call.get("dropout_p", 0.0)) if call.get("training", True) else 0.0
    out, weights = attention(q, k, v, variant, flags, mask=mask, causal=causal, dropout=dropout)
    out = out.permute(2, 0, 1, 3).reshape(length, batch, width)
    out = linear(out, call["out_proj_weight"], call.get("out_proj_bias"), flags[2] or (variant != "cp" and any(flags)))
    if not call.get("need_weights", True):
        return (out.squeeze(1) if unbatched else out), None
    if call.get("average_attn_weights", True):
        weights = weights.mean(dim=1)
    if unbatched:
        return out.squeeze(1), weights.squeeze(0)
    return out, weights
