"""Pure attention math for vision transformers: rollout, gradient-weighted rollout and LeGrad.

Every function takes attention probabilities ``A`` [B, heads, N, N] (rows are queries, columns
keys, each row sums to 1) as a transformer's softmax gives them, layer by layer in the order
the model runs them, and returns token relevance with no hooks and no state.

* :func:`attention_rollout` (Abnar & Zuidema, "Quantifying Attention Flow in Transformers",
  ACL 2020): ``Ā_l = 0.5 * fuse_heads(A_l) + 0.5 * I`` with its rows renormalised to sum to 1,
  and ``R = Ā_L ··· Ā_1``.
* :func:`gradient_rollout` (Chefer, Gur & Wolf, "Generic Attention-model Explainability for
  Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV 2021): ``R = I`` and, layer by
  layer, ``R <- R + mean_heads((dA_l ⊙ A_l)^+) R``, with ``dA_l`` the gradient of the score.
* :func:`legrad_relevance` (Bousselham et al., "LeGrad: An Explainability Method for Vision
  Transformers via Feature Formation Sensitivity", 2024): ``E_l = mean over heads and queries of
  ReLU(ds_l / dA_l)``, averaged over layers.

:func:`token_relevance` reads one row of a relevance matrix ``R`` [B, N, N] over the patch
keys: the class token's row, or the mean of all rows for models that pool their tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["attention_rollout", "fuse_heads", "gradient_rollout", "legrad_relevance", "token_relevance"]

_FUSIONS = ("mean", "max", "min")


def _check(attention: Tensor, where: str) -> None:
    if attention.dim() != 4 or attention.shape[-1] != attention.shape[-2]:
        raise InvalidInputError(f"{where} must be attention probabilities [B, heads, N, N], got {list(attention.shape)}")


def fuse_heads(attention: Tensor, fusion: str = "mean") -> Tensor:
    """Fuse the heads of attention probabilities [B, heads, N, N] into [B, N, N]: their mean, max or min.

    Example:
        >>> import torch
        >>> from camkit.functional import fuse_heads
        >>> a = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]]])
        >>> fuse_heads(a).tolist(), fuse_heads(a, "max").tolist()
        ([[[0.5, 0.5], [0.5, 0.5]]], [[[1.0, 1.0], [0.5, 0.5]]])
    """
    _check(attention, "attention")
    if fusion == "mean":
        return attention.mean(dim=1)
    if fusion == "max":
        return attention.amax(dim=1)
    if fusion == "min":
        return attention.amin(dim=1)
    raise InvalidInputError(f"head fusion must be one of {', '.join(_FUSIONS)}, got {fusion!r}")


def _discard(fused: Tensor, ratio: float) -> Tensor:
    # The lowest ``ratio`` of each matrix's entries set to zero; the diagonal is kept (the
    # identity added next keeps every row's own token anyway).
    batch, n, _ = fused.shape
    count = int(n * n * ratio)
    if count <= 0:
        return fused
    diagonal = torch.eye(n, dtype=torch.bool, device=fused.device)
    ranked = fused.masked_fill(diagonal, float("inf")).reshape(batch, n * n)
    lowest = ranked.topk(count, dim=1, largest=False).indices
    dropped = fused.reshape(batch, n * n).scatter(1, lowest, 0.0).reshape(batch, n, n)
    return torch.where(diagonal, fused, dropped)


def attention_rollout(attentions: Sequence[Tensor], *, head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
    """Attention rollout ``R = Ā_L ··· Ā_1`` [B, N, N] of per-layer probabilities [B, heads, N, N].

    Each layer: heads fused (:func:`fuse_heads`), the lowest ``discard_ratio`` of the fused
    matrix's off-diagonal entries set to zero, then ``Ā = 0.5 * fused + 0.5 * I`` with each row
    divided by its sum.

    Example:
        >>> import torch
        >>> from camkit.functional import attention_rollout
        >>> a = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]])  # every query reads token 1
        >>> attention_rollout([a]).tolist()
        [[[0.5, 0.5], [0.0, 1.0]]]
        >>> attention_rollout([a, a]).tolist()  # (0.5 A + 0.5 I) twice
        [[[0.25, 0.75], [0.0, 1.0]]]
    """
    if not attentions:
        raise InvalidInputError("attention rollout needs the probabilities of at least one layer")
    if not 0.0 <= discard_ratio < 1.0:
        raise InvalidInputError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    rollout: Tensor | None = None
    for index, attention in enumerate(attentions):
        _check(attention, f"layer {index}'s attention")
        fused = _discard(fuse_heads(attention.float(), head_fusion), discard_ratio)
        eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
        mixed = 0.5 * fused + 0.5 * eye
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    assert rollout is not None
    return rollout


def gradient_rollout(attentions: Sequence[Tensor], gradients: Sequence[Tensor]) -> Tensor:
    """Chefer et al.'s relevance ``R`` [B, N, N]: ``R = I``, then ``R <- R + mean_heads((dA ⊙ A)^+) R`` per layer.

    Example:
        >>> import torch
        >>> from camkit.functional import gradient_rollout
        >>> a = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]])
        >>> gradient_rollout([a], [2 * torch.ones_like(a)]).tolist()  # I + 2A
        [[[1.0, 2.0], [0.0, 3.0]]]
    """
    if not attentions or len(attentions) != len(gradients):
        raise InvalidInputError(
            f"gradient rollout needs one gradient per attention layer, got {len(attentions)} layers and "
            f"{len(gradients)} gradients"
        )
    cams = []
    for index, (attention, gradient) in enumerate(zip(attentions, gradients)):
        _check(attention, f"layer {index}'s attention")
        if gradient.shape != attention.shape:
            raise InvalidInputError(
                f"layer {index}'s gradient has shape {list(gradient.shape)}, its attention {list(attention.shape)}"
            )
        cams.append(weighted_attention(attention, gradient))
    return rollout_weighted(cams)


def weighted_attention(attention: Tensor, gradient: Tensor) -> Tensor:
    """One layer's term of :func:`gradient_rollout`: ``mean_heads((dA ⊙ A)^+)`` [B, N, N], in float32.

    Example:
        >>> import torch
        >>> from camkit.functional.attention import weighted_attention
        >>> a = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]]])
        >>> weighted_attention(a, torch.ones_like(a) - 2 * a[:, :1]).tolist()  # head 0 negative: clamped
        [[[0.5, 0.0], [0.5, 0.0]]]
    """
    return (gradient.float() * attention.float()).clamp_min(0).mean(dim=1)


def rollout_weighted(cams: Sequence[Tensor]) -> Tensor:
    """:func:`gradient_rollout` from each layer's :func:`weighted_attention` [B, N, N], first layer first.

    Example:
        >>> import torch
        >>> from camkit.functional.attention import rollout_weighted
        >>> rollout_weighted([torch.tensor([[[0.0, 2.0], [0.0, 2.0]]])]).tolist()  # I + 2A
        [[[1.0, 2.0], [0.0, 3.0]]]
    """
    if not cams:
        raise InvalidInputError("gradient rollout needs the weighted attention of at least one layer")
    batch, n, _ = cams[0].shape
    relevance = torch.eye(n, device=cams[0].device).expand(batch, n, n)
    for cam in cams:
        relevance = relevance + cam @ relevance
    return relevance


def legrad_relevance(gradients: Sequence[Tensor], prefix: int = 0) -> Tensor:
    """LeGrad's token relevance [B, N - prefix]: the mean over layers of ``ReLU(dA_l)`` averaged over heads and queries.

    ``gradients`` are the gradients ``ds_l / dA_l`` [B, heads, N, N] of each layer's own score;
    the ``prefix`` leading keys (class, distillation, register tokens) are dropped.

    Example:
        >>> import torch
        >>> from camkit.functional import legrad_relevance
        >>> g = torch.tensor([[[[1.0, -1.0, 3.0], [1.0, 1.0, -3.0], [1.0, 2.0, 3.0]]]])
        >>> legrad_relevance([g], prefix=1).tolist()
        [[1.0, 2.0]]
    """
    if not gradients:
        raise InvalidInputError("LeGrad needs the gradients of at least one layer")
    layers = []
    for index, gradient in enumerate(gradients):
        _check(gradient, f"layer {index}'s gradient")
        layers.append(gradient.float().clamp_min(0).mean(dim=(1, 2))[:, prefix:])
    return torch.stack(layers).mean(dim=0)


def token_relevance(relevance: Tensor, prefix: int = 0, *, query: str = "class") -> Tensor:
    """One query's relevance over the patch keys [B, N - prefix] of a relevance matrix [B, N, N].

    ``query="class"``: the class token's row (row 0); ``"mean"``: the mean of all rows, for models
    that pool their tokens instead of reading a class token.

    Example:
        >>> import torch
        >>> from camkit.functional import token_relevance
        >>> r = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 4.0, 5.0], [0.0, 0.0, 1.0]]])
        >>> token_relevance(r, 1).tolist(), token_relevance(r, 1, query="mean").tolist()
        ([[2.0, 3.0]], [[2.0, 3.0]])
    """
    if relevance.dim() != 3 or relevance.shape[-1] != relevance.shape[-2]:
        raise InvalidInputError(f"relevance must be [B, N, N], got {list(relevance.shape)}")
    if query == "class":
        row = relevance[:, 0]
    elif query == "mean":
        row = relevance.mean(dim=1)
    else:
        raise InvalidInputError(f"query must be 'class' or 'mean', got {query!r}")
    return row[:, prefix:]
