"""CheferRollout's gradients a segment of blocks at a time (private; :class:`~camkit.methods.CheferRollout` calls them).

Both ways start with a forward without graph inside the blocks that keeps the input of each segment's
first block (:class:`~camkit.methods._blockwise.BlockRecorder`), then take the segments from the last
to the first, each called again on a few samples at a time and differentiated
(:func:`segments_back`).

* :func:`from_last_segment`, when each sample is scored alone (a model family camkit knows, called on
  the image alone, which the caller checks, and a class target or the predicted class): the forward halts at the last segment's
  first block. The last segment and what follows it (final norm, head, target) then run once, in the
  model's own forward called on each micro-batch, with the blocks before that segment standing in
  for themselves (the last of them gives back the kept input; see :func:`_stand_in`). The model's own
  code computes the score, so no head need be known, and the last segment runs twice in all (not
  three times, as it does when the first forward goes through it).
* The caller's other way (:meth:`CheferRollout._by_block`): the forward runs whole, the blocks'
  outputs handed on as leaves, so that the score's gradient with respect to each block's output comes
  from the score's graph alone; then every segment is called again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ...errors import LayerNotReachedError
from ...explanation import Explanation
from ...functional.attention import weighted_attention
from ...targets.classes import Target
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
from .legrad import given_classes

if TYPE_CHECKING:
    from .base import CheferRollout

__all__ = ["from_last_segment", "query_row", "roll", "segments_back"]


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


def _take(
    explainer: CheferRollout,
    names: Sequence[str],
    got: Sequence[Tensor | None],
    attentions: Sequence[Tensor],
    first: int,
    blocks: int,
    rows: Tensor,
    inputs: Tensor | None,
    k: int,
    part: slice,
    start: Tensor,
) -> None:
    """Take one backward of a segment starting at block ``first``: its attention gradients ``got`` rolled into
    ``rows[part]`` (score column ``k``'s), last block first, and, where the segment's input is kept (``inputs``),
    its gradient (``got[-1]``) into ``inputs[k, part]``."""
    for offset in reversed(range(len(attentions))):
        grad = explainer._grads_of(got[offset], attentions[offset], names[first + offset])
        with torch.no_grad():
            cam = weighted_attention(attentions[offset].detach(), grad)
            rows[part] = roll(rows[part], start, cam, last=first + offset == blocks - 1)
    if inputs is not None and got[-1] is not None:
        inputs[k, part] = got[-1]


def segments_back(
    explainer: CheferRollout,
    capture: AttentionCapture,
    recorder: BlockRecorder,
    blocks: Sequence[nn.Module],
    firsts: Sequence[int],
    every: int,
    upstream: list[list[Tensor | None]],
    rows: Tensor,
    start: Tensor,
    parts: Sequence[slice],
) -> None:
    """Call the segments that start at ``firsts`` again, last to first, and roll their attention into ``rows``.

    ``upstream[k][i]``: the gradient of score column ``k`` with respect to block ``i``'s output from
    outside the blocks called here (``None``: none); the segments' own input gradients are added in as
    they are found. ``rows`` [K, B, 1, N] is updated in place; each segment's kept input is freed with it.
    """
    names = explainer.layer_names()
    columns = len(upstream)
    for first in reversed(firsts):
        stop = min(first + every, len(blocks))
        kept = recorder.calls[first][0].tokens
        assert kept is not None  # kept for every segment's first block
        inputs = kept.new_zeros(columns, *kept.shape) if first > 0 else None
        for part in parts:
            tokens = kept[part].detach().requires_grad_(first > 0)
            torch.set_grad_enabled(True)
            outs, attentions = [], []
            current = tokens
            for index in range(first, stop):
                current = recorder.calls[index][0].run(blocks[index], current)
                outs.append(current)
                attentions.append(capture.take(index))
            del current
            wrt = [*attentions, tokens] if first > 0 else attentions
            for k, grads in enumerate(upstream):
                if grads[stop - 1] is None or not outs[-1].requires_grad:
                    raise LayerNotReachedError(f"the score does not depend on the attention of '{names[stop - 1]}'")
                pairs = [(out, grads[i]) for i, out in zip(range(first, stop), outs) if grads[i] is not None]
                got = torch.autograd.grad([out for out, _ in pairs], wrt, retain_graph=k < columns - 1, allow_unused=True,
                                          grad_outputs=[grad[part] for _, grad in pairs if grad is not None])
                _take(explainer, names, got, attentions, first, len(blocks), rows[k], inputs, k, part, start)
                del got, pairs
            del outs, attentions, wrt, tokens
        for grads in upstream:
            for index in range(first, stop):
                grads[index] = None
        if inputs is not None:
            for k, grads in enumerate(upstream):
                previous = grads[first - 1]
                grads[first - 1] = inputs[k] if previous is None else previous + inputs[k]
        for index in range(first, stop):
            recorder.calls[index].clear()  # the kept input is freed with its segment
        del inputs, kept


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


def from_last_segment(explainer: CheferRollout, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
    """Chefer's rollout with the last segment run once, inside the model's own forward on each micro-batch.

    ``None`` where that cannot be done exactly (the forward did not halt at the last segment, the
    blocks do not chain, a block's output holds other tensors, or the score reads the output of a
    block before the last segment's input directly): the caller then takes its other way.
    """
    model = explainer.model
    names = explainer.layer_names()
    every = explainer._segment or segment_length(len(blocks))
    firsts = list(range(0, len(blocks), every))
    last = firsts[-1]
    given = None if target is None else given_classes(target, x.shape[0])
    if target is not None and given is None:
        return None
    if given is not None and given.device.type == "cpu" and x.device.type == "cuda":
        given = given.pin_memory()  # each part's classes then reach the device without the host waiting for it
    with (
        AttentionCapture(model, gradients=True) as capture,
        BlockRecorder(blocks, leaves=False, keep=firsts, halt=last) as recorder,
    ):
        capture.live = False
        with torch.no_grad():
            try:
                explainer._call_model(x)
            except Halted:
                pass
            else:
                return None  # the forward went on (the model caught the halt, or never reached the block)
        if not recorder.replayable(chain=True) or any(recorder.templates[i] is None for i in range(last)):
            return None
        recorder.stop()
        capture.live = True
        call = recorder.calls[last][0]
        kept = call.tokens
        assert kept is not None  # every segment's first block keeps its input
        parts = recorder.calls[0][0].slices(explainer._block_batch, 2 * every)
        prefix, grid, query = explainer._layout(kept.shape[1], x)
        start = query_row(kept.new_empty(1, 1, kept.shape[1], dtype=torch.float32), query)  # v [1, 1, N]
        rows: Tensor | None = None
        inputs: Tensor | None = None
        classes: list[Tensor] = []
        scores: list[Tensor] = []
        entry: Tensor | None = None
        skipped: list[Tensor] = []

        def entry_tokens(args: Any, kwargs: Any) -> Tensor:
            assert entry is not None
            return entry

        def skipped_tokens(args: Any, kwargs: Any) -> Tensor:
            tokens = _input_tokens(args, kwargs)
            skipped.append(tokens)
            return tokens

        patched = [(block, block.__dict__.get("forward")) for block in blocks[:last]]
        frozen = [p for p in model.parameters() if p.requires_grad]
        try:
            for index, (block, _) in enumerate(patched):
                block.forward = _stand_in(recorder.templates[index], entry_tokens if index == last - 1 else skipped_tokens)
            for p in frozen:  # no parameter gradient: autograd keeps only what the attention's gradient needs
                p.requires_grad_(False)
            torch.set_grad_enabled(True)
            for number, part in enumerate(parts):
                entry = kept[part].detach().requires_grad_(last > 0)
                skipped.clear()
                picked, scored = explainer._target_scores(x[part], None if given is None else given[part])
                attentions = [capture.take(index) for index in range(last, len(blocks))]
                columns = explainer._columns(scored)
                if number == 0:
                    if not all(column.requires_grad for column in columns):
                        raise LayerNotReachedError("the score does not depend on the model's attention: no graph links them")
                    if any(leaves_reached(columns, skipped)):
                        return None  # the score reads a block's output outside the chain: the other way keeps it
                    rows = kept.new_zeros(len(columns), x.shape[0], 1, kept.shape[1], dtype=torch.float32)
                    inputs = kept.new_zeros(len(columns), *kept.shape) if last > 0 else None
                assert rows is not None
                wrt = [*attentions, entry] if last > 0 else attentions
                for k, column in enumerate(columns):
                    got = torch.autograd.grad(column.sum(), wrt, retain_graph=k < len(columns) - 1, allow_unused=True)
                    _take(explainer, names, got, attentions, last, len(blocks), rows[k], inputs, k, part, start)
                    del got
                if picked is not None:
                    classes.append(picked)
                scores.append(scored.detach())
                del attentions, columns, wrt, scored
            entry = None
        finally:
            for block, own in patched:
                if own is None:
                    block.__dict__.pop("forward", None)
                else:
                    block.forward = own
            for p in frozen:
                p.requires_grad_(True)
        assert rows is not None
        recorder.calls[last].clear()
        upstream: list[list[Tensor | None]] = [[None] * len(blocks) for _ in range(rows.shape[0])]
        if inputs is not None:
            for k, grads in enumerate(upstream):
                grads[last - 1] = inputs[k]
        del inputs, kept
        segments_back(explainer, capture, recorder, blocks, firsts[:-1], every, upstream, rows, start, parts)
        found = [(start + row)[:, 0, prefix:] for row in rows]
    return explainer._finish(found, x, grid, torch.cat(classes) if classes else None, torch.cat(scores))
