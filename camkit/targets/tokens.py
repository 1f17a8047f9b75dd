"""Token targets: the log-probability a causal language model gives to tokens of its sequence.

A :class:`TokenTarget` scores a teacher-forced sequence: the model read the whole sequence (a
prompt, images among its tokens, and an answer) in one forward, and the score of sample ``b``
is the sum, over the positions ``p`` asked for, of ``log_softmax(logits[b, p - 1])[token at p]``:
how likely the model found the token at ``p`` given everything before it. Any camkit explainer
takes it as ``target=`` (a vision-language model's ``pixel_values`` as ``x``, its ``input_ids``
as a keyword input), and :func:`camkit.explain_generation` builds on it.

The tokens scored are ``token_ids`` when given, else the tokens of the sequence itself: those of
the ``input_ids`` the model is called with, which the target records for the duration of an
explainer's call (a forward pre-hook on the model, scoped to the call), or those passed as
``input_ids=`` when the target is called directly on logits.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..errors import InvalidTargetError, OutputSelectionError
from ..hooks import HookScope

__all__ = ["TokenTarget", "token_log_probs"]

def _logits_of(output: Any) -> Tensor:
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        output = output["logits"]
    elif not isinstance(output, Tensor) and isinstance(getattr(output, "logits", None), Tensor):
        output = output.logits
    if not isinstance(output, Tensor) or output.dim() != 3:
        got = list(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise OutputSelectionError(
            f"TokenTarget scores a causal language model's logits [B, L, V] (a tensor, or an output with "
            f".logits), got {got}"
        )
    return output


def _as_index(value: Any, name: str) -> Tensor:
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise InvalidTargetError(f"{name} must be integers, not bools")
    try:
        index = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidTargetError(f"{name} must be an int, a sequence of ints or an integer tensor, got {value!r}") from None
    if index.numel() == 0:
        raise InvalidTargetError(f"{name} is empty: give at least one position to score")
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise InvalidTargetError(f"{name} must be integers, got dtype {index.dtype}")
    if index.dim() > 2:
        raise InvalidTargetError(f"{name} must be an int, [K] or [B, K], got shape {list(index.shape)}")
    return index.long()


def token_log_probs(logits: Tensor, positions: Tensor, token_ids: Tensor) -> Tensor:
    """``log_softmax(logits[b, p - 1])[token]`` for each position ``p`` and its token: [B, K], float32.

    Only the rows ``p - 1`` are normalised (never the whole [B, L, V]), in float32 whatever the
    logits' dtype. ``positions`` and ``token_ids`` are LongTensors [B, K] on the logits' device,
    already checked (``1 <= p < L``).

    Example:
        >>> import torch
        >>> from camkit.targets.tokens import token_log_probs
        >>> logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
        >>> token_log_probs(logits, torch.tensor([[1]]), torch.tensor([[0]])).exp()
        tensor([[0.5000]])
    """
    rows = logits.gather(1, (positions - 1)[..., None].expand(-1, -1, logits.shape[-1]))  # [B, K, V]
    return rows.float().log_softmax(dim=-1).gather(2, token_ids[..., None])[..., 0]


class TokenTarget:
    """The log-probability of tokens of a teacher-forced sequence, as a target.

    The score of sample ``b`` is ``sum_p log_softmax(logits[b, p - 1])[token_b(p)]`` over the
    positions ``p`` given, where ``token_b(p)`` is ``token_ids`` if given, else the token at ``p``
    of the sample's ``input_ids`` (see the module docstring for how the target sees them).

    Args:
        positions: an int (one position for every sample), a sequence of ints or a LongTensor
            [K] (one span for every sample), or a LongTensor [B, K] (K positions per sample).
            Positions count from the start of the sequence; position 0 has no token before it
            and is refused, as are positions past the sequence's end.
        token_ids: ``None`` (the tokens of the sequence at those positions), or ids of the same
            shape as ``positions``: score other tokens at those places (what the model would
            have had to say).
        reduce: ``"sum"`` (default) the score [B] of the whole span, or ``"none"``: each position
            its own score [B, K], so an explainer makes K maps per sample from one forward.

    Example:
        >>> import torch
        >>> import camkit
        >>> probs = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]])
        >>> logits, input_ids = probs.log(), torch.tensor([[2, 0, 2]])
        >>> camkit.TokenTarget(1)(logits, input_ids=input_ids).exp()      # p(token 0 at position 1)
        tensor([0.5000])
        >>> camkit.TokenTarget([1, 2])(logits, input_ids=input_ids).exp()  # 0.5 * 0.8
        tensor([0.4000])
        >>> camkit.TokenTarget(2, token_ids=1)(logits).exp()              # another token at 2
        tensor([0.1000])
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(
        self,
        positions: int | Sequence[int] | Tensor,
        token_ids: int | Sequence[int] | Tensor | None = None,
        *,
        reduce: Literal["sum", "none"] = "sum",
    ) -> None:
        if reduce not in ("sum", "none"):
            raise InvalidTargetError(f"reduce must be 'sum' or 'none', got {reduce!r}")
        index = _as_index(positions, "positions").cpu()
        low = int(index.min())
        if low < 1:
            raise InvalidTargetError(
                f"position {low} cannot be scored: a token's log-probability is read from the logits of the "
                "position before it, so positions start at 1 (count from the start of the sequence)"
            )
        ids = None
        if token_ids is not None:
            ids = _as_index(token_ids, "token_ids").cpu()
            if ids.shape != index.shape:
                raise InvalidTargetError(
                    f"token_ids has shape {list(ids.shape)} but positions has {list(index.shape)}; give one token "
                    "per position"
                )
            if ids.numel() and int(ids.min()) < 0:
                raise InvalidTargetError(f"token id {int(ids.min())} is negative")
        self.positions = index
        self.token_ids = ids
        self.reduce = reduce
        self._local = threading.local()

    def __repr__(self) -> str:
        where = self.positions.tolist() if self.positions.numel() <= 8 else list(self.positions.shape)
        tokens = "from input_ids" if self.token_ids is None else "given"
        return f"TokenTarget(positions={where}, tokens={tokens}, reduce={self.reduce!r})"

    @contextmanager
    def bind_model(self, model: nn.Module) -> Iterator[TokenTarget]:
        """Record the ``input_ids`` the model is called with during the block (this thread only)."""
        local = self._local

        def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids")
            if ids is None and args and isinstance(args[0], Tensor) and not args[0].is_floating_point():
                ids = args[0]
            local.input_ids = ids

        local.depth = getattr(local, "depth", 0) + 1
        try:
            with HookScope() as scope:
                scope.forward_pre(model, record, with_kwargs=True)
                yield self
        finally:
            local.depth -= 1
            if local.depth == 0:
                local.input_ids = None

    def for_rows(self, rows: Tensor) -> TokenTarget:
        """The target of a batch of changed copies whose row ``i`` was made from sample ``rows[i]``.

        Per-sample positions and token ids ([B, K]) are taken row by row; a shared span stays as it
        is. The copy reads the same recorded ``input_ids`` (those of the copies' own forward).
        Perturbation methods (occlusion, RISE...) and wrappers call this for each chunk of rows.

        Example:
            >>> import torch
            >>> import camkit
            >>> target = camkit.TokenTarget(torch.tensor([[1], [2]]))
            >>> target.for_rows(torch.tensor([1, 1, 0])).positions.tolist()
            [[2], [2], [1]]
        """
        if self.positions.dim() < 2 and (self.token_ids is None or self.token_ids.dim() < 2):
            return self
        index = rows.to("cpu", non_blocking=False).long()
        other = copy.copy(self)  # shares the recorder of input_ids
        other.positions = self.positions[index] if self.positions.dim() == 2 else self.positions
        if self.token_ids is not None and self.token_ids.dim() == 2:
            other.token_ids = self.token_ids[index]
        return other

    def _expand(self, index: Tensor, batch: int, name: str) -> Tensor:
        if index.dim() < 2:
            return index.reshape(1, -1).expand(batch, -1)
        if index.shape[0] != batch:
            raise InvalidTargetError(
                f"{name} has shape {list(index.shape)} but the batch has {batch} samples; give [B, K] with B={batch}, "
                "or one position list for all"
            )
        return index

    def _tokens(self, positions: Tensor, input_ids: Tensor | None, batch: int, vocab: int, device: torch.device) -> Tensor:
        if self.token_ids is not None:
            ids = self._expand(self.token_ids, batch, "token_ids")
            if ids.numel() and int(ids.max()) >= vocab:
                raise InvalidTargetError(f"token id {int(ids.max())} is out of range for a vocabulary of {vocab}")
            return ids.to(device, non_blocking=True)
        if input_ids is None:
            input_ids = getattr(self._local, "input_ids", None)
        if not isinstance(input_ids, Tensor):
            raise InvalidTargetError(
                f"{self!r} needs the sequence's tokens: pass it as target= to a camkit explainer whose call gives "
                "the model input_ids=, call it as target(logits, input_ids=ids), or give token_ids="
            )
        if input_ids.dim() != 2 or input_ids.shape[0] != batch:
            raise InvalidTargetError(f"input_ids must be [B, L] with B={batch}, got shape {list(input_ids.shape)}")
        return input_ids.to(device).gather(1, positions)

    def __call__(self, output: Any, *, input_ids: Tensor | None = None) -> Tensor:
        """The scores [B] (``reduce="sum"``) or [B, K] (``reduce="none"``), float32, attached to the graph.

        Args:
            output: logits [B, L, V], or an output holding them as ``logits``.
            input_ids: the sequence [B, L], when the target is called outside an explainer and
                ``token_ids`` was not given.
        """
        logits = _logits_of(output)
        batch, length, vocab = logits.shape
        positions = self._expand(self.positions, batch, "positions")
        high = int(positions.max())
        if high >= length:
            raise InvalidTargetError(
                f"position {high} is past the end of the sequence (length {length}); positions run from 1 to {length - 1}"
            )
        positions = positions.to(logits.device, non_blocking=True)
        tokens = self._tokens(positions, input_ids, batch, vocab, logits.device)
        scores = token_log_probs(logits, positions, tokens)
        return scores.sum(dim=1) if self.reduce == "sum" else scores
