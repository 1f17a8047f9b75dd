"""Attention rollout from a generated token to the image tokens, over the language model's layers.

What is computed (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, attention
rollout): in each layer ``l`` of the language model, ``A_l`` [L, L] is the attention probabilities
averaged over heads; with the residual connection counted as half the flow,
``Â_l = (1 - r) A_l + r I`` (``r = residual``, 0.5 in the paper). The rollout is the product
``Â_n ... Â_2 Â_1``; a token written at position ``p`` is predicted from position ``p - 1``, so its
scores are the row ``p - 1`` of the product at the image tokens' columns (for a phrase, the sum of its
tokens' rows). Each row sums to one over the sequence, so a score is the share of the token's
attention flow that comes from that image token.

How the probabilities are read with fused kernels: the model runs as loaded (SDPA, or eager). A
:class:`~torch.overrides.TorchFunctionMode` sees each ``F.scaled_dot_product_attention`` call of the
language model (not those of the vision tower) and computes ``softmax(q k^T * scale + mask)`` from
the very queries, keys, mask and scale the kernel got (grouped key heads repeated); with eager
attention it reads the softmax the layer computes. Flash-attention kernels are not ``torch``
functions and cannot be read this way: the call says so. No gradient is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ...errors import InvalidInputError, UnsupportedModelError
from ...hooks import HookScope
from ._language import Targets, decoder_of, logits_of, model_inputs, per_sample
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["attention_rollout", "sdpa_probabilities"]

_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax}


def sdpa_probabilities(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, causal: bool = False, scale: float | None = None
) -> Tensor:
    """``softmax(q k^T * scale + mask)`` averaged over heads, float32 [B, L, S], one head at a time.

    ``q`` [B, H, L, E], ``k`` [B, Hk, S, E] (``H`` a multiple of ``Hk``: grouped heads), ``mask``
    boolean (True: attend) or additive, broadcasting to [B, H, L, S]; as
    ``F.scaled_dot_product_attention`` reads them. Rows with nothing to attend to are zero.

    Example:
        >>> import torch
        >>> q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        >>> p = sdpa_probabilities(q, k, causal=True)
        >>> p.sum(-1).tolist(), p[0, 0].tolist()
        ([[1.0, 1.0, 1.0]], [1.0, 0.0, 0.0])
    """
    heads, groups = q.shape[-3], q.shape[-3] // k.shape[-3]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    length, source = q.shape[-2], k.shape[-2]
    total = torch.zeros(q.shape[0], length, source, dtype=torch.float32, device=q.device)
    for h in range(heads):
        logits = q[:, h].float() @ k[:, h // groups].float().transpose(-2, -1) * scale
        if causal:
            keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
            logits = logits.masked_fill(~keep, float("-inf"))
        if mask is not None:
            m = mask[:, min(h, mask.shape[1] - 1)] if mask.dim() == 4 else mask
            logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
        total += torch.nan_to_num(logits.softmax(dim=-1), nan=0.0)
    return total / heads


class _Probabilities(TorchFunctionMode):
    """Records each attention layer's head-mean probabilities [B, L, S] while ``inside[0]`` is True."""

    def __init__(self, inside: list[bool]) -> None:
        super().__init__()
        self.inside = inside
        self.layers: list[Tensor] = []
        self.kinds: set[str] = set()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.inside[0]:
            return out
        if func is F.scaled_dot_product_attention:
            self.layers.append(_from_sdpa(*args, **kwargs))
            self.kinds.add("sdpa")
        elif _is_softmax(func) and isinstance(out, Tensor) and out.dim() == 4:  # eager attention [B, H, L, S]
            self.layers.append(torch.nan_to_num(out.detach().float().mean(dim=1), nan=0.0))
            self.kinds.add("eager")
        return out


def _is_softmax(func: Callable[..., Any]) -> bool:
    try:
        return func in _SOFTMAX
    except TypeError:
        return False


def _from_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:  # fmt: skip
    return sdpa_probabilities(query.detach(), key.detach(), attn_mask, causal=is_causal, scale=scale)


def _layer_probabilities(request: MethodRequest, targets: Targets) -> tuple[list[Tensor], Tensor]:
    """The language model's layers' head-mean probabilities and the targets' log-probabilities [B, T]."""
    model = request.model
    decoder = decoder_of(model)
    inside = [False]
    mode = _Probabilities(inside)

    def enter(*_: Any) -> None:
        inside[0] = True

    def leave(*_: Any) -> None:
        inside[0] = False

    with torch.no_grad(), HookScope() as scope:
        scope.forward_pre(decoder, enter)
        scope.forward(decoder, leave, always_call=True)
        with mode:
            output = model(**model_inputs(request, targets))
        scores = targets.scores(logits_of(output))
    expected = getattr(getattr(decoder, "config", None), "num_hidden_layers", None)
    if not mode.layers or (expected is not None and len(mode.layers) != expected):
        implementation = getattr(getattr(decoder, "config", None), "_attn_implementation", "unknown")
        raise UnsupportedModelError(
            f"camkit read {len(mode.layers)} attention layers of the language model, which has {expected}: its "
            f"attention implementation {implementation!r} runs a kernel camkit cannot see (it reads 'sdpa' and "
            "'eager'); use method='gradient_input', 'attnlrp' or 'gradcam' with this model as loaded"
        )
    return mode.layers, scores


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
    if not 0.0 <= residual <= 1.0:
        raise InvalidInputError(f"residual must lie in [0, 1], got {residual}")
    targets = Targets.of(request)
    layers, scores = _layer_probabilities(request, targets)
    batch, length = layers[0].shape[0], layers[0].shape[-1]
    picks = torch.where(targets.valid, targets.rows[targets.index], -1)  # [B, T, K] rows p - 1
    rows = torch.zeros(batch, targets.length, length + 1, device=layers[0].device)
    rows.scatter_add_(2, (picks % (length + 1)).to(rows.device), targets.valid.float().to(rows.device))
    rolled = attention_rollout(layers, rows[..., :length], residual)
    positions = [layout.positions for layout in request.layouts]
    log_probs = [scores[b, :n].float() for b, n in enumerate(targets.counts)]
    return UnitScores(per_sample(rolled, positions, targets.counts), "tokens", log_probs,
                      extras={"rollout": "Abnar & Zuidema 2020, head mean", "residual": residual})  # fmt: skip
