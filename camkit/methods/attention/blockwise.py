"""Gradients of a transformer's attention one block at a time, at about a forward's memory.

Chefer's rollout needs ``dS/dA_l`` for every block ``l``, LeGrad the gradient of block ``l``'s own
score. Keeping the graph of every block for one backward costs the activations of the whole
network (11 to 16 times a no-grad forward on ViT-B/16). Here instead:

1. One forward runs without a graph inside the blocks; :class:`BlockRecorder` keeps each block's
   call (its other arguments) and the input tokens ``x_l`` [B, N, D] of a few blocks only (the
   first block of each segment for Chefer, the first block read for LeGrad): every block input
   kept beside a forward's own activations weighs as much as the forward (13 tensors [B, N, D]
   on ViT-S). For Chefer's rollout each block's output is handed on as a fresh leaf and autograd
   runs between and after the blocks, so the score's graph holds only what follows the blocks
   (final norm, head, target) and whatever reads a block's output outside the chain of blocks
   (:meth:`BlockRecorder.outputs_read` finds those outputs on the score's graph). Where each
   sample is scored alone, Chefer's forward halts at the last segment instead (``halt=``,
   :class:`Halted`), and that segment runs with the score in the model's own forward
   (:meth:`~camkit.methods.attention.chefer.CheferRollout._from_last_segment`).
2. Chefer: from the last segment of blocks to the first, the segment's blocks are called again,
   chained, from the segment's kept input, with their attention recorded on the graph
   (:class:`~camkit.methods.attention.capture.AttentionCapture`), and differentiated in one backward: the
   gradient with respect to the segment's input is the gradient with respect to the previous
   block's output, added to what the score reads of that output directly. Segments of about
   ``sqrt(L)`` blocks (:func:`segment_length`) keep ``sqrt(L)`` inputs and one segment's graph.
   LeGrad: each block's score reads its own output, so the blocks are called again in order from
   the first block read, each differentiated and freed before the next, its output the next one's
   input: no block input but the first is kept.
3. A block treats each sample on its own in eval mode (layer norms per token, attention within
   a sample), so the blocks are called again on a slice of the batch at a time
   (:func:`micro_batches`): the peak holds one slice's graph, not the whole batch's.

The forward runs as the model's own does (its fused attention, where it has one), which is the
fastest forward and gives the model's own scores; the blocks called again compute the attention
unfused, to record it. Kept inputs and recomputed outputs therefore differ only by rounding, and
the gradients are those of one backward through the whole graph up to rounding (the tests hold
the maps to 1e-6). This holds when the model is deterministic: explainers run the model in eval mode; a
model that keeps a module in training mode (``keep_mode=True``), a block whose input is not the
previous block's output, a block that runs twice, or a kept input changed in place afterwards,
takes the whole-graph path instead (:meth:`BlockRecorder.replayable` says which).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..._internal.state import GradModes
from ...errors import InvalidInputError
from ...hooks import HookScope
from .capture import block_of, first_tensor

__all__ = [
    "BlockCall",
    "BlockRecorder",
    "Halted",
    "attention_blocks",
    "graph_leaves",
    "leaves_reached",
    "micro_batches",
    "replace_first",
    "segment_length",
    "tokens_at",
]

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


def micro_batches(batch: int, size: int | None = None, parts: int = MICRO_BATCHES) -> list[slice]:
    """The slices of a batch of ``batch`` samples, ``size`` at a time (``None``: ``ceil(batch / parts)``).

    Example:
        >>> micro_batches(5, 2)
        [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
        >>> len(micro_batches(8)), len(micro_batches(8, parts=8))
        (4, 8)
    """
    if size is None:
        size = -(-batch // max(1, parts))
    if size < 1:
        raise InvalidInputError(f"a micro-batch holds at least one sample, got {size}; pass None for the automatic size")
    return [slice(start, min(start + size, batch)) for start in range(0, batch, size)]


def segment_length(blocks: int) -> int:
    """Blocks per segment of Chefer's block-by-block backward: ``ceil(sqrt(blocks))``.

    ``L / k`` kept inputs during the forward and ``k`` blocks' graph per backward are both about
    ``sqrt(L)`` at ``k = sqrt(L)``.

    Example:
        >>> [segment_length(n) for n in (1, 3, 12, 24)]
        [1, 2, 4, 5]
    """
    return max(1, math.ceil(math.sqrt(blocks)))


class Halted(Exception):
    """Raised by a :class:`BlockRecorder` with ``halt=`` when the forward reaches that block (caught by its caller)."""


def graph_leaves(roots: Sequence[Tensor]) -> Iterator[Tensor]:
    """The leaf tensors the graph of ``roots`` reads (a root without graph counts as its own leaf), each node once."""
    stack = []
    for root in roots:
        if root.grad_fn is None:
            yield root
        else:
            stack.append(root.grad_fn)
    seen: dict[int, Any] = {}  # holding the nodes keeps their ids unique
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if isinstance(variable, Tensor):
            yield variable
        stack.extend(following for following, _ in node.next_functions if following is not None)


def leaves_reached(roots: Sequence[Tensor], leaves: Sequence[Tensor]) -> list[bool]:
    """For each of ``leaves`` (tensors made by ``detach().requires_grad_()``), whether the graph of ``roots`` reads it."""
    reached = {id(leaf) for leaf in graph_leaves(roots)}
    return [id(leaf) in reached for leaf in leaves]


# a block that returns its tokens alone (see BlockRecorder.templates)
TOKENS_ONLY = "tokens only"


def tokens_at(args: Sequence[Any], kwargs: dict[str, Any]) -> int | str | None:
    """Where a block's call holds its input tokens: ``0`` (the first argument), ``"hidden_states"``
    (Hugging Face's keyword), or ``None``."""
    if args and isinstance(args[0], Tensor):
        return 0
    if isinstance(kwargs.get("hidden_states"), Tensor):
        return "hidden_states"
    return None


def replace_first(output: Any, tensor: Tensor) -> Any:
    """``output`` with its tokens (see :func:`first_tensor`) replaced by ``tensor``."""
    if isinstance(output, Tensor):
        return tensor
    return type(output)([tensor, *output[1:]]) if isinstance(output, list) else (tensor, *output[1:])


def _template(output: Any) -> Any:
    """A block's output with its tokens taken out (see :attr:`BlockRecorder.templates`)."""
    if isinstance(output, Tensor):
        return TOKENS_ONLY
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        rest = output[1:]
        if not any(isinstance(item, Tensor) or (isinstance(item, (tuple, list)) and any(isinstance(t, Tensor) for t in item))
                   for item in rest):
            return replace_first(output, None)  # type: ignore[arg-type]
    return None


@dataclass
class BlockCall:
    """One recorded call of a block: its arguments, with the input tokens at ``where``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    where: int | str
    tokens: Tensor | None  # None where the recorder did not keep this block's input
    version: int
    batch: int

    def splittable(self) -> bool:
        """Whether the block can be called on a slice of the batch: no tensor argument but the tokens."""
        others = [*(a for i, a in enumerate(self.args) if i != self.where), *(v for k, v in self.kwargs.items() if k != self.where)]
        return not any(isinstance(a, Tensor) or (isinstance(a, (tuple, list)) and any(isinstance(t, Tensor) for t in a)) for a in others)

    def slices(self, size: int | None, parts: int = MICRO_BATCHES) -> list[slice]:
        """The micro-batches to call the block on: :func:`micro_batches`, or the whole batch if not :meth:`splittable`."""
        return micro_batches(self.batch, size, parts) if self.splittable() else [slice(0, self.batch)]

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
        keep: the blocks whose input tokens are kept (``None``: every block's); the others' calls
            are recorded without their tokens.
        halt: stop the forward when it reaches this block, once its call is recorded: :class:`Halted`
            is raised from the block's pre-hook (:attr:`halted` then says so) and the blocks before
            it leave their output's structure in :attr:`templates`.

    Hooks are scoped by :class:`~camkit.hooks.HookScope` and removed when the ``with`` block ends.
    While :attr:`recording` is ``False`` (the blocks being called again) the hooks do nothing.
    """

    def __init__(
        self, blocks: Sequence[nn.Module], *, leaves: bool, keep: Collection[int] | None = None, halt: int | None = None
    ) -> None:
        self.blocks = list(blocks)
        self.leaves = leaves
        self.keep = None if keep is None else set(keep)
        self.halt = halt
        self.halted = False
        # with halt: per block before it, its output with the tokens taken out (TOKENS_ONLY for a bare tensor;
        # None where the output holds other tensors, which a stand-in could not give back)
        self.templates: list[Any] = [None] * len(self.blocks)
        self.recording = True
        self.calls: list[list[BlockCall]] = [[] for _ in self.blocks]
        self.runs = [0] * len(self.blocks)
        self.chained = [False] * len(self.blocks)  # block i's input was block i - 1's output
        self._previous: Tensor | None = None
        self._leaves: dict[int, tuple[int, weakref.ref[Tensor]]] = {}
        self._scope = HookScope()
        # autograd's mode: off inside each block, on after each (leaves), as it was again on exit
        self._grad_modes = GradModes()

    def __enter__(self) -> BlockRecorder:
        self._grad_modes = GradModes()
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
        self._previous = None
        self._grad_modes.close()

    def stop(self) -> None:
        """Stop recording (the blocks are about to be called again) and let go of the last output."""
        self.recording = False
        self._previous = None

    def _before(self, index: int) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self.recording:
                return
            where = tokens_at(args, kwargs)
            if where is not None:
                tokens = args[0] if where == 0 else kwargs["hidden_states"]
                self.chained[index] = index > 0 and tokens is self._previous
                kept = self.keep is None or index in self.keep
                if not kept:  # the call without its tokens: the tensor is not held here
                    args = (None, *args[1:]) if where == 0 else args
                    kwargs = {**kwargs, "hidden_states": None} if where != 0 else kwargs
                call = BlockCall(args, dict(kwargs), where, tokens if kept else None, tokens._version, tokens.shape[0])
                self.calls[index].append(call)
            self._previous = None
            self._grad_modes.enter(False)
            if index == self.halt:
                self.halted = True
                self.recording = False
                raise Halted(index)

        return hook

    def _after(self, index: int) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not self.recording:
                return None
            tokens = first_tensor(output)
            if tokens is None:
                return None
            self.runs[index] += 1
            if self.halt is not None:
                self.templates[index] = _template(output)
            if not self.leaves:
                self._previous = tokens
                return None
            leaf = tokens.detach().requires_grad_(True)
            self._previous = leaf
            self._leaves[id(leaf)] = (index, weakref.ref(leaf))
            self._grad_modes.enter(True)
            return replace_first(output, leaf)

        return hook

    def replayable(self, *, chain: bool) -> bool:
        """Whether every block ran once, with its kept input unchanged since (and, with ``chain``,
        each block's input being the previous block's output).

        With ``halt``: whether the forward halted there, every block before it having run once, and the
        halting block called once (its input recorded, the blocks after it never reached).
        """
        reached = len(self.blocks) if self.halt is None else self.halt + 1
        if self.halt is not None and (not self.halted or any(self.calls[reached:]) or self.runs[self.halt]):
            return False
        runs = [*self.runs[: reached - 1], 1] if self.halt is not None else self.runs
        if any(len(calls) != 1 or ran != 1 for calls, ran in zip(self.calls[:reached], runs)):
            return False
        kept = [calls[0] for calls in self.calls[:reached] if calls[0].tokens is not None]
        if any(call.tokens is not None and call.tokens._version != call.version for call in kept):
            return False
        return all(self.chained[1:reached]) if chain else True

    def outputs_read(self, roots: Sequence[Tensor]) -> list[Tensor | None]:
        """Each block's output leaf (``leaves=True``) that the graph of ``roots`` reads, else ``None``, per block.

        The leaves are found on the graph itself (its leaf nodes), so the recorder keeps none of them:
        an output that nothing but the next block read is freed once that block has run.
        """
        found: list[Tensor | None] = [None] * len(self.blocks)
        for leaf in graph_leaves(roots):
            entry = self._leaves.get(id(leaf))
            if entry is not None and entry[1]() is leaf:
                found[entry[0]] = leaf
        return found
