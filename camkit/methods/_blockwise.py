"""Gradients of a transformer's attention one block at a time, at about a forward's memory (private).

Chefer's rollout needs ``dS/dA_l`` for every block ``l``, LeGrad the gradient of block ``l``'s own
score. Keeping the graph of every block for one backward costs the activations of the whole
network (11 to 16 times a no-grad forward on ViT-B/16). Here instead:

1. One forward runs without a graph inside the blocks; :class:`BlockRecorder` keeps each block's
   call (its input tokens ``x_l`` [B, N, D] and its other arguments). For Chefer's rollout each
   block's output is handed on as a fresh leaf and autograd runs between and after the blocks, so
   the score's graph holds only what follows the blocks (final norm, head, target) and whatever
   reads a block's output outside the chain of blocks.
2. From the last block to the first, the block is called again on its recorded input, with its
   attention recorded on the graph (:class:`~camkit.methods._attention.AttentionCapture`), and
   differentiated: the gradient with respect to its input is the gradient with respect to the
   previous block's output, added to what the score reads of that output directly. Its graph is
   freed before the next block, so the peak holds one block's graph plus the block inputs.
3. A block treats each sample on its own in eval mode (layer norms per token, attention within
   a sample), so each block is called again on a slice of the batch at a time
   (:func:`micro_batches`): the peak holds one slice's block graph, not the whole batch's.

The blocks run the same operations on the same inputs both times, so the gradients are those of
one backward through the whole graph (up to the order of floating-point sums). This holds when
the model is deterministic: explainers run the model in eval mode; a model that keeps a module in
training mode (``keep_mode=True``), a block whose input is not the previous block's output, a
block that runs twice, or a recorded input changed in place afterwards, takes the whole-graph path
instead (:meth:`BlockRecorder.replayable` says which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..hooks import HookScope
from ._attention import block_of

__all__ = ["BlockCall", "BlockRecorder", "attention_blocks", "first_tensor", "micro_batches", "replace_first"]

# a block called again on about a quarter of the batch at a time: its graph and backward (about three
# times a no-grad forward's activations per sample on ViT-S and ViT-B) then stay below one forward's
MICRO_BATCHES = 4


def attention_blocks(model: nn.Module, names: Sequence[str]) -> list[nn.Module] | None:
    """The block holding each attention module, in order; ``None`` when blocks and attentions are not one to one."""
    try:
        blocks = [block_of(model, name)[1] for name in names]
    except InvalidInputError:
        return None
    if len({id(block) for block in blocks}) != len(blocks):
        return None
    return blocks


def micro_batches(batch: int, size: int | None = None) -> list[slice]:
    """The slices of a batch of ``batch`` samples, ``size`` at a time (``None``: ``ceil(batch / 4)``).

    Example:
        >>> micro_batches(5, 2)
        [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
        >>> len(micro_batches(8))
        4
    """
    if size is None:
        size = -(-batch // MICRO_BATCHES)
    if size < 1:
        raise InvalidInputError(f"a micro-batch holds at least one sample, got {size}; pass None for the automatic size")
    return [slice(start, min(start + size, batch)) for start in range(0, batch, size)]


def first_tensor(output: Any) -> Tensor | None:
    """A block's output tokens: the output itself, or the first item of a tuple or list."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def replace_first(output: Any, tensor: Tensor) -> Any:
    """``output`` with its tokens (see :func:`first_tensor`) replaced by ``tensor``."""
    if isinstance(output, Tensor):
        return tensor
    return type(output)([tensor, *output[1:]]) if isinstance(output, list) else (tensor, *output[1:])


@dataclass
class BlockCall:
    """One recorded call of a block: its arguments, with the input tokens at ``where``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    where: int | str
    tokens: Tensor
    version: int

    def splittable(self) -> bool:
        """Whether the block can be called on a slice of the batch: no tensor argument but the tokens."""
        others = [*(a for i, a in enumerate(self.args) if i != self.where), *(v for k, v in self.kwargs.items() if k != self.where)]
        return not any(isinstance(a, Tensor) or (isinstance(a, (tuple, list)) and any(isinstance(t, Tensor) for t in a)) for a in others)

    def slices(self, size: int | None) -> list[slice]:
        """The micro-batches to call the block on: :func:`micro_batches`, or the whole batch if not :meth:`splittable`."""
        batch = self.tokens.shape[0]
        return micro_batches(batch, size) if self.splittable() else [slice(0, batch)]

    def run(self, block: nn.Module, tokens: Tensor) -> Tensor:
        """Call ``block`` again with ``tokens`` for its input tokens; its output tokens [B, N, D].

        The block's parameters are set not to require grad for the call (and put back after): no
        parameter gradient is ever taken, and autograd then keeps only what the gradients with
        respect to the tokens and the attention need (not the inputs of every linear layer).
        """
        args, kwargs = list(self.args), dict(self.kwargs)
        if isinstance(self.where, int):
            args[self.where] = tokens
        else:
            kwargs[self.where] = tokens
        frozen = [p for p in block.parameters() if p.requires_grad]
        try:
            for p in frozen:
                p.requires_grad_(False)
            output = block(*args, **kwargs)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        out = first_tensor(output)
        if out is None:
            raise InvalidInputError(f"a transformer block returned {type(output).__name__}; camkit reads tensors [B, N, D]")
        return out


class BlockRecorder:
    """Record each block's call during a forward in which the blocks build no graph.

    Args:
        blocks: the transformer blocks, in the order the model runs them.
        leaves: hand each block's output on as a fresh leaf and switch autograd on after each
            block (off again inside the next one), so that a score is differentiable with respect
            to each block's output (Chefer's rollout); ``False``: no graph anywhere (LeGrad).

    Hooks are scoped by :class:`~camkit.hooks.HookScope` and removed when the ``with`` block ends.
    While :attr:`recording` is ``False`` (the blocks being called again) the hooks do nothing.
    """

    def __init__(self, blocks: Sequence[nn.Module], *, leaves: bool) -> None:
        self.blocks = list(blocks)
        self.leaves = leaves
        self.recording = True
        self.calls: list[list[BlockCall]] = [[] for _ in self.blocks]
        self.outputs: list[list[Tensor]] = [[] for _ in self.blocks]
        self._scope = HookScope()

    def __enter__(self) -> BlockRecorder:
        try:
            for index, block in enumerate(self.blocks):
                self._scope.forward_pre(block, self._before(index), with_kwargs=True)
                self._scope.forward(block, self._after(index), own_thread=True)
        except BaseException:
            self._scope.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._scope.remove()

    def _before(self, index: int) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self.recording:
                return
            where: int | str | None = None
            if args and isinstance(args[0], Tensor):
                where = 0
            elif isinstance(kwargs.get("hidden_states"), Tensor):
                where = "hidden_states"
            if where is not None:
                tokens = args[0] if where == 0 else kwargs["hidden_states"]
                self.calls[index].append(BlockCall(args, dict(kwargs), where, tokens, tokens._version))
            torch.set_grad_enabled(False)

        return hook

    def _after(self, index: int) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not self.recording:
                return None
            tokens = first_tensor(output)
            if tokens is None:
                return None
            if not self.leaves:
                self.outputs[index].append(tokens)
                return None
            leaf = tokens.detach().requires_grad_(True)
            self.outputs[index].append(leaf)
            torch.set_grad_enabled(True)
            return replace_first(output, leaf)

        return hook

    def replayable(self, *, chain: bool) -> bool:
        """Whether every block ran once, with its recorded input unchanged since (and, with ``chain``,
        each block's input being the previous block's output)."""
        if any(len(calls) != 1 or len(outs) != 1 for calls, outs in zip(self.calls, self.outputs)):
            return False
        if any(calls[0].tokens._version != calls[0].version for calls in self.calls):
            return False
        if chain:
            return all(self.calls[i + 1][0].tokens is self.outputs[i][0] for i in range(len(self.blocks) - 1))
        return True
