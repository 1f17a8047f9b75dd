"""Chefer's gradient-weighted attention rollout (:class:`CheferRollout`) and the steps of its three paths.

* The last segment in the model's forward (:meth:`CheferRollout._from_last_segment`), when each sample
  is scored alone (a model family camkit knows, called on the image alone, and a class target or the
  predicted class): a forward without graph inside the blocks keeps the input of each segment's first
  block (:class:`~camkit.methods.attention.blockwise.BlockRecorder`) and halts at the last segment's
  first block. The last segment and what follows it (final norm, head, target) then run once, in the
  model's own forward called on each micro-batch, with the blocks before that segment standing in for
  themselves (the last of them gives back the kept input; see :func:`_stand_in`). The model's own code
  computes the score, so no head need be known, and the last segment runs twice in all (not three
  times, as it does when the first forward goes through it).
* Block by block (:meth:`CheferRollout._by_block`): the forward runs whole, the blocks' outputs handed
  on as leaves, so that the score's gradient with respect to each block's output comes from the score's
  graph alone; then every segment is called again.
* The whole graph (:meth:`CheferRollout._whole_graph`): one backward through every block's graph.

The first two then take the segments from the last to the first, each called again on a few samples
at a time and differentiated (:meth:`CheferRollout._segments_back`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from ...errors import LayerNotReachedError
from ...explanation import Explanation
from ...functional.attention import gradient_rollout, token_relevance, weighted_attention
from ...targets.classes import OutputSelector, Target, given_classes
from .._core.binding import InputIndex
from ..registry import register_method
from .base import AttentionExplainer, frozen_parameters, known_head
from .blockwise import (
    TOKENS_ONLY,
    BlockRecorder,
    Halted,
    leaves_reached,
    replace_first,
    segment_length,
    tokens_at,
)
from .capture import AttentionCapture

__all__ = ["CheferRollout", "query_row", "roll"]


def query_row(cam: Tensor, query: str) -> Tensor:
    """The query row [B, 1, N] that :func:`~camkit.functional.token_relevance` reads of a relevance matrix."""
    n = cam.shape[-1]
    if query == "class":  # written, not one_hot: one_hot checks its indices on the host
        row = torch.zeros(cam.shape[0], 1, n, dtype=cam.dtype, device=cam.device)
        row[..., 0] = 1
        return row
    return torch.full((cam.shape[0], 1, n), 1.0 / n, dtype=cam.dtype, device=cam.device)


def roll(rows: Tensor, start: Tensor, cam: Tensor, *, last: bool) -> Tensor:
    """One step of the rollout read through the query row ``v`` (``start``): ``d <- d + (v + d) C_l``.

    ``rows`` holds ``d = w - v`` [B, 1, N] (the identity's share is kept out of each step's rounding);
    the last block's step starts it: ``d = v C_L``.
    """
    return start @ cam if last else rows + (start + rows) @ cam


def _upstream(recorder: BlockRecorder, columns: Sequence[Tensor], blocks: int) -> list[list[Tensor | None]]:
    """Per score column, the score's gradient with respect to each block's output it reads directly (the last
    block's: all of it) from the score's graph alone; ``None`` for a block whose output it does not read."""
    last = len(columns) - 1
    read = recorder.outputs_read(columns)
    wanted = [i for i, out in enumerate(read) if out is not None]
    leaves = [out for out in read if out is not None]
    upstream: list[list[Tensor | None]] = []
    for k, column in enumerate(columns):
        got = torch.autograd.grad(column.sum(), leaves, retain_graph=k < last, allow_unused=True) if leaves else ()
        grads: list[Tensor | None] = [None] * blocks
        for i, grad in zip(wanted, got):
            grads[i] = grad
        upstream.append(grads)
    return upstream


def _pass_on(upstream: list[list[Tensor | None]], segment: range, inputs: Tensor | None) -> None:
    """A segment is done: its blocks' output gradients dropped, its input's gradient (``inputs`` [K, B, N, D])
    added to the previous block's output gradient."""
    for grads in upstream:
        for index in segment:
            grads[index] = None
    if inputs is not None:
        for k, grads in enumerate(upstream):
            previous = grads[segment.start - 1]
            grads[segment.start - 1] = inputs[k] if previous is None else previous + inputs[k]


def _stand_in(template: Any, tokens: Callable[[Any, Any], Tensor]) -> Callable[..., Any]:
    """A block's forward that runs nothing: its output's structure (``template``) around ``tokens(args, kwargs)``."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = tokens(args, kwargs)
        return out if template == TOKENS_ONLY else replace_first(template, out)

    return forward


def _input_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    where = tokens_at(args, kwargs)
    got = args[0] if where == 0 else kwargs["hidden_states"]  # the halted forward recorded this block's tokens
    return got.detach().requires_grad_(True)  # a fresh leaf: a score that reads it is found on its graph


@contextmanager
def _forwards_replaced(blocks: Sequence[nn.Module], forwards: Sequence[Callable[..., Any]]) -> Iterator[None]:
    """Each block's forward replaced by its own of ``forwards`` (an instance attribute) for the block, put back after."""
    patched = [(block, block.__dict__.get("forward")) for block in blocks]
    try:
        for block, forward in zip(blocks, forwards):
            block.forward = forward
        yield
    finally:
        for block, own in patched:
            if own is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = own


@dataclass
class _LastSegment:
    """What the runs of the last segment in the model's forward share and collect.

    ``kept``: the last segment's input [B, N, D]; ``start``: the query row ``v`` [1, 1, N]; ``entry``: the
    running part's input leaf, which the stand-in before the last segment gives back; ``skipped``: the
    leaves the other stand-ins gave back; ``rows`` [K, B, 1, N] and ``inputs`` [K, B, N, D] (the gradient
    of each score column with respect to ``kept``), allocated by the first part; the parts' classes and scores.
    """

    kept: Tensor
    start: Tensor
    entry: Tensor | None = None
    skipped: list[Tensor] = field(default_factory=list)
    rows: Tensor | None = None
    inputs: Tensor | None = None
    classes: list[Tensor] = field(default_factory=list)
    scores: list[Tensor] = field(default_factory=list)

    def entry_tokens(self, args: Any, kwargs: Any) -> Tensor:
        assert self.entry is not None
        return self.entry

    def skipped_tokens(self, args: Any, kwargs: Any) -> Tensor:
        tokens = _input_tokens(args, kwargs)
        self.skipped.append(tokens)
        return tokens


@register_method("cheferrollout")
class CheferRollout(AttentionExplainer):
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf, "Generic Attention-model Explainability", ICCV 2021).

    ``R = I``; for each layer ``R <- R + mean_heads((dA_l ⊙ A_l)^+) R``, with ``dA_l`` the gradient
    of the target's score with respect to the layer's attention probabilities; the map is the
    class token's row of ``R`` over the patch tokens (see :func:`camkit.functional.gradient_rollout`).

    The gradients come a few blocks at a time: a forward without graph keeps the input of every
    ``ceil(sqrt(L))``-th block, then from the last segment of blocks to the first the segment is
    called again from its input and differentiated, the gradient with respect to its input going
    on to the previous segment; each segment is called on a few samples at a time (samples are
    independent in a block in eval mode). The peak memory is about ``sqrt(L)`` block inputs plus
    one such call's graph, not the graph of every block. On a model family camkit knows (timm's,
    torchvision's and Hugging Face's ViTs, DeiT, DINOv2, CLIP's vision tower) called on the image
    alone, with a class target or ``target=None``, the forward without graph stops at the last
    segment: that segment, the head and the score then run once, inside the model's own forward
    on each few samples (the blocks before it standing in for themselves), instead of once in the
    forward and again to be differentiated. A model
    with a module in training mode (``keep_mode=True``), a target read inside the model
    (:class:`~camkit.NeuronTarget`) or blocks that do not feed each other directly take one
    backward through the whole graph instead; the maps are the same either way.

    On a GPU, where memory rarely runs out but every block call costs kernel launches, the whole
    graph is faster: one forward that keeps every block's graph (parameters frozen for the call),
    one ``torch.autograd.grad`` for all blocks' attention at once. ``path="auto"`` (the default)
    takes it whenever its memory, estimated from shapes before anything runs
    (:func:`camkit.methods.attention.budget.whole_graph_bytes`), fits the budget: ``max_memory``
    bytes, or on CUDA 80% of the device's free memory. On the CPU without ``max_memory`` the
    default stays block by block (at most about 2x a no-grad forward's memory). The path taken,
    the estimate and the budget are reported in ``extras["path"]`` (``"whole"`` or
    ``"blockwise"``), ``extras["estimated_bytes"]`` and ``extras["budget_bytes"]``.

    Args:
        model: a vision transformer (see :class:`AttentionExplainer`).
        path: ``"auto"`` (default: the whole graph where it fits the memory budget, else block by
            block), ``"whole"`` (one backward through every block's graph: 2.4x a no-grad forward's
            time on vit_b_16 at batch 8 on the CPU, but 16x its memory) or ``"blockwise"`` (segments
            called again, at about a no-grad forward's peak memory: 3.1x its time). Same maps.
        max_memory: the budget in bytes for ``path="auto"``; ``None``: on CUDA 80% of the free
            device memory, elsewhere none (block by block).
        query, output, keep_mode, input_index: see :class:`AttentionExplainer`.

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
        ...                         num_classes=3)
        >>> camkit.CheferRollout(vit)(torch.rand(2, 3, 16, 16), target=[0, 2]).shape
        torch.Size([2, 16, 16])
    """

    cost: ClassVar[str] = (
        "where the whole graph fits the memory budget (max_memory=, or on CUDA 80% of the free memory): 1 forward "
        "keeping every block's graph, attention unfused, + 1 backward; otherwise (the CPU's default) 1 forward without "
        "a graph, then the blocks recomputed and differentiated a segment of about sqrt(L) at a time, last to first: "
        "about 1 more forward + 1 backward, at peak memory sqrt(L) block inputs + one segment's graph for a few samples"
    )
    use_when: ClassVar[str] = (
        "You want a class-specific map of a ViT that reads its class token: the attention weighted by the score's gradient."
    )

    def __init__(
        self, model: nn.Module, *, path: str = "auto", max_memory: int | None = None, query: str = "auto",
        output: OutputSelector = None, keep_mode: bool = False, input_index: InputIndex = 0
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        self._set_path(path, max_memory)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        choice = self._choose(x)
        blocks = self._replays(target, choice)
        explanation = None
        # a family camkit knows (tokens meet only within a sample, from the input to the head) called on the image
        # alone: the model's own forward may run on a few samples at a time
        if blocks is not None and self._call is None and known_head(self.model) is not None:
            explanation = self._from_last_segment(x, target, blocks)
        if blocks is not None and explanation is None:
            explanation = self._by_block(x, target, blocks)
        if explanation is not None:
            return self._reported(explanation, choice, "blockwise")
        return self._reported(self._whole_graph(x, target), choice, "whole")

    def _segments(self, blocks: int) -> tuple[int, list[int]]:
        """The blocks per segment and each segment's first block."""
        every = self._segment or segment_length(blocks)
        return every, list(range(0, blocks, every))

    def _whole_graph(self, x: Tensor, target: Target) -> Explanation:
        """One forward keeping every block's graph (parameters frozen: no weight gradient is kept for), one
        backward per score column for every block's attention at once."""
        names = self.layer_names()
        with frozen_parameters(self.model), AttentionCapture(self.model, gradients=True) as capture:
            classes, scores = self._target_scores(x, target)
            attentions = capture.attentions()
            columns = self._columns(scores)
            rows = []
            for k, column in enumerate(columns):
                grads = self._grads(column, attentions, names, k < len(columns) - 1)
                with torch.no_grad():
                    relevance = gradient_rollout([a.detach() for a in attentions], grads)
                    prefix, grid, query = self._layout(relevance.shape[-1], x)
                    rows.append(token_relevance(relevance, prefix, query=query))
        return self._finish(rows, x, grid, classes, scores)

    def _by_block(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        """Every block's output a leaf in the forward, then every segment called again; ``None`` where the blocks
        cannot be called again."""
        every, firsts = self._segments(len(blocks))
        with (
            AttentionCapture(self.model, gradients=True) as capture,
            BlockRecorder(blocks, leaves=True, keep=firsts) as recorder,
        ):
            recorded = self._recorded_forward(capture, recorder, x, target)
            if recorded is None:
                return None
            classes, scores = recorded
            columns = self._columns(scores)
            if not all(column.requires_grad for column in columns):
                raise LayerNotReachedError("the score does not depend on the model's attention: no graph links them")
            with torch.enable_grad():  # the segments are called again with a graph
                upstream = _upstream(recorder, columns, len(blocks))
                # a segment's graph holds `every` blocks: a micro-batch of about batch / (2 * every) samples keeps
                # it near half a block's graph for the whole batch
                call = recorder.calls[0][0]
                parts = call.slices(self._block_batch, 2 * every)
                # R = (I + C_L) ··· (I + C_1) is read through one query row v (token_relevance's): from the last
                # layer down, w <- w + w C_l, kept as d = w - v [C, B, 1, N] (the identity's share is not rounded
                # into each step). d is allocated before the blocks run (small results allocated between large
                # temporaries keep the C heap from shrinking).
                entry = cast(Tensor, call.tokens)  # the first block's input, kept: [B, N, D] on the model's device
                prefix, grid, query = self._layout(entry.shape[1], x)
                start = query_row(entry.new_empty(1, 1, entry.shape[1], dtype=torch.float32), query)  # v [1, 1, N]
                rows = entry.new_zeros(len(columns), call.batch, 1, entry.shape[1], dtype=torch.float32)
                self._segments_back(capture, recorder, blocks, firsts, every, upstream, rows, start, parts)
                found = [(start + row)[:, 0, prefix:] for row in rows]
        return self._finish(found, x, grid, classes, scores)

    def _from_last_segment(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        """Chefer's rollout with the last segment run once, inside the model's own forward on each micro-batch.

        ``None`` where that cannot be done exactly (the forward did not halt at the last segment, the
        blocks do not chain, a block's output holds other tensors, or the score reads the output of a
        block before the last segment's input directly): the caller then takes its other way.
        """
        every, firsts = self._segments(len(blocks))
        last = firsts[-1]
        given = None if target is None else given_classes(target, x.shape[0])
        if target is not None and given is None:
            return None
        if given is not None and given.device.type == "cpu" and x.device.type == "cuda":
            given = given.pin_memory()  # each part's classes then reach the device without the host waiting for it
        with (
            AttentionCapture(self.model, gradients=True) as capture,
            BlockRecorder(blocks, leaves=False, keep=firsts, halt=last) as recorder,
        ):
            if not self._halted_forward(capture, recorder, x, last):
                return None
            call = recorder.calls[last][0]
            assert call.tokens is not None  # every segment's first block keeps its input
            parts = recorder.calls[0][0].slices(self._block_batch, 2 * every)
            prefix, grid, query = self._layout(call.tokens.shape[1], x)
            start = query_row(call.tokens.new_empty(1, 1, call.tokens.shape[1], dtype=torch.float32), query)  # v [1, 1, N]
            run = _LastSegment(call.tokens, start)
            if not self._run_last_segment(capture, recorder, blocks, last, x, given, parts, run):
                return None
            rows = cast(Tensor, run.rows)
            recorder.calls[last].clear()
            upstream: list[list[Tensor | None]] = [[None] * len(blocks) for _ in range(rows.shape[0])]
            if run.inputs is not None:
                for k, grads in enumerate(upstream):
                    grads[last - 1] = run.inputs[k]
            run.inputs = None
            self._segments_back(capture, recorder, blocks, firsts[:-1], every, upstream, rows, start, parts)
            found = [(start + row)[:, 0, prefix:] for row in rows]
        classes = torch.cat(run.classes) if run.classes else None
        return self._finish(found, x, grid, classes, torch.cat(run.scores))

    def _halted_forward(self, capture: AttentionCapture, recorder: BlockRecorder, x: Tensor, last: int) -> bool:
        """The forward without graph that halts at block ``last``: ``True`` where it halted there and the blocks
        before it chain and can stand in for themselves (``capture`` then records again)."""
        capture.live = False
        with torch.no_grad():
            try:
                self._call_model(x)
            except Halted:
                pass
            else:
                return False  # the forward went on (the model caught the halt, or never reached the block)
        if not recorder.replayable(chain=True) or any(recorder.templates[i] is None for i in range(last)):
            return False
        recorder.stop()
        capture.live = True
        return True

    def _run_last_segment(
        self, capture: AttentionCapture, recorder: BlockRecorder, blocks: list[nn.Module], last: int, x: Tensor,
        given: Tensor | None, parts: Sequence[slice], run: _LastSegment
    ) -> bool:
        """The model's own forward on each part, the blocks before ``last`` standing in for themselves, its last
        segment's attention rolled into ``run``; ``False`` where the score reads a block's output before the
        last segment's input directly (the other way keeps it)."""
        stand_ins = [
            _stand_in(recorder.templates[index], run.entry_tokens if index == last - 1 else run.skipped_tokens)
            for index in range(last)
        ]
        with _forwards_replaced(blocks[:last], stand_ins), frozen_parameters(self.model), torch.enable_grad():
            for number, part in enumerate(parts):
                if not self._last_segment_part(capture, len(blocks), last, x, given, part, run, first=number == 0):
                    return False
            run.entry = None
        return True

    def _last_segment_part(
        self, capture: AttentionCapture, blocks: int, last: int, x: Tensor, given: Tensor | None, part: slice, run:
        _LastSegment, *, first: bool
    ) -> bool:
        """One part's forward through the last segment and its backward per score column; ``False`` where (seen
        on the first part) the score reads a stand-in's output."""
        run.entry = run.kept[part].detach().requires_grad_(last > 0)
        run.skipped.clear()
        picked, scored = self._target_scores(x[part], None if given is None else given[part])
        attentions = [capture.take(index) for index in range(last, blocks)]
        columns = self._columns(scored)
        if first:
            if not all(column.requires_grad for column in columns):
                raise LayerNotReachedError("the score does not depend on the model's attention: no graph links them")
            if any(leaves_reached(columns, run.skipped)):
                return False  # the score reads a block's output outside the chain: the other way keeps it
            run.rows = run.kept.new_zeros(len(columns), x.shape[0], 1, run.kept.shape[1], dtype=torch.float32)
            run.inputs = run.kept.new_zeros(len(columns), *run.kept.shape) if last > 0 else None
        assert run.rows is not None
        names = self.layer_names()
        wrt = [*attentions, run.entry] if last > 0 else attentions
        for k, column in enumerate(columns):
            got = torch.autograd.grad(column.sum(), wrt, retain_graph=k < len(columns) - 1, allow_unused=True)
            self._take(names, got, attentions, last, blocks, run.rows[k], run.inputs, k, part, run.start)
            del got
        if picked is not None:
            run.classes.append(picked)
        run.scores.append(scored.detach())
        return True

    def _segments_back(
        self, capture: AttentionCapture, recorder: BlockRecorder, blocks: Sequence[nn.Module], firsts: Sequence[int],
        every: int, upstream: list[list[Tensor | None]], rows: Tensor, start: Tensor, parts: Sequence[slice]
    ) -> None:
        """Call the segments that start at ``firsts`` again, last to first, and roll their attention into ``rows``.

        ``upstream[k][i]``: the gradient of score column ``k`` with respect to block ``i``'s output from
        outside the blocks called here (``None``: none); the segments' own input gradients are added in as
        they are found. ``rows`` [K, B, 1, N] is updated in place; each segment's kept input is freed with it.
        """
        for first in reversed(firsts):
            segment = range(first, min(first + every, len(blocks)))
            kept = recorder.calls[first][0].tokens
            assert kept is not None  # kept for every segment's first block
            inputs = kept.new_zeros(len(upstream), *kept.shape) if first > 0 else None
            for part in parts:
                self._segment_part(capture, recorder, blocks, segment, kept[part], upstream, rows, inputs, part, start)
            _pass_on(upstream, segment, inputs)
            for index in segment:
                recorder.calls[index].clear()  # the kept input is freed with its segment
            del inputs, kept

    def _segment_part(
        self, capture: AttentionCapture, recorder: BlockRecorder, blocks: Sequence[nn.Module], segment: range, kept:
        Tensor, upstream: list[list[Tensor | None]], rows: Tensor, inputs: Tensor | None, part: slice, start: Tensor
    ) -> None:
        """The blocks of ``segment`` called again on the samples ``part`` (their kept input ``kept``), then one
        backward per score column, rolled into ``rows``."""
        names = self.layer_names()
        first, stop = segment.start, segment.stop
        tokens = kept.detach().requires_grad_(first > 0)
        with torch.enable_grad():
            outs, attentions = [], []
            current = tokens
            for index in segment:
                current = recorder.calls[index][0].run(blocks[index], current)
                outs.append(current)
                attentions.append(capture.take(index))
            del current
            wrt = [*attentions, tokens] if first > 0 else attentions
            for k, grads in enumerate(upstream):
                if grads[stop - 1] is None or not outs[-1].requires_grad:
                    raise LayerNotReachedError(f"the score does not depend on the attention of '{names[stop - 1]}'")
                pairs = [(out, grads[i]) for i, out in zip(segment, outs) if grads[i] is not None]
                got = torch.autograd.grad([out for out, _ in pairs], wrt, retain_graph=k < len(upstream) - 1, allow_unused=True,
                                          grad_outputs=[grad[part] for _, grad in pairs if grad is not None])
                self._take(names, got, attentions, first, len(blocks), rows[k], inputs, k, part, start)
                del got, pairs

    def _take(
        self, names: Sequence[str], got: Sequence[Tensor | None], attentions: Sequence[Tensor], first: int, blocks:
        int, rows: Tensor, inputs: Tensor | None, k: int, part: slice, start: Tensor
    ) -> None:
        """Take one backward of a segment starting at block ``first``: its attention gradients ``got`` rolled into
        ``rows[part]`` (score column ``k``'s), last block first, and, where the segment's input is kept (``inputs``),
        its gradient (``got[-1]``) into ``inputs[k, part]``."""
        for offset in reversed(range(len(attentions))):
            grad = self._grads_of(got[offset], attentions[offset], names[first + offset])
            with torch.no_grad():
                cam = weighted_attention(attentions[offset].detach(), grad)
                rows[part] = roll(rows[part], start, cam, last=first + offset == blocks - 1)
        if inputs is not None and got[-1] is not None:
            inputs[k, part] = got[-1]
