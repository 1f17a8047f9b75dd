"""LeGrad's two ways through the blocks without every block's graph (private; :class:`~camkit.methods.LeGrad` calls them).

LeGrad's score of block ``l`` reads that block's output tokens through the model's final norm and
head, so ``ds_l / dA_l`` runs back through block ``l`` alone: block ``l``'s graph can be freed as
soon as that gradient is taken, before the next block runs.

* :func:`single_pass`, when the classes are known before the forward: given (ints or an integer
  tensor), or the predicted class named first by a forward without graph. One forward in which
  each block read builds the graph of its attention onwards only (its queries, keys and values
  without autograd), its score is differentiated as soon as it returns, and its output goes on
  without graph. Where each sample is scored alone (a head camkit knows, the model called on the
  image alone) the batch runs in halves (``SINGLE_PASS_PARTS``): each half's forward plus one
  block's graph stays below the whole batch's forward.
* :func:`recompute`, for callable targets (what they score is known only from the model's output):
  a forward without graph that keeps the first read block's input, then the blocks called again in
  order, each differentiated and freed before the next (:mod:`camkit.methods._blockwise`).

Both give the maps of one backward through the whole graph up to rounding (the tests hold them to
1e-6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ...explanation import Explanation
from ...functional.attention import legrad_relevance
from ...hooks import HookScope
from ...targets.classes import Target, _index_tensor, _plain_target, resolve_target, select_output
from .blockwise import BlockRecorder, first_tensor, micro_batches, replace_first
from .capture import AttentionCapture

if TYPE_CHECKING:
    from .base import LeGrad

__all__ = ["SINGLE_PASS_PARTS", "given_classes", "recompute", "single_pass"]

# the single pass runs the batch in this many parts: half the batch's forward plus one block's graph (its attention
# onwards: values, the MLP's input and hidden layer) stays below one forward of the whole batch
SINGLE_PASS_PARTS = 2


def given_classes(target: Target, batch: int) -> Tensor | None:
    """The classes a target names before any forward, [B] or [B, K] (range checked later); ``None`` if it names none.

    ``None`` for the predicted class (``target=None``), a callable, or anything :func:`resolve_target`
    would refuse (it then refuses it on the other path, with its message). Numpy integers and arrays
    count as the ints and tensors they hold, as :func:`resolve_target` reads them.
    """
    if target is None or callable(target):
        return None
    try:
        target = _plain_target(target)
        if isinstance(target, int):
            return torch.full((batch,), target, dtype=torch.long)
        return _index_tensor(target, batch).long()
    except (InvalidTargetError, TypeError, ValueError, RuntimeError):  # the last three: what torch.as_tensor refuses
        return None


def single_pass(explainer: LeGrad, x: Tensor, blocks: list[nn.Module], classes: Tensor) -> Explanation:
    """LeGrad in one forward per part of the batch, for ``classes`` [B] or [B, K] given before it.

    The batch is split only where each sample is scored alone: a head camkit knows and the model called
    on the image alone (a ``head=`` of the caller's, or other inputs, take the whole batch at once).
    """
    names = explainer.layer_names()
    head = explainer.head
    assert head is not None
    layers = explainer.layers
    first, final = layers[0], layers[-1]
    model = explainer.model
    found: Tensor | None = None  # per column, per layer read: the relevance [C, L, B, N - prefix]
    prefix, grid = 0, cast(tuple[int, ...], ())
    outputs = []
    split = explainer._known_head and explainer._call is None
    frozen = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in frozen:  # no parameter gradient is taken: autograd keeps only what dA needs
            p.requires_grad_(False)
        with AttentionCapture(model, gradients=True, local=True) as capture, HookScope() as scope:
            runs = [0] * len(blocks)
            part = slice(None)

            def before(index: int) -> Any:
                def hook(*_: Any) -> None:
                    runs[index] += 1
                    if runs[index] > 1:
                        raise LayerNotReachedError(
                            f"the block of '{names[index]}' ran {runs[index]} times in one forward; attention methods "
                            "read each layer once per forward"
                        )
                    capture.live = first <= index <= final  # the other blocks run the model's own attention

                return hook

            def after(index: int) -> Any:
                def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
                    nonlocal found, prefix, grid
                    if not first <= index <= final:
                        return None
                    tokens = first_tensor(output)
                    if tokens is None:
                        raise InvalidInputError(f"a transformer block returned {type(output).__name__}; camkit reads tensors [B, N, D]")
                    attention = capture.take(index)
                    if index in layers:
                        read = head(tokens)
                        logits = read if isinstance(read, Tensor) else select_output(read, explainer.output)
                        _, scores = resolve_target(classes[part], logits, batch=tokens.shape[0])
                        columns = explainer._columns(scores)
                        if found is None:
                            prefix, grid = explainer._layout(tokens.shape[1], x)[:2]
                            found = torch.zeros(len(columns), len(layers), x.shape[0], tokens.shape[1] - prefix, device=tokens.device)
                        for k, column in enumerate(columns):
                            (grad,) = explainer._grads(torch.stack([column.sum()]), [attention], [names[index]], k < len(columns) - 1)
                            with torch.no_grad():
                                found[k, layers.index(index), part] = legrad_relevance([grad], prefix)
                        del read, logits, scores, columns
                    capture.live = False
                    return replace_first(output, tokens.detach())

                return hook

            for index, block in enumerate(blocks):
                scope.forward_pre(block, before(index))
                scope.forward(block, after(index), own_thread=True)
            for part in micro_batches(x.shape[0], explainer._block_batch, SINGLE_PASS_PARTS) if split else [slice(None)]:
                runs[:] = [0] * len(blocks)
                capture.live = False
                outputs.append(select_output(explainer._call_model(x[part]), explainer.output).detach())
                if any(runs[index] == 0 for index in layers):
                    missing = names[next(index for index in layers if runs[index] == 0)]
                    raise LayerNotReachedError(f"the block of '{missing}' did not run in the forward")
    finally:
        for p in frozen:
            p.requires_grad_(True)
    assert found is not None
    output = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    picked, scores = resolve_target(classes, output, batch=x.shape[0])
    return explainer._finish(list(found.mean(dim=1).unbind(0)), x, grid, picked, scores)


def recompute(explainer: LeGrad, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
    """LeGrad by a forward without graph, then the blocks called again in order; ``None`` where they cannot be."""
    names = explainer.layer_names()
    head = explainer.head
    assert head is not None
    first, final = explainer.layers[0], explainer.layers[-1]
    with (
        AttentionCapture(explainer.model, gradients=True, local=True) as capture,
        BlockRecorder(blocks, leaves=False, keep=[first]) as recorder,
    ):
        recorded = explainer._recorded_forward(capture, recorder, x, target)
        if recorded is None:
            return None
        classes, scores = recorded
        columns = explainer._columns(scores)
        multi = scores.dim() == 2
        read_layers = set(explainer.layers)
        # a known head and a class target score each sample alone: the blocks run on slices of the batch
        split = classes is not None and explainer._known_head
        call = recorder.calls[first][0]
        kept = call.tokens
        assert kept is not None  # the first block read keeps its input
        prefix, grid, _ = explainer._layout(kept.shape[1], x)
        # per column, per layer read: the relevance [B, N - prefix], allocated once before the blocks run
        # (small results allocated between the blocks' large temporaries keep the C heap from shrinking)
        found = torch.zeros(len(columns), len(explainer.layers), kept.shape[0], kept.shape[1] - prefix, device=kept.device)
        for part in call.slices(explainer._block_batch) if split else [slice(None)]:
            tokens = kept[part].detach()
            picked = None if classes is None else classes[part]
            # from the first block read on, each block called again on the previous one's output, its
            # own score differentiated and its graph freed before the next
            for index in range(first, final + 1):
                torch.set_grad_enabled(True)
                out = recorder.calls[index][0].run(blocks[index], tokens)
                attention = capture.take(index)
                if index in read_layers:
                    read = head(out)
                    for k in range(len(columns)):
                        score = explainer._layer_score(read, picked, target, k, multi)
                        total = torch.stack([score.sum()])  # as the whole-graph path
                        (grad,) = explainer._grads(total, [attention], [names[index]], k < len(columns) - 1)
                        with torch.no_grad():
                            found[k, explainer.layers.index(index), part] = legrad_relevance([grad], prefix)
                    del read
                tokens = out.detach()
                del out, attention
            del tokens
        rows = list(found.mean(dim=1).unbind(0))
    return explainer._finish(rows, x, grid, classes, scores)

