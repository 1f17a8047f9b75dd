"""What the vision-language methods share: the targets of a request as rows of logits, and the language model's parts.

A request's targets (sample ``b``, target ``t``: the tokens ``token_ids[b][t, k]`` at positions
``positions[b][t, k]``) are read from the logits at ``p - 1``. :class:`Targets` asks the model for
the logits of those rows only (``logits_to_keep``, the same rows for every sample), so that no
``[B, L, V]`` tensor is ever made, and sums each target's log-probabilities (or logits) from them.
Targets are padded to the longest sample's count ``T``; a padded target scores zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from .registry import MethodRequest

__all__ = ["Targets", "decoder_of", "logits_of", "model_inputs", "per_sample"]


@dataclass(frozen=True)
class Targets:
    """The request's targets over the kept rows of the logits.

    Attributes:
        rows: LongTensor [U], the sorted sequence positions ``p - 1`` whose logits are kept.
        index: LongTensor [B, T, K], each target token's row in ``rows`` (0 where padded).
        tokens: LongTensor [B, T, K], each target token's id (0 where padded).
        valid: bool [B, T, K], which entries are real tokens.
        counts: the number of targets of each sample (``T_b``).
    """

    rows: Tensor
    index: Tensor
    tokens: Tensor
    valid: Tensor
    counts: tuple[int, ...]

    @classmethod
    def of(cls, request: MethodRequest) -> Targets:
        """The targets of ``request``, on the device of its ``input_ids``.

        Example:
            >>> import torch
            >>> from types import SimpleNamespace
            >>> request = SimpleNamespace(inputs={"input_ids": torch.zeros(2, 6, dtype=torch.long)},
            ...                           positions=[torch.tensor([[4], [5]]), torch.tensor([[3]])],
            ...                           token_ids=[torch.tensor([[7], [8]]), torch.tensor([[9]])])
            >>> t = Targets.of(request)
            >>> t.rows.tolist(), t.index[..., 0].tolist(), t.counts
            ([2, 3, 4], [[1, 2], [0, 0]], (2, 1))
        """
        device = request.inputs["input_ids"].device
        positions = [p.to(device=device, dtype=torch.long) for p in request.positions]
        tokens = [t.to(device=device, dtype=torch.long) for t in request.token_ids]
        counts = tuple(int(p.shape[0]) for p in positions)
        if not counts or max(counts) == 0:
            raise InvalidInputError("the request has no targets: every sample needs at least one token to explain")
        width = max(int(p.shape[1]) for p in positions)
        batch, length = len(positions), max(counts)
        pos = torch.ones(batch, length, width, dtype=torch.long, device=device)
        tok = torch.zeros(batch, length, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, length, width, dtype=torch.bool, device=device)
        for b, (p, t) in enumerate(zip(positions, tokens)):
            pos[b, : p.shape[0], : p.shape[1]] = p
            tok[b, : t.shape[0], : t.shape[1]] = t
            valid[b, : p.shape[0], : p.shape[1]] = True
        rows = torch.unique(pos[valid] - 1)
        index = torch.searchsorted(rows, pos - 1).clamp(max=rows.numel() - 1)
        return cls(rows, torch.where(valid, index, 0), tok, valid, counts)

    @property
    def length(self) -> int:
        """T, the most targets of one sample."""
        return int(self.index.shape[1])

    def scores(self, logits: Tensor, samples: Tensor | None = None, *, log_probs: bool = True) -> Tensor:
        """Each target's score [B', T] (float32) from kept logits [B', U, V].

        ``samples`` [B'] says which sample of the request each row of ``logits`` is (default: row
        ``b`` is sample ``b``). ``log_probs=False`` sums the logits themselves (AttnLRP's target).
        """
        if samples is None:
            samples = torch.arange(logits.shape[0], device=logits.device)
        index, tokens, valid = self.index[samples], self.tokens[samples], self.valid[samples]
        batch, length, width = index.shape
        flat = index.reshape(batch, length * width)
        picked = logits.gather(1, flat[..., None].expand(-1, -1, logits.shape[-1]))  # [B', T * K, V]
        if log_probs:
            picked = picked.float().log_softmax(dim=-1)
        values = picked.gather(2, tokens.reshape(batch, -1, 1))[..., 0].reshape(batch, length, width)
        return torch.where(valid, values.float(), 0.0).sum(dim=-1)


def model_inputs(
    request: MethodRequest, targets: Targets, inputs: Mapping[str, Tensor] | None = None
) -> dict[str, Any]:
    """The keyword inputs of one forward: the batch, no cache, and only the targets' rows of logits."""
    call: dict[str, Any] = dict(request.inputs if inputs is None else inputs)
    call["use_cache"] = False
    call["logits_to_keep"] = targets.rows
    return call


def logits_of(output: Any) -> Tensor:
    """The logits of a transformers output (or the tensor itself)."""
    logits = output if isinstance(output, Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, Tensor):
        raise UnsupportedModelError(
            f"the model returned {type(output).__name__} without logits; explain a model with its generation head "
            "(LlavaForConditionalGeneration rather than LlavaModel, say)"
        )
    return logits


def decoder_of(model: nn.Module) -> nn.Module:
    """The language model inside a vision-language model (transformers' ``get_decoder``)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no language model that camkit can find (transformers' get_decoder()); "
            "explain it with method='occlusion' or 'rise', which need only its outputs"
        )
    return decoder


def per_sample(values: Tensor, positions: Sequence[Tensor], counts: Sequence[int]) -> list[Tensor]:
    """Per sample ``b``, float32 ``values[b, :T_b]`` at its image tokens' ``positions[b]``: [T_b, N_b].

    Example:
        >>> import torch
        >>> per_sample(torch.arange(12.0).reshape(2, 2, 3), [torch.tensor([0, 2]), torch.tensor([1])], (2, 1))
        [tensor([[0., 2.],
                [3., 5.]]), tensor([[7.]])]
    """
    return [
        values[b, :count][:, pos.to(values.device)].float() for b, (pos, count) in enumerate(zip(positions, counts))
    ]
